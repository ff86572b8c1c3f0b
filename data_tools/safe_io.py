"""Reading a file the user named, with bounds: never blocking, never unbounded.

Every file the project reads on a user's say-so (a YAML configuration, a vocabulary, a kernel cache, a
checkpoint's JSON and tensor headers) can be something other than what it should be: a FIFO, whose
`open()` blocks until some writer appears (a start-up that hangs forever), a device (`/dev/zero`: an
endless read), a folder, a file of gigabytes, or JSON nested a hundred thousand levels deep (Python's
parser raises RecursionError). These functions refuse each with `UnsafeFile` (a ValueError) naming the
path and what it is, before reading a byte more than allowed:

- the path is checked with `stat` and opened with `O_NONBLOCK`, then checked again on the open
  descriptor (`fstat`): a FIFO swapped in between the two cannot block the read;
- a regular file larger than `max_bytes` is refused by its size, and the read stops at `max_bytes + 1`
  bytes whatever the size says (a file growing meanwhile);
- JSON that nests too deeply is refused instead of raising RecursionError.

Callers turn `UnsafeFile` into their own error (a ConfigError naming the flag, a note about a cache).
This module imports nothing of the project (data_tools never imports ernie_mtl).
"""
from __future__ import annotations

import json
import os
import stat
from typing import Any

_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"))


class UnsafeFile(ValueError):
    """A path that is not a regular file of a sane size. `special`: it is a FIFO, device or socket
    (callers must not replace it either: it may be someone else's pipe)."""

    def __init__(self, message: str, *, special: bool = False):
        super().__init__(message)
        self.special = special


def kind_of(mode: int) -> str:
    """'a FIFO (named pipe)', 'a folder', ... or '' for a regular file."""
    for test, name in _KINDS:
        if test(mode):
            return name
    return "" if stat.S_ISREG(mode) else "not a regular file"


def _refuse_kind(path: os.PathLike, mode: int, what: str) -> None:
    kind = kind_of(mode)
    if kind:
        special = not stat.S_ISDIR(mode)
        raise UnsafeFile(f"{what} {os.fspath(path)} is {kind}, not a regular file", special=special)


def check_regular(path: os.PathLike, *, what: str = "file") -> os.stat_result:
    """The `stat` of `path`, which must be a regular file (FileNotFoundError when missing)."""
    st = os.stat(path)
    _refuse_kind(path, st.st_mode, what)
    return st


def read_bytes_bounded(path: os.PathLike, *, max_bytes: int, what: str = "file") -> bytes:
    """The bytes of the regular file `path`, at most `max_bytes` (module docstring)."""
    check_regular(path, what=what)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        st = os.fstat(fd)
        _refuse_kind(path, st.st_mode, what)
        if st.st_size > max_bytes:
            raise UnsafeFile(f"{what} {os.fspath(path)} is {st.st_size:,} bytes, more than the {max_bytes:,} such a "
                             "file can sensibly hold")
        chunks, total = [], 0
        while total <= max_bytes:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > max_bytes:
            raise UnsafeFile(f"{what} {os.fspath(path)} grew past {max_bytes:,} bytes while it was read")
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_text_bounded(path: os.PathLike, *, max_bytes: int, what: str = "file", encoding: str = "utf-8",
                      errors: str = "strict") -> str:
    """The text of `path` (see `read_bytes_bounded`); a decoding error is a ValueError naming the path."""
    data = read_bytes_bounded(path, max_bytes=max_bytes, what=what)
    try:
        return data.decode(encoding, errors)
    except UnicodeDecodeError as e:
        raise ValueError(f"{what} {os.fspath(path)} is not {encoding} text (byte {e.start}: {e.reason})") from None


def loads_json_bounded(text: str, *, source: str = "JSON") -> Any:
    """`json.loads`, with nesting too deep for Python's parser as a ValueError naming `source`."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError(f"{source} is nested too deeply to be read (not a file this project writes)") from None


def read_json_bounded(path: os.PathLike, *, max_bytes: int, what: str = "JSON file") -> Any:
    """The JSON value of `path`, read with `read_text_bounded` and `loads_json_bounded`."""
    text = read_text_bounded(path, max_bytes=max_bytes, what=what)
    return loads_json_bounded(text, source=f"{what} {os.fspath(path)}")
