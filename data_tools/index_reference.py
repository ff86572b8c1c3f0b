"""NumPy reference of the index helper: the executable specification of data_tools/helpers.cpp.

The compiled helper (used through :mod:`data_tools.index`) must return exactly what these
functions return (same values, same dtype); tests/unit/test_index_helper.py checks that on random
and edge-case inputs. This module is written for clarity, not speed, and assumes validated
inputs (the wrapper validates); it is never used as a silent fallback.

Random numbers
--------------
A counter-based hash, so that every random value is a pure function of (seed, stream, counter)
and can be computed in any order, vectorised, in C++ and NumPy alike. All arithmetic is on
uint64 with wrap-around::

    GOLDEN = 0x9E3779B97F4A7C15
    mix64(z): z ^= z >> 30; z *= 0xBF58476D1CE4E5B9; z ^= z >> 27; z *= 0x94D049BB133111EB;
              z ^= z >> 31                                       (the splitmix64 finaliser)
    stream_key(seed, stream) = mix64(seed * GOLDEN + stream)
    draw(seed, stream, i)    = mix64(stream_key(seed, stream) + i * GOLDEN)
    uniform(seed, stream, i) = (draw(seed, stream, i) >> 11) * 2**-53   (exact double in [0, 1))
    shuffle_order(n, seed, stream) = stable argsort of [draw(seed, stream, i) for i < n]

Streams: 1 short-sample decision, 2 short target length, 3 pair-mapping shuffle,
4 document shuffle, 5 sample shuffle. ``seed`` is an int in [0, 2**63).

build_sentence_pair_mapping (BERT/ERNIE sentence-pair samples)
--------------------------------------------------------------
Inputs: ``doc_idx`` int64 [D+1], non-decreasing absolute sentence boundaries (document d is
sentences ``[doc_idx[d], doc_idx[d+1])``; a split passes a slice of the full index, so
``doc_idx[0]`` may be > 0); ``sizes`` int32 [S], tokens per sentence. ``max_seq_len`` is the
token budget of segments A+B without special tokens (>= 2); ``min_num_sent`` is 2 with the
next-sentence/sentence-order head, else 1.

For epoch e = 0, 1, ..., num_epochs-1, stopping *before* an epoch once at least
``max_num_samples`` rows exist (so whole epochs), each document with at least ``min_num_sent``
sentences is walked in order:

* a sample starting at sentence s0 draws its target length with key k = e * S + s0:
  ``short_seq_prob`` > uniform(seed, 1, k) gives target = 2 + draw(seed, 2, k) % (max_seq_len-1),
  otherwise target = max_seq_len;
* each sentence s adds sizes[s] to the running length (int64) and 1 to num_sent;
  remaining = sentences of the document after s;
* the row (s0, s+1, target) is emitted when (length >= target and remaining >= min_num_sent
  and num_sent >= min_num_sent) or (remaining == 0 and num_sent >= min_num_sent); the next
  sample starts at s+1. Unlike Megatron (``remaining > 1``) a cut is made only when the rest of
  the document can still form a valid sample. Sentences longer than the target are kept (the
  dataset truncates); every sentence of an eligible document lands in exactly one row.

Rows come out ordered by (epoch, start sentence); with ``shuffle`` they are permuted by
shuffle_order(N, seed, 3). Columns: start sentence, end sentence (exclusive), target length;
dtype int32 when S < 2**31 and max_seq_len < 2**31, else int64. A split without any sentence
gives a [0, 3] array; a split whose documents all have fewer than ``min_num_sent`` (but some)
sentences raises ValueError (PaddleNLP hung forever there: its GitHub issue #1921).

Vectorised form used here: per epoch, the eligible documents are sorted by sentence count
(descending) so that the documents still running at sentence position j form a prefix; one
step per position j advances all of them at once with per-document state arrays (start,
length, num_sent, target); emitted rows are finally ordered by start sentence.

build_blending_indices (mixing datasets by weight)
--------------------------------------------------
Weights (float64, finite, >= 0, sum > 0) are normalised by their left-to-right sum. Greedy and
RNG-free: sample i goes to d = argmax_d (w[d] * (i+1) - counts[d]) (the first index wins ties),
recording (d, counts[d]) and then counts[d] += 1. Outputs dataset_index int16[size] and
dataset_sample_index int64[size]. Every prefix of n samples satisfies
|counts_d(n) - w[d] * n| < 1 for every d (checked by the tests on random weights).

build_sample_idx (GPT-style contiguous windows over a document order)
---------------------------------------------------------------------
``sizes`` are tokens per document, ``doc_idx`` the document order over all epochs.
num_samples = (num_epochs * tokens_per_epoch - add_extra_token) // seq_len, and
num_epochs * tokens_per_epoch must not exceed the tokens in sizes[doc_idx]. With
cum = [0] + cumsum(sizes[doc_idx]) (int64), row k (k = 0..num_samples) is (pos, start - cum[pos])
for start = k * seq_len and pos the position with cum[pos] <= start < cum[pos+1] (empty
documents are skipped); start == cum[-1] maps to pos = len(doc_idx) - 1. Sample k spans tokens
[k * seq_len, (k+1) * seq_len + add_extra_token). dtype int32 when len(doc_idx) < 2**31 and
max(sizes) < 2**31, else int64.

build_doc_idx / build_shuffle_index
-----------------------------------
build_doc_idx(documents, num_epochs, seed) = tile(documents, num_epochs) permuted by
shuffle_order(len, seed, 4) (int64). build_shuffle_index(n, seed, stream=5) =
shuffle_order(n, seed, stream) (int64).
"""
from __future__ import annotations

from typing import Tuple

import numpy as np

GOLDEN = 0x9E3779B97F4A7C15
_MASK64 = (1 << 64) - 1
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S11 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(11)
STREAM_SHORT_DECISION, STREAM_SHORT_TARGET, STREAM_PAIR_SHUFFLE = 1, 2, 3
STREAM_DOC_SHUFFLE, STREAM_SAMPLE_SHUFFLE = 4, 5


def mix64(z: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser on a uint64 array (wrap-around multiplication)."""
    z = np.asarray(z, dtype=np.uint64)
    z = z ^ (z >> _S30)
    z = z * _M1
    z = z ^ (z >> _S27)
    z = z * _M2
    return z ^ (z >> _S31)


def stream_key(seed: int, stream: int) -> np.uint64:
    """mix64(seed * GOLDEN + stream), the per-stream key (Python ints, masked to 64 bits)."""
    return np.uint64(mix64(np.array([(seed * GOLDEN + stream) & _MASK64], dtype=np.uint64))[0])


def draw(seed: int, stream: int, counters: np.ndarray) -> np.ndarray:
    """draw(seed, stream, i) for an array of counters i (taken modulo 2**64)."""
    counters = np.asarray(counters).astype(np.uint64)
    return mix64(stream_key(seed, stream) + counters * np.uint64(GOLDEN))


def uniform(seed: int, stream: int, counters: np.ndarray) -> np.ndarray:
    """Exact doubles in [0, 1): the top 53 bits of draw()."""
    return (draw(seed, stream, counters) >> _S11).astype(np.float64) * 2.0 ** -53


def shuffle_order(n: int, seed: int, stream: int) -> np.ndarray:
    """Stable argsort of draw(seed, stream, 0..n-1) (int64)."""
    keys = draw(seed, stream, np.arange(n, dtype=np.uint64))
    return np.argsort(keys, kind="stable").astype(np.int64)


def _targets(keys: np.ndarray, max_seq_len: int, short_seq_prob: float, seed: int) -> np.ndarray:
    """Target lengths of samples whose draw counters are `keys` (int64)."""
    target = np.full(len(keys), max_seq_len, dtype=np.int64)
    short = uniform(seed, STREAM_SHORT_DECISION, keys) < short_seq_prob
    span = np.uint64(max_seq_len - 1)
    target[short] = 2 + (draw(seed, STREAM_SHORT_TARGET, keys[short]) % span).astype(np.int64)
    return target


def build_sentence_pair_mapping(doc_idx: np.ndarray, sizes: np.ndarray, *, num_epochs: int,
                                max_num_samples: int, max_seq_len: int, short_seq_prob: float,
                                seed: int, min_num_sent: int, shuffle: bool = True) -> np.ndarray:
    """Sentence-pair sample rows (start, end, target); see the module docstring."""
    doc_idx = np.asarray(doc_idx, dtype=np.int64)
    sizes = np.asarray(sizes, dtype=np.int64)
    num_sentences = len(sizes)
    out_dtype = np.int32 if num_sentences < 2 ** 31 and max_seq_len < 2 ** 31 else np.int64
    counts = np.diff(doc_idx)
    if not np.any(counts > 0):
        return np.zeros((0, 3), dtype=out_dtype)
    eligible = counts >= min_num_sent
    if not np.any(eligible):
        raise ValueError(
            f"no document has at least min_num_sent={min_num_sent} sentences (documents with "
            f"sentences: {int(np.count_nonzero(counts > 0))}, longest: {int(counts.max())} "
            "sentences), so no sentence-pair sample can be built. Split documents into more "
            "sentences, or train without the next-sentence/sentence-order head "
            "(binary_head=False, min_num_sent=1)")
    by_length = np.argsort(-counts[eligible], kind="stable")
    first = doc_idx[:-1][eligible][by_length]
    n_sent = counts[eligible][by_length]
    # running[j] = how many documents have more than j sentences (a prefix, thanks to the sort).
    running = np.searchsorted(-n_sent, -np.arange(n_sent[0]), side="left")

    epochs, total = [], 0
    for epoch in range(num_epochs):
        if total >= max_num_samples:
            break
        base = epoch * num_sentences
        start = first.copy()
        length = np.zeros(len(first), dtype=np.int64)
        num_sent = np.zeros(len(first), dtype=np.int64)
        target = _targets(base + start, max_seq_len, short_seq_prob, seed)
        emitted = []
        for j, a in enumerate(running):
            s = first[:a] + j
            length[:a] += sizes[s]
            num_sent[:a] += 1
            remaining = n_sent[:a] - 1 - j
            enough = num_sent[:a] >= min_num_sent
            cut = np.flatnonzero(((length[:a] >= target[:a]) & (remaining >= min_num_sent) & enough)
                                 | ((remaining == 0) & enough))
            emitted.append(np.stack([start[cut], s[cut] + 1, target[cut]], axis=1))
            start[cut] = s[cut] + 1
            length[cut] = 0
            num_sent[cut] = 0
            cont = cut[remaining[cut] > 0]
            target[cont] = _targets(base + start[cont], max_seq_len, short_seq_prob, seed)
        rows = np.concatenate(emitted)
        epochs.append(rows[np.argsort(rows[:, 0], kind="stable")])
        total += len(rows)
    mapping = np.concatenate(epochs or [np.zeros((0, 3), np.int64)]).astype(out_dtype)
    if shuffle:
        mapping = mapping[shuffle_order(len(mapping), seed, STREAM_PAIR_SHUFFLE)]
    return mapping


def build_blending_indices(weights: np.ndarray, size: int) -> Tuple[np.ndarray, np.ndarray]:
    """Greedy blending: (dataset_index int16[size], dataset_sample_index int64[size])."""
    raw = [float(w) for w in np.asarray(weights, dtype=np.float64)]
    total = 0.0
    for w in raw:  # left to right, as the C++ does
        total += w
    w = [x / total for x in raw]
    counts = [0] * len(w)
    dataset_index = np.empty(size, dtype=np.int16)
    sample_index = np.empty(size, dtype=np.int64)
    for i in range(size):
        due = float(i + 1)
        best, best_deficit = 0, w[0] * due - counts[0]
        for d in range(1, len(w)):
            deficit = w[d] * due - counts[d]
            if deficit > best_deficit:
                best, best_deficit = d, deficit
        dataset_index[i] = best
        sample_index[i] = counts[best]
        counts[best] += 1
    return dataset_index, sample_index


def build_sample_idx(sizes: np.ndarray, doc_idx: np.ndarray, *, seq_len: int, num_epochs: int,
                     tokens_per_epoch: int, add_extra_token: int = 1) -> np.ndarray:
    """GPT-style sample index [num_samples+1, 2] of (position in doc_idx, token offset)."""
    sizes = np.asarray(sizes)
    doc_idx = np.asarray(doc_idx)
    cum = np.concatenate([[0], np.cumsum(sizes[doc_idx], dtype=np.int64)])
    needed = num_epochs * tokens_per_epoch
    if needed > cum[-1]:
        raise ValueError(f"num_epochs * tokens_per_epoch = {needed} exceeds the tokens in "
                         f"sizes[doc_idx] ({int(cum[-1])}); pass tokens_per_epoch = the tokens of "
                         "one epoch's documents")
    num_samples = (needed - add_extra_token) // seq_len
    starts = np.arange(num_samples + 1, dtype=np.int64) * seq_len
    pos = np.minimum(np.searchsorted(cum, starts, side="right") - 1, len(doc_idx) - 1)
    small = len(doc_idx) < 2 ** 31 and (len(sizes) == 0 or int(sizes.max()) < 2 ** 31)
    return np.stack([pos, starts - cum[pos]], axis=1).astype(np.int32 if small else np.int64)


def build_doc_idx(documents: np.ndarray, num_epochs: int, seed: int) -> np.ndarray:
    """`documents` repeated num_epochs times, shuffled with stream 4 (int64)."""
    tiled = np.tile(np.asarray(documents, dtype=np.int64), num_epochs)
    return tiled[shuffle_order(len(tiled), seed, STREAM_DOC_SHUFFLE)]


def build_shuffle_index(n: int, seed: int, stream: int = STREAM_SAMPLE_SHUFFLE) -> np.ndarray:
    """A permutation of range(n) (int64): shuffle_order(n, seed, stream)."""
    return shuffle_order(n, seed, stream)
