"""PaddlePALM's learning-rate schedules (`palm.lr_sched.*`, PALM's spelling kept, with correctly spelled
aliases), as the engine's warm-up + linear decay (ernie_mtl/program/optim.py).

- `TriangularSchedualer(warmup_steps, num_train_steps)`: linear warm-up over `warmup_steps` optimizer
  steps to the peak rate, then linear decay to 0 at step `num_train_steps`. PALM's formula differed:
  its first step had rate 0, and its decay was `lr * (1 - step / num_train_steps)` measured from step 0,
  so the rate dropped at the end of warm-up (to 0.9 x peak with a 10% warm-up) and never reached the
  peak. Here the peak is reached at the end of warm-up and decay starts from it.
- `WarmupSchedualer(warmup_steps)`: warm-up, then the constant peak rate. PALM defined it with `def`
  instead of `class`, so it returned None and the rate stayed constant from step 0; here it warms up.

A `num_train_steps` shorter than the run leaves the last steps at rate 0 (PALM's multi-task example
did that to a quarter of its run); the trainer says so when the run starts.
"""
from __future__ import annotations

from typing import Any, Dict


class Schedualer:
    """PALM's scheduler base."""

    def flags(self, lr: float) -> Dict[str, Any]:
        raise NotImplementedError


class TriangularSchedualer(Schedualer):
    """Linear warm-up to the peak over `warmup_steps`, linear decay to 0 at `num_train_steps`."""

    def __init__(self, warmup_steps, num_train_steps):
        if not (isinstance(warmup_steps, int) and isinstance(num_train_steps, (int, float))):
            raise TypeError(f"warmup_steps {warmup_steps!r} and num_train_steps {num_train_steps!r} must be numbers "
                            "of optimizer steps")
        if not num_train_steps > warmup_steps > 0:
            raise ValueError(f"TriangularSchedualer needs num_train_steps > warmup_steps > 0, got "
                             f"warmup_steps {warmup_steps}, num_train_steps {num_train_steps}")
        self.warmup_steps = int(warmup_steps)
        self.num_train_steps = int(num_train_steps)

    def flags(self, lr: float) -> Dict[str, Any]:
        return {"warmup_steps": self.warmup_steps, "decay_steps": self.num_train_steps, "min_lr": 0.0}


class WarmupSchedualer(Schedualer):
    """Linear warm-up to the peak over `warmup_steps`, then the peak rate."""

    def __init__(self, warmup_steps):
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 1:
            raise ValueError(f"warmup_steps {warmup_steps!r}: a number of optimizer steps >= 1")
        self.warmup_steps = warmup_steps

    def flags(self, lr: float) -> Dict[str, Any]:
        return {"warmup_steps": self.warmup_steps, "min_lr": lr}


TriangularScheduler = TriangularSchedualer
WarmupScheduler = WarmupSchedualer

__all__ = ["Schedualer", "TriangularSchedualer", "WarmupSchedualer", "TriangularScheduler", "WarmupScheduler"]
