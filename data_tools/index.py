"""Typed wrapper around the compiled index helper `data_tools._helpers`.

Every function checks its parameters and the kinds and shapes of its arrays, converts integer
arrays to the exact dtype the C++ expects (without a copy when they already have it), then
calls C++, which checks the array *values* (monotonic boundaries, index ranges, non-negative
sizes) next to the computation, where a check is nearly free, with the GIL released. Errors are
ValueErrors naming the argument, the bad value and the fix. The algorithms are specified in
data_tools/index_reference.py (the NumPy test oracle); this module never falls back to it.
"""
from __future__ import annotations

import math
import operator
from typing import Tuple

import numpy as np

try:
    from data_tools import _helpers
except ImportError as exc:  # pragma: no cover - exercised by hand on broken installs
    raise ImportError(
        "The compiled index helper data_tools._helpers is not importable "
        f"({exc}). Build it with `pip install -e .` from the project root (needs a C++17 "
        "compiler such as g++ and the Python headers, e.g. apt-get install g++ python3-dev)."
    ) from exc

# Part of every index-cache key; equal to _helpers.VERSION (bump both when any output changes).
HELPER_VERSION = "1"

if _helpers.VERSION != HELPER_VERSION:  # pragma: no cover - a stale build
    raise ImportError(
        f"data_tools._helpers is version {_helpers.VERSION} but data_tools/index.py expects "
        f"{HELPER_VERSION}: the compiled module is stale. Rebuild it with `pip install -e .` "
        "(or `python setup.py build_ext --inplace`) from the project root.")

_INT32_MAX = 2 ** 31 - 1
_INT64_MAX = 2 ** 63 - 1


def _int(name: str, value, low: int, high: int = _INT64_MAX) -> int:
    """`value` as a Python int in [low, high]; bools and floats are refused."""
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be an integer, got the bool {value!r}")
    try:
        value = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {value!r} ({type(value).__name__}); "
                         f"pass int({value!r}) if it is a whole number") from None
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value}")
    return value


def _seed(seed) -> int:
    return _int("seed", seed, 0, _INT64_MAX)


def _int_array(name: str, array, dtype) -> np.ndarray:
    """A 1-D C-contiguous array of exactly `dtype`, converted from any integer dtype whose
    values fit (checked before converting, since a narrowing cast would wrap silently)."""
    array = np.asarray(array)
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {array.shape}")
    if array.dtype.kind not in "iu":
        raise ValueError(f"{name} must be an integer array, got dtype {array.dtype}; convert it "
                         f"with .astype(np.{np.dtype(dtype).name}) if the values are whole numbers")
    if array.dtype != dtype and array.size and not np.can_cast(array.dtype, dtype):
        info = np.iinfo(dtype)
        low, high = array.min(), array.max()
        if low < info.min or high > info.max:
            bad = low if low < info.min else high
            raise ValueError(f"{name} holds {bad}, outside the {np.dtype(dtype).name} range "
                             f"[{info.min}, {info.max}] that the index helper uses")
    return np.ascontiguousarray(array, dtype=dtype)


def build_sentence_pair_mapping(doc_idx: np.ndarray, sizes: np.ndarray, *, num_epochs: int,
                                max_num_samples: int, max_seq_len: int, short_seq_prob: float,
                                seed: int, min_num_sent: int, shuffle: bool = True,
                                _force_int64: bool = False) -> np.ndarray:
    """Sentence-pair samples [N, 3] of (start sentence, end sentence exclusive, target length).

    Args:
        doc_idx: [D+1] non-decreasing sentence boundaries of the split's documents (a slice of
            the dataset's document index; doc_idx[-1] <= len(sizes)).
        sizes: [S] tokens per sentence of the whole dataset (>= 0).
        num_epochs: most passes over the documents (>= 1).
        max_num_samples: stop before the next epoch once this many rows exist (whole epochs).
        max_seq_len: token budget of segments A+B, special tokens excluded (>= 2).
        short_seq_prob: probability that a sample gets a random shorter target, in [0, 1].
        seed: in [0, 2**63).
        min_num_sent: 2 with the next-sentence/sentence-order head, else 1.
        shuffle: permute the rows (stream 3) instead of (epoch, start sentence) order.
        _force_int64: tests only: int64 output even when int32 would do.

    Returns:
        int32 rows (int64 when len(sizes) >= 2**31 or max_seq_len >= 2**31); [0, 3] when the
        split has no sentence.

    Raises:
        ValueError: bad arguments, or documents with sentences of which none has
            min_num_sent sentences (the message suggests binary_head=False).
    """
    doc_idx = _int_array("doc_idx", doc_idx, np.int64)
    sizes = _int_array("sizes", sizes, np.int32)
    if len(doc_idx) == 0:
        raise ValueError("doc_idx must hold at least one boundary (D documents need D+1 "
                         "entries), got an empty array")
    if not isinstance(short_seq_prob, (int, float, np.floating, np.integer)) or isinstance(
            short_seq_prob, (bool, np.bool_)) or not 0.0 <= float(short_seq_prob) <= 1.0:
        raise ValueError(f"short_seq_prob must be a probability in [0, 1], got {short_seq_prob!r}")
    return _helpers.build_sentence_pair_mapping(
        doc_idx, sizes,
        num_epochs=_int("num_epochs", num_epochs, 1),
        max_num_samples=_int("max_num_samples", max_num_samples, 0),
        max_seq_len=_int("max_seq_len (token budget for A+B)", max_seq_len, 2),
        short_seq_prob=float(short_seq_prob), seed=_seed(seed),
        min_num_sent=_int("min_num_sent", min_num_sent, 1),
        shuffle=bool(shuffle), _force_int64=bool(_force_int64))


def build_blending_indices(weights, size: int) -> Tuple[np.ndarray, np.ndarray]:
    """Greedy, RNG-free blend of datasets by weight.

    Args:
        weights: one weight per dataset (finite, >= 0, positive sum; at most 32767 datasets);
            normalised internally.
        size: number of blended samples (>= 0).

    Returns:
        (dataset_index int16[size], dataset_sample_index int64[size]): sample i is sample
        dataset_sample_index[i] of dataset dataset_index[i]. Every prefix of n samples holds
        within one sample of weight * n of every dataset.
    """
    w = np.asarray(weights)
    if w.ndim != 1 or not 1 <= len(w) <= 32767:
        raise ValueError(f"weights must be a 1-D list of 1 to 32767 dataset weights, got shape "
                         f"{w.shape}")
    if w.dtype.kind not in "iuf":
        raise ValueError(f"weights must be numbers, got dtype {w.dtype}")
    w = np.ascontiguousarray(w, dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(w) | (w < 0))
    if len(bad):
        raise ValueError(f"weights must be finite and >= 0, but weights[{bad[0]}] = {w[bad[0]]}")
    if not math.fsum(w) > 0:
        raise ValueError(f"weights must not all be zero, got {w.tolist()}")
    return _helpers.build_blending_indices(w, _int("size", size, 0))


def build_sample_idx(sizes: np.ndarray, doc_idx: np.ndarray, *, seq_len: int, num_epochs: int,
                     tokens_per_epoch: int, add_extra_token: int = 1,
                     _force_int64: bool = False) -> np.ndarray:
    """GPT-style contiguous windows over a document order: [num_samples+1, 2] rows of
    (position in doc_idx, token offset), with
    num_samples = (num_epochs * tokens_per_epoch - add_extra_token) // seq_len.

    Args:
        sizes: tokens per document (int32 and int64 are used as they are; other integer
            dtypes are converted to int64), >= 0.
        doc_idx: document ids in training order over all epochs (int32 or int64 used as is).
        seq_len: tokens per sample, not counting the extra token (>= 1).
        num_epochs: epochs covered by doc_idx (>= 1).
        tokens_per_epoch: tokens of one epoch's documents; num_epochs * tokens_per_epoch must
            not exceed the tokens in sizes[doc_idx].
        add_extra_token: tokens each sample reads past its window (1 for next-token labels).
        _force_int64: tests only: int64 output even when int32 would do.

    Returns:
        int32 rows (int64 when len(doc_idx) >= 2**31 or max(sizes) >= 2**31).
    """
    sizes = np.asarray(sizes)
    doc_idx = np.asarray(doc_idx)
    sizes = _int_array("sizes", sizes, sizes.dtype if sizes.dtype in (np.int32, np.int64) else np.int64)
    doc_idx = _int_array("doc_idx", doc_idx,
                         doc_idx.dtype if doc_idx.dtype in (np.int32, np.int64) else np.int64)
    if len(doc_idx) == 0:
        raise ValueError("doc_idx is empty: there are no documents to sample from")
    num_epochs = _int("num_epochs", num_epochs, 1)
    tokens_per_epoch = _int("tokens_per_epoch", tokens_per_epoch, 0)
    add_extra_token = _int("add_extra_token", add_extra_token, 0)
    if num_epochs * tokens_per_epoch > _INT64_MAX:
        raise ValueError(f"num_epochs * tokens_per_epoch = {num_epochs * tokens_per_epoch} "
                         "overflows int64")
    if num_epochs * tokens_per_epoch < add_extra_token:
        raise ValueError(f"num_epochs * tokens_per_epoch = {num_epochs * tokens_per_epoch} is "
                         f"smaller than add_extra_token = {add_extra_token}: not enough tokens "
                         "for one sample")
    return _helpers.build_sample_idx(
        sizes, doc_idx, seq_len=_int("seq_len", seq_len, 1), num_epochs=num_epochs,
        tokens_per_epoch=tokens_per_epoch, add_extra_token=add_extra_token,
        _force_int64=bool(_force_int64))


def build_doc_idx(documents: np.ndarray, num_epochs: int, seed: int) -> np.ndarray:
    """`documents` (int64 ids) repeated num_epochs times in a seeded shuffled order (stream 4)."""
    documents = _int_array("documents", documents, np.int64)
    return _helpers.build_doc_idx(documents, _int("num_epochs", num_epochs, 1), _seed(seed))


def build_shuffle_index(n: int, seed: int, stream: int = 5) -> np.ndarray:
    """A seeded permutation of range(n) (int64): the stable argsort of draw(seed, stream, i)."""
    return _helpers.build_shuffle_index(_int("n", n, 0), _seed(seed),
                                        _int("stream", stream, 0, _INT64_MAX))
