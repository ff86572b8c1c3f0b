"""ERNIE pretraining samples: splits, determinism, pair construction, whole-word masking, caching."""
import os

import numpy as np
import pytest

from data_tools.indexed_dataset import IndexedDatasetBuilder
from ernie_mtl.data.masking import VocabInfo, mask_whole_word_ngrams
from ernie_mtl.data.pretrain import (PretrainSampleConfig, build_pretrain_datasets, collate_pretrain,
                                     parse_split, required_samples, split_document_ranges)

SPECIALS = ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"]
CHARS = list("我爱北京天安门人民日报中国今")
WORDPIECES = ["hello", "##lo", "##ing", "play", "the", "a"]


def _write_vocab(path):
    tokens = SPECIALS + CHARS + WORDPIECES + ["##" + c for c in CHARS]
    path.write_text("\n".join(tokens) + "\n", encoding="utf-8")
    return {t: i for i, t in enumerate(tokens)}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """60 documents of 1-6 sentences made of whole 'words' (a start id + 0-2 continuation ids)."""
    root = tmp_path_factory.mktemp("corpus")
    vocab = _write_vocab(root / "vocab.txt")
    starts = [vocab[c] for c in CHARS] + [vocab[w] for w in ("hello", "play", "the", "a")]
    conts = [vocab["##" + c] for c in CHARS] + [vocab["##lo"], vocab["##ing"]]
    rng = np.random.default_rng(0)
    docs = []
    with IndexedDatasetBuilder(str(root / "corpus"), np.uint16) as builder:
        for d in range(60):
            doc = []
            for _ in range(1 + d % 6):
                sent = []
                for _ in range(int(rng.integers(1, 6))):
                    sent.append(int(rng.choice(starts)))
                    sent += [int(x) for x in rng.choice(conts, size=int(rng.integers(0, 3)))]
                builder.add_sentence(np.array(sent))
                doc.append(sent)
            builder.end_document()
            docs.append(doc)
        builder.finalize()
    return root, docs


def _vocab(root):
    return VocabInfo.from_file(root / "vocab.txt")


def _datasets(root, tmp_path, **overrides):
    cfg = PretrainSampleConfig(**{"max_seq_len": 128, "short_seq_prob": 0.0, "seed": 7, **overrides})
    return build_pretrain_datasets(str(root / "corpus"), split="8,1,1", num_samples=(200, 20, 10), cfg=cfg,
                                   vocab=_vocab(root), cache_dir=str(tmp_path / "cache"), log=lambda m: None)


def test_split_ranges_and_errors():
    assert split_document_ranges("949,50,1", 1000) == {"train": (0, 949), "valid": (949, 999), "test": (999, 1000)}
    assert split_document_ranges("949/50/1", 10) == {"train": (0, 9), "valid": (9, 10), "test": (10, 10)}
    assert parse_split("1") == [1.0, 0.0, 0.0]
    for bad in ("", "a,b", "1,-1,0", "0,0,0", "1,1,1,1"):
        with pytest.raises(ValueError, match="--split .* is not a valid train,valid,test ratio"):
            parse_split(bad)


def test_required_samples_arithmetic():
    assert required_samples(global_batch_size=8, max_steps=100, eval_freq=10, eval_iters=2) == (800, 8 * 2 * 11, 8 * 20)


def test_samples_are_a_pure_function_of_seed_and_index(corpus, tmp_path):
    root, _ = corpus
    first = _datasets(root, tmp_path)["train"]
    again = _datasets(root, tmp_path)["train"]  # from the cache, new objects
    other_seed = _datasets(root, tmp_path / "s", seed=8)["train"]
    assert len(first) >= 200
    for i in (0, 5, 199):
        for a, b in zip(first[i], again[i]):
            np.testing.assert_array_equal(a, b)
    assert any(not np.array_equal(first[i][0], other_seed[i][0]) for i in range(20))


def test_pair_samples_rebuild_the_document_text(corpus, tmp_path):
    root, docs = corpus
    vocab = _vocab(root)
    ds = _datasets(root, tmp_path)["train"]
    sentence_tokens = [np.array(s) for doc in docs for s in doc]
    labels = []
    for i in range(len(ds)):
        ids, seg, pos, lab, pair_label = ds[i]
        start, end, _ = ds.mapping[i]
        original = ids.copy()
        original[pos] = lab
        assert original[0] == vocab.cls_id and original[-1] == vocab.sep_id
        seps = np.flatnonzero(original == vocab.sep_id)
        assert len(seps) == 2 and len(ids) <= 128
        a, b = original[1:seps[0]], original[seps[0] + 1:seps[1]]
        assert (seg[:seps[0] + 1] == 0).all() and (seg[seps[0] + 1:] == 1).all()
        text = vocab.base_id[np.concatenate(sentence_tokens[start:end])]
        # no truncation at this length: the halves are the document's sentences, swapped when label 1
        joined = np.concatenate([b, a]) if pair_label == 1 else np.concatenate([a, b])
        np.testing.assert_array_equal(joined, text)
        labels.append(pair_label)
    assert 0.3 < np.mean(labels) < 0.7


def test_masking_masks_whole_words_at_the_right_rates(corpus, tmp_path):
    root, _ = corpus
    vocab = _vocab(root)
    ds = _datasets(root, tmp_path, binary_head=False)["train"]
    masked = replaced = kept = total = 0
    for i in range(len(ds)):
        ids, _, pos, lab, _ = ds[i]
        start, end, _ = ds.mapping[i]
        raw = np.concatenate([[vocab.cls_id], *[ds.corpus[s] for s in range(start, end)], [vocab.sep_id]])
        assert not vocab.is_continuation[ids][ids != vocab.base_id[ids]].any()  # markers never reach the model
        assert np.all(np.diff(pos) > 0) and np.all(lab == vocab.base_id[raw[pos]])
        is_masked = np.zeros(len(raw), dtype=bool)
        is_masked[pos] = True
        # whole words: a masked continuation token's predecessor is masked too, and vice versa
        cont = vocab.is_continuation[raw]
        assert np.all(is_masked[1:][cont[1:]] == is_masked[:-1][cont[1:]])
        assert not is_masked[0] and not is_masked[-1]
        masked += len(pos)
        total += len(raw)
        replaced += int((ids[pos] == vocab.mask_id).sum())
        kept += int((ids[pos] == lab).sum())
    assert 0.10 < masked / total < 0.20
    assert 0.72 < replaced / masked < 0.88
    assert 0.05 < kept / masked < 0.18  # 10% kept plus random draws that hit the same id


def test_masking_budget_and_ngram_limits():
    vocab = VocabInfo(pad_id=0, cls_id=1, sep_id=2, mask_id=3, unk_id=4, size=10,
                      is_continuation=np.zeros(10, dtype=bool), base_id=np.arange(10),
                      random_ids=np.arange(5, 10))
    tokens = np.array([1] + [5, 6, 7, 8, 9] * 20 + [2])
    for seed in range(20):
        ids, pos, lab = mask_whole_word_ngrams(tokens, vocab, np.random.default_rng(seed),
                                               masked_lm_prob=0.15, max_predictions=10, max_ngrams=3)
        assert len(pos) == 10  # min(max_predictions, round(102 * 0.15) = 15)
        np.testing.assert_array_equal(lab, tokens[pos])


def test_nsp_negatives_come_from_other_documents(corpus, tmp_path):
    root, _ = corpus
    ds = _datasets(root, tmp_path, pair_task="nsp")["train"]
    negatives = 0
    for i in range(len(ds)):
        _, _, _, _, label = ds[i]
        negatives += label
    assert 0.3 < negatives / len(ds) < 0.7


def test_empty_split_and_single_sentence_documents_are_clear_errors(corpus, tmp_path):
    root, _ = corpus
    cfg = PretrainSampleConfig(max_seq_len=64, seed=1)
    with pytest.raises(ValueError, match="the test split is empty: --split 100,0,0 .* gives it 0 documents"):
        build_pretrain_datasets(str(root / "corpus"), split="100,0,0", num_samples=(10, 0, 5), cfg=cfg,
                                vocab=_vocab(root), cache_dir=str(tmp_path / "c"), log=lambda m: None)
    # only single-sentence documents in the pair-head case
    with IndexedDatasetBuilder(str(tmp_path / "single"), np.uint16) as b:
        for _ in range(5):
            b.add_sentence(np.array([5, 6, 7]))
            b.end_document()
        b.finalize()
    with pytest.raises(ValueError, match="binary_head"):
        build_pretrain_datasets(str(tmp_path / "single"), split="1", num_samples=(10, 0, 0), cfg=cfg,
                                vocab=_vocab(root), cache_dir=str(tmp_path / "c"), log=lambda m: None)


def test_cache_is_reused_and_invalidated_by_a_changed_corpus(corpus, tmp_path):
    root, _ = corpus
    logs = []
    cfg = PretrainSampleConfig(max_seq_len=64, seed=3)
    kwargs = dict(split="8,1,1", num_samples=(50, 0, 0), cfg=cfg, vocab=_vocab(root),
                  cache_dir=str(tmp_path / "cache"), log=logs.append)
    prefix = tmp_path / "copy"
    for ext in (".bin", ".idx"):
        (tmp_path / f"copy{ext}").write_bytes((root / f"corpus{ext}").read_bytes())
    build_pretrain_datasets(str(prefix), **kwargs)
    build_pretrain_datasets(str(prefix), **kwargs)
    assert sum("built index cache" in m for m in logs) == 1
    os.utime(tmp_path / "copy.bin", ns=(1, 1))  # same bytes, other mtime: the same data, the same cache
    build_pretrain_datasets(str(prefix), **kwargs)
    assert sum("built index cache" in m for m in logs) == 1
    with open(tmp_path / "copy.bin", "r+b") as f:  # other bytes: identity changed
        f.write(b"\x01\x00")
    build_pretrain_datasets(str(prefix), **kwargs)
    assert sum("built index cache" in m for m in logs) == 2
    assert len(list((tmp_path / "cache").iterdir())) >= 2


def test_collate_feed_layout(corpus, tmp_path):
    root, _ = corpus
    ds = _datasets(root, tmp_path)["train"]
    samples = [ds[i] for i in range(4)]
    batch = collate_pretrain(samples, pad_id=0)
    length = batch["input_ids"].shape[1]
    assert length % 8 == 0 and length >= max(len(s[0]) for s in samples)
    assert batch["input_mask"].shape == (4, 1, 1, length)
    n_masked = sum(len(s[2]) for s in samples)
    assert len(batch["masked_lm_positions"]) % 8 == 0
    assert (batch["masked_lm_labels"][:n_masked, 0] >= 0).all() and (batch["masked_lm_labels"][n_masked:] == -1).all()
    flat = batch["input_ids"].reshape(-1)
    expected = np.concatenate([s[0][s[2]] for s in samples])
    np.testing.assert_array_equal(flat[batch["masked_lm_positions"][:n_masked]], expected)
    assert batch["next_sentence_labels"].shape == (4, 1)
    for b, s in enumerate(samples):
        assert (batch["input_mask"][b, 0, 0, :len(s[0])] == 0).all()
        assert (batch["input_mask"][b, 0, 0, len(s[0]):] == -1e4).all()
