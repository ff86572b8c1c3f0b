"""The forward of every run: one shared backbone, one head per reuse group, gated task losses.

A flag-mode pretraining run is the one task `pretrain` (its head: ErnieForPretraining's heads);
a multi-task run has several.

Mechanism (why every head runs on every micro-batch). A micro-batch belongs to one task. All
heads run on the backbone output of every micro-batch (other tasks' label feeds get finite
placeholders, `TaskType.dummy_labels`), and the total loss is `sum_i gate_i * w_i * loss_i`
with `gate` the one-hot of the micro-batch's task (fed) and `w_i` the task's `loss_weight`.
So every rank runs exactly the same ops every step (no control flow: gradient all-reduce,
gradient merge and sharding see one static program), micro-batches of different tasks can be
accumulated into one update, and a head whose task is absent gets a gradient of exactly 0.
(Adam would still move it through stale moments and weight decay; such parameters are frozen for
that update on the device: see ernie_mtl/program/idle_heads.py.) With a single task there is no gate.
The cost is the heads' forward/backward on foreign batches, small next to the backbone.

Parameter names. Built under a fresh `unique_name.guard()` in a fixed order (backbone, then
heads in `task_instance` order of their group's first task), the same configuration always gets
the same static names, so the training program, the plain forward used for export and the
converter agree. `name_map` maps structured names to static names: `ernie.<...>` / `bert.<...>`
for the backbone (PaddleNLP's ErnieForPretraining keys) and `heads.<group>.<...>` for a head,
`<group>` being the name of the first task of its reuse group.

Loss balancing (`loss_balance`, docs/multitask.md), term_i before the gate:
    none         w_i * L_i
    uncertainty  w_i * (exp(-s_i) * L_i + s_i)      Kendall et al. 2018: s_i = log sigma_i^2, one trained
                 scalar per task (`loss_balance.<task>.log_var` in `name_map`, starts at 0, no weight decay,
                 learning rate x BALANCE_LR_SCALE); at its optimum exp(s_i) = L_i, so every task's
                 effective weight becomes 1 / (its loss)
    normalize    w_i * L_i / (stop_gradient(L_i) + eps)   each micro-batch's loss divided by its own value:
                 the gradient of log L_i, scale-free (a token-level loss of 8 and a sentence-level one of 0.7
                 pull equally); value w_i, so the summed loss reads ~ sum w_i (the task losses are logged raw)
Both add O(tasks) scalar ops to a step; under accumulation each micro-batch's term is balanced by itself,
under sharding the log-variances are sharded like every parameter. The balanced terms are what
`plan_freeze` walks, so a task's log-variance is frozen in steps that do not draw the task.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Sequence, Set, Tuple

import numpy as np

from ernie_mtl.config import model_family
from ernie_mtl.program.caller_lookup import use_cheap_caller_lookup, use_cheap_stack_extract
from ernie_mtl.tasks.feeds import BACKBONE_FEEDS, TASK_GATE, TASK_TYPE_IDS, FeedSpec, feed_name
from ernie_mtl.tasks.base import Encoded, HeadOutputs, TaskType

LOSS_BALANCE = ("none", "uncertainty", "normalize")
BALANCE_PREFIX = "loss_balance."  # name_map keys of the log-variances: not model weights
BALANCE_LR_SCALE = 100.0  # the log-variances' learning rate, x the run's (at 5e-5 they move ~5e-3 per step)
NORMALIZE_EPS = 1e-3


def model_names(name_map: Mapping[str, str]) -> Dict[str, str]:
    """`name_map` without the loss-balancing log-variances (what exports, conversion and warm starts carry)."""
    return {k: v for k, v in name_map.items() if not k.startswith(BALANCE_PREFIX)}


def backbone_names(name_map: Mapping[str, str]) -> Dict[str, str]:
    """`name_map`'s backbone: what pretrained weights (a PaddleNLP directory, ERNIE 1.0 / PALM parameters)
    initialise; neither the heads nor the loss-balancing log-variances, which no pretrained file holds."""
    return {k: v for k, v in model_names(name_map).items() if not k.startswith("heads.")}


@dataclass
class HeadGroup:
    """Tasks that share one head, and the head's parameters (static names)."""

    name: str  # the first task of the group
    tasks: List[str]
    params: List[str]


@dataclass
class Forward:
    """The variables of a built multi-task forward."""

    feeds: Tuple[FeedSpec, ...]
    feed_vars: Dict[str, Any]
    loss: Any  # gated, weighted sum of task losses
    task_losses: Dict[str, Any]
    task_scalars: Dict[str, Dict[str, Any]]  # task -> extra scalar fetches for logs (e.g. mlm_loss, nsp_loss)
    predictions: Dict[str, Dict[str, Any]]  # task -> prediction name -> variable
    name_map: Dict[str, str]
    groups: List[HeadGroup]
    recompute_checkpoints: List[str]
    backbone_feed_names: List[str]  # what an exported inference model takes
    no_decay: Set[str] = field(default_factory=set)  # parameters without weight decay (by role)
    balanced: Dict[str, Any] = field(default_factory=dict)  # task -> its term before the gate (what freezing walks)


def group_of(tasks: Sequence[TaskType]) -> Dict[str, str]:
    """task name -> name of its head group (first task with the same reuse tag; itself if untagged)."""
    hosts: Dict[Any, str] = {}
    out = {}
    for task in tasks:
        tag = task.spec.reuse_tag
        if tag is None:
            out[task.spec.name] = task.spec.name
        else:
            out[task.spec.name] = hosts.setdefault(tag, task.spec.name)
    return out


def backbone_config(model_type: str, arch: Mapping[str, Any], *, use_task_id: bool = False, num_tasks: int = 1):
    """(paddlenlp model class, config) of ErnieModel / BertModel for `arch` (a resolved architecture dict)."""
    config_cls, model_cls, _, _ = model_family(model_type).classes()
    kwargs = {k: v for k, v in arch.items() if k != "model_type"}
    if use_task_id:
        if model_type != "ernie":
            raise ValueError("use_task_id needs the ERNIE backbone (BERT has no task embedding)")
        kwargs.update(use_task_id=True, task_type_vocab_size=max(num_tasks, int(kwargs.get("task_type_vocab_size", 3))))
    return model_cls, config_cls(**kwargs)


def build_backbone(model_type: str, arch: Mapping[str, Any], *, use_task_id: bool = False, num_tasks: int = 1):
    """paddlenlp ErnieModel / BertModel for `arch` (a resolved architecture dict), and its config."""
    model_cls, config = backbone_config(model_type, arch, use_task_id=use_task_id, num_tasks=num_tasks)
    return model_cls(config), config


def build_forward(model_type: str, arch: Mapping[str, Any], tasks: Sequence[TaskType], *,
                  use_task_id: bool = False, loss_balance: str = "none") -> Forward:
    """Build the forward into the current `program_guard` (call it under a fresh `unique_name.guard()`).
    `loss_balance` (module docstring) applies to runs of more than one task."""
    import paddle

    if loss_balance not in LOSS_BALANCE:
        raise ValueError(f"loss_balance {loss_balance!r} is not one of {list(LOSS_BALANCE)}")
    use_cheap_caller_lookup()  # operators on batch-shaped variables stop reading every frame's source
    use_cheap_stack_extract()  # each operator's recorded call stack, without a stat per frame

    specs: List[FeedSpec] = list(BACKBONE_FEEDS)
    if use_task_id:
        specs.append(FeedSpec(TASK_TYPE_IDS, (-1, -1), "int64", "task id of every token (task embedding)"))
    gated = len(tasks) > 1
    if gated:
        specs.append(FeedSpec(TASK_GATE, (len(tasks),), "float32", "one-hot of the micro-batch's task"))
    own: Dict[str, Dict[str, FeedSpec]] = {}
    for task in tasks:
        own[task.spec.name] = {s.name: s for s in task.label_feeds()}
        specs += [FeedSpec(feed_name(task.spec.name, s.name), s.shape, s.dtype, s.doc) for s in task.label_feeds()]
    feed_vars = {s.name: paddle.static.data(s.name, list(s.shape), s.dtype) for s in specs}

    encoder = shared_encoder(tasks)
    if encoder is None:
        enc, name_map, recompute_checkpoints = _paddlenlp_encoder(model_type, arch, feed_vars, use_task_id=use_task_id,
                                                                  num_tasks=len(tasks))
    else:  # a task type's own encoder (the PALM face's user-defined backbone)
        enc, name_map, recompute_checkpoints = encoder(feed_vars)
    backbone = enc.backbone

    groups_by_task = group_of(tasks)
    heads: Dict[str, Any] = {}
    signatures: Dict[str, Tuple] = {}
    groups: Dict[str, HeadGroup] = {}
    task_losses: Dict[str, Any] = {}
    task_scalars: Dict[str, Dict[str, Any]] = {}
    predictions: Dict[str, Dict[str, Any]] = {}
    gate = feed_vars.get(TASK_GATE)
    balanced: Dict[str, Any] = {}
    no_decay: Set[str] = set()
    total = None
    for i, task in enumerate(tasks):
        group = groups_by_task[task.spec.name]
        first = group not in heads
        if first:
            heads[group] = task.create_head(enc)
            signatures[group] = task.head_signature()
            groups[group] = HeadGroup(group, [], [])
        elif task.head_signature() != signatures[group]:
            raise ValueError(f"tasks {group!r} and {task.spec.name!r} share a head "
                             f"(task_reuse_tag {task.spec.reuse_tag}) "
                             f"but their heads differ: {signatures[group]} vs {task.head_signature()}; give them "
                             "different task_reuse_tag values")
        groups[group].tasks.append(task.spec.name)
        task_feeds = {n: feed_vars[feed_name(task.spec.name, n)] for n in own[task.spec.name]}
        out: HeadOutputs = task.head_forward(heads[group], enc, task_feeds)
        if first:  # read after the head's graph: a head may create its parameters in head_forward (PALM's build)
            _add_head_parameters(name_map, groups[group], heads[group])
        loss = out.loss if out.loss.dtype == paddle.float32 else paddle.cast(out.loss, "float32")
        task_losses[task.spec.name] = loss
        task_scalars[task.spec.name] = dict(out.scalars)
        predictions[task.spec.name] = dict(out.predictions)
        balanced[task.spec.name] = _balanced(loss, float(task.spec.loss_weight), task.spec.name,
                                          loss_balance if gated else "none", name_map, no_decay)
        term = gate[i] * balanced[task.spec.name] if gated else balanced[task.spec.name]
        total = term if total is None else total + term
    backbone_feed_names = [s.name for s in BACKBONE_FEEDS] + ([TASK_TYPE_IDS] if use_task_id else [])
    from ernie_mtl.program.optim import no_decay_parameters

    return Forward(feeds=tuple(specs), feed_vars=feed_vars, loss=paddle.reshape(total, [1]), task_losses=task_losses,
                   task_scalars=task_scalars, predictions=predictions, name_map=name_map, groups=list(groups.values()),
                   recompute_checkpoints=recompute_checkpoints,
                   backbone_feed_names=backbone_feed_names,
                   no_decay=no_decay_parameters([backbone, *heads.values()]) | no_decay, balanced=balanced)


def _balanced(loss, weight: float, task: str, how: str, name_map: Dict[str, str], no_decay: Set[str]):
    """A task's term before the gate (module docstring, Loss balancing)."""
    import paddle

    if how == "uncertainty":
        log_var = paddle.static.create_parameter(
            shape=[1], dtype="float32", attr=paddle.ParamAttr(
                initializer=paddle.nn.initializer.Constant(0.0), learning_rate=BALANCE_LR_SCALE))
        name_map[f"{BALANCE_PREFIX}{task}.log_var"] = log_var.name
        no_decay.add(log_var.name)
        term = paddle.exp(-log_var) * paddle.reshape(loss, [1]) + log_var
        term = paddle.reshape(term, loss.shape)
    elif how == "normalize":
        # a copy, not `detach()`: detach shares the loss's memory, and the executor's in-place reuse then
        # lets `+ eps` overwrite the loss itself (the term came out exactly 1)
        value = paddle.assign(loss)
        value.stop_gradient = True
        term = loss / (value + NORMALIZE_EPS)
    else:
        term = loss
    return term if weight == 1.0 else weight * term


def shared_encoder(tasks: Sequence[TaskType]):
    """The encoder a task type supplies instead of PaddleNLP's ERNIE/BERT (`TaskType.shared_encoder`),
    or None; tasks that supply one must supply the same."""
    supplied = [(task, task.shared_encoder()) for task in tasks]
    supplied = [(task, e) for task, e in supplied if e is not None]
    if any(e is not supplied[0][1] for _, e in supplied[1:]):
        raise ValueError(f"tasks {[task.spec.name for task, _ in supplied]} supply different shared encoders; "
                         "the tasks of a run share one backbone")
    return supplied[0][1] if supplied else None


def _paddlenlp_encoder(model_type: str, arch: Mapping[str, Any], feed_vars: Mapping[str, Any], *, use_task_id: bool,
                       num_tasks: int) -> Tuple[Encoded, Dict[str, str], List[str]]:
    """(Encoded, name map of the backbone, recompute checkpoints: every encoder layer's output) of
    PaddleNLP's ErnieModel / BertModel built on `feed_vars`."""
    import paddle

    backbone, config = build_backbone(model_type, arch, use_task_id=use_task_id, num_tasks=num_tasks)
    layers = backbone.encoder.layers
    captured: Dict[int, str] = {}
    hooks = [layer.register_forward_post_hook(lambda layer, inputs, output, i=i: captured.__setitem__(i, output.name))
             for i, layer in enumerate(layers)]
    try:
        kwargs = dict(token_type_ids=feed_vars["segment_ids"], attention_mask=feed_vars["input_mask"])
        if use_task_id:
            kwargs["task_type_ids"] = feed_vars[TASK_TYPE_IDS]
        # AMP O2 (fleet's use_fp16_guard) casts only the ops inside an fp16 guard: paddlenlp guards
        # ErnieForPretraining's forward but not ErnieModel's, so without this the backbone would
        # silently stay float32. The heads and their losses stay float32.
        with paddle.static.amp.fp16_guard():
            sequence_output, pooled_output = backbone(feed_vars["input_ids"], **kwargs)[:2]
    finally:
        for hook in hooks:
            hook.remove()
    if len(captured) != len(layers):
        raise RuntimeError(f"captured {len(captured)} layer outputs for {len(layers)} encoder layers")
    enc = Encoded(sequence_output=sequence_output, pooled_output=pooled_output, backbone=backbone, config=config,
                  feeds={s.name: feed_vars[s.name] for s in BACKBONE_FEEDS})
    prefix = "ernie" if model_type == "ernie" else "bert"
    name_map = {f"{prefix}.{k}": v.name for k, v in backbone.state_dict().items()}
    return enc, name_map, [captured[i] for i in range(len(layers))]


def _add_head_parameters(name_map: Dict[str, str], group: HeadGroup, head: Any) -> None:
    """Record a head's parameters as `heads.<group>.<key>` in `name_map` and the group; a parameter
    the map already holds (a tied embedding: the backbone's) is not the head's own."""
    known = set(name_map.values())
    for k, v in head.state_dict().items():
        name_map[f"heads.{group.name}.{k}"] = v.name
        if v.name not in known and v.name not in group.params:
            group.params.append(v.name)


def make_feed(tasks: Sequence[TaskType], task_index: int, batch: Mapping[str, np.ndarray], *,
              use_task_id: bool = False) -> Dict[str, np.ndarray]:
    """The full feed of one micro-batch of `tasks[task_index]` (`batch` = that task's `collate` output):
    backbone inputs, the gate, its own labels, and placeholders for every other task's labels."""
    ids = batch["input_ids"]
    b, s = ids.shape
    feed: Dict[str, np.ndarray] = {k: batch[k] for k in ("input_ids", "segment_ids", "input_mask")}
    if use_task_id:
        feed[TASK_TYPE_IDS] = np.full((b, s), task_index, dtype=np.int64)
    if len(tasks) > 1:
        gate = np.zeros(len(tasks), dtype=np.float32)
        gate[task_index] = 1.0
        feed[TASK_GATE] = gate
    for i, task in enumerate(tasks):
        names = [f.name for f in task.label_feeds()]
        source = batch if i == task_index else task.dummy_labels(b, s)
        for n in names:
            if n not in source:
                what = "collate()" if i == task_index else "dummy_labels()"
                raise KeyError(f"task {task.spec.name!r} ({task.name}): {what} did not produce feed {n!r}")
            feed[feed_name(task.spec.name, n)] = source[n]
    return feed
