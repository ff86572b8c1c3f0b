"""PaddlePALM's `palm.downloader`: ernie_mtl downloads nothing; `download` says how to get a model instead."""
from __future__ import annotations

from ernie_mtl.config import ConfigError


def download(item, scope="all", path="."):
    """Refused: nothing is downloaded at run time. Put a model where the script expects it."""
    raise ConfigError([f"palm.downloader.download({item!r}, {scope!r}, {path!r}): ernie_mtl downloads nothing. Copy "
                       "a pretrained model to the machine instead: an ERNIE 1.0 / PALM folder "
                       "(<name>/params/, vocab.txt, ernie_config.json: load_pretrain('<name>/params')) or a PaddleNLP "
                       "directory written by save_pretrained() (load_pretrain('<dir>')); see docs/palm.md"])


def ls(item="all", scope="all"):
    """Nothing is available for download; returns an empty list."""
    print("ernie_mtl downloads nothing: copy pretrained models to the machine (docs/palm.md)")
    return []


__all__ = ["download", "ls"]
