"""Build (never run) the static pretraining programs of ERNIE/BERT with fleet.

The network is paddlenlp's `ErnieForPretraining` (or `BertForPretraining`) built inside
`program_guard`, so its structured parameter names are PaddleNLP's and weights stay compatible.
Static variable names (`linear_3.w_0`, ...) depend on build order; `Programs.name_map` records
structured name -> static name, and the build runs under a fresh `unique_name` guard so the same
configuration always yields the same names.

Order of use: `programs = build_pretrain_programs(...)`; `programs.initialize(exe)` (startup,
pretrained weights, AMP O2 cast); then `exe.run(programs.main, feed=..., fetch_list=...)`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import paddle
import paddle.nn.functional as F
from paddle.utils import unique_name

from ernie_mtl.config import AmpConfig, ConfigError, ModelConfig, OptimConfig
from ernie_mtl.optim import WarmupLinearDecay, make_optimizer, no_decay_parameters
from ernie_mtl.parallel import Topology
from ernie_mtl.randomness import seed_initializers, strip_dropout_seeds, wire_dropout_seeds


@dataclass(frozen=True)
class FeedSpec:
    """One input of the program: what the collate function must produce."""

    name: str
    shape: Tuple[int, ...]
    dtype: str
    doc: str


FEED_SPECS: Tuple[FeedSpec, ...] = (
    FeedSpec("input_ids", (-1, -1), "int64", "token ids [batch, seq]"),
    FeedSpec("segment_ids", (-1, -1), "int64", "segment (token type) ids [batch, seq]"),
    FeedSpec("input_mask", (-1, 1, 1, -1), "float32", "additive attention mask: 0 keep, -1e4 padding"),
    FeedSpec("masked_lm_positions", (-1,), "int64", "flattened positions b*seq+pos of masked tokens"),
    FeedSpec("masked_lm_labels", (-1, 1), "int64", "original ids of masked tokens; -1 = padding slot"),
    FeedSpec("next_sentence_labels", (-1, 1), "int64", "sentence-pair label (binary head only)"),
)
IGNORE_LABEL = -1

# model_type -> (paddlenlp config class, pretraining class, attribute of the backbone)
_FAMILIES = {
    "ernie": ("ErnieConfig", "ErnieForPretraining", "ernie"),
    "bert": ("BertConfig", "BertForPretraining", "bert"),
}

_BACKBONES = {base for _, _, base in _FAMILIES.values()}
StrategyBuilder = Callable[..., Any]  # f(*, recompute_checkpoints) -> DistributedStrategy


@dataclass
class Programs:
    """Everything the trainer needs to run pretraining: programs, feeds, fetches, schedule, names.

    `main` trains on one micro-batch per run (the update happens every `topo.accumulate_steps`
    runs); `test` evaluates the loss; `lr_scheduler.step()` once per optimizer step; `name_map`
    maps PaddleNLP structured names (`ErnieForPretraining.state_dict()` keys, tied weights under
    each of their names) to static variable names: store it with every checkpoint.
    """

    main: paddle.static.Program
    startup: paddle.static.Program
    test: paddle.static.Program
    feeds: Tuple[FeedSpec, ...]
    feed_vars: List[Any]
    loss: Any
    mlm_loss: Any
    nsp_loss: Optional[Any]
    lr: Any
    loss_scaling: Optional[Any]
    lr_scheduler: WarmupLinearDecay
    name_map: Dict[str, str]
    recompute_checkpoints: List[str]
    strategy: Any
    topo: Topology
    arch: Dict[str, Any]
    weights: Optional[Path]
    amp_level: Optional[str] = None
    dropout_seeds: int = 0  # length of the `dropout_seeds` feed (ernie_mtl/randomness.py)
    _amp_optimizer: Any = field(default=None, repr=False)

    @property
    def feed_names(self) -> List[str]:
        """Names to feed, in order."""
        return [f.name for f in self.feeds]

    @property
    def fetches(self) -> Dict[str, Any]:
        """Named fetch variables: loss, mlm_loss, nsp_loss (binary head), lr, loss_scaling (AMP)."""
        named = {"loss": self.loss, "mlm_loss": self.mlm_loss, "nsp_loss": self.nsp_loss, "lr": self.lr,
                 "loss_scaling": self.loss_scaling}
        return {k: v for k, v in named.items() if v is not None}

    def initialize(self, exe: paddle.static.Executor, scope: Optional[paddle.static.Scope] = None) -> None:
        """Run the startup program, load the pretrained weights (local directory), and for AMP O2
        cast the float32 parameters to low precision, in that order. Resuming a checkpoint comes
        after this."""
        scope = scope or paddle.static.global_scope()
        exe.run(self.startup, scope=scope)
        if self.weights is not None:
            load_pretrained_into_scope(self.weights, self.name_map, scope, program=self.main, place=exe.place)
        if self.amp_level == "O2":
            self._amp_optimizer.amp_init(exe.place, scope=scope)


def _paddlenlp_classes(model_type: str):
    import paddlenlp.transformers as T

    cfg_cls, model_cls, base = _FAMILIES[model_type]
    return getattr(T, cfg_cls), getattr(T, model_cls), base


def pretraining_losses(prediction_scores, seq_relationship_score, masked_lm_labels,
                       next_sentence_labels=None):
    """(mlm_loss, nsp_loss or None), both float32 means.

    The MLM mean is over real masked tokens only: padding slots (label -1, added to make the
    masked count a multiple of 8) neither add loss nor count, unlike ErniePretrainingCriterion,
    whose mean divides by all slots. A batch without masked tokens gives 0, not NaN.
    """
    per_token = F.cross_entropy(_fp32(prediction_scores), masked_lm_labels, ignore_index=IGNORE_LABEL,
                                reduction="none")
    real = paddle.cast(masked_lm_labels != IGNORE_LABEL, "float32")
    mlm_loss = paddle.sum(per_token) / paddle.clip(paddle.sum(real), min=1.0)
    if next_sentence_labels is None:
        return mlm_loss, None
    return mlm_loss, F.cross_entropy(_fp32(seq_relationship_score), next_sentence_labels)


def _fp32(x):
    return x if x.dtype == paddle.float32 else paddle.cast(x, "float32")


def _feed_vars(binary_head: bool) -> Tuple[Tuple[FeedSpec, ...], List[Any]]:
    specs = tuple(s for s in FEED_SPECS if binary_head or s.name != "next_sentence_labels")
    return specs, [paddle.static.data(s.name, list(s.shape), s.dtype) for s in specs]


def _forward(model, base: str, feeds: Mapping[str, Any]) -> Tuple[Any, Any, List[str]]:
    """Run the model's forward in the current program; also returns the recompute checkpoints:
    every encoder layer's output, captured by forward hooks. Fleet recomputes each segment between
    checkpoints and the one before the first, so every layer is recomputed once."""
    layers = getattr(model, base).encoder.layers
    captured: Dict[int, str] = {}
    hooks = [layer.register_forward_post_hook(
        lambda layer, inputs, output, i=i: captured.__setitem__(i, output.name)) for i, layer in enumerate(layers)]
    try:
        prediction_scores, seq_relationship_score = model(
            feeds["input_ids"], token_type_ids=feeds["segment_ids"], attention_mask=feeds["input_mask"],
            masked_positions=feeds["masked_lm_positions"])
    finally:
        for hook in hooks:
            hook.remove()
    if len(captured) != len(layers):
        raise RuntimeError(f"captured {len(captured)} layer outputs for {len(layers)} encoder layers")
    return prediction_scores, seq_relationship_score, [captured[i] for i in range(len(layers))]


def build_pretrain_programs(model_cfg: ModelConfig, optim_cfg: OptimConfig,
                            strategy: Union[StrategyBuilder, Any], topo: Topology, *, seed: int,
                            amp_cfg: Optional[AmpConfig] = None) -> Programs:
    """Build the main, startup and test programs of pretraining with fleet (fleet must be
    initialised: `parallel.init_fleet`, or `compat.emulate_gpu_program` for GPU programs on CPU).

    `strategy` is a `DistributedStrategy`, or a builder `f(*, recompute_checkpoints) -> strategy`
    such as `functools.partial(parallel.build_strategy, topo, parallel_cfg, amp_cfg)`: recompute
    checkpoints are variables of this forward, so a strategy with recompute must come from a
    builder. `amp_cfg` is needed only for what fleet cannot express: bfloat16 (decorated here with
    the static AMP API) and AMP O2's initial cast (`Programs.initialize`).

    The test program is the forward of `main` taken *after* minimize (see `_forward_only`):
    fleet rewrites the forward (sharding broadcasts every parameter from its owner before use,
    and a non-owner holds no persistable copy; AMP inserts casts), so a clone taken before
    minimize would read parameters a sharded rank does not have and would evaluate other
    numerics. Under sharding every rank must run the test program together (it broadcasts).

    `seed` seeds initialisation (each parameter its own seed, from its structured name) and is the
    base of the dropout seeds fed per micro-batch (ernie_mtl/randomness.py). Give every rank the
    same seed: data parallelism broadcasts rank 0's initial values but sharding keeps each
    owner's, so only equal seeds make the initial model independent of the topology.
    """
    import paddle.distributed.fleet as fleet

    if paddle.in_dynamic_mode():
        raise RuntimeError("build_pretrain_programs needs static mode: call paddle.enable_static() first")
    if fleet.fleet._role_maker is None:
        raise RuntimeError("fleet is not initialised: call ernie_mtl.parallel.init_fleet(topo) first")
    if fleet.worker_num() != topo.world_size:
        raise ValueError(f"fleet runs {fleet.worker_num()} workers but the topology has {topo.world_size}")
    resolved = model_cfg.resolve()
    optim_cfg.validate()
    config_cls, model_cls, base = _paddlenlp_classes(model_cfg.model_type)
    amp_cfg = amp_cfg or AmpConfig()
    amp_cfg.validate()
    main, startup = paddle.static.Program(), paddle.static.Program()
    startup.random_seed = seed  # per-parameter seeds are set below; main's stays 0 (see ernie_mtl/randomness.py)
    with paddle.static.program_guard(main, startup), unique_name.guard():
        specs, feed_vars = _feed_vars(model_cfg.binary_head)
        feeds = dict(zip((s.name for s in specs), feed_vars))
        arch = {k: v for k, v in resolved.arch.items() if k != "model_type"}
        model = model_cls(config_cls(**arch))
        prediction_scores, seq_relationship_score, checkpoints = _forward(model, base, feeds)
        mlm_loss, nsp_loss = pretraining_losses(prediction_scores, seq_relationship_score,
                                                feeds["masked_lm_labels"], feeds.get("next_sentence_labels"))
        loss = mlm_loss + nsp_loss if nsp_loss is not None else mlm_loss
        name_map = {k: v.name for k, v in model.state_dict().items()}
        _drop_untied_duplicates(main, startup, set(name_map.values()))
        n_seeds = wire_dropout_seeds(main)

        minimized = minimize_with_fleet(loss, name_map, optim_cfg, strategy, amp_cfg, checkpoints,
                                        no_decay=no_decay_parameters([model]))
        test = _forward_only(main, loss)
    seed_initializers(startup, name_map, seed)

    return Programs(
        main=main, startup=startup, test=test, feeds=specs, feed_vars=feed_vars, loss=loss, mlm_loss=mlm_loss,
        nsp_loss=nsp_loss, lr=minimized.lr_var, loss_scaling=minimized.loss_scaling,
        lr_scheduler=minimized.lr_scheduler, name_map=name_map, recompute_checkpoints=checkpoints,
        strategy=minimized.strategy, topo=topo, arch=resolved.arch, weights=resolved.weights,
        amp_level=minimized.amp_level, dropout_seeds=n_seeds, _amp_optimizer=minimized.amp_optimizer)


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
    parameter -> its CPU skip flag (ernie_mtl/idle_heads.py)."""
    import paddle.distributed.fleet as fleet

    dist_strategy = strategy(recompute_checkpoints=recompute_checkpoints) if callable(strategy) else strategy
    if dist_strategy.recompute and not dist_strategy.recompute_configs["checkpoints"]:
        raise ValueError("the strategy enables recompute without checkpoints (fleet would recompute "
                         "nothing); pass a builder such as partial(build_strategy, topo, parallel_cfg, "
                         "amp_cfg) instead of a finished strategy")
    lr_scheduler = WarmupLinearDecay(optim_cfg)
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


def remove_variable(name: str, programs) -> None:
    """Remove variable `name` and the ops that write it from the global blocks of `programs`."""
    for program in programs:
        block = program.global_block()
        for idx in reversed(range(len(block.ops))):
            if name in block.ops[idx].output_arg_names:
                block._remove_op(idx, sync=False)
        if block.has_var(name):
            block._remove_var(name, sync=False)
        block._sync_with_cpp()


def _forward_only(main: paddle.static.Program, loss) -> paddle.static.Program:
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
    from ernie_mtl.idle_heads import strip_idle_flags

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
        read = {name for b in program.blocks for op in b.ops for name in op.input_arg_names}
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
                               program: Optional[paddle.static.Program] = None, place: Any = None) -> List[str]:
    """Copy PaddleNLP weights (a model directory or its `model_state.pdparams`) into `scope`.

    Keys are structured names (`ernie.encoder.layers.0.linear1.weight`); a tied parameter may
    appear under any of its names; files saved from the backbone alone (keys without the
    `ernie.`/`bert.` prefix) are accepted. Every parameter of `name_map` must be in the file and
    match its shape, else ConfigError listing all problems. With `program`, only parameters that
    program holds are written (a sharded rank holds its own shard only). Returns the static names
    written. Run it after the startup program and before AMP O2's `amp_init`. `place`: where the
    parameters live (default: the current device).
    """
    path = Path(path)
    weights_file = path / "model_state.pdparams" if path.is_dir() else path
    if not weights_file.is_file():
        raise ConfigError([f"pretrained weights {weights_file} not found; copy PaddleNLP's model_state.pdparams "
                           "there (save_pretrained() writes it)"])
    from paddle.base.data_feeder import convert_dtype

    place = place if place is not None else paddle.framework._current_expected_place()
    state = paddle.load(str(weights_file), return_numpy=True)
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
                        if k.split(".", 1)[0] in _BACKBONES and k.split(".", 1)[1] in state), None)
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
        problems.insert(0, f"{weights_file} lacks {len(missing)} of the model's parameters: {', '.join(missing)}")
    if problems:  # checked before writing anything, so a failed load leaves the scope as it was
        raise ConfigError(problems)
    for _, tensor, array in assignments:
        tensor.set(array.astype(convert_dtype(tensor._dtype())), place)
    return [static for static, _, _ in assignments]
