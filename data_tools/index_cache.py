"""On-disk cache of sample-index arrays, keyed by a hash of everything that shapes them.

Layout (one folder per key, never modified once it exists)::

    <cache_dir>/<name>-<key16>/
        description.json     # the full description that was hashed, plus array shapes/dtypes
        <array>.npy          # one file per array, loaded with mmap_mode="r"

Protocol, in the order that keeps every rank safe:

1. The key is the SHA-1 of the canonical JSON of a description dict that the caller fills with
   *everything* that changes the arrays: data-file identity (content: sizes and hashes),
   split, sequence length, probabilities, seed, sample count, pair head and helper version.
   A changed input therefore gets a new folder; a stale cache can never be picked up.
2. The builder rank (`is_index_builder`: global rank 0 with `--share_folder true`, the default;
   local rank 0 of every node with `--share_folder false`, for nodes that share no filesystem)
   builds into a temporary folder beside the final one, fsyncs, then renames it into place
   (atomic on POSIX). An advisory lock serialises concurrent *jobs* sharing the cache, and a
   complete folder is never replaced, so builders that race anyway (per-node builders on a
   filesystem that is shared after all) leave one intact copy.
3. Every rank then meets at the barrier. The builder enters the barrier even when building
   failed, so the other ranks never hang; they find no folder and raise an error pointing at
   the builder's log.
4. Everyone memory-maps the arrays and checks them against description.json.

The arrays are memory maps: a dataset holding them is sent to a data-loading worker process by
pickling, and `by_path` / `reopened` make such an array travel as its file name (the worker maps
the same file) instead of as a copy of its data.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import mmap
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, Mapping, Optional

import numpy as np

from data_tools.cli_utils import UserError

DESCRIPTION_FILE = "description.json"


class IndexCacheError(UserError):
    """The index cache is missing, incomplete or inconsistent."""


def cache_key(description: Mapping) -> str:
    """Stable 16-hex-digit key of a JSON-serialisable description."""
    canonical = json.dumps(description, sort_keys=True, separators=(",", ":"), default=_json_default)
    return hashlib.sha1(canonical.encode("utf-8")).hexdigest()[:16]


def cache_folder(cache_dir: os.PathLike, name: str, description: Mapping) -> Path:
    """Folder the arrays for `description` live in (whether or not it exists yet)."""
    return Path(cache_dir) / f"{name}-{cache_key(description)}"


def is_index_builder(global_rank: int, local_rank: int, shared_filesystem: bool) -> bool:
    """Which rank builds index caches (PaddleNLP's `share_folder`): global rank 0 when the cache
    directory is on a filesystem every node shares, else each node's local rank 0 (its own copy).
    Every rank still calls `load_or_build` and so meets every barrier."""
    return global_rank == 0 if shared_filesystem else local_rank == 0


def load_or_build(
    cache_dir: os.PathLike,
    name: str,
    description: Mapping,
    build_fn: Callable[[], Mapping[str, np.ndarray]],
    *,
    is_builder: bool = True,
    barrier: Optional[Callable[[], None]] = None,
    log: Callable[[str], None] = print,
) -> Dict[str, np.ndarray]:
    """Return the cached arrays for `description`, building them first if this rank is the builder.

    `build_fn` returns a dict of array name -> array. `barrier` is called exactly once on every
    rank (pass None in a single process). Arrays come back memory-mapped read-only.
    """
    folder = cache_folder(cache_dir, name, description)
    build_error: Optional[BaseException] = None
    if is_builder and not _is_complete(folder):
        try:
            _build(folder, description, build_fn, log)
        except BaseException as exc:  # still meet the other ranks at the barrier below
            build_error = exc
    elif is_builder:
        log(f"reusing index cache {folder}")
    if barrier is not None:
        barrier()
    if build_error is not None:
        raise build_error
    if not _is_complete(folder):
        raise IndexCacheError(
            f"index cache {folder} does not exist after the builder rank finished. Either the builder "
            "failed (see its log: global rank 0, or local rank 0 of this node with --share_folder false) "
            "or this node does not share the cache directory with global rank 0: put the cache on a "
            "shared filesystem, or let each node build its own copy (--share_folder false: local rank 0 "
            "of every node builds), or prebuild it on every node with the run's own command plus `--prebuild_index`.")
    return _load(folder)


def _is_complete(folder: Path) -> bool:
    return (folder / DESCRIPTION_FILE).is_file()


def _build(folder: Path, description: Mapping, build_fn, log) -> None:
    folder.parent.mkdir(parents=True, exist_ok=True)
    with _locked(folder.parent / f".{folder.name}.lock"):
        if _is_complete(folder):  # another job built it while we waited for the lock
            return
        start = time.perf_counter()
        arrays = dict(build_fn())
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=folder.parent))
        try:
            meta = {}
            for key, array in arrays.items():
                array = np.ascontiguousarray(array)
                with open(tmp / f"{key}.npy", "wb") as f:
                    np.save(f, array, allow_pickle=False)
                    f.flush()
                    os.fsync(f.fileno())
                meta[key] = {"shape": list(array.shape), "dtype": array.dtype.str}
            record = {"description": description, "arrays": meta,
                      "built_seconds": round(time.perf_counter() - start, 3)}
            with open(tmp / DESCRIPTION_FILE, "w", encoding="utf-8") as f:
                json.dump(record, f, indent=2, sort_keys=True, default=_json_default)
                f.flush()
                os.fsync(f.fileno())
            _publish(tmp, folder)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        sizes = ", ".join(f"{k} {tuple(v['shape'])}" for k, v in meta.items())
        log(f"built index cache {folder} in {record['built_seconds']:.2f}s ({sizes})")


def _publish(tmp: Path, folder: Path) -> None:
    """Rename the finished `tmp` into place. A complete folder already there is never touched: it
    was built by another builder whose lock did not exclude us (each node's builder on a
    filesystem that is shared after all, where flock may not reach across nodes), and other
    ranks may be reading it; ours is then dropped (same key, same content)."""
    if folder.exists():
        if _is_complete(folder):
            shutil.rmtree(tmp, ignore_errors=True)
            return
        # an incomplete leftover (a crash before description.json): move it aside, then replace it
        stale = Path(tempfile.mkdtemp(prefix=f".{folder.name}.stale-", dir=folder.parent))
        try:
            os.rename(folder, stale / "old")
        except FileNotFoundError:
            pass  # another builder removed it first
        shutil.rmtree(stale, ignore_errors=True)
    try:
        os.rename(tmp, folder)
    except OSError:
        if not _is_complete(folder):  # not "someone else published first": a real failure
            raise
        shutil.rmtree(tmp, ignore_errors=True)


def _load(folder: Path) -> Dict[str, np.ndarray]:
    with open(folder / DESCRIPTION_FILE, encoding="utf-8") as f:
        record = json.load(f)
    arrays = {}
    for key, meta in record["arrays"].items():
        path = folder / f"{key}.npy"
        try:
            array = np.load(path, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise IndexCacheError(f"index cache file {path} is unreadable ({exc}); "
                                  f"delete {folder} to rebuild it") from exc
        if list(array.shape) != meta["shape"] or array.dtype.str != meta["dtype"]:
            raise IndexCacheError(
                f"index cache file {path} has shape {array.shape} dtype {array.dtype.str}, but "
                f"{folder / DESCRIPTION_FILE} records {tuple(meta['shape'])} {meta['dtype']}; "
                f"delete {folder} to rebuild it")
        arrays[key] = array
    return arrays


def by_path(array):
    """`array` for pickling: a whole memory-mapped `.npy` file (as `load_or_build` returns its
    arrays) becomes a `MappedNpy` token naming the file; anything else is returned as it is. (NumPy
    pickles a memmap as a copy of its data: gigabytes for a large corpus's sample index.)"""
    if isinstance(array, np.memmap) and isinstance(array.base, mmap.mmap) and array.filename:
        return MappedNpy(str(array.filename), tuple(array.shape), array.dtype.str)
    return array


def reopened(value):
    """The inverse of `by_path` in the unpickling process: a token's file mapped again (read-only)."""
    return value.open() if isinstance(value, MappedNpy) else value


class MappedNpy:
    """A memory-mapped `.npy` file by name, with the shape and dtype it had (checked on opening)."""

    def __init__(self, path: str, shape: tuple, dtype: str):
        self.path, self.shape, self.dtype = path, tuple(shape), dtype

    def open(self) -> np.ndarray:
        array = np.load(self.path, mmap_mode="r", allow_pickle=False)
        if tuple(array.shape) != self.shape or array.dtype.str != self.dtype:
            raise IndexCacheError(f"index cache file {self.path} changed while the run used it: shape {array.shape} "
                                  f"dtype {array.dtype.str}, was {self.shape} {self.dtype}; caches are never "
                                  "rewritten in place: was the folder deleted and rebuilt during the run?")
        return array


@contextlib.contextmanager
def _locked(path: Path):
    with open(path, "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _json_default(obj):
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj)
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON-serialisable in an index-cache description: {obj!r}")
