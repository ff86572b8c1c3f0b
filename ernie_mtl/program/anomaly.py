"""A non-finite step never reaches the weights: the update is skipped on the device when the global
gradient norm is NaN or infinite, and counted.

Where the decision comes from. Gradient clipping (`--grad_clip`, ClipGradByGlobalNorm; with `--grad_clip 0` a
bound of `NORM_ONLY_CLIP` that never clips, so the guard is never silently off) computes the
global L2 norm of all gradients after they are all-reduced (data parallel) and, under sharding,
after fleet sums the shards' squared norms across the sharding group: so the norm, and a decision
taken from it, is the same on every rank (a rank-local loss check would let ranks diverge). A NaN
or infinite loss on any rank makes its gradients non-finite, hence the norm. With fp16 AMP the loss
scaler's `found_inf` already skips such steps; this guard covers float32 and bfloat16.

What it changes in the program, next to the norm's `sqrt` (in the gradient-merge block when there
is one, so once per optimizer step): `bad = !isfinite(norm)`, on the CPU; every AdamW op's
`SkipUpdate` becomes `SkipUpdate OR bad` (the mechanism idle heads use: parameter, moments, beta
powers and master weights left bitwise untouched); the persistable counter `anomaly_skipped_steps`
(float32, in every checkpoint) grows by one. No value reaches the host unless read: the loop reads
the counter at logging steps (policy skip) or every step (stop, replay).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

from ernie_mtl.program.edits import live_blocks

COUNTER = "anomaly_skipped_steps"
# With --grad_clip 0 the guard still needs the global norm: the program clips at this bound, which no finite
# float32 gradient norm of a trainable model reaches, so every gradient is multiplied by clip / max(norm, clip)
# = 1.0 exactly (the same bits as no clipping), at the cost of the norm's reduction and one multiply per gradient.
NORM_ONLY_CLIP = 1e30
_OPTIMIZE = 0x0002


@dataclass
class AnomalyGuard:
    counter: str  # persistable float32 [1]: optimizer steps skipped so far
    flag: str  # the step's bool [1] (CPU), in the update's block


def _clip_norm(program):
    """(block, index of the op computing the global gradient norm): the optimizer-role `sqrt` whose
    output the clipping's elementwise_max reads; None without clipping."""
    for block in live_blocks(program):
        readers = {n for op in block.ops if op.type == "elementwise_max" for n in op.input_arg_names}
        for i, op in enumerate(block.ops):
            if op.type == "sqrt" and int(op.attr("op_role")) & _OPTIMIZE and op.output("Out")[0] in readers:
                return block, i
    return None


def add_anomaly_guard(main, startup) -> Optional[AnomalyGuard]:
    """Wire the guard into a minimized training program (see the module docstring); None when the
    program has no global-norm clipping to read the norm from."""
    import paddle
    from paddle.base import core
    from paddle.utils import unique_name

    found = _clip_norm(main)
    if found is None:
        return None
    block, index = found
    role = core.op_proto_and_checker_maker.kOpRoleAttrName()
    device = core.op_proto_and_checker_maker.kOpDeviceAttrName()
    attrs = {role: _OPTIMIZE, device: "cpu"}
    norm = block.ops[index].output("Out")[0]
    finite = block.create_var(name=unique_name.generate("anomaly_finite"), shape=[1], dtype="bool", stop_gradient=True)
    bad = block.create_var(name=unique_name.generate("anomaly_bad"), shape=[1], dtype="bool", stop_gradient=True)
    one = block.create_var(name=unique_name.generate("anomaly_one"), shape=[1], dtype="float32", stop_gradient=True)
    gblock, sblock = main.global_block(), startup.global_block()
    counter = gblock.create_var(name=COUNTER, shape=[1], dtype="float32", persistable=True, stop_gradient=True)
    sblock.create_var(name=COUNTER, shape=[1], dtype="float32", persistable=True)
    sblock.append_op(type="fill_constant", outputs={"Out": [COUNTER]},
                     attrs={"shape": [1], "dtype": int(core.VarDesc.VarType.FP32), "value": 0.0})
    ops = [("isfinite_v2", {"X": [norm]}, {"Out": [finite]}, {}),
           ("logical_not", {"X": [finite]}, {"Out": [bad]}, {}),
           ("cast", {"X": [bad]}, {"Out": [one]}, {"in_dtype": int(core.VarDesc.VarType.BOOL),
                                                    "out_dtype": int(core.VarDesc.VarType.FP32)}),
           ("elementwise_add", {"X": [counter], "Y": [one]}, {"Out": [counter]}, {"axis": -1})]
    for k, (kind, inputs, outputs, extra) in enumerate(ops):
        block._insert_op(index + 1 + k, type=kind, inputs=inputs, outputs=outputs, attrs={**attrs, **extra})
    # every update's SkipUpdate becomes (its flag OR bad): each OR right before the first update that
    # reads it (its flag may be computed just before that update: AMP's found_inf OR an idle-head flag)
    ored: Dict[str, str] = {}
    i = index + 1 + len(ops)
    while i < len(block.ops):
        op = block.ops[i]
        skip = op.input("SkipUpdate") if op.type in ("adamw", "adam") and "SkipUpdate" in op.input_names else None
        if skip is None:
            i += 1
            continue
        if not skip:
            op.desc.set_input("SkipUpdate", [bad.name])
        else:
            if skip[0] not in ored:
                out = block.create_var(name=unique_name.generate("skip_or_anomaly"), shape=[1], dtype="bool",
                                       stop_gradient=True)
                block._insert_op(i, type="logical_or", inputs={"X": [skip[0]], "Y": [bad]}, outputs={"Out": [out]},
                                 attrs=dict(attrs))
                ored[skip[0]] = out.name
                i += 1
                op = block.ops[i]
            op.desc.set_input("SkipUpdate", [ored[skip[0]]])
        i += 1
    block._sync_with_cpp()
    del paddle  # imported for its op registry (isfinite_v2, logical ops)
    return AnomalyGuard(counter=COUNTER, flag=bad.name)


def skipped_steps(scope) -> float:
    """The counter's value in `scope` (0 when the program has no guard)."""
    import numpy as np

    var = scope.find_var(COUNTER)
    if var is None or not var.get_tensor()._is_initialized():
        return 0.0
    return float(np.array(var.get_tensor()).reshape(-1)[0])
