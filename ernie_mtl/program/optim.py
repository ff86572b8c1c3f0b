"""AdamW with weight decay by parameter role, idle-parameter freezing, global-norm clipping, and the LR schedule."""
from __future__ import annotations

from typing import Dict, Iterable, List, Mapping, Optional, Set

import paddle
from paddle.optimizer.lr import LRScheduler

from ernie_mtl.config import OptimConfig

# Layers whose parameters are normalisation scales and shifts (never decayed), by class name so
# that paddlenlp's and users' own norm layers count too.
_NORM_LAYER_SUFFIXES = ("Norm", "Norm1D", "Norm2D", "Norm3D")


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
    into the program on every run. For an exact resume save `state_dict()` (last_epoch, last_lr,
    and any re-plan) after the step's `step()` and restore it with `set_state_dict()`.

    Re-planning (`replan`): when a multi-task run becomes shorter than planned (a target stopped
    early), the decay is re-aimed at the new end: from the update after step s, the rate falls
    linearly from lr_at(s) (the rate of update s) to min_lr at the new horizon D', and stays there;
    updates up to s are unchanged. Several re-plans chain (each starts from the current rate).

    Another global batch (`rebase`, --allow_batch_change): the schedule is kept in the units of the
    run's first global batch ("data units": samples, or micro-batches in multi-task runs, divided by
    that batch). From the step s where the batch changed, step n is at x(n) = x(s) + (n - s) * ratio
    data units, ratio = new batch / first batch, and its rate is the original schedule's at x(n):
    warm-up and decay keep their positions in the data, not in steps. Chained changes compose.
    """

    def __init__(self, cfg: OptimConfig, last_epoch: int = -1):
        self.max_lr = cfg.max_lr
        self.min_lr = cfg.min_lr
        self.warmup_steps = cfg.resolved_warmup_steps
        self.decay_steps = cfg.resolved_decay_steps
        self.replan_step: Optional[float] = None  # last step computed with the previous plan (data units)
        self.replan_lr: Optional[float] = None
        self.clock: Optional[List[float]] = None  # [step s, x(s), ratio] after a change of global batch
        super().__init__(learning_rate=cfg.max_lr, last_epoch=last_epoch)

    def state_keys(self) -> None:
        self.keys = ["last_epoch", "last_lr", "decay_steps", "replan_step", "replan_lr", "warmup_steps", "clock"]

    def at(self, step: int) -> float:
        """Step `step` in data units (module docstring of `rebase`): the step itself without a batch change."""
        if self.clock is None:
            return step
        base, x, ratio = self.clock
        return x + (step - base) * ratio

    def _planned(self, step: float) -> float:
        if self.replan_step is None or step <= self.replan_step:
            return lr_at(step, max_lr=self.max_lr, min_lr=self.min_lr, warmup_steps=self.warmup_steps,
                         decay_steps=self.decay_steps)
        span = max(self.decay_steps - self.replan_step - 1, 1)
        progress = min((step - self.replan_step) / span, 1.0)
        return self.replan_lr + (self.min_lr - self.replan_lr) * progress

    def get_lr(self) -> float:
        return self._planned(self.at(self.last_epoch))

    def replan(self, new_total_steps: int) -> None:
        """Aim the decay at `new_total_steps` optimizer steps, from the next update on (see the class
        docstring). The current rate (already fed for the coming update) is kept."""
        horizon = self.at(new_total_steps)
        if horizon == self.decay_steps:
            return
        self.replan_lr = float(self.last_lr)
        self.replan_step = self.at(self.last_epoch)
        self.decay_steps = horizon

    def rebase(self, step: int, ratio: float) -> None:
        """The global batch becomes `ratio` times what it was at step `step` (the current step count of
        a restored state): from here a step advances the schedule by that many of the previous steps."""
        x = self.at(step)
        previous = 1.0 if self.clock is None else float(self.clock[2])
        self.clock = [int(step), float(x), previous * float(ratio)]
        self.last_lr = self.get_lr()

    def set_state_dict(self, state_dict) -> None:
        state = {"decay_steps": self.decay_steps, "replan_step": None, "replan_lr": None,
                 "warmup_steps": self.warmup_steps, "clock": None, **dict(state_dict)}
        super().set_state_dict(state)


def make_lr_schedule(cfg: OptimConfig) -> WarmupLinearDecay:
    """The run's learning-rate schedule (the one place it is chosen): linear warm-up, linear decay to
    `min_lr` at the resolved decay horizon, re-plannable when a run ends early."""
    return WarmupLinearDecay(cfg)


def no_decay_parameters(layers: Iterable) -> Set[str]:
    """Static names of the parameters that get no weight decay, by their role in `layers`
    (paddle.nn.Layer objects, inspected while the program is built): biases (a layer's parameter
    held as `bias` or `*_bias`) and every parameter of a normalisation layer (LayerNorm scale and
    shift, ...). Decided by role, not by name: a task called `debias` or `normalize` keeps weight
    decay on its head's weights (PaddleNLP's and HF's substring rule would drop it). A layer may also
    list static names in `no_weight_decay` (the PALM face's holders of parameters a `build` created,
    decided by PALM's name rule)."""
    out: Set[str] = set()
    for layer in layers:
        out.update(getattr(layer, "no_weight_decay", ()))
        for _, sub in layer.named_sublayers(include_self=True):
            is_norm = type(sub).__name__.endswith(_NORM_LAYER_SUFFIXES)
            for attr, param in sub.named_parameters(include_sublayers=False):
                if is_norm or attr == "bias" or attr.endswith("_bias"):
                    out.add(param.name)
    return out


class FreezableAdamW(paddle.optimizer.AdamW):
    """AdamW whose update of some parameters can be skipped per step by a CPU bool flag
    (ernie_mtl/program/idle_heads.py): `skip_flags` maps a static parameter name to its flag variable,
    which becomes the adamw op's `SkipUpdate` (OR-ed with AMP's found_inf when loss scaling is on).
    A skipped adamw op leaves the parameter, moments, beta powers and master weight unchanged."""

    def __init__(self, *args, skip_flags: Optional[Mapping[str, str]] = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._skip_flags: Dict[str, str] = dict(skip_flags or {})
        self._skip_vars: Dict = {}

    def _append_optimize_op(self, block, param_and_grad):
        flag = self._skip_flags.get(param_and_grad[0].name) if isinstance(param_and_grad, (tuple, list)) else None
        if flag is None:
            return super()._append_optimize_op(block, param_and_grad)
        from ernie_mtl.program.idle_heads import skip_update_var

        found_inf = self._get_auxiliary_var("found_inf")
        self._set_auxiliary_var("found_inf", skip_update_var(block, flag, found_inf, self._skip_vars))
        try:
            return super()._append_optimize_op(block, param_and_grad)
        finally:
            self._set_auxiliary_var("found_inf", found_inf)


def make_optimizer(cfg: OptimConfig, name_map: Mapping[str, str], lr_scheduler: LRScheduler, *,
                   no_decay: Iterable[str] = (), skip_flags: Optional[Mapping[str, str]] = None,
                   multi_precision: bool = False) -> FreezableAdamW:
    """AdamW driven by `lr_scheduler`, decay on every parameter of `name_map` but `no_decay`
    (`no_decay_parameters`), idle-parameter flags `skip_flags`, and global-norm clipping when
    `cfg.grad_clip > 0`. `multi_precision` (AMP O2): keep fp32 master weights and update them,
    instead of accumulating into the float16 parameters."""
    decay = set(name_map.values()) - set(no_decay)
    clip = paddle.nn.ClipGradByGlobalNorm(cfg.grad_clip) if cfg.grad_clip > 0 else None
    return FreezableAdamW(
        learning_rate=lr_scheduler, beta1=cfg.adam_beta1, beta2=cfg.adam_beta2, epsilon=cfg.adam_epsilon,
        weight_decay=cfg.weight_decay, grad_clip=clip, apply_decay_param_fun=lambda name: name in decay,
        multi_precision=multi_precision, skip_flags=skip_flags)
