"""Writes that are never seen half-done: a temporary name in the same folder, flushed and fsynced,
then renamed over the final name (and the folder fsynced). Every JSON and state file the project
writes goes through `write_json_atomic`; folders are swapped into place with `replace_dir`."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any, Union


def write_json_atomic(path: Union[str, os.PathLike], data: Any, *, indent: int = 2, sort_keys: bool = True) -> Path:
    """`data` as UTF-8 JSON at `path` (its folder created), atomically and durably."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=indent, sort_keys=sort_keys, ensure_ascii=False, default=str)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def replace_dir(tmp: os.PathLike, final: os.PathLike) -> None:
    """Swap the complete folder `tmp` into place as `final`: the previous `final` stays whole under a
    backup name until the new one is in place (and is put back if the swap fails), then goes."""
    tmp, final = Path(tmp), Path(final)
    backup = final.with_name(f".{final.name}.old")
    shutil.rmtree(backup, ignore_errors=True)
    if final.exists():
        os.rename(final, backup)
    try:
        os.rename(tmp, final)
    except OSError:
        if backup.exists() and not final.exists():
            os.rename(backup, final)  # the previous folder back in place
        raise
    fsync_dir(final.parent)
    shutil.rmtree(backup, ignore_errors=True)


def fsync_dir(path: os.PathLike) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha1_of(path: os.PathLike) -> str:
    digest = hashlib.sha1()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()
