"""Small reads and edits of built static programs: the blocks that can run, and the inputs a
control-flow op must declare."""
from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, List

# Ops that run a block of their own (the `sub_block` attribute)
_CONTROL_FLOW_ATTR = "sub_block"


def strip_split_feed(program, feed: str) -> None:
    """Remove a fed vector and the ops that read it (its split into per-use scalars) from the global
    block, with the split's outputs `<feed>.<k>`: evaluation copies of the training program have
    nothing to feed there (dropout seeds, idle-head flags)."""
    block = program.global_block()
    for idx in reversed(range(len(block.ops))):
        if feed in block.ops[idx].input_arg_names:
            block._remove_op(idx, sync=False)
    for name in [n for n in block.vars if n == feed or n.startswith(feed + ".")]:
        block._remove_var(name, sync=False)
    block._sync_with_cpp()


def live_blocks(program) -> List[Any]:
    """The blocks of `program` that can run: the global block and, recursively, the sub-blocks
    named by the control-flow ops of live blocks.

    A program can hold blocks nothing runs: fleet's sharding with gradient merge
    (`_sharding_gradient_merge`, Paddle 2.6.2) copies the optimizer ops into a scratch block, then
    builds the real conditional block from the copies and leaves the scratch block in the program.
    Checks over "every op of the program" must read the live blocks only, or they count each
    optimizer op twice."""
    return live_blocks_from(program, 0)


def declare_sub_block_inputs(program) -> Dict[int, List[str]]:
    """Add to each control-flow op of the global block the non-persistable variables its sub-block
    reads from outside; returns {op index: names added}.

    Fleet's sharding with gradient merge (Paddle 2.6.2) builds its conditional block of optimizer
    ops with `Input: []`. The executor frees a non-persistable variable after its last declared
    reader, so a variable computed in the global block and read only inside that block (the idle-head
    flags that gate AdamW, ernie_mtl/program/idle_heads.py) is freed before the block runs: "Tensor holds no
    memory ... [operator < adamw > error]" on the first accumulated step. Declaring the reads keeps
    them alive until the block has run (and orders the block after their producers)."""
    block = program.global_block()
    added: Dict[int, List[str]] = {}
    for idx, op in enumerate(block.ops):
        if not op.has_attr(_CONTROL_FLOW_ATTR) or "Input" not in op.input_names:
            continue
        sub = program.block(op._block_attr_id(_CONTROL_FLOW_ATTR))
        inner = [o for b in live_blocks_from(program, sub.idx) for o in b.ops]
        made_inside = {n for o in inner for n in o.output_arg_names}
        outer = []
        for o in inner:
            for name in o.input_arg_names:
                if name in made_inside or name in outer or not block.has_var(name):
                    continue
                if not block.var(name).persistable:
                    outer.append(name)
        missing = [n for n in outer if n not in op.input("Input")]
        if missing:
            op.desc.set_input("Input", list(op.input("Input")) + missing)
            added[idx] = missing
    if added:
        block._sync_with_cpp()
    return added


def live_blocks_from(program, start: int) -> List[Any]:
    """Block `start` and the blocks its control-flow ops run, recursively."""
    seen: List[int] = []
    stack = [start]
    while stack:
        idx = stack.pop()
        if idx in seen:
            continue
        seen.append(idx)
        for op in program.block(idx).ops:
            if op.has_attr(_CONTROL_FLOW_ATTR):
                stack.append(op._block_attr_id(_CONTROL_FLOW_ATTR))
    return [program.block(idx) for idx in sorted(seen)]


@contextlib.contextmanager
def static_mode() -> Iterator[None]:
    """Paddle's static mode for the block, the caller's mode afterwards (building or loading programs
    from a caller that may be in dynamic mode: the converter, a checkpoint's evaluation, the dry run)."""
    import paddle

    was_dynamic = paddle.in_dynamic_mode()
    paddle.enable_static()
    try:
        yield
    finally:
        if was_dynamic:
            paddle.disable_static()
