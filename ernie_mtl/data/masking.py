"""Dynamic whole-word n-gram masking for ERNIE pretraining samples.

Word boundaries come from the token ids themselves (PaddleNLP's convention): the
preprocessor writes a Chinese character that continues a word as the id of `##<char>`, and
WordPiece continuations are `##` pieces anyway. At sample time a `##<char>` id is mapped back
to `<char>` for both the model input and the label, so the model never sees the markers.
"""
from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SPECIAL_TOKENS = ("[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]")


@dataclass(frozen=True)
class VocabInfo:
    """What masking needs to know about a vocabulary (arrays are indexed by token id)."""

    pad_id: int
    cls_id: int
    sep_id: int
    mask_id: int
    unk_id: int
    size: int
    is_continuation: np.ndarray  # bool[V]: the token continues the previous word ("##..." pieces)
    base_id: np.ndarray  # int64[V]: id fed to the model ("##<cjk>" -> "<cjk>" when present, else itself)
    random_ids: np.ndarray  # int64[]: ids drawn for the 10% random replacement (no specials, no markers)
    sha1: str = ""  # of the vocab file, matched against the corpus sidecar written at tokenization

    @classmethod
    def from_file(cls, vocab_file: str | Path) -> "VocabInfo":
        """Read a vocab.txt (one token per line, id = line number)."""
        from data_tools.tokenization import continuation_table, load_vocab

        vocab = load_vocab(vocab_file)
        missing = [token for token in SPECIAL_TOKENS if token not in vocab]
        if missing:
            raise ValueError(f"vocab file {vocab_file} lacks the special tokens {missing}; "
                             "build it with `python -m data_tools.build_vocab`")
        is_cont, base = continuation_table(vocab)
        special = np.zeros(len(is_cont), dtype=bool)
        special[[vocab[token] for token in SPECIAL_TOKENS]] = True
        # "[unused]"-style and other bracketed tokens are never good random replacements either
        for tok, i in vocab.items():
            if tok.startswith("[") and tok.endswith("]"):
                special[i] = True
        random_ids = np.flatnonzero(~special & ~(is_cont & (base != np.arange(len(base)))))
        sha1 = hashlib.sha1(Path(vocab_file).read_bytes()).hexdigest()
        return cls(pad_id=vocab["[PAD]"], cls_id=vocab["[CLS]"], sep_id=vocab["[SEP]"],
                   mask_id=vocab["[MASK]"], unk_id=vocab["[UNK]"], size=len(is_cont),
                   is_continuation=np.asarray(is_cont, dtype=bool),
                   base_id=np.asarray(base, dtype=np.int64), random_ids=random_ids.astype(np.int64), sha1=sha1)


def mask_whole_word_ngrams(
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

    This is the profiled hot spot of sample building (benchmarks/bench_host.py --profile). It
    draws exactly the random numbers of the first, plainer version and returns the same arrays
    (tests/unit/test_masking.py keeps that version as the reference and compares them on random
    inputs), so samples, losses and resumed runs are unchanged.
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
    next_break = np.concatenate([np.flatnonzero(~candidate), [n_tokens]])
    ends = np.minimum(np.concatenate([starts[1:], [n_tokens]]), next_break[np.searchsorted(next_break, starts)])

    n_words = len(starts)
    order = rng.permutation(n_words)
    # n-gram sizes with p(n) proportional to 1/n: the draws of rng.choice(max_ngrams, p=...), done
    # directly (Generator.choice with p searches uniforms in the normalised cdf; its checks cost more)
    ns = np.searchsorted(_ngram_cdf(max_ngrams), rng.random(n_words), side="right") + 1
    # the selection loop on Python ints: numpy calls on a few elements cost more than the work
    start, end = starts.tolist(), ends.tolist()
    covered = bytearray(n_tokens)
    remaining = budget
    chosen = False
    for w, n in zip(order.tolist(), ns.tolist()):
        if remaining <= 0:
            break
        n = min(n, n_words - w)
        while n > 0:
            lo, hi = start[w], end[w + n - 1]
            # an n-gram must not cross [SEP]: all its words must be contiguous
            if hi - lo <= remaining and not (n > 1 and any(start[k + 1] != end[k] for k in range(w, w + n - 1))):
                break
            n -= 1
        if n == 0 or any(covered[lo:hi]):
            continue
        covered[lo:hi] = b"\x01" * (hi - lo)
        chosen = True
        remaining -= hi - lo
    if not chosen:
        empty = np.zeros(0, dtype=np.int64)
        return input_ids, empty, empty
    positions = np.flatnonzero(np.frombuffer(covered, dtype=np.uint8))
    labels = input_ids[positions].copy()
    roll = rng.random(len(positions))
    replace = roll < 0.8
    randomise = roll >= 0.9
    input_ids[positions[replace]] = vocab.mask_id
    if randomise.any():  # the draws of rng.choice(vocab.random_ids, size=k)
        picks = rng.integers(0, len(vocab.random_ids), size=int(randomise.sum()), dtype=np.int64)
        input_ids[positions[randomise]] = vocab.random_ids[picks]
    return input_ids, positions.astype(np.int64), labels


@functools.lru_cache(maxsize=8)
def _ngram_cdf(max_ngrams: int) -> np.ndarray:
    """The cumulative distribution Generator.choice builds from p(n) = (1/n) / sum_k 1/k."""
    weights = 1.0 / np.arange(1, max_ngrams + 1)
    cdf = (weights / weights.sum()).cumsum()
    cdf /= cdf[-1]
    return cdf
