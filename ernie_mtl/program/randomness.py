"""Training randomness that is random, reproducible and resumable: dropout masks and initial weights.

Why not Paddle's defaults. A static program whose `random_seed` is set builds every dropout op with
`fix_seed=True` and that one seed: the mask is the same on every step and every dropout op of the
same shape draws the same mask (dropout degenerates into a fixed pruning). Likewise a startup
program with `random_seed` set gives every initializer op that seed, so parameters of the same
shape start equal (q, k and v projections, and every layer, identical). Leaving the seeds unset
instead makes runs irreproducible, and fleet's recompute then seeds its replays from
`std::random_device`. So both are set explicitly here.

Dropout. `wire_dropout_seeds(program)` gives every dropout op of the forward its own seed
*tensor* (the op's `Seed` input, which takes priority over its attributes): one fed int32 vector
`dropout_seeds` of length K (one entry per dropout op, in program order), split on the CPU into K
scalars at the top of the program. Each micro-batch feeds
    dropout_seeds = draw(seed, optimizer step, slot of the micro-batch in the global batch)  (K int32 values)
so every mask is a pure function of (seed, step, slot, op): masks differ across steps, slots and
layers, a resumed run feeds exactly the seeds the uninterrupted run fed (nothing to save), and
fleet's recompute replays a layer with the same Seed input, hence the same mask (it inserts its own
`seed` ops only for dropout ops without one).

Slots, not ranks. An optimizer step's global batch is `slots_per_step` micro-batches ("slots")
whichever processes compute them: with D data-parallel ranks and A micro-batches per rank,
micro-batch m of data rank r is slot `slot_of(m, r, D) = m * D + r` (so slot m*D..m*D+D-1 run
together, as the all-reduce sums them). The schedule draws a task per slot and the slot reads its
task's next micro-batch of examples (ernie_mtl/planning/schedule.py), so the same slot holds the
same examples with the same masks on 2 processes, on 1 process with accumulation 2, or sharded:
a run can continue on another topology with the same global batch and micro-batch size and see
what the uninterrupted run saw. (With another micro-batch size a dropout op draws one mask for a
tensor of another shape: the examples stay in order, the masks cannot match.) The rule before this
one seeded with (step, micro-batch, data rank) separately, which tied the masks to the layout. The
split runs under `device_guard("cpu")`: on GPUs the seed scalars are CPU tensors, so the dropout
kernels read them without a device-to-host copy per op (one small copy at the top of the program).

Initial weights. `seed_initializers(startup, name_map, seed)` gives every initializer op of the
startup program its own seed, a hash of (seed, the parameter's structured name): different
parameters get different values, and a parameter's initial value depends on neither the build
order nor the topology (a sharded rank initialises only its own parameters, to the same values).
"""
from __future__ import annotations

import hashlib
from typing import Iterable, List, Mapping, Optional

import numpy as np

from ernie_mtl.program.edits import strip_split_feed

DROPOUT_SEEDS = "dropout_seeds"
_SEED_OP_ATTR = "seed"
_DROPOUT_TAG = 0xD51F  # the slot rule (0xD20F was the (micro-batch, data rank) rule)
_INT31 = 2**31 - 1


def dropout_ops(program) -> List:
    """The dropout ops of `program`'s global block, in program order."""
    return [op for op in program.global_block().ops if op.type == "dropout"]


def wire_dropout_seeds(program) -> int:
    """Feed every dropout op of `program` (being built, before minimize) its own seed tensor.

    Adds the feed variable `dropout_seeds` ([K] int32) and a CPU `split` into K scalars at the top
    of the global block; returns K (0: no dropout op, nothing added, nothing to feed).
    """
    from paddle.base import core

    ops = [op for op in dropout_ops(program) if not op.input("Seed")]
    if not ops:
        return 0
    block = program.global_block()
    seeds = block.create_var(name=DROPOUT_SEEDS, shape=[len(ops)], dtype="int32", persistable=False,
                             stop_gradient=True, type=core.VarDesc.VarType.LOD_TENSOR, need_check_feed=True)
    outs = [block.create_var(name=f"{DROPOUT_SEEDS}.{k}", shape=[1], dtype="int32", persistable=False,
                             stop_gradient=True) for k in range(len(ops))]
    op_device = core.op_proto_and_checker_maker.kOpDeviceAttrName()
    role = core.op_proto_and_checker_maker.kOpRoleAttrName()
    block._insert_op(0, type="split", inputs={"X": [seeds]}, outputs={"Out": outs},
                     attrs={"axis": 0, "num": len(ops), "sections": [], op_device: "cpu",
                            role: int(core.op_proto_and_checker_maker.OpRole.Forward)})
    for op, out in zip(ops, outs):
        op.desc.set_input("Seed", [out.name])
        op._set_attr("fix_seed", False)
        op._set_attr("seed", 0)
    block._sync_with_cpp()
    return len(ops)


def strip_dropout_seeds(program) -> None:
    """Remove the seed wiring from an evaluation copy (dropout is off there: nothing to feed)."""
    for op in program.global_block().ops:
        if op.type == "dropout" and op.input("Seed"):
            op.desc.set_input("Seed", [])
    strip_split_feed(program, DROPOUT_SEEDS)


def num_dropout_seeds(program) -> int:
    """K, the length of the `dropout_seeds` feed of a wired program (0 when it has none)."""
    block = program.global_block()
    return int(block.var(DROPOUT_SEEDS).shape[0]) if block.has_var(DROPOUT_SEEDS) else 0


def slot_of(micro: int, data_rank: int, data_world: int) -> int:
    """The slot (0-based position in the step's global batch, counted in micro-batches) of
    micro-batch `micro` of a step on data rank `data_rank` of `data_world`: micro * D + rank."""
    if not 0 <= data_rank < data_world or micro < 0:
        raise ValueError(f"micro-batch {micro} of data rank {data_rank} in a data world of {data_world}")
    return int(micro) * int(data_world) + int(data_rank)


def draw_dropout_seeds(seed: int, step: int, slot: int, count: int) -> np.ndarray:
    """The `dropout_seeds` feed of slot `slot` (`slot_of`) of optimizer step `step` (0-based: the
    step being computed): `count` int32 values in [1, 2^31 - 1), the same whichever rank and
    micro-batch compute the slot."""
    rng = np.random.default_rng([int(seed), _DROPOUT_TAG, int(step), int(slot)])
    return rng.integers(1, _INT31, size=count, dtype=np.int64).astype(np.int32)


def parameter_seed(seed: int, name: str) -> int:
    """A nonzero int31 seed for the initializer of parameter `name` (structured name)."""
    digest = hashlib.sha256(f"{int(seed)}/{name}".encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "little") % (_INT31 - 1) + 1


def seed_initializers(startup, name_map: Mapping[str, str], seed: int,
                      extra_names: Optional[Iterable[str]] = None) -> int:
    """Give every seeded op of `startup` that writes a parameter its own seed (see the module
    docstring); returns how many ops were changed. Parameters are named by their first structured
    name in `name_map` (structured -> static), else by their static name."""
    structured = {}
    for key, static in name_map.items():
        structured.setdefault(static, key)
    for static in extra_names or ():
        structured.setdefault(static, static)
    changed = 0
    for op in startup.global_block().ops:
        if not op.has_attr(_SEED_OP_ATTR):
            continue
        outputs = op.output_arg_names
        if len(outputs) != 1:
            continue
        name = structured.get(outputs[0], outputs[0])
        op._set_attr(_SEED_OP_ATTR, parameter_seed(seed, name))
        changed += 1
    return changed
