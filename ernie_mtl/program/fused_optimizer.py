"""`--fuse_optimizer`: the per-parameter `adamw` ops of a built program replaced by a few `fused_adam` ops.

Why: on a GPU every op costs the host tens of microseconds to issue (InferShape, allocation, launch).
ERNIE-base's training step has 1,520 ops, 206 of them `adamw`; at 32 sequences per step an A100
computes a step faster than the host issues it (docs/performance.md, section 13). One `fused_adam` op
(Paddle 2.6's multi-tensor Adam: one kernel over many tensors on GPU) per group of compatible updates
takes the optimizer from 206 ops to a handful.

What is fused: the `adamw` ops of one block that share every setting (learning-rate variable,
SkipUpdate flag, betas, epsilon, decay coefficient, master weights or not) and have no per-op extra
(lr_ratio 1, no tensor betas, not lazy, no global beta powers). A group is one op placed where its last
member was; a member moves only over ops that neither read what the group writes nor write what it
reads or writes, so every update reads the same values as before. Parameters with their own idle-head
flag, AMP's found_inf or the anomaly flag keep them: a group shares one SkipUpdate.

Numerics: Paddle 2.6's CPU `fused_adam` runs the `adamw` kernel (or the `adam` kernel without decay,
which is what `adamw` runs without decay) once per tensor with the same arguments: bitwise the unfused
update (tests/unit/test_fused_optimizer.py). The GPU kernel is apex's multi-tensor Adam: the same
formula in another order of operations (float32 rounding differs) and the first tensor's beta powers
for the whole group, which is why a group never mixes SkipUpdate flags (the members' step counts stay
equal). The optimizer state (moments, beta powers, master weights) keeps its variables, so checkpoints
are the same files either way."""
from __future__ import annotations

from typing import Dict, List, Tuple

from ernie_mtl.program.edits import live_blocks

_ADAMW_INPUTS = {"Param": "Params", "Grad": "Grads", "Moment1": "Moments1", "Moment2": "Moments2",
                 "Beta1Pow": "Beta1Pows", "Beta2Pow": "Beta2Pows", "MasterParam": "MasterParams"}
_ADAMW_OUTPUTS = {"ParamOut": "ParamsOut", "Moment1Out": "Moments1Out", "Moment2Out": "Moments2Out",
                  "Beta1PowOut": "Beta1PowsOut", "Beta2PowOut": "Beta2PowsOut", "MasterParamOut": "MasterParamsOut"}
_CHUNK = 65536  # elements per block of the GPU multi-tensor kernel (apex's 2048 x 32)


def _names(op, slot: str) -> List[str]:
    return list(op.input(slot)) if slot in op.input_names else []


def _out_names(op, slot: str) -> List[str]:
    return list(op.output(slot)) if slot in op.output_names else []


def _signature(op) -> Tuple | None:
    """The settings a fused group shares, or None when the op has a per-op extra `fused_adam` lacks."""
    if any(_names(op, slot) for slot in ("Beta1Tensor", "Beta2Tensor", "EpsilonTensor")):
        return None
    if op.attr("lazy_mode") or op.attr("use_global_beta_pow") or float(op.attr("lr_ratio")) != 1.0:
        return None
    if len(op.input("Param")) != 1:
        return None
    with_decay = bool(op.attr("with_decay"))
    return (tuple(op.input("LearningRate")), tuple(_names(op, "SkipUpdate")), float(op.attr("beta1")),
            float(op.attr("beta2")), float(op.attr("epsilon")), with_decay,
            float(op.attr("coeff")) if with_decay else 0.0, bool(op.attr("multi_precision")),
            bool(_names(op, "MasterParam")))


def _variables(block, slots: Dict[str, List[str]]) -> Dict[str, List]:
    """`slots` with each name as its variable, looked up from `block` upwards (an op of a sub-block names
    the parameters of the global block)."""
    return {slot: [block._var_recursive(name) for name in names] for slot, names in slots.items()}


def fuse_adamw_ops(program) -> Dict[str, int]:
    """Replace the groups of compatible `adamw` ops of `program`'s live blocks by `fused_adam` ops, in
    place. Returns {"adamw": updates fused, "fused_adam": ops made}; a group of one stays an `adamw`."""
    fused = made = 0
    for block in live_blocks(program):
        groups: List[List] = []
        open_groups: Dict[Tuple, Dict] = {}
        for op in block.ops:
            key = _signature(op) if op.type == "adamw" else None
            if key is not None:
                group = open_groups.setdefault(key, {"ops": [], "reads": set(), "writes": set()})
                group["ops"].append(op)
                group["reads"].update(op.input_arg_names)
                group["writes"].update(op.output_arg_names)
                continue
            ins, outs = set(op.input_arg_names), set(op.output_arg_names)
            for key in [key for key, group in open_groups.items()
                        if (ins | outs) & group["writes"] or outs & group["reads"]]:
                groups.append(open_groups.pop(key)["ops"])  # this op must see the group's updates done
        groups.extend(group["ops"] for group in open_groups.values())
        groups = [members for members in groups if len(members) > 1]
        if not groups:
            continue
        index = {id(op): i for i, op in enumerate(block.ops)}
        # insert each group's op after its last member (latest first, so earlier positions hold), then
        # remove the members (latest first)
        for members in sorted(groups, key=lambda members: index[id(members[-1])], reverse=True):
            last = members[-1]
            inputs = {plural: [n for op in members for n in _names(op, slot)]
                      for slot, plural in _ADAMW_INPUTS.items()}
            inputs = {k: v for k, v in inputs.items() if v}
            inputs["LearningRate"] = list(last.input("LearningRate"))
            if _names(last, "SkipUpdate"):
                inputs["SkipUpdate"] = list(last.input("SkipUpdate"))
            outputs = {plural: [n for op in members for n in _out_names(op, slot)]
                       for slot, plural in _ADAMW_OUTPUTS.items()}
            outputs = {k: v for k, v in outputs.items() if v}
            with_decay = bool(last.attr("with_decay"))
            role_var = [n for op in members for n in (op.attr("op_role_var") or [])]
            attrs = {"beta1": float(last.attr("beta1")), "beta2": float(last.attr("beta2")),
                     "epsilon": float(last.attr("epsilon")), "chunk_size": _CHUNK,
                     "weight_decay": float(last.attr("coeff")) if with_decay else 0.0, "use_adamw": with_decay,
                     "multi_precision": bool(last.attr("multi_precision")), "use_global_beta_pow": False,
                     "op_role": last.attr("op_role"), "op_role_var": role_var}
            if last.has_attr("op_device"):
                attrs["op_device"] = last.attr("op_device")
            block._insert_op(index[id(last)] + 1, type="fused_adam", inputs=_variables(block, inputs),
                             outputs=_variables(block, outputs), attrs=attrs)
            made += 1
            fused += len(members)
        doomed = {id(op) for members in groups for op in members}
        for i in range(len(block.ops) - 1, -1, -1):
            if id(block.ops[i]) in doomed:
                block._remove_op(i, sync=False)
        block._sync_with_cpp()
    return {"adamw": fused, "fused_adam": made}
