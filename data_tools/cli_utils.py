"""Small helpers shared by the command-line tools."""
from __future__ import annotations

import argparse

_TRUE = {"1", "true", "t", "yes", "y", "on"}
_FALSE = {"0", "false", "f", "no", "n", "off"}


def str2bool(value) -> bool:
    """Parse a boolean flag value. Use with `nargs="?", const=True` so that a bare `--flag`
    enables it and `--flag true/false` both work (PaddleNLP's `const=False` turned a bare
    `--use_amp` *off*)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (true/false, 1/0, yes/no), got {value!r}")
