"""What parsing a configuration needs from the layers above config, handed in by the caller.

config/ is a leaf: it imports nothing of ernie_mtl above it. Some of what a configuration means is
known only above: which task types exist (and their option keys), which plugin files register
more, what a corpus specification resolves to, whether the topology fits the launcher's world or
a checkpoint path is complete. The parser asks a `ParseHooks` object for those; the engine's
(ernie_mtl/engine/config_checks.py) is the one the command line and the Python API pass, so every
problem is still reported at once.
"""
from __future__ import annotations

from typing import Any, List, Optional, Protocol, Sequence


class ParseHooks(Protocol):
    def task_type(self, reader: str) -> Any:
        """The registered TaskType class of `reader: <name>`; ConfigError for an unknown name."""

    def import_plugins(self, paths: Sequence[str], *, where: str) -> List[str]:
        """Import plugin files (registering their task types and callbacks); one problem per failure."""

    def corpus_spec(self, value: Any, *, what: str, base_dir: Optional[str] = None) -> Any:
        """The canonical form of a corpus specification: the absolute prefix of a lone corpus, else
        [[weight, absolute prefix], ...]; ConfigError naming `what` when it cannot be read."""

    def check(self, cfg: Any, *, world_size: Optional[int] = None) -> List[str]:
        """The checks of a parsed RunConfig that need the layers above config (data, topology, device,
        checkpoints, plugins); one problem per item."""
