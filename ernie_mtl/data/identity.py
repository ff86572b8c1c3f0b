"""The identity of a task's training data, for the resume check (data_tools/identity.py explains it).

A `.bin/.idx` corpus prefix or a weighted mixture of corpora: the identity of each corpus's two
files (and its weight); any other file: its own identity.
"""
from __future__ import annotations

import os
from typing import Any, Optional

from data_tools.identity import content_identity
from ernie_mtl.config import ConfigError


def data_identity(spec: Optional[Any]) -> Optional[Any]:
    if spec is None:
        return None
    if isinstance(spec, str) and os.path.isfile(spec):
        return content_identity(spec)
    from ernie_mtl.data.mixture import parse_mixture

    try:
        mixture = parse_mixture(spec)
    except ConfigError:
        return {"unreadable": str(spec)}
    return [{"weight": c.weight, "prefix": c.prefix, "bin": content_identity(c.prefix + ".bin"),
             "idx": content_identity(c.prefix + ".idx")} for c in mixture]
