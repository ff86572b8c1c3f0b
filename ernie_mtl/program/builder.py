"""Build (never run) the programs of a run: training (fleet), evaluation, and a plain forward.

One builder for every run: a flag-mode pretraining run is the one task `pretrain`, a multi-task
run has several (ernie_mtl/program/forward.py). `main` is that forward minimized by AdamW through fleet
(data parallel, sharding, AMP, gradient merge, recompute, as the strategy says); `test` is its
forward part with dropout off, taken *after* minimize so it carries fleet's rewrites (sharding's
broadcasts: every rank runs it together; AMP's casts); `forward` is the same network built again
without fleet or optimizer, for exporting inference models. All three use the same static
parameter names, because they are built in the same order under a fresh `unique_name.guard()`;
`Programs.name_map` maps structured names (PaddleNLP's `ernie.*` / `bert.*`, `heads.<group>.*`)
to them: store it with every checkpoint.

Besides the network: dropout seeds fed per micro-batch (ernie_mtl/program/randomness.py), idle parameter
groups frozen through AdamW's SkipUpdate (ernie_mtl/program/idle_heads.py; the build fails if the freeze
does not cover a group's whole optimizer state), the prediction-only ops removed from the training
program, per-parameter initialisation seeds, the EMA programs (ernie_mtl/program/ema.py), and the
per-task loss sums kept on the device so that no micro-batch fetches (ernie_mtl/program/loss_sums.py).

Order of use: `programs = build_programs(...)`; `programs.initialize(exe)` (startup, pretrained
weights, AMP O2 cast, EMA); then `exe.run(programs.main, feed=...)` per micro-batch and
`programs.loss_sums.take(exe)` when the losses are logged.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass, replace, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

import numpy as np
import paddle
from paddle.utils import unique_name

from ernie_mtl.config import MODEL_FAMILIES, AmpConfig, ConfigError, ModelConfig, OptimConfig
from ernie_mtl.dist.console import captured_prints
from ernie_mtl.program.ema import DeviceEMA
from ernie_mtl.program.fused_optimizer import fuse_adamw_ops
from ernie_mtl.program.forward import Forward, HeadGroup, backbone_names, build_forward
from ernie_mtl.program.idle_heads import FreezePlan, check_coverage, plan_freeze, strip_idle_flags
from ernie_mtl.program.loss_sums import LossSums, StateView
from ernie_mtl.program.optim import WarmupLinearDecay, make_lr_schedule, make_optimizer
from ernie_mtl.dist.topology import Topology
from ernie_mtl.program.randomness import seed_initializers, strip_dropout_seeds, wire_dropout_seeds
from ernie_mtl.program.static_params import is_static_params_dir, static_name, structured_state
from ernie_mtl.tasks.base import TaskType
from ernie_mtl.program.anomaly import NORM_ONLY_CLIP, AnomalyGuard, add_anomaly_guard
from ernie_mtl.program.edits import declare_sub_block_inputs, live_blocks
from ernie_mtl.tasks.base import remove_variable
from ernie_mtl.tasks.feeds import TASK_GATE
from ernie_mtl.dist.topology import build_strategy

StrategyBuilder = Callable[..., Any]  # f(*, recompute_checkpoints) -> DistributedStrategy


@dataclass
class Programs:
    """Everything the trainer needs: programs, variables, LR schedule, names, and the on-device state
    helpers (dropout seeds, idle groups, EMA)."""

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
    dropout_seeds: int = 0  # length of the `dropout_seeds` feed (ernie_mtl/program/randomness.py)
    freeze: Optional[FreezePlan] = None  # idle parameter groups (ernie_mtl/program/idle_heads.py)
    ema: Optional[DeviceEMA] = None  # use_ema (ernie_mtl/program/ema.py)
    loss_sums: Optional[LossSums] = None  # per-task loss sums on the device (ernie_mtl/program/loss_sums.py)
    pretrained_heads: Dict[str, str] = field(default_factory=dict)  # e.g. cls.* -> a pretrain head's parameters
    anomaly: Optional[AnomalyGuard] = None  # non-finite updates skipped on the device (program/anomaly.py)
    fused_optimizer: Optional[Dict[str, int]] = None  # --fuse_optimizer: {adamw: fused, fused_adam: ops}
    _amp_optimizer: Any = None

    @property
    def name_map(self) -> Dict[str, str]:
        return self.fwd.name_map

    @property
    def groups(self) -> List[HeadGroup]:
        return self.fwd.groups

    @property
    def state_program(self):
        """`main` as checkpoints save and load it: every persistable variable but the loss sums."""
        return StateView(self.main, self.loss_sums.variables if self.loss_sums is not None else ())

    def initialize(self, exe: paddle.static.Executor, scope: Optional[paddle.static.Scope] = None) -> None:
        """Startup, pretrained backbone weights (a PaddleNLP directory), AMP O2's cast, the EMA's
        zeros, in that order."""
        scope = scope or paddle.static.global_scope()
        exe.run(self.startup, scope=scope)
        if self.weights is not None:
            load_pretrained_into_scope(self.weights, backbone_names(self.name_map), scope, program=self.main,
                                       place=exe.place, optional=self.pretrained_heads)
        if self.amp_level == "O2":
            self._amp_optimizer.amp_init(exe.place, scope=scope)
        if self.ema is not None:
            self.ema.initialize(exe, scope=scope)


def build_programs(model_cfg: ModelConfig, optim_cfg: OptimConfig, strategy: Union[StrategyBuilder, Any],
                   topo: Topology, tasks: Sequence[TaskType], *, seed: int, amp_cfg: Optional[AmpConfig] = None,
                   use_task_id: bool = False, ema_decay: Optional[float] = None,
                   anomaly_guard: bool = False, loss_balance: str = "none",
                   dump_dir: Optional[str] = None) -> Programs:
    """The programs of a run (fleet initialised first: `parallel.init_fleet`, or
    `compat.emulate_gpu_program` for GPU programs on CPU; static mode).

    `strategy` is a `DistributedStrategy`, or a builder `f(*, recompute_checkpoints) -> strategy`
    such as `functools.partial(parallel.build_strategy, topo, parallel_cfg, amp_cfg)`: recompute
    checkpoints (every encoder layer's output) are variables of this forward, so a strategy with
    recompute must come from a builder. `amp_cfg` is needed for what fleet cannot express:
    bfloat16 (the static AMP API) and AMP O2's initial cast (`Programs.initialize`).
    `optim_cfg.max_steps` is the planned number of optimizer steps (the LR schedule's horizon).
    `seed` seeds initialisation (each parameter its own seed, from its structured name) and is the
    base of the dropout seeds fed per micro-batch; give every rank the same seed (data
    parallelism broadcasts rank 0's initial values but sharding keeps each owner's).
    `ema_decay`: keep an EMA of the weights on the device. `anomaly_guard`: skip (and count) an update
    whose global gradient norm is not finite, on the device (ernie_mtl/program/anomaly.py). `loss_balance`:
    how task losses are balanced (ernie_mtl/program/forward.py). `dump_dir`: where fleet's sharding
    optimizer writes its debug text of the programs (`main_sharding_<rank>`, `start_sharding_<rank>`; it
    writes them into the working directory): a run keeps them under `<output_dir>/program_desc`; None
    puts them in a temporary folder, discarded, so a build never leaves files where it was called."""
    import paddle.distributed.fleet as fleet

    if paddle.in_dynamic_mode():
        raise RuntimeError("build_programs needs static mode: call paddle.enable_static() first")
    if fleet.fleet._role_maker is None:
        raise RuntimeError("fleet is not initialised: call ernie_mtl.dist.topology.init_fleet(topo) first")
    if fleet.worker_num() != topo.world_size:
        raise ValueError(f"fleet runs {fleet.worker_num()} workers but the topology has {topo.world_size}")
    resolved = model_cfg.resolve()
    optim_cfg.validate()
    if anomaly_guard and optim_cfg.grad_clip <= 0:  # the guard reads the clip's global norm: compute it anyway
        optim_cfg = replace(optim_cfg, grad_clip=NORM_ONLY_CLIP)
    amp_cfg = amp_cfg or AmpConfig()
    amp_cfg.validate()
    arch = {k: v for k, v in resolved.arch.items() if k != "model_type"}
    main, startup = paddle.static.Program(), paddle.static.Program()
    startup.random_seed = seed  # per-parameter seeds are set below; main's stays 0 (ernie_mtl/program/randomness.py)
    with paddle.static.program_guard(main, startup), unique_name.guard():
        fwd = build_forward(model_cfg.model_type, arch, tasks, use_task_id=use_task_id, loss_balance=loss_balance)
        _drop_untied_duplicates(main, startup, set(fwd.name_map.values()))
        n_seeds = wire_dropout_seeds(main)
        freeze = plan_freeze(main, fwd.balanced or fwd.task_losses, fwd.name_map)
        with _dumps_into(dump_dir):  # only fleet's minimize writes there: task files are read before
            minimized = minimize_with_fleet(fwd.loss, fwd.name_map, optim_cfg, strategy, amp_cfg,
                                            fwd.recompute_checkpoints, no_decay=fwd.no_decay,
                                            skip_flags=freeze.param_flags)
        test = forward_only(main, fwd.loss)
    declare_sub_block_inputs(main)
    check_coverage(main, freeze)
    anomaly = add_anomaly_guard(main, startup) if anomaly_guard else None  # after the check: it only adds skips
    # last of the optimizer's edits: a fused group shares its members' final SkipUpdate
    fused = fuse_adamw_ops(main) if optim_cfg.fuse_optimizer else None
    fetched = [v.name for v in fwd.task_losses.values()] + [fwd.loss.name]
    fetched += [v.name for scalars in fwd.task_scalars.values() for v in scalars.values()]
    prune_unused_forward_ops(main, keep=fetched)
    loss_sums = LossSums(main, startup, fwd.task_losses, fwd.task_scalars, gate=fwd.feed_vars.get(TASK_GATE),
                         lr=minimized.lr_var, loss_scaling=minimized.loss_scaling)
    seed_initializers(startup, fwd.name_map, seed)
    ema = DeviceEMA(main, sorted(set(fwd.name_map.values())), ema_decay) if ema_decay is not None else None
    forward, export_fwd = build_forward_program(model_cfg.model_type, arch, tasks, seed=seed, use_task_id=use_task_id,
                                                loss_balance=loss_balance)
    if export_fwd.name_map != fwd.name_map:  # the export would read other parameters: never expected
        raise RuntimeError("the export program's parameter names differ from the training program's")
    pretrained_heads = {}
    for group in fwd.groups:  # heads that are PaddleNLP's pretraining heads load its `cls.*` weights when present
        first = next(task for task in tasks if task.spec.name == group.tasks[0])
        prefix = getattr(first, "pretrained_head_prefix", None)
        if prefix and not pretrained_heads:
            head = f"heads.{group.name}."
            pretrained_heads = {prefix + k[len(head):]: v for k, v in fwd.name_map.items() if k.startswith(head)}
    return Programs(
        main=main, startup=startup, test=test, forward=forward, fwd=fwd, export_fwd=export_fwd, lr=minimized.lr_var,
        loss_scaling=minimized.loss_scaling, lr_scheduler=minimized.lr_scheduler, strategy=minimized.strategy,
        topo=topo, arch=resolved.arch, weights=resolved.weights, amp_level=minimized.amp_level,
        dropout_seeds=n_seeds, freeze=freeze, ema=ema, loss_sums=loss_sums, pretrained_heads=pretrained_heads,
        anomaly=anomaly, fused_optimizer=fused,
        _amp_optimizer=minimized.amp_optimizer)


@contextlib.contextmanager
def _dumps_into(folder: Optional[str]):
    """The working directory set to `folder` (created), or to a temporary folder removed after, for the
    duration of the block: fleet's sharding optimizer writes its program dumps into the cwd."""
    if folder is not None:
        os.makedirs(folder, exist_ok=True)
        with contextlib.chdir(folder):
            yield
        return
    with tempfile.TemporaryDirectory(prefix="ernie_mtl_fleet_dumps_") as tmp, contextlib.chdir(tmp):
        yield


def build_run_programs(cfg, topo: Topology, tasks: Sequence[TaskType], *, total_steps: int,
                       dump_dir: Optional[str] = None) -> Programs:
    """`build_programs` as a run configured by the RunConfig `cfg` calls it (fleet initialised first):
    the strategy of its parallel and AMP slices, the LR horizon `total_steps` (the plan's optimizer
    steps), its seed, task ids and EMA. The trainer and the dry run's GPU program
    (ernie_mtl/planning/dryrun.py) both build through here, so the plan shows the program the run builds."""
    import functools
    from dataclasses import replace


    m = cfg.setup.mtl
    strategy = functools.partial(build_strategy, topo, cfg.parallel, cfg.amp)
    return build_programs(cfg.model, replace(cfg.optim, max_steps=total_steps), strategy, topo, tasks,
                          seed=cfg.train.seed, amp_cfg=cfg.amp, use_task_id=m.use_task_id,
                          ema_decay=m.ema_decay if m.use_ema else None,
                          anomaly_guard=cfg.train.on_anomaly != "none", loss_balance=m.loss_balance,
                          dump_dir=dump_dir)


def build_forward_program(model_type: str, arch: Dict[str, Any], tasks: Sequence[TaskType], *, seed: int = 0,
                          use_task_id: bool = False, loss_balance: str = "none"):
    """(program, Forward): the multi-task forward alone, dropout off (for export and verification)."""
    program, startup = paddle.static.Program(), paddle.static.Program()
    startup.random_seed = seed
    with paddle.static.program_guard(program, startup), unique_name.guard():
        fwd = build_forward(model_type, arch, tasks, use_task_id=use_task_id, loss_balance=loss_balance)
        _drop_untied_duplicates(program, startup, set(fwd.name_map.values()))
    return program.clone(for_test=True), fwd


@dataclass
class Minimized:
    """What `minimize_with_fleet` added to the program."""

    lr_scheduler: WarmupLinearDecay
    lr_var: Any
    loss_scaling: Optional[Any]
    strategy: Any
    amp_level: Optional[str]
    amp_optimizer: Any


def minimize_with_fleet(loss, name_map: Mapping[str, str], optim_cfg: OptimConfig,
                        strategy: Union[StrategyBuilder, Any], amp_cfg: AmpConfig,
                        recompute_checkpoints: List[str], *, no_decay=(), skip_flags=None) -> Minimized:
    """AdamW + LR schedule wrapped by fleet's distributed optimizer (AMP, recompute, sharding,
    gradient merge as the strategy says), minimizing `loss` in the current program_guard.
    `no_decay`: parameters without weight decay (optim.no_decay_parameters); `skip_flags`: idle
    parameter -> its CPU skip flag (ernie_mtl/program/idle_heads.py)."""
    import paddle.distributed.fleet as fleet

    dist_strategy = strategy(recompute_checkpoints=recompute_checkpoints) if callable(strategy) else strategy
    if dist_strategy.recompute and not dist_strategy.recompute_configs["checkpoints"]:
        raise ValueError("the strategy enables recompute without checkpoints (fleet would recompute "
                         "nothing); pass a builder such as partial(build_strategy, topo, parallel_cfg, "
                         "amp_cfg) instead of a finished strategy")
    lr_scheduler = make_lr_schedule(optim_cfg)
    optimizer = make_optimizer(optim_cfg, name_map, lr_scheduler, no_decay=no_decay, skip_flags=skip_flags,
                               multi_precision=amp_cfg.use_amp and amp_cfg.amp_level == "O2")
    fp16 = amp_cfg.use_amp and amp_cfg.amp_dtype == "float16"
    bf16 = amp_cfg.use_amp and amp_cfg.amp_dtype == "bfloat16"
    if fp16 != bool(dist_strategy.amp):
        raise ValueError(f"amp_cfg (use_amp={amp_cfg.use_amp}, {amp_cfg.amp_dtype}) and the strategy "
                         f"(amp={dist_strategy.amp}) disagree; build the strategy from the same AmpConfig")
    if bf16:  # fleet 2.6.2 cannot express bf16: decorate the optimizer before fleet wraps it
        optimizer = paddle.static.amp.decorate(
            optimizer, amp_lists=paddle.static.amp.AutoMixedPrecisionLists(
                custom_white_list=set(amp_cfg.custom_white_list),
                custom_black_list=set(amp_cfg.custom_black_list), dtype="bfloat16"),
            level=amp_cfg.amp_level, dtype="bfloat16", init_loss_scaling=1.0,
            use_dynamic_loss_scaling=False, use_amp_guard=True)
    dist_optimizer = fleet.distributed_optimizer(optimizer, strategy=dist_strategy)
    with captured_prints():  # fleet prints its meta-optimizers (ernie_mtl/dist/console.py)
        dist_optimizer.minimize(loss)
    # fleet keeps the applied AMP meta-optimizer in global state: take it now, before another build
    amp_optimizer = fleet.fleet._get_amp_optimizer() if fp16 else optimizer if bf16 else None
    main = loss.block.program
    loss_scaling = main.global_block().var(amp_optimizer.get_loss_scaling().name) if fp16 else None
    return Minimized(lr_scheduler=lr_scheduler, lr_var=main.global_block().var(lr_scheduler._var_name),
                     loss_scaling=loss_scaling, strategy=dist_strategy,
                     amp_level=amp_cfg.amp_level if amp_cfg.use_amp else None, amp_optimizer=amp_optimizer)


def _drop_untied_duplicates(main: paddle.static.Program, startup: paddle.static.Program, used: set) -> None:
    """Remove parameters no op reads and no structured name refers to.

    paddlenlp's tied LM decoder creates its own vocab x hidden weight before `tie_weights()`
    points it at the word embedding; in a static program the orphan stays a persistable,
    initialised, broadcast and checkpointed parameter (55 MB for ERNIE 1.0 base).
    """
    read = {name for op in main.global_block().ops for name in op.input_arg_names}
    orphans = [p.name for p in main.global_block().all_parameters() if p.name not in used | read]
    for name in orphans:
        remove_variable(name, (main, startup))


def forward_only(main: paddle.static.Program, loss) -> paddle.static.Program:
    """An evaluation copy of `main`: its ops up to the one that produces `loss`, with dropout off.

    Cutting at the loss rather than relying on `clone(for_test=True)` alone, because gradient
    merge appends its step counter (`increment`, `elementwise_mod`, `equal`) and its
    `conditional_block` with the *forward* op role: the plain clone keeps the counter (evaluation
    would advance the accumulation) and fails on the conditional block's sub-block.
    """
    program = main.clone()
    block = program.global_block()
    last = max(i for i, op in enumerate(block.ops) if loss.name in op.output_arg_names)
    for idx in reversed(range(last + 1, len(block.ops))):
        block._remove_op(idx, sync=False)
    block._sync_with_cpp()
    strip_dropout_seeds(program)  # dropout is off in evaluation: nothing to feed
    strip_idle_flags(program)
    return program.clone(for_test=True)


# Ops never removed by `prune_unused_forward_ops`, whatever their outputs: communication and control.
_SIDE_EFFECT_OPS = ("feed", "fetch", "fetch_v2", "conditional_block", "while", "increment", "print", "seed",
                    "memcpy", "memcpy_d2h", "memcpy_h2d")


def prune_unused_forward_ops(program: paddle.static.Program, keep: Sequence[str]) -> int:
    """Remove forward ops of `program` whose outputs nothing reads (e.g. the prediction heads of a
    training program: argmax, softmax, the CRF's Viterbi decode); returns how many. `keep`: variable
    names that are fetched (losses, lr) and must stay. Ops writing persistable variables,
    collective and control-flow ops are never removed."""
    from paddle.base import core

    role_attr = core.op_proto_and_checker_maker.kOpRoleAttrName()
    block = program.global_block()
    keep = set(keep)
    removed = 0
    while True:
        read = {name for b in live_blocks(program) for op in b.ops for name in op.input_arg_names}
        dead = []
        for idx, op in enumerate(block.ops):
            outputs = op.output_arg_names
            if (not outputs or op.type in _SIDE_EFFECT_OPS or op.type.startswith("c_")
                    or (op.has_attr(role_attr) and int(op.attr(role_attr)) != 0)):
                continue
            if any(n in read or n in keep or (block.has_var(n) and block.var(n).persistable) for n in outputs):
                continue
            dead.append(idx)
        if not dead:
            break
        for idx in reversed(dead):
            block._remove_op(idx, sync=False)
        removed += len(dead)
        block._sync_with_cpp()
    return removed


def load_pretrained_into_scope(path: Union[str, Path], name_map: Mapping[str, str],
                               scope: paddle.static.Scope, *,
                               program: Optional[paddle.static.Program] = None, place: Any = None,
                               optional: Optional[Mapping[str, str]] = None) -> List[str]:
    """Copy PaddleNLP weights (a model directory or its `model_state.pdparams`) or an ERNIE 1.0 / PALM
    static parameter directory (one file per variable, ernie_mtl/program/static_params.py) into `scope`.

    Keys are structured names (`ernie.encoder.layers.0.linear1.weight`); a tied parameter may
    appear under any of its names; files saved from the backbone alone (keys without the
    `ernie.`/`bert.` prefix) are accepted. Every parameter of `name_map` must be in the file and
    match its shape, else ConfigError listing all problems. `optional` (structured -> static) is
    loaded too when the file holds every one of its keys (e.g. PaddleNLP's `cls.*` pretraining heads
    for a `pretrain` task's head), and skipped otherwise. With `program`, only parameters that
    program holds are written (a sharded rank holds its own shard only). Returns the static names
    written. Run it after the startup program and before AMP O2's `amp_init`. `place`: where the
    parameters live (default: the current device). A static directory's variables are mapped by name;
    a variable no parameter takes is an error too (ERNIE's pretraining heads aside, see `_static_state`).
    """
    path = Path(path)
    static_dir = path.is_dir() and is_static_params_dir(path) and not (path / "model_state.pdparams").is_file()
    weights_file = path if static_dir else path / "model_state.pdparams" if path.is_dir() else path
    if not weights_file.exists():
        raise ConfigError([f"pretrained weights {weights_file} not found; copy PaddleNLP's model_state.pdparams "
                           "there (save_pretrained() writes it)"])
    from paddle.base.data_feeder import convert_dtype

    place = place if place is not None else paddle.framework._current_expected_place()
    if static_dir:
        state, extra = _static_state(path, name_map, optional)
    else:
        state, extra = paddle.load(str(weights_file), return_numpy=True), []
    if optional and all(k in state for k in optional):
        name_map = {**name_map, **optional}
    by_static: Dict[str, List[str]] = {}
    for structured, static in name_map.items():
        by_static.setdefault(static, []).append(structured)
    owned = {v.name for v in program.list_vars() if v.persistable} if program is not None else None
    missing: List[str] = []
    problems: List[str] = []
    assignments = []
    for static, structured_names in by_static.items():
        key = next((k for k in structured_names if k in state), None)
        if key is None:  # a backbone-only file: keys lack the "ernie." / "bert." prefix
            key = next((k.split(".", 1)[1] for k in structured_names
                        if k.split(".", 1)[0] in MODEL_FAMILIES and k.split(".", 1)[1] in state), None)
        if key is None:
            missing.append(structured_names[0])
            continue
        if owned is not None and static not in owned:
            continue
        var = scope.find_var(static)
        if var is None or not var.get_tensor()._is_initialized():
            problems.append(f"parameter {static} ({key}) is not initialised in the scope; run the startup "
                            "program first")
            continue
        tensor, array = var.get_tensor(), np.asarray(state[key])
        if tuple(tensor.shape()) != array.shape:
            problems.append(f"{key}: shape {list(array.shape)} in {weights_file} but {list(tensor.shape())} in "
                            "the model; the architecture flags differ from the weights' config")
            continue
        assignments.append((static, tensor, array))
    if missing:
        what = (" (variables named as in ERNIE 1.0 / PALM: " + ", ".join(static_name(m) or m for m in missing)
                + "); the architecture (flags or ernie_config.json) does not match these weights") if static_dir else ""
        problems.insert(0, f"{weights_file} lacks {len(missing)} of the model's parameters: {', '.join(missing)}"
                           f"{what}")
    if extra:
        problems.append(f"{weights_file} holds {len(extra)} variable(s) the model has no parameter for: "
                        f"{', '.join(extra)}; the architecture (flags or ernie_config.json: layers, task embedding) "
                        "does not match these weights, or the directory holds other files (it must hold the "
                        "model's parameters only)")
    if problems:  # checked before writing anything, so a failed load leaves the scope as it was
        raise ConfigError(problems)
    for _, tensor, array in assignments:
        tensor.set(array.astype(convert_dtype(tensor._dtype())), place)
    return [static for static, _, _ in assignments]


def _static_state(path: Path, name_map: Mapping[str, str], optional: Optional[Mapping[str, str]]):
    """(state under structured names, variables nothing takes) of an ERNIE 1.0 / PALM static parameter
    directory (ernie_mtl/program/static_params.py). A variable is taken when the model has its parameter
    (with or without the `ernie.`/`bert.` prefix); ERNIE's pretraining heads (`mask_lm_*`, `next_sent_fc`)
    are taken by a pretraining head of the run (`optional`) and otherwise skipped, as every fine-tuning of
    ERNIE's published parameters does; anything else is an extra variable (an error)."""
    state, unknown = structured_state(path)
    wanted = {k.split(".", 1)[1] if k.split(".", 1)[0] in MODEL_FAMILIES else k for k in name_map}
    wanted |= set(optional or ())
    extra = [static_name(k) or k for k in state if k not in wanted and not k.startswith("cls.")]
    return state, sorted(unknown + extra)
