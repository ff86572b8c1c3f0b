"""PaddlePALM's optimizer (`palm.optimizer.Adam`): the engine's AdamW with PALM's settings.

`Adam(loss_var, lr, lr_schedualer)` sets the peak learning rate and the schedule; the weight decay
comes from `Trainer.build_backward(weight_decay=...)` (PALM's decoupled decay, like AdamW's), and
gradients are not clipped unless `grad_clip` is given (PALM's `_build(grad_clip)` argument, never
passed by its trainer).
"""
from __future__ import annotations

from typing import Any, Dict, Optional


class Optimizer:
    """PALM's `Optimizer` base."""

    def __init__(self, loss_var, lr, lr_schedualer=None):
        if not isinstance(lr, (int, float)) or isinstance(lr, bool) or lr <= 0:
            raise ValueError(f"lr {lr!r}: the learning rate, a number > 0")
        self._loss = loss_var
        self._lr = float(lr)
        self._lr_schedualer = lr_schedualer

    def get_cur_learning_rate(self) -> float:
        """The peak learning rate (the engine logs the rate of every step as `lr`)."""
        return self._lr

    def flags(self) -> Dict[str, Any]:
        raise NotImplementedError


class Adam(Optimizer):
    """Adam(W): beta1 0.9, beta2 0.999, epsilon 1e-8 (PALM's); `grad_clip`: clip by global norm (None: off)."""

    def __init__(self, loss_var, lr, lr_schedualer=None, grad_clip: Optional[float] = None):
        super().__init__(loss_var, lr, lr_schedualer)
        if grad_clip is not None and not grad_clip > 0:
            raise ValueError(f"grad_clip {grad_clip!r}: a global norm > 0, or None")
        self._grad_clip = grad_clip

    def flags(self) -> Dict[str, Any]:
        """--max_lr, --grad_clip, --adam_* and the schedule's flags."""
        out = {"max_lr": self._lr, "grad_clip": float(self._grad_clip or 0.0), "adam_beta1": 0.9,
               "adam_beta2": 0.999, "adam_epsilon": 1e-8}
        if self._lr_schedualer is None:  # constant rate (PALM without a scheduler)
            out.update(warmup_steps=0, min_lr=self._lr)
        else:
            out.update(self._lr_schedualer.flags(self._lr))
        return out


__all__ = ["Optimizer", "Adam"]
