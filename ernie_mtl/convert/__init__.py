"""Checkpoint or exported task model -> PaddleNLP dygraph weights, verified numerically
(`static_to_dynamic.py` and the `ernie-mtl-convert` command are `convert.cli`)."""
from ernie_mtl.convert.converter import (ConvertError, Difference, Result, Source, VerificationError,  # noqa: F401
                                         convert, read_source, verify)
