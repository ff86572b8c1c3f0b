"""Idle parameters stay bitwise frozen, on the device: heads (and the pooler) of tasks not drawn.

The multi-task loss is `sum_i gate_i * w_i * loss_i` (ernie_mtl/program/forward.py), so a parameter
that only tasks absent from an optimizer step depend on gets a gradient of exactly 0 -- but AdamW
would still move it through its stale moments and decoupled weight decay. Such a parameter is
frozen for that step instead: parameter, both moments, both beta powers and (AMP O2) the fp32
master weight are left untouched, with no traffic between host and device.

Who uses what. `parameter_users` walks the forward ops backwards from each task's loss: a
parameter's users are the tasks whose loss depends on it. Parameters with the same users form a
`FreezeGroup`; a group every task uses (the encoder, the embeddings) is never frozen. In practice
the groups are the task heads (shared heads: the tasks of their `task_reuse_tag`), and the
backbone's pooler, which only pooled-output tasks (cls, match, pretrain with the pair head) read:
when only token-level tasks (seq_label, mrc, mlm) are drawn, the pooler is frozen with the pooled
heads. The ERNIE task-type embedding (`use_task_id`) is read by every task, so it is always
updated: the rows of tasks not drawn get zero gradient and move only through Adam's moments and
weight decay, exactly as the word-embedding rows of tokens absent from a batch do (dense Adam).

Mechanism. Each step feeds `idle_groups` ([G] bool, True = no user drawn in this step; the same
value on every micro-batch of the step), split on the CPU into G scalars at the top of the
program. AdamW's `SkipUpdate` input of a frozen group's parameter is that scalar (OR-ed with AMP's
CPU copy of `found_inf` when loss scaling is on): the adamw kernel then copies its inputs to its
outputs unchanged. `check_coverage` fails the build unless every frozen parameter's whole
optimizer state is written only by its skippable adamw op (or by value-preserving ops: AMP O2's
cast of the master weight, sharding's broadcast of the parameter).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Dict, FrozenSet, Iterable, List, Mapping, Optional, Set, Tuple

import numpy as np

from ernie_mtl.program.edits import live_blocks, strip_split_feed

IDLE_GROUPS = "idle_groups"
# AdamW's per-parameter state (also of AMP O2's fp32 master copy `<param>_fp32_master_0`)
_STATE_SUFFIX = re.compile(r"^(_fp32_master_0)?(_moment1_0|_moment2_0|_beta1_pow_acc_0|_beta2_pow_acc_0)?$")
# ops allowed to write a frozen parameter's state besides its adamw op: value-preserving when the
# adamw op skipped (cast: O2 master -> low-precision parameter; broadcast: sharding owner -> others;
# the stream syncs are identities on their variables)
_PRESERVING_OPS = ("cast", "c_broadcast", "broadcast")
_IDENTITY_OPS = ("c_sync_comm_stream", "c_sync_calc_stream")
_FORWARD_ROLE = 0


class FreezeCoverageError(RuntimeError):
    """The built program could move a frozen parameter's state: never expected, a bug."""


@dataclass
class FreezeGroup:
    """Parameters used by the same tasks; frozen in a step where none of `users` is drawn. Named
    after its users ("sentiment", "a+b")."""

    name: str
    users: Tuple = ()
    params: List[str] = field(default_factory=list)



@dataclass
class FreezePlan:
    """The freezable groups of a program and the scalar flag variable of each."""

    tasks: Tuple[str, ...]
    groups: List[FreezeGroup]
    flag_vars: Dict[str, str] = field(default_factory=dict)  # group name -> CPU scalar var

    @property
    def param_flags(self) -> Dict[str, str]:
        """static parameter name -> its group's flag variable."""
        return {p: self.flag_vars[g.name] for g in self.groups for p in g.params}

    def idle(self, drawn: Iterable[str]) -> Dict[str, bool]:
        """group name -> frozen in a step whose micro-batches came from the tasks `drawn`."""
        drawn = set(drawn)
        return {g.name: not (drawn & set(g.users)) for g in self.groups}

    def feed(self, drawn: Iterable[str]) -> Dict[str, np.ndarray]:
        """The `idle_groups` feed of a step (empty when nothing can be frozen)."""
        if not self.groups:
            return {}
        idle = self.idle(drawn)
        return {IDLE_GROUPS: np.array([idle[g.name] for g in self.groups], dtype=bool)}

    def state_vars(self, program, group: FreezeGroup) -> List[str]:
        """Persistable variables of `program` holding a group's parameters and their optimizer state."""
        persistable = sorted(v.name for v in program.list_vars() if v.persistable)
        return [name for param in group.params for name in persistable
                if name.startswith(param) and _STATE_SUFFIX.match(name[len(param):])]


def _forward_ops(block) -> List[Any]:
    from paddle.base import core

    role = core.op_proto_and_checker_maker.kOpRoleAttrName()
    return [op for op in block.ops if not op.has_attr(role) or int(op.attr(role)) == _FORWARD_ROLE]


def parameter_users(program, losses: Mapping[str, Any], params: Iterable[str]) -> Dict[str, FrozenSet[str]]:
    """static parameter name -> the tasks whose loss (a variable of `program`) depends on it.

    Reverse reachability over the forward ops of the global block (call it before minimize, or on
    a program whose forward part is unchanged); a parameter no loss reaches gets an empty set."""
    ops = _forward_ops(program.global_block())
    producers: Dict[str, List[int]] = {}
    for k, op in enumerate(ops):
        for name in op.output_arg_names:
            producers.setdefault(name, []).append(k)
    params = set(params)
    users: Dict[str, Set[str]] = {p: set() for p in params}
    for task, loss in losses.items():
        seen_vars: Set[str] = set()
        seen_ops: Set[int] = set()
        stack = [loss.name if hasattr(loss, "name") else str(loss)]
        while stack:
            name = stack.pop()
            if name in seen_vars:
                continue
            seen_vars.add(name)
            if name in users:
                users[name].add(task)
            for k in producers.get(name, ()):
                if k not in seen_ops:
                    seen_ops.add(k)
                    stack.extend(ops[k].input_arg_names)
    return {p: frozenset(u) for p, u in users.items()}


def plan_freeze(program, losses: Mapping[str, Any], name_map: Mapping[str, str]) -> FreezePlan:
    """Group the parameters of `name_map` (structured -> static) by their users and wire a CPU flag
    per freezable group into `program` (the feed `idle_groups` and its split, at the top of the
    global block). Call it after the forward is built, before minimize."""
    from paddle.base import core

    tasks = tuple(losses)
    structured: Dict[str, List[str]] = {}
    for key, static in name_map.items():
        structured.setdefault(static, []).append(key)
    users = parameter_users(program, losses, structured)
    by_users: Dict[FrozenSet[str], List[str]] = {}
    for static in structured:  # name_map order: backbone first, then heads in task order
        u = users[static]
        if u and u != frozenset(tasks):
            by_users.setdefault(u, []).append(static)
    groups = [FreezeGroup(name="+".join(task for task in tasks if task in u),
                          users=tuple(task for task in tasks if task in u),
                          params=params) for u, params in by_users.items()]
    plan = FreezePlan(tasks=tasks, groups=groups)
    if not groups:
        return plan
    block = program.global_block()
    flags = block.create_var(name=IDLE_GROUPS, shape=[len(groups)], dtype="bool", persistable=False,
                             stop_gradient=True, type=core.VarDesc.VarType.LOD_TENSOR, need_check_feed=True)
    outs = [block.create_var(name=f"{IDLE_GROUPS}.{k}", shape=[1], dtype="bool", persistable=False,
                             stop_gradient=True) for k in range(len(groups))]
    block._insert_op(0, type="split", inputs={"X": [flags]}, outputs={"Out": outs},
                     attrs={"axis": 0, "num": len(groups), "sections": [],
                            core.op_proto_and_checker_maker.kOpDeviceAttrName(): "cpu",
                            core.op_proto_and_checker_maker.kOpRoleAttrName():
                                int(core.op_proto_and_checker_maker.OpRole.Forward)})
    block._sync_with_cpp()
    plan.flag_vars = {g.name: out.name for g, out in zip(groups, outs)}
    return plan


def strip_idle_flags(program) -> None:
    """Remove the flag wiring from an evaluation copy (no optimizer there: nothing to feed)."""
    strip_split_feed(program, IDLE_GROUPS)


def skip_update_var(block, flag: str, found_inf: Optional[Any], cache: Dict) -> Any:
    """The SkipUpdate input of a frozen parameter's adamw op in `block`: the group flag, OR-ed
    (on the CPU) with AMP's found_inf when there is one. Created once per (block, flag)."""
    import paddle
    from paddle.utils import unique_name

    key = (block.idx, flag, None if found_inf is None else found_inf.name)
    if key in cache:
        return cache[key]
    flag_var = block._var_recursive(flag)
    if found_inf is None:
        cache[key] = flag_var
        return flag_var
    with paddle.static.device_guard("cpu"):
        out = block.create_var(name=unique_name.generate("skip_update"), shape=[1], dtype="bool",
                               persistable=False, stop_gradient=True)
        block.append_op(type="logical_or", inputs={"X": [found_inf], "Y": [flag_var]}, outputs={"Out": [out]})
    cache[key] = out
    return out


def check_coverage(program, plan: FreezePlan) -> None:
    """Fail unless every frozen parameter's whole optimizer state can only change through its adamw
    op, and that op's SkipUpdate is the group's flag (possibly OR-ed with found_inf)."""
    if not plan.groups:
        return
    allowed_skip: Dict[str, Set[str]] = {}
    all_ops = [op for block in live_blocks(program) for op in block.ops]
    for op in all_ops:  # the OR-ed flags
        if op.type == "logical_or":
            for flag in plan.flag_vars.values():
                if flag in op.input_arg_names:
                    allowed_skip.setdefault(flag, set()).update(op.output_arg_names)
    problems = []
    persistable = sorted(v.name for v in program.list_vars() if v.persistable)
    for group in plan.groups:
        flag = plan.flag_vars[group.name]
        skips = {flag} | allowed_skip.get(flag, set())
        for param in group.params:
            state = {n for n in persistable if n.startswith(param) and _STATE_SUFFIX.match(n[len(param):])}
            if param not in state:
                continue  # not held by this rank (sharding): its owner checks it
            updates = [op for op in all_ops if op.type in ("adamw", "adam") and param in op.input("Param")]
            if len(updates) != 1:
                problems.append(f"{param} (group {group.name}): {len(updates)} optimizer ops update it, expected 1")
                continue
            update = updates[0]
            skip = update.input("SkipUpdate") if "SkipUpdate" in update.input_names else []
            if len(skip) != 1 or skip[0] not in skips:
                problems.append(f"{param} (group {group.name}): its {update.type} op's SkipUpdate is {skip}, not the "
                                f"group's flag {flag}")
            moved = set(update.output_arg_names)
            missing = sorted(state - moved - set(update.input_arg_names))
            if missing:
                problems.append(f"{param} (group {group.name}): optimizer state {missing} is not handled by its "
                                f"{update.type} op")
            for op in all_ops:
                if op is update or op.has_attr("sub_block"):  # control flow: its block's ops are checked
                    continue
                written = state & set(op.output_arg_names)
                if not written:
                    continue
                if op.type in _PRESERVING_OPS and set(op.input_arg_names) <= state:
                    continue
                if op.type in _IDENTITY_OPS and written <= set(op.input_arg_names):
                    continue
                problems.append(f"{param} (group {group.name}): op {op.type} writes {sorted(written)} outside the "
                                "skippable update")
    if problems:
        raise FreezeCoverageError("idle-head freeze does not cover the whole optimizer state:\n  "
                                  + "\n  ".join(problems))
