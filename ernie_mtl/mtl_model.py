"""Build (never run) the multi-task static programs: train (fleet), evaluation, and a plain forward.

`main` is the multi-task forward of ernie_mtl/mtl_forward.py (shared backbone, every head,
gated losses) minimized by AdamW through fleet (data parallel, sharding, AMP, gradient merge,
recompute, exactly as for pretraining); `test` is its forward part with dropout off (it carries
fleet's rewrites, e.g. sharding's broadcasts: every rank runs it together); `forward` is the same
network built again without fleet or optimizer, for exporting inference models. All three use the
same static parameter names, because they are built in the same order under a fresh
`unique_name.guard()`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Union

import paddle
from paddle.utils import unique_name

from ernie_mtl.config import AmpConfig, ModelConfig, OptimConfig
from ernie_mtl.ema import DeviceEMA
from ernie_mtl.idle_heads import FreezePlan, check_coverage, plan_freeze
from ernie_mtl.model import (StrategyBuilder, WarmupLinearDecay, _drop_untied_duplicates, _forward_only,
                             load_pretrained_into_scope, minimize_with_fleet, prune_unused_forward_ops)
from ernie_mtl.mtl_forward import Forward, HeadGroup, build_multitask_forward
from ernie_mtl.parallel import Topology
from ernie_mtl.randomness import seed_initializers, wire_dropout_seeds
from ernie_mtl.tasks.base import TaskType


@dataclass
class MultiTaskPrograms:
    main: paddle.static.Program
    startup: paddle.static.Program
    test: paddle.static.Program
    forward: paddle.static.Program  # plain forward, no fleet: inference export
    fwd: Forward  # variables of `main` (feeds, losses, predictions)
    export_fwd: Forward  # the same variables in `forward`
    lr: Any
    loss_scaling: Optional[Any]
    lr_scheduler: WarmupLinearDecay
    strategy: Any
    topo: Topology
    arch: Dict[str, Any]
    weights: Any
    amp_level: Optional[str] = None
    dropout_seeds: int = 0  # length of the `dropout_seeds` feed (ernie_mtl/randomness.py)
    freeze: Optional[FreezePlan] = None  # idle parameter groups (ernie_mtl/idle_heads.py)
    ema: Optional[DeviceEMA] = None  # use_ema (ernie_mtl/ema.py)
    _amp_optimizer: Any = None

    @property
    def name_map(self) -> Dict[str, str]:
        return self.fwd.name_map

    @property
    def groups(self) -> List[HeadGroup]:
        return self.fwd.groups

    def initialize(self, exe: paddle.static.Executor, scope: Optional[paddle.static.Scope] = None) -> None:
        """Startup, pretrained backbone weights (a PaddleNLP directory), AMP O2's cast, the EMA's
        zeros, in that order."""
        scope = scope or paddle.static.global_scope()
        exe.run(self.startup, scope=scope)
        if self.weights is not None:
            backbone = {k: v for k, v in self.name_map.items() if not k.startswith("heads.")}
            load_pretrained_into_scope(self.weights, backbone, scope, program=self.main, place=exe.place)
        if self.amp_level == "O2":
            self._amp_optimizer.amp_init(exe.place, scope=scope)
        if self.ema is not None:
            self.ema.initialize(exe, scope=scope)


def build_multitask_programs(model_cfg: ModelConfig, optim_cfg: OptimConfig, strategy: Union[StrategyBuilder, Any],
                             topo: Topology, tasks: Sequence[TaskType], *, seed: int,
                             amp_cfg: Optional[AmpConfig] = None, use_task_id: bool = False,
                             ema_decay: Optional[float] = None) -> MultiTaskPrograms:
    """The multi-task programs (fleet initialised first, static mode; see model.build_pretrain_programs
    for `strategy`, `seed` and AMP). `optim_cfg.max_steps` must be the planned number of optimizer
    steps (the LR schedule's horizon). `ema_decay`: keep an EMA of the weights on the device.

    Besides the network: dropout seeds fed per micro-batch (ernie_mtl/randomness.py), idle
    parameter groups frozen through AdamW's SkipUpdate (ernie_mtl/idle_heads.py; the build fails
    if the freeze does not cover a group's whole optimizer state), and the prediction-only ops
    (argmax, probabilities, the CRF's Viterbi decode) removed from the training program after the
    evaluation program was taken from it."""
    resolved = model_cfg.resolve()
    optim_cfg.validate()
    amp_cfg = amp_cfg or AmpConfig()
    amp_cfg.validate()
    arch = {k: v for k, v in resolved.arch.items() if k != "model_type"}
    main, startup = paddle.static.Program(), paddle.static.Program()
    startup.random_seed = seed  # per-parameter seeds are set below; main's stays 0 (ernie_mtl/randomness.py)
    with paddle.static.program_guard(main, startup), unique_name.guard():
        fwd = build_multitask_forward(model_cfg.model_type, arch, tasks, use_task_id=use_task_id)
        _drop_untied_duplicates(main, startup, set(fwd.name_map.values()))
        n_seeds = wire_dropout_seeds(main)
        freeze = plan_freeze(main, fwd.task_losses, fwd.name_map)
        minimized = minimize_with_fleet(fwd.loss, fwd.name_map, optim_cfg, strategy, amp_cfg,
                                        fwd.recompute_checkpoints, no_decay=fwd.no_decay,
                                        skip_flags=freeze.param_flags)
        test = _forward_only(main, fwd.loss)
    check_coverage(main, freeze)
    prune_unused_forward_ops(main, keep=[v.name for v in fwd.task_losses.values()] + [fwd.loss.name])
    seed_initializers(startup, fwd.name_map, seed)
    ema = DeviceEMA(main, sorted(set(fwd.name_map.values())), ema_decay) if ema_decay is not None else None
    forward, export_fwd = build_forward_program(model_cfg.model_type, arch, tasks, seed=seed, use_task_id=use_task_id)
    if export_fwd.name_map != fwd.name_map:  # the export would read other parameters: never expected
        raise RuntimeError("the export program's parameter names differ from the training program's")
    return MultiTaskPrograms(
        main=main, startup=startup, test=test, forward=forward, fwd=fwd, export_fwd=export_fwd, lr=minimized.lr_var,
        loss_scaling=minimized.loss_scaling, lr_scheduler=minimized.lr_scheduler, strategy=minimized.strategy,
        topo=topo, arch=resolved.arch, weights=resolved.weights, amp_level=minimized.amp_level,
        dropout_seeds=n_seeds, freeze=freeze, ema=ema, _amp_optimizer=minimized.amp_optimizer)


def build_forward_program(model_type: str, arch: Dict[str, Any], tasks: Sequence[TaskType], *, seed: int = 0,
                          use_task_id: bool = False):
    """(program, Forward): the multi-task forward alone, dropout off (for export and verification)."""
    program, startup = paddle.static.Program(), paddle.static.Program()
    startup.random_seed = seed
    with paddle.static.program_guard(program, startup), unique_name.guard():
        fwd = build_multitask_forward(model_type, arch, tasks, use_task_id=use_task_id)
        _drop_untied_duplicates(program, startup, set(fwd.name_map.values()))
    return program.clone(for_test=True), fwd
