"""ERNIE pretraining samples from a `.bin/.idx` corpus: `[CLS] A [SEP] B [SEP]` with a
next-sentence or sentence-order label and dynamic whole-word n-gram masking.

Sample i of a split is a pure function of (seed, split, i): the sentence spans come from the
cached index (itself a function of the data and the seed) and all randomness of sample i is
drawn from a generator seeded with (seed, split id, i). That is what makes exact resume and
any number of DataLoader workers give the same batches.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from data_tools import index as index_helper
from data_tools.index_cache import by_path, load_or_build, reopened
from data_tools.indexed_dataset import MMapIndexedDataset, file_identity
from ernie_mtl.data.masking import VocabInfo, mask_whole_word_ngrams

SPLIT_NAMES = ("train", "valid", "test")
# A split gets its own random stream so that train sample i and valid sample i differ.
_SPLIT_IDS = {name: k for k, name in enumerate(SPLIT_NAMES)}
# Effectively unbounded: the helper stops after the epoch that reaches the requested samples.
_MAX_EPOCHS = 2**31 - 1


def parse_split(split: str) -> List[float]:
    """'949,50,1' (or '949/50/1') -> normalised [train, valid, test] weights."""
    parts = [p for p in split.replace("/", ",").split(",") if p.strip() != ""]
    try:
        weights = [float(p) for p in parts]
    except ValueError:
        weights = []
    if not weights or len(weights) > 3 or any(w < 0 or not math.isfinite(w) for w in weights) or sum(weights) <= 0:
        raise ValueError(
            f"--split {split!r} is not a valid train,valid,test ratio: give up to three non-negative "
            "numbers with a positive sum, e.g. --split 949,50,1")
    weights += [0.0] * (3 - len(weights))
    total = sum(weights)
    return [w / total for w in weights]


def split_document_ranges(split: str, num_docs: int) -> Dict[str, Tuple[int, int]]:
    """Contiguous document ranges [start, end) per split (PaddleNLP/Megatron rule: rounded bookends)."""
    weights = parse_split(split)
    bounds = [0]
    acc = 0.0
    for w in weights:
        acc += w
        bounds.append(int(round(acc * num_docs)))
    bounds[-1] = num_docs
    return {name: (bounds[k], bounds[k + 1]) for k, name in enumerate(SPLIT_NAMES)}


@dataclass(frozen=True)
class PretrainSampleConfig:
    """How samples are cut and masked (the parts of the run config this dataset needs)."""

    max_seq_len: int = 512
    short_seq_prob: float = 0.1
    binary_head: bool = True
    pair_task: str = "sop"  # "sop": B follows A unless swapped; "nsp": B is a random segment half the time
    masked_lm_prob: float = 0.15
    max_predictions_per_seq: int = 20
    max_ngrams: int = 3
    seed: int = 1234

    def problems(self) -> List[str]:
        """Every invalid value, each naming its flag, the value and the fix."""
        problems = []
        if self.max_seq_len < 5:
            problems.append(f"--max_seq_len {self.max_seq_len} must be >= 5 (room for [CLS] A [SEP] B [SEP]), "
                            "e.g. 512")
        if not 0.0 <= self.short_seq_prob <= 1.0:
            problems.append(f"--short_seq_prob {self.short_seq_prob} must be within [0, 1], e.g. 0.1")
        if not 0.0 < self.masked_lm_prob < 1.0:
            problems.append(f"--masked_lm_prob {self.masked_lm_prob} must be within (0, 1), e.g. 0.15")
        if self.max_predictions_per_seq < 1:
            problems.append(f"--max_predictions_per_seq {self.max_predictions_per_seq} must be >= 1, e.g. 20")
        if self.max_ngrams < 1:
            problems.append(f"--max_ngrams {self.max_ngrams} must be >= 1 (3 = up to trigrams)")
        if self.pair_task not in ("sop", "nsp"):
            problems.append(f"pair_task {self.pair_task!r} must be 'sop' or 'nsp'")
        return problems

    def validate(self) -> None:
        problems = self.problems()
        if problems:
            raise ValueError("; ".join(problems))


class ErniePretrainDataset:
    """Samples of one split. `dataset[i]` -> (input_ids, segment_ids, masked_positions, masked_labels, pair_label)."""

    def __init__(self, corpus: MMapIndexedDataset, mapping: np.ndarray, split_name: str,
                 doc_range: Tuple[int, int], cfg: PretrainSampleConfig, vocab: VocabInfo,
                 stream: Optional[int] = None):
        self.corpus = corpus
        self.mapping = mapping
        self.split_name = split_name
        self.doc_range = doc_range
        self.cfg = cfg
        self.vocab = vocab
        self._split_id = _SPLIT_IDS[split_name]
        # The sample generator's key: (seed, split, i), plus the corpus's position in a mixture
        # (ernie_mtl.data.mixture), so that sample i of two corpora draw independent masks and labels.
        self.stream = None if stream is None else int(stream)
        self._doc_bounds = np.asarray(corpus.doc_idx[doc_range[0]:doc_range[1] + 1])

    def __len__(self) -> int:
        return len(self.mapping)

    def __getstate__(self):
        """Pickled for a data-loading worker: the corpus and the sample index travel as file names
        and are mapped again there (no copy of either)."""
        state = dict(self.__dict__)
        state["mapping"] = by_path(self.mapping)
        del state["_doc_bounds"]  # a view of the corpus's .idx map
        return state

    def __setstate__(self, state):
        state["mapping"] = reopened(state["mapping"])
        self.__dict__.update(state)
        self._doc_bounds = np.asarray(self.corpus.doc_idx[self.doc_range[0]:self.doc_range[1] + 1])

    def __getitem__(self, i: int):
        if not 0 <= i < len(self.mapping):
            raise IndexError(f"sample {i} out of range for the {self.split_name} split ({len(self)} samples)")
        cfg, vocab = self.cfg, self.vocab
        key = [cfg.seed, self._split_id, int(i)] + ([] if self.stream is None else [self.stream])
        rng = np.random.default_rng(key)
        start, end, target = (int(v) for v in self.mapping[i])
        sentences = [self.corpus[s] for s in range(start, end)]
        if cfg.binary_head:
            a, b, label = self._pair(sentences, start, rng)
        else:
            a, b, label = np.concatenate(sentences), np.zeros(0, dtype=np.int64), 0
        a, b = _truncate_pair(a, b, target, rng)
        tokens = np.concatenate([[vocab.cls_id], a, [vocab.sep_id], b,
                                 [vocab.sep_id] if len(b) else []]).astype(np.int64)
        segment_ids = np.zeros(len(tokens), dtype=np.int64)
        segment_ids[len(a) + 2:] = 1
        input_ids, positions, labels = mask_whole_word_ngrams(
            tokens, vocab, rng, masked_lm_prob=cfg.masked_lm_prob,
            max_predictions=cfg.max_predictions_per_seq, max_ngrams=cfg.max_ngrams)
        return input_ids, segment_ids, positions, labels, label

    def _pair(self, sentences: List[np.ndarray], start: int, rng: np.random.Generator):
        n = len(sentences)
        a_end = int(rng.integers(1, n)) if n >= 3 else 1
        a = np.concatenate(sentences[:a_end])
        b = np.concatenate(sentences[a_end:])
        if rng.random() >= 0.5:
            return a, b, 0
        if self.cfg.pair_task == "sop":  # sentence order: swapped halves are the positive label
            return b, a, 1
        return a, self._random_segment(len(b), start, rng), 1

    def _document_of(self, sentence: int) -> int:
        return int(np.searchsorted(self._doc_bounds, sentence, side="right")) - 1

    def _random_segment(self, length: int, own_start: int, rng: np.random.Generator) -> np.ndarray:
        """NSP negative: `length` tokens from a random sample of another document (10 tries)."""
        own_doc = self._document_of(own_start)
        for _ in range(10):
            j = int(rng.integers(len(self.mapping)))
            s, e, _ = (int(v) for v in self.mapping[j])
            tokens = np.concatenate([self.corpus[k] for k in range(s, e)])
            if self._document_of(s) != own_doc and len(tokens):
                break
        offset = int(rng.integers(0, max(1, len(tokens) - length + 1)))
        return tokens[offset:offset + max(1, length)]


def _truncate_pair(segment_a: np.ndarray, segment_b: np.ndarray, target: int, rng: np.random.Generator):
    """Drop tokens from the longer segment, from its front or back with equal odds, until they fit."""
    excess = len(segment_a) + len(segment_b) - target
    if excess <= 0:
        return segment_a, segment_b
    a_lo, a_hi, b_lo, b_hi = 0, len(segment_a), 0, len(segment_b)
    front = (rng.random(excess) < 0.5).tolist()
    for k in range(excess):
        if (a_hi - a_lo) > (b_hi - b_lo):
            if front[k]:
                a_lo += 1
            else:
                a_hi -= 1
        elif front[k]:
            b_lo += 1
        else:
            b_hi -= 1
    return segment_a[a_lo:a_hi], segment_b[b_lo:b_hi]


def index_description(corpus_prefix: str, split: str, split_name: str, doc_range: Tuple[int, int],
                      num_samples: int, cfg: PretrainSampleConfig) -> dict:
    """Everything that shapes a split's sample mapping (the index-cache key)."""
    return {
        "kind": "ernie_sentence_pair_mapping",
        "data": file_identity(corpus_prefix),
        "split": split,
        "split_name": split_name,
        "doc_range": list(doc_range),
        "num_samples": int(num_samples),
        "max_seq_len": cfg.max_seq_len,
        "short_seq_prob": cfg.short_seq_prob,
        "seed": cfg.seed,
        "binary_head": cfg.binary_head,
        "helper_version": index_helper.HELPER_VERSION,
    }


def build_pretrain_datasets(
    corpus_prefix: str,
    *,
    split: str,
    num_samples: Sequence[int],
    cfg: PretrainSampleConfig,
    vocab: VocabInfo,
    cache_dir: Optional[str] = None,
    is_builder: bool = True,
    barrier: Optional[Callable[[], None]] = None,
    log: Callable[[str], None] = print,
    sample_stream: Optional[int] = None,
) -> Dict[str, Optional[ErniePretrainDataset]]:
    """Datasets for train/valid/test. `num_samples[k]` = samples the run needs from split k (0 = skip it).

    Index arrays are cached under `cache_dir` (default: `<corpus dir>/index-cache`); see
    data_tools/index_cache.py for the build-on-one-rank protocol. Every rank must call this.
    `sample_stream`: the corpus's position in a mixture (ernie_mtl.data.mixture), added to every
    sample's random key; None (one corpus) keeps the key (seed, split, i). The index arrays do
    not depend on it.
    """
    cfg.validate()
    corpus = MMapIndexedDataset(corpus_prefix)
    _check_vocab_matches(corpus_prefix, vocab)
    ranges = split_document_ranges(split, corpus.num_docs)
    cache_dir = cache_dir or str(Path(corpus_prefix).resolve().parent / "index-cache")
    datasets: Dict[str, Optional[ErniePretrainDataset]] = {}
    for k, name in enumerate(SPLIT_NAMES):
        wanted = int(num_samples[k]) if k < len(num_samples) else 0
        doc_range = ranges[name]
        if wanted <= 0:
            datasets[name] = None
            continue
        if doc_range[1] <= doc_range[0]:
            raise ValueError(
                f"the {name} split is empty: --split {split} over the {corpus.num_docs} documents of "
                f"{corpus_prefix} gives it 0 documents, but the run needs {wanted} {name} samples. "
                f"Give {name} a larger ratio or use more data.")
        description = index_description(corpus_prefix, split, name, doc_range, wanted, cfg)

        def build(doc_range=doc_range, wanted=wanted):
            mapping = index_helper.build_sentence_pair_mapping(
                np.asarray(corpus.doc_idx[doc_range[0]:doc_range[1] + 1], dtype=np.int64),
                np.asarray(corpus.sizes, dtype=np.int32),
                num_epochs=_MAX_EPOCHS, max_num_samples=wanted, max_seq_len=cfg.max_seq_len - 3,
                short_seq_prob=cfg.short_seq_prob, seed=cfg.seed,
                min_num_sent=2 if cfg.binary_head else 1)
            return {"mapping": mapping}

        arrays = load_or_build(cache_dir, f"{Path(corpus_prefix).name}-{name}", description, build,
                               is_builder=is_builder, barrier=barrier, log=log)
        mapping = arrays["mapping"]
        if len(mapping) == 0:
            raise ValueError(f"the {name} split of {corpus_prefix} (documents {doc_range[0]}..{doc_range[1] - 1}) "
                             "yields no samples: its documents are empty")
        if len(mapping) > 20 * wanted and wanted >= 1000:
            log(f"note: {name} split built {len(mapping)} samples for {wanted} requested (whole epochs)")
        datasets[name] = ErniePretrainDataset(corpus, mapping, name, doc_range, cfg, vocab, stream=sample_stream)
    return datasets


def _check_vocab_matches(corpus_prefix: str, vocab: Optional[VocabInfo]) -> None:
    """Token ids only mean something with the vocab they were made with: compare with the sidecar."""
    sidecar = Path(f"{corpus_prefix}.json")
    if vocab is None or not vocab.sha1 or not sidecar.is_file():
        return
    meta = json.loads(sidecar.read_text(encoding="utf-8"))
    if meta.get("vocab_sha1") and meta["vocab_sha1"] != vocab.sha1:
        raise ValueError(
            f"{corpus_prefix}.bin was tokenized with {meta.get('vocab_file')} (sha1 {meta['vocab_sha1'][:12]}), "
            f"but this run's vocab has sha1 {vocab.sha1[:12]}: pass the vocab the corpus was made with "
            "(--tokenizer_name_or_path) or re-run create_pretraining_data with this one")


def collate_pretrain(samples, *, pad_id: int, pad_to: Optional[int] = None,
                     multiple_of: int = 8) -> Dict[str, np.ndarray]:
    """Stack samples into the feed layout of the static pretraining program.

    Sequences are padded to the longest in the batch rounded up to `multiple_of` (or to
    `pad_to`); masked positions are flattened as b * L + pos and their count padded to a
    multiple of 8 with label -1 (ignored by the loss).
    """
    lengths = [len(s[0]) for s in samples]
    length = pad_to or int(math.ceil(max(lengths) / multiple_of) * multiple_of)
    batch = len(samples)
    input_ids = np.full((batch, length), pad_id, dtype=np.int64)
    segment_ids = np.zeros((batch, length), dtype=np.int64)
    mask = np.full((batch, 1, 1, length), -1e4, dtype=np.float32)
    positions, labels = [], []
    for b, (ids, seg, pos, lab, _) in enumerate(samples):
        n = len(ids)
        input_ids[b, :n] = ids
        segment_ids[b, :n] = seg
        mask[b, 0, 0, :n] = 0.0
        positions.append(pos + b * length)
        labels.append(lab)
    positions = np.concatenate(positions) if positions else np.zeros(0, dtype=np.int64)
    labels = np.concatenate(labels) if labels else np.zeros(0, dtype=np.int64)
    padded = max(8, int(math.ceil(len(positions) / 8) * 8))
    masked_positions = np.zeros(padded, dtype=np.int64)
    masked_labels = np.full((padded, 1), -1, dtype=np.int64)
    masked_positions[:len(positions)] = positions
    masked_labels[:len(labels), 0] = labels
    return {
        "input_ids": input_ids,
        "segment_ids": segment_ids,
        "input_mask": mask,
        "masked_lm_positions": masked_positions,
        "masked_lm_labels": masked_labels,
        "next_sentence_labels": np.array([[s[4]] for s in samples], dtype=np.int64),
    }


def required_samples(*, global_batch_size: int, max_steps: int, eval_freq: int, eval_iters: int,
                     test_iters: Optional[int] = None) -> Tuple[int, int, int]:
    """Samples a run consumes per split: every step takes a global batch; every `eval_freq`
    steps (and at the end) an evaluation takes `eval_iters` global batches of the valid split
    (each evaluation continues where the previous stopped); the final test takes `test_iters`
    (default 10 x eval_iters) global batches. The trainer and prebuild_index share this."""
    test_iters = 10 * eval_iters if test_iters is None else test_iters
    train = global_batch_size * max_steps
    valid = global_batch_size * eval_iters * (max_steps // max(eval_freq, 1) + 1)
    test = global_batch_size * test_iters
    return train, valid, test
