"""Megatron-LM `MMIDIDX` v1 token datasets: `<prefix>.bin` (raw tokens) + `<prefix>.idx` (index).

Byte-compatible with Megatron-LM's `IndexedDataset` (and PaddleNLP's `MMapIndexedDataset`); the
layout, dtype codes and invariants are documented with a worked example in data_tools/README.md.
A *sequence* is one sentence; a document is a run of consecutive sentences (`doc_idx`).

- `MMapIndexedDataset(prefix)`: zero-copy reader over memory maps, validated on open.
- `IndexedDatasetBuilder(prefix, dtype)`: streaming writer whose memory does not grow with the
  corpus; both files appear under their final names only when complete (`.idx` last).
- `file_identity(prefix)`: the data identity used in index-cache keys.
"""
from __future__ import annotations

import errno
import os
import struct
import tempfile
import threading
from array import array
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from data_tools.cli_utils import UserError

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
_HEADER = struct.Struct("<9sQBQQ")  # magic, version, dtype code, sequence count, doc_idx length
HEADER_SIZE = _HEADER.size  # 34
_OLD_MAGIC = b"TNTIDX\x00\x00"  # fairseq/Megatron "lazy"/"cached" IndexedDataset

# Megatron's DType enum (1-8); 9 and 10 are PaddleNLP/fairseq extensions, read but never written
# because Megatron cannot read them.
DTYPE_CODES: Dict[int, np.dtype] = {
    1: np.dtype(np.uint8), 2: np.dtype(np.int8), 3: np.dtype(np.int16), 4: np.dtype(np.int32),
    5: np.dtype(np.int64), 6: np.dtype(np.float64), 7: np.dtype(np.float32), 8: np.dtype(np.uint16),
    9: np.dtype(np.uint32), 10: np.dtype(np.uint64),
}
_WRITABLE = {dt: code for code, dt in DTYPE_CODES.items() if code <= 8}

# Rows per chunk when streaming side files (bounded memory: 4-8 MiB per array).
_CHUNK = 1 << 20


def mkstemp_public(directory: str, prefix: str) -> Tuple[int, str]:
    """tempfile.mkstemp with the permissions a plain open() would give (mkstemp uses 0600), for
    temporary files that are renamed into place."""
    fd, path = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=directory)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)
    return fd, path


class IndexedDatasetError(UserError):
    """A `.bin/.idx` pair is missing, malformed or inconsistent (the message names file and defect)."""


def best_dtype(vocab_size: int) -> np.dtype:
    """Token dtype for a vocabulary: uint16 below 65,500 ids, else int32 (Megatron's rule)."""
    if vocab_size < 0:
        raise ValueError(f"vocab_size must be >= 0, got {vocab_size}")
    return np.dtype(np.uint16) if vocab_size < 65500 else np.dtype(np.int32)


def _prefix(path_prefix: Union[str, os.PathLike]) -> str:
    """Accept 'corpus', 'corpus.idx' or 'corpus.bin' for the prefix 'corpus'."""
    p = os.fspath(path_prefix)
    return p[:-4] if p.endswith((".idx", ".bin")) else p


def index_file(path_prefix: Union[str, os.PathLike]) -> str:
    return _prefix(path_prefix) + ".idx"


def data_file(path_prefix: Union[str, os.PathLike]) -> str:
    return _prefix(path_prefix) + ".bin"


def file_identity(path_prefix: Union[str, os.PathLike]) -> dict:
    """Identity of a built dataset for cache keys and resume checks: the content identity of both
    files (size and a SHA-1 of their content, sampled on large files: data_tools/identity.py).
    Re-tokenising into the same prefix changes it, so index caches keyed on it are never silently
    reused; copying the corpus elsewhere or touching it keeps it, so caches and checkpoints follow
    the data (and nodes with their own copy agree)."""
    from data_tools.identity import content_identity

    idx, bin_ = index_file(path_prefix), data_file(path_prefix)
    try:
        return {"idx": content_identity(idx), "bin": content_identity(bin_)}
    except FileNotFoundError as exc:
        raise IndexedDatasetError(f"{exc.filename}: file not found (dataset {_prefix(path_prefix)!r} "
                                  "is not built; run `python -m data_tools.create_pretraining_data`)") from None


def _stat_identity(st: os.stat_result) -> Tuple[int, int, int, int]:
    return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev)


def _when(mtime_ns: int) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(mtime_ns / 1e9))


class MMapIndexedDataset:
    """Read-only view of a `.bin/.idx` pair through memory maps.

    `ds[i]` is sentence i as a zero-copy NumPy view (`ds[a:b]` a list of views); `sizes`,
    `pointers` and `doc_idx` are views into the `.idx` map. Pickling keeps only the prefix, so
    DataLoader workers re-open their own maps instead of copying arrays. Opening validates the
    header, the file sizes and the document index (O(#documents)); `verify()` additionally
    checks every pointer against the sizes (O(#sentences)).
    """

    def __init__(self, path_prefix: Union[str, os.PathLike]):
        self._open(_prefix(path_prefix), validate=True)

    def _open(self, prefix: str, validate: bool) -> None:
        self.path_prefix = prefix
        idx, bin_ = prefix + ".idx", prefix + ".bin"
        if not os.path.exists(idx):
            raise IndexedDatasetError(f"{idx}: index file not found (dataset {prefix!r} is not built, "
                                      "or its build did not finish; the .idx is written last)")
        if not os.path.exists(bin_):
            raise IndexedDatasetError(f"{bin_}: data file not found (its index {idx} exists; "
                                      "the pair is incomplete: rebuild the dataset)")
        idx_size = os.path.getsize(idx)
        if idx_size < HEADER_SIZE:
            raise IndexedDatasetError(f"{idx}: truncated index: {idx_size} bytes, shorter than the "
                                      f"{HEADER_SIZE}-byte MMIDIDX header")
        self._idx_map = np.memmap(idx, dtype=np.uint8, mode="r")
        magic, version, code, n_seq, n_doc = _HEADER.unpack_from(self._idx_map, 0)
        if magic != MAGIC:
            if bytes(self._idx_map[:len(_OLD_MAGIC)]) == _OLD_MAGIC:
                raise IndexedDatasetError(f"{idx}: old 'TNTIDX' (lazy/cached IndexedDataset) index, not "
                                          "MMIDIDX; re-run preprocessing to produce an mmap dataset")
            raise IndexedDatasetError(f"{idx}: wrong magic {magic!r}, expected {MAGIC!r}: not an "
                                      "MMIDIDX index file")
        if version != VERSION:
            raise IndexedDatasetError(f"{idx}: unsupported MMIDIDX version {version}, expected {VERSION}")
        if code not in DTYPE_CODES:
            raise IndexedDatasetError(f"{idx}: unknown dtype code {code} (known: "
                                      + ", ".join(f"{c}={d.name}" for c, d in DTYPE_CODES.items()) + ")")
        self.dtype = DTYPE_CODES[code]
        expected = HEADER_SIZE + 12 * n_seq + 8 * n_doc
        if idx_size != expected:
            fairseq_size = HEADER_SIZE - 8 + 12 * n_seq
            if idx_size == fairseq_size:
                raise IndexedDatasetError(
                    f"{idx}: fairseq-style MMIDIDX index (no document count or document index); "
                    "re-run preprocessing with this tool or Megatron-LM")
            defect = "truncated" if idx_size < expected else "has trailing bytes"
            raise IndexedDatasetError(
                f"{idx}: index {defect}: the header says {n_seq} sequences and {n_doc} document-index "
                f"entries ({expected} bytes), the file has {idx_size} bytes")
        self.sizes = np.frombuffer(self._idx_map, dtype="<i4", count=n_seq, offset=HEADER_SIZE)
        self.pointers = np.frombuffer(self._idx_map, dtype="<i8", count=n_seq, offset=HEADER_SIZE + 4 * n_seq)
        self.doc_idx = np.frombuffer(self._idx_map, dtype="<i8", count=n_doc, offset=HEADER_SIZE + 12 * n_seq)
        bin_size = os.path.getsize(bin_)
        if validate:
            self._validate(idx, bin_, n_seq, n_doc, bin_size)
        # np.memmap refuses empty files; an empty corpus has nothing to map
        self._bin_map = np.memmap(bin_, dtype=np.uint8, mode="r") if bin_size else np.zeros(0, np.uint8)
        self._watch_files(idx, bin_)

    # -- the files must not change under a run: a truncated map is SIGBUS, one zeroed in place trains on [PAD]
    def _watch_files(self, idx: str, bin_: str) -> None:
        """Keep descriptors of both files and what they were when mapped (size, modification time, inode)."""
        for name in ("_idx_fd", "_bin_fd"):
            if getattr(self, name, None) is not None:
                os.close(getattr(self, name))
        self._idx_fd, self._bin_fd = os.open(idx, os.O_RDONLY), os.open(bin_, os.O_RDONLY)
        self._identity = tuple(_stat_identity(os.fstat(fd)) for fd in (self._idx_fd, self._bin_fd))

    def check_unchanged(self) -> None:
        """IndexedDatasetError when either file changed since it was mapped (`get` calls this first)."""
        for fd, path, then in zip((self._idx_fd, self._bin_fd), (".idx", ".bin"), self._identity):
            now = _stat_identity(os.fstat(fd))
            if now != then:
                raise IndexedDatasetError(
                    f"{self.path_prefix}{path} changed while this run was reading it ({then[0]:,} bytes modified at "
                    f"{_when(then[1])}, now {now[0]:,} bytes modified at {_when(now[1])}): a running job's corpus must "
                    "not be written. Put the corpus back as it was (or rebuild it and start a new run), then run the "
                    "same command again: it resumes from the last checkpoint")

    def __del__(self):
        for name in ("_idx_fd", "_bin_fd"):
            fd = getattr(self, name, None)
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass

    def _validate(self, idx: str, bin_: str, n_seq: int, n_doc: int, bin_size: int) -> None:
        if n_doc < 1:
            raise IndexedDatasetError(f"{idx}: document index is empty; it must hold at least [0]")
        first, last = int(self.doc_idx[0]), int(self.doc_idx[-1])
        if first != 0:
            raise IndexedDatasetError(f"{idx}: document index starts at {first}, expected 0")
        if last != n_seq:
            raise IndexedDatasetError(f"{idx}: document index ends at {last}, expected the sequence "
                                      f"count {n_seq}")
        for lo in range(0, n_doc - 1, _CHUNK):
            step = np.diff(self.doc_idx[lo:lo + _CHUNK + 1])
            if (step < 0).any():
                bad = lo + int(np.flatnonzero(step < 0)[0])
                raise IndexedDatasetError(
                    f"{idx}: document index is not monotonic: entry {bad + 1} ({int(self.doc_idx[bad + 1])}) "
                    f"< entry {bad} ({int(self.doc_idx[bad])})")
        if n_seq:
            if int(self.sizes.min()) < 0:
                raise IndexedDatasetError(f"{idx}: negative sequence length in sizes")
            if int(self.pointers[0]) != 0:
                raise IndexedDatasetError(f"{idx}: first byte pointer is {int(self.pointers[0])}, expected 0")
        end = int(self.pointers[-1]) + int(self.sizes[-1]) * self.dtype.itemsize if n_seq else 0
        if end != bin_size:
            raise IndexedDatasetError(
                f"{bin_}: data file has {bin_size} bytes but its index {idx} describes {end} bytes "
                f"({n_seq} sequences of {self.dtype.name}); the pair is inconsistent or truncated")

    def verify(self) -> None:
        """Full consistency check: every pointer equals the running sum of the preceding sizes."""
        idx = self.path_prefix + ".idx"
        carry = 0
        for lo in range(0, len(self.sizes), _CHUNK):
            sizes = self.sizes[lo:lo + _CHUNK].astype(np.int64) * self.dtype.itemsize
            expect = carry + np.concatenate(([0], np.cumsum(sizes[:-1])))
            bad = np.flatnonzero(self.pointers[lo:lo + _CHUNK] != expect)
            if len(bad):
                i = lo + int(bad[0])
                raise IndexedDatasetError(f"{idx}: byte pointer {i} is {int(self.pointers[i])}, expected "
                                          f"{int(expect[bad[0]])} from the sizes of sequences 0..{i - 1}")
            carry = int(expect[-1] + sizes[-1])

    @property
    def num_docs(self) -> int:
        return len(self.doc_idx) - 1

    @property
    def num_tokens(self) -> int:
        return int(self.sizes.sum(dtype=np.int64))

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, i: Union[int, slice]):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return self.get(i)

    def get(self, i: int, offset: int = 0, length: Optional[int] = None) -> np.ndarray:
        """Tokens [offset, offset+length) of sentence i (a read-only view; length None = to the end)."""
        n = len(self.sizes)
        if not -n <= i < n:
            raise IndexError(f"sentence {i} out of range for {self.path_prefix} ({n} sentences)")
        i %= n
        size = int(self.sizes[i])
        if length is None:
            length = size - offset
        if offset < 0 or length < 0 or offset + length > size:
            raise IndexError(f"tokens [{offset}, {offset + length}) out of range for sentence {i} of "
                             f"{size} tokens")
        self.check_unchanged()
        start = int(self.pointers[i]) + offset * self.dtype.itemsize
        return np.frombuffer(self._bin_map, dtype=self.dtype, count=length, offset=start)

    def __getstate__(self):
        return {"path_prefix": self.path_prefix, "identity": self._identity}

    def __setstate__(self, state):
        # validated when first opened; a worker re-open only maps the files, and checks they are the same
        self._open(state["path_prefix"], validate=False)
        if state.get("identity") is not None:
            self._identity = tuple(tuple(x) for x in state["identity"])
            self.check_unchanged()

    def __repr__(self) -> str:
        return (f"MMapIndexedDataset({self.path_prefix!r}: {self.num_docs} documents, {len(self)} sentences, "
                f"{self.dtype.name})")


_NO_COPY_FILE_RANGE = {errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EBADF, errno.EPERM}


def _copy_file(src: str, dst_fd: int, progress: Optional[Callable[[int], None]] = None,
               block: int = 64 << 20, start: int = 0, length: Optional[int] = None) -> None:
    """Append bytes [start, start+length) of file `src` (default: all of it) at the current offset
    of `dst_fd`: in the kernel with copy_file_range where the filesystems allow it, else through a
    buffer."""
    with open(src, "rb", buffering=0) as f:  # unbuffered: reads continue where the kernel copy stopped
        left = os.fstat(f.fileno()).st_size - start if length is None else length
        f.seek(start)
        fast = hasattr(os, "copy_file_range")
        while left > 0:
            if fast:
                try:
                    n = os.copy_file_range(f.fileno(), dst_fd, min(block, left))
                except OSError as exc:
                    if exc.errno not in _NO_COPY_FILE_RANGE:
                        raise
                    fast = False
                    continue
                if n == 0:
                    raise IndexedDatasetError(f"{src}: file shrank while being copied")
            else:
                chunk = f.read(min(8 << 20, left))
                if not chunk:
                    raise IndexedDatasetError(f"{src}: file shrank while being copied")
                view = memoryview(chunk)
                while view:
                    view = view[os.write(dst_fd, view):]
                n = len(chunk)
            left -= n
            if progress is not None:
                progress(n)


class _FsyncThread(threading.Thread):
    """fsync a file in the background; join() re-raises its error."""

    def __init__(self, path: str):
        super().__init__(daemon=True)
        self.path, self.error = path, None
        self.start()

    def run(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except BaseException as exc:  # noqa: BLE001  (handed to the joining thread)
            self.error = exc

    def join(self, timeout=None) -> None:
        super().join(timeout)
        if self.error is not None:
            raise self.error


class IndexedDatasetBuilder:
    """Streaming writer of a `.bin/.idx` pair.

    Tokens go straight to a temporary `.bin`; sentence sizes and document ends go to temporary
    side files through small buffers, so memory stays constant whatever the corpus size.
    `finalize()` writes the `.idx` (pointers by chunked cumsum), then renames `.bin` and lastly
    `.idx` into place; any stale `.idx` under the final name is removed first, so a reader never
    pairs an old index with new data. Used as a context manager, an exception (or leaving the
    block without `finalize()`) deletes every temporary file.

    Empty sentences are rejected (they would make empty training segments); `end_document()`
    with no sentence since the previous one is a no-op, so empty documents are never stored.
    `finalize()` closes a document left open.
    """

    def __init__(self, out_prefix: Union[str, os.PathLike], dtype=np.uint16):
        self.out_prefix = _prefix(out_prefix)
        self.dtype = np.dtype(dtype)
        if self.dtype not in _WRITABLE:
            raise ValueError(f"cannot write token dtype {self.dtype.name}: Megatron's dtype codes cover "
                             + ", ".join(sorted(d.name for d in _WRITABLE)))
        self._info = np.iinfo(self.dtype) if self.dtype.kind in "iu" else None
        directory = os.path.dirname(os.path.abspath(self.out_prefix))
        os.makedirs(directory, exist_ok=True)
        base = os.path.basename(self.out_prefix)
        self._tmp: List[str] = []
        self._bin = self._temp(directory, base + ".bin.")
        self._sizes_f = self._temp(directory, base + ".sizes.")
        self._docs_f = self._temp(directory, base + ".docs.")
        self._size_buf = array("i")
        self._doc_buf = array("q")
        self._n_seq = 0
        self._n_docs = 0
        self._n_tokens = 0
        self._doc_open = False
        self._done = False

    def _temp(self, directory: str, prefix: str):
        fd, path = mkstemp_public(directory, prefix)
        self._tmp.append(path)
        return os.fdopen(fd, "wb")

    def _check(self, tokens) -> np.ndarray:
        if self._done:
            raise RuntimeError(f"builder for {self.out_prefix} is already finalized or aborted")
        arr = np.asarray(tokens)
        if arr.ndim != 1:
            raise ValueError(f"tokens must be one-dimensional, got shape {arr.shape}")
        if self._info is not None and arr.size:
            if arr.dtype.kind not in "iub":
                raise ValueError(f"token ids must be integers, got dtype {arr.dtype}")
            lo, hi = int(arr.min()), int(arr.max())
            if lo < self._info.min or hi > self._info.max:
                raise ValueError(f"token id out of range for {self.dtype.name} "
                                 f"[{self._info.min}, {self._info.max}]: min {lo}, max {hi} "
                                 "(choose the dtype with best_dtype(vocab_size))")
        return arr.astype(self.dtype, copy=False)

    def add_sentence(self, tokens: Sequence[int]) -> None:
        """Append one sentence (non-empty sequence of token ids) to the current document."""
        arr = self._check(tokens)
        if arr.size == 0:
            raise ValueError("empty sentence: drop sentences without tokens before adding them")
        self._bin.write(arr.tobytes())
        self._size_buf.append(arr.size)
        self._n_seq += 1
        self._n_tokens += arr.size
        self._doc_open = True
        if len(self._size_buf) >= _CHUNK:
            self._flush()

    def end_document(self) -> None:
        """Close the current document (no-op when no sentence was added since the last call)."""
        if self._done:
            raise RuntimeError(f"builder for {self.out_prefix} is already finalized or aborted")
        if self._doc_open:
            self._doc_buf.append(self._n_seq)
            self._n_docs += 1
            self._doc_open = False
            if len(self._doc_buf) >= _CHUNK:
                self._flush()

    def add_documents(self, tokens: np.ndarray, sentence_sizes: np.ndarray, doc_sentences: np.ndarray) -> None:
        """Bulk append: `tokens` concatenates all sentences, `sentence_sizes[k]` tokens each, grouped
        into documents of `doc_sentences[d]` sentences (all positive). Equivalent to add_sentence /
        end_document calls, without a Python loop per sentence."""
        arr = self._check(tokens)
        sizes = np.asarray(sentence_sizes, dtype=np.int64)
        docs = np.asarray(doc_sentences, dtype=np.int64)
        if self._doc_open:
            raise RuntimeError("add_documents() needs the previous document closed with end_document()")
        if (sizes <= 0).any() or (docs <= 0).any():
            raise ValueError("add_documents(): sentence sizes and sentences per document must be positive")
        if int(sizes.sum()) != arr.size or int(docs.sum()) != sizes.size:
            raise ValueError(f"add_documents(): {arr.size} tokens, sizes summing to {int(sizes.sum())}, "
                             f"{sizes.size} sentences, documents summing to {int(docs.sum())}")
        self._bin.write(arr.tobytes())
        self._flush()
        self._sizes_f.write(sizes.astype("<i4").tobytes())
        self._docs_f.write((self._n_seq + np.cumsum(docs)).astype("<i8").tobytes())
        self._n_seq += sizes.size
        self._n_docs += docs.size
        self._n_tokens += arr.size

    def append_dataset(self, other: "MMapIndexedDataset",
                       progress: Optional[Callable[[int], None]] = None) -> None:
        """Append every sentence and document of `other` (same dtype) unchanged: its `.bin` bytes
        are copied without decoding (`os.copy_file_range` where the system has it), its sizes and
        document ends are streamed in chunks, shifted by what this builder already holds. Memory
        does not depend on the size of `other`; `progress(nbytes)` is called as bytes are copied.
        The result is what adding the same sentences one by one would give."""
        if self._done:
            raise RuntimeError(f"builder for {self.out_prefix} is already finalized or aborted")
        if self._doc_open:
            raise RuntimeError("append_dataset() needs the previous document closed with end_document()")
        if other.dtype != self.dtype:
            raise ValueError(f"{other.path_prefix}: tokens are {other.dtype.name}, this builder writes "
                             f"{self.dtype.name}")
        self._flush()
        self._bin.flush()
        _copy_file(other.path_prefix + ".bin", self._bin.fileno(), progress)
        self._sizes_f.flush()  # the sizes are a byte range of the other .idx: copied as they are
        _copy_file(other.path_prefix + ".idx", self._sizes_f.fileno(), start=HEADER_SIZE, length=4 * len(other.sizes))
        tokens = int(other.sizes.sum(dtype=np.int64))
        ends = other.doc_idx[1:]
        for lo in range(0, len(ends), _CHUNK):
            self._docs_f.write((ends[lo:lo + _CHUNK].astype(np.int64) + self._n_seq).astype("<i8").tobytes())
        self._n_seq += len(other.sizes)
        self._n_docs += len(ends)
        self._n_tokens += tokens

    def _flush(self) -> None:
        self._sizes_f.write(np.frombuffer(self._size_buf, dtype=np.int32).astype("<i4").tobytes())
        self._docs_f.write(np.frombuffer(self._doc_buf, dtype=np.int64).astype("<i8").tobytes())
        self._size_buf = array("i")
        self._doc_buf = array("q")

    def finalize(self) -> dict:
        """Write the index and move both files into place. Returns counts and paths."""
        self.end_document()
        self._flush()
        self._done = True
        for f in (self._bin, self._sizes_f, self._docs_f):
            f.close()  # (the side files are temporary: no fsync)
        bin_tmp, sizes_tmp, docs_tmp = self._tmp
        directory = os.path.dirname(bin_tmp)
        # the tokens reach the disk while the index is written (fsync releases the GIL)
        sync = _FsyncThread(bin_tmp)
        try:
            idx_f = self._temp(directory, os.path.basename(self.out_prefix) + ".idx.")
            try:
                self._write_index(idx_f, sizes_tmp, docs_tmp)
            finally:
                idx_f.close()
        finally:
            sync.join()
        idx_path, bin_path = self.out_prefix + ".idx", self.out_prefix + ".bin"
        if os.path.exists(idx_path):
            os.remove(idx_path)  # never let an old index describe the new data, even briefly
        os.replace(bin_tmp, bin_path)
        os.replace(self._tmp[-1], idx_path)
        for path in (sizes_tmp, docs_tmp):
            os.remove(path)
        self._tmp = []
        return {"sequences": self._n_seq, "documents": self._n_docs, "tokens": self._n_tokens,
                "dtype": self.dtype.name, "bin_path": bin_path, "idx_path": idx_path,
                "bin_bytes": os.path.getsize(bin_path), "idx_bytes": os.path.getsize(idx_path)}

    def _write_index(self, out, sizes_tmp: str, docs_tmp: str) -> None:
        out.write(_HEADER.pack(MAGIC, VERSION, _WRITABLE[self.dtype], self._n_seq, self._n_docs + 1))
        out.flush()
        _copy_file(sizes_tmp, out.fileno())  # sizes verbatim
        carry = 0
        itemsize = self.dtype.itemsize
        with open(sizes_tmp, "rb") as f:  # byte pointers = exclusive running sum of sizes
            while chunk := f.read(4 * _CHUNK):
                sizes = np.frombuffer(chunk, dtype="<i4")
                pointers = np.cumsum(sizes, dtype=np.int64)
                pointers -= sizes
                pointers *= itemsize
                pointers += carry
                out.write(pointers.astype("<i8", copy=False))
                carry = int(pointers[-1]) + int(sizes[-1]) * itemsize
        out.write(np.zeros(1, dtype="<i8").tobytes())
        out.flush()
        _copy_file(docs_tmp, out.fileno())
        os.fsync(out.fileno())

    def abort(self) -> None:
        """Delete all temporary files; nothing appears under the final names. Closing a file can
        fail (its buffered bytes do not fit on a full disk): the file is deleted all the same."""
        self._done = True
        for f in (self._bin, self._sizes_f, self._docs_f):
            try:
                f.close()
            except OSError:
                pass
        for path in self._tmp:
            try:
                os.remove(path)
            except OSError:
                pass
        self._tmp = []

    def __enter__(self) -> "IndexedDatasetBuilder":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._tmp:  # not finalized: an exception, or the block ended without finalize()
            self.abort()
            if exc_type is None:
                raise RuntimeError(f"IndexedDatasetBuilder for {self.out_prefix} left without finalize(); "
                                   "nothing was written")


__all__ = ["MAGIC", "VERSION", "HEADER_SIZE", "DTYPE_CODES", "IndexedDatasetError", "best_dtype",
           "file_identity", "mkstemp_public", "index_file", "data_file", "MMapIndexedDataset", "IndexedDatasetBuilder"]
