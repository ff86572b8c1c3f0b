"""oneDNN kernels for chosen op types of a built static program (CPU training).

Paddle picks a CPU op's oneDNN kernel when the op carries the attribute `use_mkldnn=True` and a
oneDNN kernel is registered for its type and dtype (`OperatorWithKernel::CanMKLDNNBeUsed`); the
executor converts layouts at the boundaries with plain kernels. Setting the attribute per op, after
the program is built, is the only safe way to use them in Paddle 2.6.2 training:

- the global `FLAGS_use_mkldnn=1` puts every op with a oneDNN kernel on it, and the training
  program then fails (`could not create a primitive descriptor for a reorder primitive` in
  `elementwise_add_grad`);
- some oneDNN kernels change the numerics (different reduction or rounding order): losses then drift
  from the plain program's.

`EXACT_ONEDNN_OPS` lists the op types measured to give the plain program's losses and to be faster
(docs/performance.md has the figures and the rejected candidates; tests/test_onednn.py checks the
losses). Call `use_onednn_ops(program)` on the *training* program after fleet's minimize and before
its first run; evaluation programs cloned before the call keep plain kernels, which is harmless.

This module does not change what a GPU program runs: the attribute only selects CPU kernels.
"""
from __future__ import annotations

from collections import Counter
from typing import Dict, Iterable, Optional

# Kept: measured exact (training losses identical to the plain program's) and faster at ERNIE-base size.
EXACT_ONEDNN_OPS = frozenset({
    "elementwise_add", "elementwise_mul",
    "relu", "relu_grad",
    "transpose2", "transpose2_grad", "reshape2", "reshape2_grad",
    "sum", "scale",
})


# op_role bits (paddle's OpRole): ops of the optimizer and the LR schedule are never switched
_OPTIMIZE, _LR_SCHED = 0x0002, 0x0010


def use_onednn_ops(program, op_types: Optional[Iterable[str]] = None) -> Dict[str, int]:
    """Set `use_mkldnn=True` on the forward and backward ops of `op_types` (default
    `EXACT_ONEDNN_OPS`) in every block of `program`, in place; return {op type: ops changed}.

    Left alone: ops of other types; optimizer and LR-schedule ops (gradient clipping's per-parameter
    `elementwise_mul` and its `sum` of squared norms: with oneDNN on both, the global norm changed in
    its last bit and every parameter with it, and such small ops gain nothing); ops with a float16,
    bfloat16 or float64 input or output (oneDNN's low-precision kernels are another numeric path)."""
    import paddle

    types = EXACT_ONEDNN_OPS if op_types is None else frozenset(op_types)
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
    return dict(changed)
