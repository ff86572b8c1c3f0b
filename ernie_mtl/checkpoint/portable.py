"""The topology-free checkpoint format: every tensor by structured name, in safetensors files, one
set of files whatever topology wrote them, readable with NumPy alone (or the `safetensors` package).

    model_<step>/
      tensors/<structured parameter name>.safetensors   the parameter and everything it owns, by key:
                                                        "<name>", "<name>_moment1_0", "<name>_moment2_0",
                                                        "<name>_beta1_pow_acc_0", "<name>@EMA",
                                                        "<name>_fp32_master_0", ... (reshard.py names)
      tensors/@run.safetensors                          run-level state: loss_scaling_0, num_good_steps_0, ...
      state/rank_<r>.sha1                               the files rank r wrote, with their sizes and SHA-1s
      train_state.json                                  written last ("state_format": "portable"; `files` lists
                                                        every tensor file with its size and SHA-1)

A safetensors file is an 8-byte little-endian header length, a JSON header ({key: {"dtype", "shape",
"data_offsets"}}, "__metadata__"), then the raw little-endian bytes of each tensor, C order. Dtypes
are NumPy's (F32, F16, F64, I64, I32, I16, I8, U8, U16, BOOL; Paddle's bfloat16 is stored as its
uint16 bits, U16, as Paddle hands it to NumPy).

The same guarantees as the Paddle format: everything is written inside the checkpoint's hidden
temporary folder, which is renamed into place only when complete; each file's SHA-1 is computed
while it is written (no second read) and recorded by its writer in `state/rank_<r>.sha1`, then in
train_state.json, which is written last; readers verify sizes and SHA-1s first.

Writing in parallel: the tensors are grouped by parameter; under sharding each rank writes the
groups its program holds (its own shard), otherwise (every rank holds the same state) the groups
are dealt out round-robin so that every rank writes a part (`share`); rank 0 writes `@run`.

Reading: `read_tensors` (memory-mapped, verified by the store first), `describe` (what `--inspect`
prints). `ernie-mtl-reshard` (ernie_mtl/convert/reshard_cli.py) converts a Paddle-format checkpoint
of any topology into this format, inspects one and averages several (ernie_mtl/checkpoint/offline.py).
"""
from __future__ import annotations

import hashlib
import json
import mmap
import os
import struct
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from data_tools.safe_io import loads_json_bounded
from ernie_mtl.checkpoint.errors import CheckpointError

FORMAT = "portable"
TENSORS = "tensors"
RUN_GROUP = "@run"  # run-level variables (AMP loss scaling)
SUFFIX = ".safetensors"
_DTYPES = {"float32": "F32", "float16": "F16", "float64": "F64", "int64": "I64", "int32": "I32", "int16": "I16",
           "int8": "I8", "uint8": "U8", "uint16": "U16", "bool": "BOOL"}
_NUMPY = {v: k for k, v in _DTYPES.items()}


MAX_HEADER = 100 << 20  # the safetensors specification's bound on the JSON header


class PortableError(CheckpointError):
    """A file of the portable format is not what it should be (the message names it and the defect)."""


def group_of(key: str, parameters: Iterable[str]) -> str:
    """The file group of structured key `key`: its parameter's structured name, or RUN_GROUP."""
    params = parameters if isinstance(parameters, (set, frozenset, dict)) else set(parameters)
    if key in params:
        return key
    for cut in range(len(key) - 1, 0, -1):
        if key[cut] in "_@" and key[:cut] in params:
            return key[:cut]
    return RUN_GROUP


def file_name(group: str) -> str:
    """`tensors/<group>.safetensors` (structured names are dotted identifiers: safe as file names)."""
    if "/" in group or group in ("", ".", ".."):
        raise PortableError(f"{group!r} cannot name a file")
    return f"{TENSORS}/{group}{SUFFIX}"


def share(groups: Sequence[str], rank: int, world_size: int) -> List[str]:
    """The groups rank `rank` writes when every rank holds the same state: every world_size-th of
    them in sorted order (so all ranks write about as much, in parallel); RUN_GROUP goes to rank 0."""
    ordered = sorted(g for g in groups if g != RUN_GROUP)
    mine = ordered[rank::world_size]
    return ([RUN_GROUP] if rank == 0 and RUN_GROUP in groups else []) + mine


def write_file(path: os.PathLike, tensors: Mapping[str, np.ndarray], *, metadata: Optional[Mapping[str, str]] = None
               ) -> Dict[str, object]:
    """Write one safetensors file; returns {"size", "sha1"} computed while writing."""
    header: Dict[str, object] = {}
    offset = 0
    arrays = []
    for key in sorted(tensors):
        array = np.asarray(tensors[key])
        if not array.flags.c_contiguous:  # (np.ascontiguousarray would turn a 0-d array into 1-d)
            array = array.copy(order="C")
        dtype = str(array.dtype)
        if dtype not in _DTYPES:
            raise PortableError(f"{key}: dtype {dtype} has no safetensors code")
        if array.dtype.byteorder == ">":
            array = array.astype(array.dtype.newbyteorder("<"))
        header[key] = {"dtype": _DTYPES[dtype], "shape": list(array.shape),
                       "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
        arrays.append(array)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned
    digest = hashlib.sha1()
    path = Path(path)
    with open(path, "wb") as f:
        for block in (struct.pack("<Q", len(raw)), raw):
            f.write(block)
            digest.update(block)
        for array in arrays:
            view = array.reshape(-1).view(np.uint8).data if array.size else memoryview(b"")
            f.write(view)
            digest.update(view)
        f.flush()
        if os.environ.get("ERNIE_MTL_BENCH_NOFSYNC") != "1":
            os.fsync(f.fileno())
    return {"size": path.stat().st_size, "sha1": digest.hexdigest()}


def read_header(path: os.PathLike) -> Tuple[Dict[str, dict], int]:
    """(header without __metadata__, offset of the data) of a safetensors file, every entry checked: a
    known dtype, a shape of non-negative integers, data offsets inside the file that hold exactly the
    shape's bytes. PortableError naming the file and the defect otherwise (a garbage header whose
    checksums were recomputed is still refused, before any tensor is read)."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) != 8:
                raise PortableError(f"{path}: shorter than a safetensors header")
            (n,) = struct.unpack("<Q", head)
            if n > size - 8 or n > MAX_HEADER:
                raise PortableError(f"{path}: header length {n} beyond the file's {size} bytes (or the format's "
                                    f"{MAX_HEADER} bytes)")
            header = loads_json_bounded(f.read(n).decode("utf-8"), source=f"{path}'s header")
    except (UnicodeDecodeError, ValueError) as e:
        if isinstance(e, PortableError):
            raise
        raise PortableError(f"{path}: damaged safetensors header ({str(e)[:200]})") from None
    if not isinstance(header, dict):
        raise PortableError(f"{path}: damaged safetensors header (not a JSON object)")
    header.pop("__metadata__", None)
    data_size = size - 8 - n
    for key, entry in header.items():
        why = _entry_problem(entry, data_size)
        if why:
            raise PortableError(f"{path}: damaged safetensors header: tensor {key!r} {why}")
    return header, 8 + n


def _entry_problem(entry, data_size: int) -> str:
    """What is wrong with one header entry ('' when nothing)."""
    if not isinstance(entry, dict):
        return f"is described by {type(entry).__name__}, not an object"
    dtype = entry.get("dtype")
    if dtype not in _NUMPY:
        return f"has the unknown dtype {dtype!r}"
    shape, offsets = entry.get("shape"), entry.get("data_offsets")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        return f"has the shape {shape!r:.80}, not a list of non-negative integers"
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) and not isinstance(o, bool)
                                                                      for o in offsets)):
        return f"has the data offsets {offsets!r:.80}, not [begin, end]"
    begin, end = offsets
    if not 0 <= begin <= end <= data_size:
        return f"has its bytes at {begin}..{end}, outside the file's {data_size} bytes of data (truncated?)"
    expected = int(np.prod(shape, dtype=np.int64)) * np.dtype(_NUMPY[dtype]).itemsize
    if end - begin != expected:
        return f"has {end - begin} bytes for the shape {shape} of {dtype} ({expected} bytes)"
    return ""


def read_file(path: os.PathLike, keys: Optional[Iterable[str]] = None) -> Dict[str, np.ndarray]:
    """Arrays of one safetensors file (all, or `keys`), memory-mapped read-only views copied out."""
    header, start = read_header(path)
    wanted = set(header) if keys is None else set(keys) & set(header)
    out: Dict[str, np.ndarray] = {}
    if not wanted:
        return out
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        data: Any = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        try:
            for key in sorted(wanted):
                entry = header[key]
                begin, end = entry["data_offsets"]
                dtype = np.dtype(_NUMPY[entry["dtype"]])
                if start + end > size:
                    raise PortableError(f"{path}: {key}'s bytes {begin}..{end} are beyond the file (truncated?)")
                out[key] = np.frombuffer(data, dtype=dtype.newbyteorder("<"), count=(end - begin) // dtype.itemsize,
                                         offset=start + begin).reshape(tuple(entry["shape"])).astype(dtype, copy=True)
        finally:
            if size:
                data.close()
    return out


def tensor_files(checkpoint: os.PathLike) -> List[Path]:
    return sorted((Path(checkpoint) / TENSORS).glob(f"*{SUFFIX}"))


def read_tensors(checkpoint: os.PathLike, keys: Optional[Iterable[str]] = None, *,
                 name_map: Optional[Mapping[str, str]] = None) -> Dict[str, np.ndarray]:
    """Every tensor of a portable checkpoint by structured key (or the `keys` among them). Verify the
    checkpoint first (the store's `verify_files`: it also refuses tensor files the checkpoint does not
    list). With the checkpoint's `name_map`, keys come back under the canonical name of their variable
    (a file written under another alias of it reads the same), and a key found in another variable's file
    is refused; a key in two files is refused either way."""
    from ernie_mtl.checkpoint.reshard import canonical_names

    canon = canonical_names(name_map) if name_map else {}
    every = set(canon)
    wanted = None if keys is None else set(keys)
    out: Dict[str, np.ndarray] = {}
    seen: Dict[str, Path] = {}
    for file in tensor_files(checkpoint):
        stem = file.name[:-len(SUFFIX)]
        got = read_file(file)
        if canon:
            renamed = {}
            for key, array in got.items():
                group = group_of(key, every)
                if canon.get(group, group) != canon.get(stem, stem):
                    raise PortableError(f"{file} holds {key!r}, which belongs to {group!r}'s file, not {stem!r}'s: "
                                        "the tensor files were edited or mixed up")
                renamed[canon[group] + key[len(group):] if group in canon else key] = array
            got = renamed
        twice = sorted(set(got) & set(out))
        if twice:
            raise PortableError(f"{twice[0]!r} is in both {seen[twice[0]]} and {file}: the tensor files were edited "
                                "or mixed up")
        seen.update({k: file for k in got})
        out.update(got)
    if canon:  # every variable of the name map has its tensor: a file removed (and unlisted) is damage
        absent = sorted(set(canon.values()) - set(out))
        if absent:
            raise PortableError(f"{checkpoint} lacks the tensors of {len(absent)} variable(s) its name map lists "
                                f"({', '.join(absent[:3])}{' ...' if len(absent) > 3 else ''}): a tensor file is "
                                f"missing from {Path(checkpoint) / TENSORS}; the checkpoint is damaged")
    return out if wanted is None else {k: v for k, v in out.items() if k in wanted}


def describe(checkpoint: os.PathLike) -> List[str]:
    """One line per tensor: key, dtype, shape, file (what `ernie-mtl-reshard --inspect` prints)."""
    lines = []
    total = 0
    for file in tensor_files(checkpoint):
        header, _ = read_header(file)
        for key in sorted(header):
            e = header[key]
            total += e["data_offsets"][1] - e["data_offsets"][0]
            lines.append(f"{key}  {e['dtype']}  {e['shape']}  {file.relative_to(Path(checkpoint))}")
    lines.append(f"{len(lines)} tensors, {total / 2**20:.1f} MiB in {len(tensor_files(checkpoint))} files")
    return lines


def write_groups(folder: os.PathLike, groups: Mapping[str, Mapping[str, np.ndarray]]) -> Dict[str, Dict[str, object]]:
    """Write `groups` ({group: {key: array}}) under `folder`/tensors; returns their `files` entries
    ({relative path: {size, sha1}})."""
    folder = Path(folder)
    (folder / TENSORS).mkdir(parents=True, exist_ok=True)
    return {file_name(g): write_file(folder / file_name(g), tensors) for g, tensors in sorted(groups.items())}


def grouped(state: Mapping[str, np.ndarray], parameters: Iterable[str]) -> Dict[str, Dict[str, np.ndarray]]:
    """A structured state ({key: array}) grouped by file: {group: {key: array}}."""
    params = set(parameters)
    out: Dict[str, Dict[str, np.ndarray]] = {}
    for key, array in state.items():
        out.setdefault(group_of(key, params), {})[key] = array
    return out
