"""Faster CPU kernels for a built static training program: oneDNN on chosen op types, and bias
gradients by matmul. Both rewrite the program in place after it is built (fleet's minimize done)
and before its first run; `tune_for_cpu(program)` applies both and returns a line for the log.

**oneDNN per op.** Paddle picks a CPU op's oneDNN kernel when the op carries the attribute
`use_mkldnn=True` and a oneDNN kernel is registered for its type and dtype
(`OperatorWithKernel::CanMKLDNNBeUsed`); the executor converts layouts at the boundaries. Setting the
attribute per op is the only safe way in Paddle 2.6.2 training: the global `FLAGS_use_mkldnn=1`
puts every op with a oneDNN kernel on it and the program fails (`could not create a primitive
descriptor for a reorder primitive` in `elementwise_add_grad`), and several oneDNN kernels round
differently (softmax, layer_norm, matmul, gelu) or are slower (the broadcast `elementwise_add_grad`,
`matmul_v2`). `EXACT_ONEDNN_OPS` holds the types measured to be bitwise exact and faster on the
developers' Intel machine (benchmarks/bench_onednn_ops.py; docs/performance.md). Whether two kernels
round alike depends on the CPU (MKL and oneDNN take other code paths on AMD and Intel), so
tests/unit/test_cpu_kernels.py compares training with them to the plain program within float32
rounding, never bitwise.

**Bias gradients.** The gradient of a bias added along the last axis is the sum of the output
gradient over all rows. Paddle's CPU `elementwise_add_grad` computes it in a serial broadcast loop
(about 46 ms for one [8,128,3072] gradient, measured), the largest non-matmul cost of an ERNIE step
after dropout. `bias_grads_by_matmul` leaves that op the input gradient only and computes the bias
gradient as the vector-matrix product ones[T] x dOut[T,n] (MKL, about 1 ms). The sum is then taken
in MKL's order instead of row by row: the gradients differ in the last bits (relative ~1e-6, the
same size as changing the thread count moves matmul results), so this pass is exact to float32
rounding, not bitwise; the tolerance and its test are in tests/unit/test_cpu_kernels.py.

**oneDNN matmul gradients see 2-D inputs.** A linear layer's `matmul_v2` multiplies a 3-D
activation [b, s, k] by a 2-D weight [k, n]. oneDNN's `matmul_v2_grad` treats that as a broadcast
batch: it computes the weight gradient per batch entry and then sums them, measured 2x slower than
MKL at ERNIE-base shapes, while the same gradient of the flattened [b*s, k] x [k, n] product runs
4x faster than MKL on an AMD EPYC. So `use_onednn_ops` gives every such oneDNN gradient op 2-D views:
the activation and the output gradient are reshaped to [b*s, k] and [b*s, n] before it, and its input
gradient back to [b, s, k] after it (`flatten_matmul_grad`). The math is the same product; the sums
run in oneDNN's order (float32 rounding, as any change of matmul kernel).

Which op types run on oneDNN is decided per machine (ernie_mtl/program/kernel_choice.py), because the
faster kernel depends on the CPU: measured, oneDNN's matmul is 4.5x MKL's on an AMD EPYC and 0.58x
on an Intel Xeon.

Neither pass changes what a GPU program runs: `use_mkldnn` selects CPU kernels only, and
`tune_for_cpu` is meant for CPU runs (GPU reductions are fast; on GPU leave the program alone).
"""
from __future__ import annotations

from collections import Counter
from typing import Dict, Iterable, List, Optional

# Kept: measured bitwise exact on an Intel machine (training losses and parameters identical to the
# plain program's; within float32 rounding elsewhere) and faster at ERNIE-base shapes (docs/performance.md).
EXACT_ONEDNN_OPS = frozenset({
    "elementwise_add",  # bias, residual and attention-mask adds: 1.3x, 1.4x, 13x (the broadcast mask)
    "transpose2", "transpose2_grad",  # attention head split/merge: 1.6x, 4.2x
    "sum",  # gradient accumulation of shared inputs: 1.7x
    "scale",  # query scaling: 1.3x
})


# Op types that Paddle 2.6.2 computes wrongly when both run on oneDNN: (kept, dropped, why). Found by the
# tolerance test of the chosen kernels (tests/unit/test_cpu_kernels.py): with oneDNN `transpose2_grad`
# feeding oneDNN `matmul_v2_grad` (the attention context's gradient into P x V's), tiny ERNIE's softmax
# gradients came out wrong by their own size; each of the two alone trains within float32 rounding.
ONEDNN_CONFLICTS = (
    ("matmul_v2_grad", "transpose2_grad",
     "Paddle 2.6.2's oneDNN transpose2_grad feeding oneDNN matmul_v2_grad gives wrong attention gradients"),
)


def onednn_conflicts(op_types: Iterable[str]):
    """(op types without the known bad pairs, notes): of each pair in `ONEDNN_CONFLICTS` present, the
    second is dropped (and a note says why)."""
    kept = set(op_types)
    notes = []
    for first, second, why in ONEDNN_CONFLICTS:
        if first in kept and second in kept:
            kept.discard(second)
            notes.append(f"{second} left plain: {why}")
    return kept, notes


# op_role bits (paddle's OpRole): ops of the optimizer and the LR schedule are never switched
_OPTIMIZE, _LR_SCHED = 0x0002, 0x0010


def use_onednn_ops(program, op_types: Optional[Iterable[str]] = None) -> Dict[str, int]:
    """Set `use_mkldnn=True` on the forward and backward ops of `op_types` (default
    `EXACT_ONEDNN_OPS`) in every block of `program`, in place; return {op type: ops changed}.

    Left alone: ops of other types; optimizer and LR-schedule ops (gradient clipping's per-parameter
    `elementwise_mul` and its `sum` of squared norms: with oneDNN on both, the global norm changed in
    its last bit and every parameter with it, and such small ops gain nothing); ops with a float16,
    bfloat16 or float64 input or output (oneDNN's low-precision kernels are another numeric path); the
    second type of a pair in `ONEDNN_CONFLICTS`. oneDNN `matmul_v2_grad` ops of linear layers get 2-D
    views (`flatten_matmul_grad`)."""
    import paddle

    types = frozenset(onednn_conflicts(EXACT_ONEDNN_OPS if op_types is None else op_types)[0])
    other_floats = {paddle.float16, paddle.bfloat16, paddle.float64}
    changed: Counter = Counter()
    for block in program.blocks:
        for op in block.ops:
            if op.type not in types:
                continue
            if op.desc.has_attr("op_role") and int(op.attr("op_role")) & (_OPTIMIZE | _LR_SCHED):
                continue
            variables = (block._find_var_recursive(n) for n in op.input_arg_names + op.output_arg_names)
            if any(v is not None and v.dtype in other_floats for v in variables):
                continue
            op._set_attr("use_mkldnn", True)
            changed[op.type] += 1
    if "matmul_v2_grad" in types:
        block = program.global_block()
        i = 0
        while i < len(block.ops):
            op = block.ops[i]
            if op.type == "matmul_v2_grad" and op.desc.has_attr("use_mkldnn") and op.attr("use_mkldnn"):
                i = flatten_matmul_grad(block, i)
            i += 1
        block._sync_with_cpp()
    return dict(changed)


def flatten_matmul_grad(block, index: int) -> int:
    """Give the `matmul_v2_grad` op at `index` of `block` 2-D views when its X is [..., k] with rank >= 3
    and its Y a 2-D [k, n] (a linear layer; module docstring): X and Out@GRAD reshaped to [-1, k] and
    [-1, n] before it, its X@GRAD computed 2-D and reshaped back to X's shape after it. Other matmul
    gradients (batched attention products, 2-D heads, transposed X) are left alone. Returns the index
    of the op that was at `index` (ops are inserted before it). Call `block._sync_with_cpp()` after."""
    op = block.ops[index]
    x, y = block._find_var_recursive(op.input("X")[0]), block._find_var_recursive(op.input("Y")[0])
    if x is None or y is None or len(x.shape) < 3 or len(y.shape) != 2 or op.attr("trans_x"):
        return index
    k = y.shape[1] if op.attr("trans_y") else y.shape[0]
    if k <= 0 or x.shape[-1] != k:
        return index
    dout = block._find_var_recursive(op.input("Out@GRAD")[0])
    n = dout.shape[-1]
    role = op.attr("op_role")

    def var(name, shape, dtype="float32"):
        return block.create_var(name=name, shape=shape, dtype=dtype, persistable=False, stop_gradient=True)

    base = f"{op.input('X')[0]}@flat2d_{index}"
    x2, dout2 = var(f"{base}_x", [-1, k]), var(f"{base}_dout", [-1, n])
    before = [("reshape2", {"X": [x.name]}, {"Out": [x2.name], "XShape": [var(f"{base}_xs", [0] + list(x.shape)).name]},
               {"shape": [-1, k]}),
              ("reshape2", {"X": [dout.name]}, {"Out": [dout2.name],
                                                "XShape": [var(f"{base}_ds", [0] + list(dout.shape)).name]},
               {"shape": [-1, n]})]
    for j, (type_, inputs, outputs, attrs) in enumerate(before):
        block._insert_op(index + j, type=type_, inputs=inputs, outputs=outputs, attrs=dict(attrs, op_role=role))
    index += len(before)
    op.desc.set_input("X", [x2.name])
    op.desc.set_input("Out@GRAD", [dout2.name])
    dx = op.output("X@GRAD")[0] if op.output("X@GRAD") else ""
    if dx:
        dx2 = var(f"{base}_dx", [-1, k])
        op.desc.set_output("X@GRAD", [dx2.name])
        shape = var(f"{base}_shape", [len(x.shape)], "int32")
        after = [("shape", {"Input": [x.name]}, {"Out": [shape.name]}, {}),
                 ("reshape2", {"X": [dx2.name], "Shape": [shape.name]},
                  {"Out": [dx], "XShape": [var(f"{base}_dxs", [0, -1, k]).name]}, {"shape": []})]
        for j, (type_, inputs, outputs, attrs) in enumerate(after):
            block._insert_op(index + 1 + j, type=type_, inputs=inputs, outputs=outputs, attrs=dict(attrs, op_role=role))
    return index


def bias_grads_by_matmul(program) -> List[str]:
    """Compute every bias gradient of `program`'s global block by matmul (module docstring); returns
    the bias gradients rewritten. A bias here is the 1-D `Y` of a backward `elementwise_add_grad`
    added along the last axis of a float32 `X`. The new ops go right after the original op, so
    anything fleet inserted after it (data-parallel all-reduce, gradient merge) sees the result."""
    import paddle

    block = program.global_block()
    rewritten: List[str] = []
    i = 0
    while i < len(block.ops):
        op = block.ops[i]
        i += 1
        if op.type != "elementwise_add_grad" or not op.output("Y@GRAD") or not op.output("Y@GRAD")[0]:
            continue
        if not int(op.attr("op_role")) & 0x0001:  # backward ops only
            continue
        x, y = block._find_var_recursive(op.input("X")[0]), block._find_var_recursive(op.input("Y")[0])
        if x is None or y is None or len(y.shape) != 1 or len(x.shape) < 2 or y.shape[0] <= 0:
            continue
        n = y.shape[0]
        if x.shape[-1] != n or op.attr("axis") not in (-1, len(x.shape) - 1):
            continue
        if x.dtype != paddle.float32 or y.dtype != paddle.float32:
            continue
        dout, dy = op.input("Out@GRAD")[0], op.output("Y@GRAD")[0]
        role = op.attr("op_role")
        op.desc.set_output("Y@GRAD", [])

        def var(suffix, shape, dtype="float32"):
            return block.create_var(name=f"{dy}@bias_{suffix}", shape=shape, dtype=dtype, persistable=False,
                                    stop_gradient=True)

        rows, xshape = var("rows", [-1, n]), var("xshape", [0] + list(x.shape))
        ones = var("ones", [-1])
        # the last op is a matmul writing dy: a compute kernel fills dy's own memory, which fleet's fused
        # all-reduce may have made a view into its buffer (a reshape there could share another buffer)
        new_ops = [
            ("reshape2", {"X": [dout]}, {"Out": [rows], "XShape": [xshape]}, {"shape": [-1, n]}),
            ("fill_constant_batch_size_like", {"Input": [rows]}, {"Out": [ones]},
             {"shape": [-1], "input_dim_idx": 0, "output_dim_idx": 0, "dtype": rows.dtype, "value": 1.0,
              "str_value": "1.0", "force_cpu": False}),
            ("matmul_v2", {"X": [ones], "Y": [rows]}, {"Out": [dy]}, {"trans_x": False, "trans_y": False}),
        ]
        for k, (type_, inputs, outputs, attrs) in enumerate(new_ops):
            block._insert_op(i + k, type=type_, inputs=inputs, outputs=outputs, attrs=dict(attrs, op_role=role))
        i += len(new_ops)
        rewritten.append(dy)
    block._sync_with_cpp()
    return rewritten


def tune_for_cpu(program, *, onednn_types: Optional[Iterable[str]] = None, bias_grads: bool = True) -> str:
    """Both CPU rewrites on a built training program (call once, before its first run): oneDNN on
    `onednn_types` (default `EXACT_ONEDNN_OPS`; empty: none), then bias gradients by matmul (their
    ones x dOut products stay on the plain kernel). Returns a line for the start-up log."""
    parts = []
    types = EXACT_ONEDNN_OPS if onednn_types is None else frozenset(onednn_types)
    if types:
        changed = use_onednn_ops(program, types)
        parts.append(f"oneDNN kernels on {sum(changed.values())} ops ({', '.join(sorted(changed))})")
        unused = sorted(set(onednn_conflicts(types)[0]) - set(changed))
        if unused:  # a listed type this program does not run (or runs only in float16): it switches nothing
            parts.append(f"no op of this program has the type{'s' if len(unused) > 1 else ''} {', '.join(unused)}")
    if bias_grads:
        parts.append(f"{len(bias_grads_by_matmul(program))} bias gradients by matmul")
    return "; ".join(parts) if parts else "as built"
