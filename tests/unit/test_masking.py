"""The whole-word n-gram masking of ernie_mtl/data/masking.py against its first, plainer version kept
here as the reference (the pattern of data_tools/index_reference.py): on random token sequences with
whole words, truncated words, [SEP] inside, and every budget and n-gram setting, the fast version
returns the same arrays and leaves the random generator in the same state (it draws the same numbers
in the same order), so samples, losses and resumed runs do not change."""
import numpy as np
import pytest

from ernie_mtl.data.masking import VocabInfo, mask_whole_word_ngrams

SPECIALS = ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"]
CHARS = [chr(0x4E00 + k) for k in range(40)]


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(SPECIALS + CHARS + ["##" + c for c in CHARS] + ["hello", "##lo"]) + "\n",
                    encoding="utf-8")
    return VocabInfo.from_file(path)


def random_sample(rng, vocab, length):
    """[CLS] A [SEP] B [SEP] of whole words (a start id + 0-3 continuations), sometimes starting with a
    cut word (a continuation right after [CLS] or [SEP]) or with B empty."""
    starts = np.arange(5, 5 + len(CHARS))
    conts = starts + len(CHARS)

    def segment(n):
        out = [int(rng.choice(conts))] if rng.random() < 0.2 else []
        while len(out) < n:
            out.append(int(rng.choice(starts)))
            out += [int(x) for x in rng.choice(conts, size=int(rng.integers(0, 4)))]
        return out[:n]

    a = segment(max(1, length // 2))
    b = segment(length - len(a)) if rng.random() < 0.8 else []
    return np.array([vocab.cls_id] + a + [vocab.sep_id] + b + ([vocab.sep_id] if b else []), dtype=np.int64)


@pytest.mark.parametrize("max_ngrams,max_predictions,prob", [(3, 20, 0.15), (1, 5, 0.15), (4, 80, 0.3), (2, 1, 0.5)])
def test_the_fast_masking_equals_the_reference(vocab, max_ngrams, max_predictions, prob):
    data = np.random.default_rng(max_ngrams * 100 + max_predictions)
    for case in range(400):
        tokens = random_sample(data, vocab, int(data.integers(0, 300)))
        fast, slow = np.random.default_rng([case, 7]), np.random.default_rng([case, 7])
        got = mask_whole_word_ngrams(tokens, vocab, fast, masked_lm_prob=prob, max_predictions=max_predictions,
                                     max_ngrams=max_ngrams)
        want = reference_mask_whole_word_ngrams(tokens, vocab, slow, masked_lm_prob=prob,
                                                max_predictions=max_predictions, max_ngrams=max_ngrams)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and np.array_equal(g, w), (case, tokens.tolist())
        assert fast.random() == slow.random(), case  # the same draws, in the same order


def test_edge_cases_equal_the_reference(vocab):
    cases = [[vocab.cls_id, vocab.sep_id], [vocab.cls_id, 5 + len(CHARS), vocab.sep_id],
             [vocab.cls_id] + [5 + len(CHARS)] * 30 + [vocab.sep_id], [vocab.cls_id, 5, vocab.sep_id, 6, vocab.sep_id],
             [5]]  # (an empty sequence never reaches masking: a sample holds at least [CLS] A [SEP])
    for k, tokens in enumerate(cases):
        tokens = np.array(tokens, dtype=np.int64)
        got = mask_whole_word_ngrams(tokens, vocab, np.random.default_rng(k))
        want = reference_mask_whole_word_ngrams(tokens, vocab, np.random.default_rng(k))
        for g, w in zip(got, want):
            assert np.array_equal(g, w), k


# -- the reference: the first version of mask_whole_word_ngrams, unchanged ------------------------------------
def reference_mask_whole_word_ngrams(
    tokens: np.ndarray,
    vocab: VocabInfo,
    rng: np.random.Generator,
    *,
    masked_lm_prob: float = 0.15,
    max_predictions: int = 20,
    max_ngrams: int = 3,
):
    """Mask whole-word n-grams of `tokens` ([CLS]/[SEP] included, raw ids with `##` markers).

    Returns (input_ids, masked_positions, masked_labels), all int64; `input_ids` has the markers
    mapped back to plain ids. The budget is min(max_predictions, max(1, round(len * prob)))
    tokens; n-grams of 1..max_ngrams whole words are drawn with p(n) proportional to 1/n (as
    in ERNIE/SpanBERT-style n-gram masking), shrunk to fit the remaining budget, and skipped
    when they overlap. Each selected token becomes [MASK] (80%), stays (10%) or becomes a
    random token (10%).
    """
    tokens = np.asarray(tokens, dtype=np.int64)
    input_ids = vocab.base_id[tokens]
    n_tokens = len(tokens)
    candidate = (tokens != vocab.cls_id) & (tokens != vocab.sep_id) & (tokens != vocab.pad_id)
    word_start = candidate & ~vocab.is_continuation[tokens]
    # a continuation right after [CLS]/[SEP] (a truncated word) starts a word of its own
    word_start[1:] |= candidate[1:] & ~candidate[:-1]
    word_start[0] = candidate[0]
    starts = np.flatnonzero(word_start)
    budget = min(max_predictions, max(1, int(round(n_tokens * masked_lm_prob))))
    if len(starts) == 0 or budget <= 0:
        empty = np.zeros(0, dtype=np.int64)
        return input_ids, empty, empty
    # word w spans [starts[w], ends[w]); a word ends at the next start or at the next non-candidate
    next_break = np.append(np.flatnonzero(~candidate), n_tokens)
    ends = np.minimum(np.append(starts[1:], n_tokens), next_break[np.searchsorted(next_break, starts)])

    ngram_weights = 1.0 / np.arange(1, max_ngrams + 1)
    ngram_p = ngram_weights / ngram_weights.sum()
    order = rng.permutation(len(starts))
    ns = rng.choice(max_ngrams, size=len(starts), p=ngram_p) + 1
    covered = np.zeros(n_tokens, dtype=bool)
    chosen = []
    remaining = budget
    n_words = len(starts)
    for w, n in zip(order.tolist(), ns.tolist()):
        if remaining <= 0:
            break
        n = min(n, n_words - w)
        while n > 0:
            lo, hi = starts[w], ends[w + n - 1]
            # an n-gram must not cross [SEP]: all its words must be contiguous
            if hi - lo <= remaining and not (n > 1 and np.any(starts[w + 1:w + n] != ends[w:w + n - 1])):
                break
            n -= 1
        if n == 0 or covered[lo:hi].any():
            continue
        covered[lo:hi] = True
        chosen.append((lo, hi))
        remaining -= hi - lo
    if not chosen:
        empty = np.zeros(0, dtype=np.int64)
        return input_ids, empty, empty
    positions = np.flatnonzero(covered)
    labels = input_ids[positions].copy()
    roll = rng.random(len(positions))
    replace = roll < 0.8
    randomise = roll >= 0.9
    input_ids[positions[replace]] = vocab.mask_id
    if randomise.any():
        input_ids[positions[randomise]] = rng.choice(vocab.random_ids, size=int(randomise.sum()))
    return input_ids, positions.astype(np.int64), labels
