"""The whole run's configuration: one typed slice per component, and the tasks."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Dict

from ernie_mtl.config.model import ModelConfig
from ernie_mtl.config.multitask import MultiTaskSetup
from ernie_mtl.config.slices import AmpConfig, DataConfig, OptimConfig, ParallelConfig, TrainConfig


@dataclass(frozen=True)
class RunConfig:
    """The whole run, one slice per component; `setup` holds the tasks (a flag-mode pretraining run
    is the one task `pretrain`, built from the PaddleNLP flags by ernie_mtl/config/cli.py)."""

    model: ModelConfig
    parallel: ParallelConfig
    amp: AmpConfig
    optim: OptimConfig
    data: DataConfig
    train: TrainConfig
    setup: MultiTaskSetup

    @property
    def flag_mode(self) -> bool:
        """Pretraining from PaddleNLP flags (logs, tags and messages as before the one engine)."""
        return self.setup.flag_mode

    def to_dict(self) -> Dict[str, Dict[str, Any]]:
        """JSON-friendly `{slice: {field: value}}` plus `mtl` (stored in checkpoints)."""
        return {**{name: asdict(getattr(self, name)) for name in SLICES}, "mtl": self.setup.mtl.to_dict()}


SLICES: Dict[str, type] = {"model": ModelConfig, "parallel": ParallelConfig, "amp": AmpConfig,
                           "optim": OptimConfig, "data": DataConfig, "train": TrainConfig}
