"""The checkpoint package's error: a checkpoint cannot be written, found, read or resumed from. Its own
module so that every module of the package (the store, the portable format, resharding) raises the same
type without importing the store."""
from __future__ import annotations

from data_tools.cli_utils import UserError


class CheckpointError(UserError):
    """A checkpoint cannot be written, found or resumed from (the message says which and why)."""
