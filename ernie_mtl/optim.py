"""AdamW with the bias/norm weight-decay filter, global-norm clipping, and the LR schedule."""
from __future__ import annotations

from typing import Mapping, Set

import paddle
from paddle.optimizer.lr import LRScheduler

from ernie_mtl.config import OptimConfig

NO_DECAY_MARKERS = ("bias", "norm")


def lr_at(step: int, *, max_lr: float, min_lr: float, warmup_steps: int, decay_steps: int) -> float:
    """Learning rate of the optimizer update that follows `step` completed updates.

    With n = step + 1 (the update's 1-based number): n <= W gives max_lr * n / W (linear warm-up
    that reaches max_lr at update W, so the very first update already learns, unlike PaddleNLP's
    LinearAnnealingWithWarmupDecay whose first update gets 0); W < n <= D decays linearly to
    min_lr at n = D; after D it stays at min_lr.
    """
    n = step + 1
    if n <= warmup_steps:
        return max_lr * n / warmup_steps
    if n >= decay_steps:
        return min_lr
    return min_lr + (max_lr - min_lr) * (decay_steps - n) / (decay_steps - warmup_steps)


class WarmupLinearDecay(LRScheduler):
    """`lr_at` as a Paddle LRScheduler: `last_epoch` counts completed optimizer steps.

    Paddle's LRScheduler.__init__ calls step() once, moving last_epoch from -1 to 0: a fresh
    scheduler therefore holds lr_at(0), the rate of the first update. Call `step()` once per
    optimizer step (every `accumulate_steps` micro-batches). The static executor feeds `last_lr`
    into the program on every run. For an exact resume save `state_dict()` (last_epoch, last_lr)
    after the step's `step()` and restore it with `set_state_dict()`.
    """

    def __init__(self, cfg: OptimConfig, last_epoch: int = -1):
        self.max_lr = cfg.max_lr
        self.min_lr = cfg.min_lr
        self.warmup_steps = cfg.warmup_steps
        self.decay_steps = cfg.resolved_decay_steps
        super().__init__(learning_rate=cfg.max_lr, last_epoch=last_epoch)

    def get_lr(self) -> float:
        return lr_at(self.last_epoch, max_lr=self.max_lr, min_lr=self.min_lr,
                     warmup_steps=self.warmup_steps, decay_steps=self.decay_steps)


def decay_parameter_names(name_map: Mapping[str, str]) -> Set[str]:
    """Static names of the parameters that get weight decay: every parameter none of whose
    structured names mentions a bias or a norm (LayerNorm scales and shifts, all biases)."""
    excluded = {static for structured, static in name_map.items()
                if any(m in structured for m in NO_DECAY_MARKERS)}
    return set(name_map.values()) - excluded


def make_optimizer(cfg: OptimConfig, name_map: Mapping[str, str], lr_scheduler: LRScheduler, *,
                   multi_precision: bool = False) -> paddle.optimizer.AdamW:
    """AdamW driven by `lr_scheduler`, decay filtered by `decay_parameter_names`, and global-norm
    clipping when `cfg.grad_clip > 0`. `multi_precision` (AMP O2): keep fp32 master weights and
    update them, instead of accumulating into the float16 parameters."""
    decay = decay_parameter_names(name_map)
    clip = paddle.nn.ClipGradByGlobalNorm(cfg.grad_clip) if cfg.grad_clip > 0 else None
    return paddle.optimizer.AdamW(
        learning_rate=lr_scheduler, beta1=cfg.adam_beta1, beta2=cfg.adam_beta2, epsilon=cfg.adam_epsilon,
        weight_decay=cfg.weight_decay, grad_clip=clip, apply_decay_param_fun=lambda name: name in decay,
        multi_precision=multi_precision)
