"""Run planner: parameter count, per-rank memory and a readable plan, by arithmetic; for a GPU job
also the program rank 0 would run, built on this machine and never run.

The arithmetic builds no program and touches no device; `run_multitask_static.py --dry_run` prints
`format_plan(...)` and exits. With `--device gpu` (accepted on a CPU build for a dry run: planning
a GPU job before spending GPU hours is what the dry run is for) `dry_run` also builds rank 0's
program through `compat.emulate_gpu_program` -- a CUDA build's float16 op lists, so AMP inserts the
casts a GPU build would, and the NCCL communicator ops -- with the trainer's own builder, and
prints what it holds (`format_gpu_program`): casts, collectives per communication ring, gradient
merge's conditional block, the persistable bytes next to the memory table. Every figure is per
rank, in bytes.

What fleet's static sharding keeps on a rank (read in Paddle 2.6.2,
`python/paddle/distributed/fleet/meta_optimizers/sharding_optimizer.py` and `sharding/shard.py`)
------------------------------------------------------------------------------------------------
- `Shard._split_params` gives every parameter one owner in the sharding group: parameters are
  taken in program order and the owner index advances once the running size passes
  `total * (owner + 1) / sharding_degree` (a greedy split by bytes, so a rank can hold up to one
  parameter more than the even share). `shard_sizes` replays it on `parameter_sizes` (checked
  against built programs in the tests); the memory rows use the most loaded rank.
- `_prune_startup_program` removes every parameter and optimizer variable (`_moment1_0`,
  `_moment2_0`, `_beta1_pow_acc_0`, `_beta2_pow_acc_0`) the rank does not own, and
  `_recreate_not_persist_param_as_var` turns the others into non-persistable variables: a rank
  stores only its own parameters and their Adam state (ZeRO-like, for parameters too).
- `_split_program` cuts forward+backward into segments of about `segment_broadcast_MB` of
  parameters; at the start of each segment the owners `c_broadcast` the parameters it uses into
  temporary `@BroadCast` variables (re-broadcast in every segment that uses them, so they are
  freed after the segment): a transient buffer of about one segment (modelled as
  `segment_broadcast_MB`; a segment closes once it reaches the threshold, so it can exceed it
  by one parameter).
- Gradients are `c_reduce_sum`-ed to the owner segment by segment; non-owned gradients are
  temporaries freed after their reduce, so the owner's share stays until the update.
- Accumulation under sharding (`gradient_merge_acc_step`) creates persistable `@GradiantMerge`
  buffers only for the owned gradients (`create_persistable_gradients_and_insert_merge_ops`
  asserts that).
- Under AMP O2 an optimizer with `multi_precision=True` (what O2 training needs; PaddleNLP's ERNIE
  sets it) creates fp32 master weights named `<param>_fp32_master_0`. That
  suffix is not in `Shard._var_device_id`'s list, so the variable counts as "every rank's" and is
  kept by `_prune_startup_program` on every rank: master weights are modelled unpartitioned.
- Without sharding (plain data parallelism) every rank holds everything; `strategy.gradient_merge`
  adds a persistable `@GRAD@MERGED` buffer per gradient.

AMP: O1 keeps float32 parameters and gradients and casts white-listed ops' weights to 16 bits in
the forward (temporaries alive until their backward use: modelled as 2 bytes per owned parameter);
O2 stores 16-bit parameters and gradients plus float32 master weights. AdamW's moments are float32
in both (`AdamW._add_moments_pows` promotes 16-bit accumulators), plus two float32 beta-power
scalars per parameter tensor.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np

from ernie_mtl.config import AmpConfig, ParallelConfig
from ernie_mtl.dist.topology import Topology, build_strategy
from ernie_mtl.data.mixture import parse_mixture, plan_mixture
from ernie_mtl.data.pretrain import PretrainSampleConfig
from ernie_mtl.dist.compat import GPU_SYNC_OPS
from ernie_mtl.dist.compat import emulate_gpu_program
from ernie_mtl.dist.process import ProcessInfo, resolve_device
from ernie_mtl.program.builder import build_run_programs
from ernie_mtl.program.forward import backbone_config, group_of
from ernie_mtl.program.edits import static_mode
from ernie_mtl.tasks.base import Encoded
from ernie_mtl.tasks.base import TaskContext, get_task_type

FP32 = 4
LOW = 2  # float16 / bfloat16
MiB = 1 << 20
GiB = 1 << 30
SEGMENT_BROADCAST_MB = 32  # fleet's default sharding_configs["segment_broadcast_MB"], as build_strategy sets it

# memory_estimate keys in table order, with their labels
MEMORY_ROWS = (
    ("parameters", "parameters"),
    ("gradients", "gradients"),
    ("optimizer_state", "optimizer state (AdamW)"),
    ("master_weights", "fp32 master weights (O2)"),
    ("gradient_merge", "gradient-merge buffers"),
    ("amp_weight_copies", "16-bit weight copies (O1)"),
    ("sharding_broadcast", "sharding broadcast buffer"),
    ("activations", "activations (ESTIMATE)"),
)


def parameter_sizes(arch: Mapping[str, Any], *, pretraining_heads: bool = True) -> List[int]:
    """Element count of every parameter tensor of paddlenlp's ErnieModel / BertModel (and, with
    `pretraining_heads`, ErnieForPretraining's heads) in creation order, which is the order fleet's
    sharding assigns owners in (`shard_sizes`). The tied MLM decoder weight is the word embedding.

    Embeddings: word, position, token type (if `type_vocab_size` > 0; BERT always builds it), task
    type (ERNIE with `use_task_id`), layer norm. Per layer: q/k/v/out projections with biases, the
    two feed-forward linears, two layer norms. Pooler. Heads: MLM transform + layer norm, decoder
    bias, the 2-way sentence-pair linear (ErnieForPretraining always builds it).
    """
    h, i, vocab = int(arch["hidden_size"]), int(arch["intermediate_size"]), int(arch["vocab_size"])
    type_vocab = int(arch.get("type_vocab_size", 2))
    tables = [vocab, int(arch["max_position_embeddings"])]
    if type_vocab > 0 or arch.get("model_type") == "bert":
        tables.append(type_vocab)
    if arch.get("model_type", "ernie") == "ernie" and arch.get("use_task_id", False):
        tables.append(int(arch.get("task_type_vocab_size", 3)))
    sizes = [n * h for n in tables] + [h, h]
    layer = [h * h, h] * 4 + [h * i, i, i * h, h] + [h, h] * 2
    sizes += layer * int(arch["num_hidden_layers"]) + [h * h, h]
    if pretraining_heads:
        sizes += [h * h, h, h, h, vocab, 2 * h, 2]
    return sizes


def count_parameters(arch: Mapping[str, Any], *, pretraining_heads: bool = True,
                     task_heads: Optional[Mapping[str, int]] = None) -> Dict[str, int]:
    """Parameter counts of paddlenlp's ErnieModel / BertModel built from `arch` (paddlenlp config keys).

    Keys: `embeddings`, `encoder`, `pooler`, `backbone` (their sum), `pretraining_heads` (MLM
    transform + layer norm + decoder bias, the decoder weight being tied to the word embeddings,
    and the sentence-pair linear), `task_head/<name>` for each caller-supplied head count, `total`,
    and `tensors` (parameter tensors of backbone and pretraining heads; task heads not included).
    The parts are those of `parameter_sizes`.
    """
    sizes = parameter_sizes(arch, pretraining_heads=pretraining_heads)
    n_embed = len(sizes) - 16 * int(arch["num_hidden_layers"]) - 2 - (7 if pretraining_heads else 0)
    n_backbone = n_embed + 16 * int(arch["num_hidden_layers"]) + 2
    counts = {"embeddings": sum(sizes[:n_embed]), "encoder": sum(sizes[n_embed:n_backbone - 2]),
              "pooler": sum(sizes[n_backbone - 2:n_backbone])}
    counts["backbone"] = sum(sizes[:n_backbone])
    if pretraining_heads:
        counts["pretraining_heads"] = sum(sizes[n_backbone:])
    for name, n in (task_heads or {}).items():
        counts[f"task_head/{name}"] = int(n)
    counts["total"] = sum(sizes) + sum(int(n) for n in (task_heads or {}).values())
    counts["tensors"] = len(sizes)
    return counts


def shard_sizes(sizes: Sequence[int], sharding_degree: int) -> List[int]:
    """Elements each sharding rank owns, by fleet's greedy split (`Shard._split_params`, Paddle 2.6.2):
    parameters in order, the owner advancing once the running total passes its even share."""
    total = sum(sizes)
    owned = [0] * sharding_degree
    rank, running = 0, 0
    for n in sizes:
        if running > total * (rank + 1) / sharding_degree:
            rank += 1
        owned[rank] += n
        running += n
    return owned


def activation_estimate(arch: Mapping[str, Any], *, micro_batch_size: int, seq_len: int, amp: AmpConfig,
                        recompute: bool, masked_tokens_per_seq: int) -> int:
    """ROUGH ESTIMATE of the activation bytes one micro-batch keeps for the backward pass.

    Per encoder layer (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
    Transformer Models", generalised from 2-byte activations to `e` bytes with 1-byte dropout masks):
    `s*b*h*(16e + 2) + a*s^2*b*(2e + 1)` (e = 2 under AMP, 4 otherwise; s sequence, b micro batch,
    h hidden, a heads). Plus the embeddings (`s*b*h*(2e + 1)`) and the MLM head on the masked tokens
    (`m*h*3e` for transform/activation/norm and `m*V*8` for float32 logits and softmax, m = b x
    masked tokens per sequence). With recompute (every layer output a checkpoint, plus the embedding
    output) the layers keep `(L + 1)*s*b*h*e` and one layer's full activations while it is recomputed.
    Ignores allocator fragmentation, workspace and framework temporaries.
    """
    h, a = int(arch["hidden_size"]), int(arch["num_attention_heads"])
    n_layers, vocab = int(arch["num_hidden_layers"]), int(arch["vocab_size"])
    b, s = micro_batch_size, seq_len
    e = LOW if amp.use_amp else FP32
    per_layer = s * b * h * (16 * e + 2) + a * s * s * b * (2 * e + 1)
    layers = (n_layers + 1) * s * b * h * e + per_layer if recompute else n_layers * per_layer
    m = b * masked_tokens_per_seq
    return s * b * h * (2 * e + 1) + layers + m * h * 3 * e + m * vocab * 2 * FP32


def memory_estimate(num_params: int, *, topology: Topology, amp: AmpConfig, num_tensors: int = 0,
                    owned_params: Optional[int] = None, activation_bytes: int = 0,
                    segment_broadcast_mb: float = SEGMENT_BROADCAST_MB) -> Dict[str, int]:
    """Bytes per rank for each item of `MEMORY_ROWS`, plus `persistent` (what stays allocated
    between steps) and `total` (the rough peak: everything at once).

    `owned_params`: parameter elements of the most loaded sharding rank (`max(shard_sizes(...))`);
    default: an even share `ceil(num_params / sharding_degree)`. The sharding model is in the module
    docstring (owner-only parameters, gradients, Adam state and merge buffers; master weights on
    every rank; one broadcast segment of transient parameters).
    """
    shards = topology.sharding_degree
    owned = num_params if shards == 1 else owned_params if owned_params is not None else -(-num_params // shards)
    pure = amp.use_amp and amp.amp_level == "O2"
    width = LOW if pure else FP32  # parameters and their gradients
    out = {
        "parameters": owned * width,
        "gradients": owned * width,
        # two float32 moments per element, two float32 beta powers per tensor
        "optimizer_state": owned * 2 * FP32 + -(-num_tensors // shards) * 2 * FP32,
        "master_weights": num_params * FP32 if pure else 0,
        "gradient_merge": owned * width if topology.accumulate_steps > 1 else 0,
        "amp_weight_copies": owned * LOW if amp.use_amp and not pure else 0,
        "sharding_broadcast": int(segment_broadcast_mb * MiB) if shards > 1 else 0,
        "activations": int(activation_bytes),
    }
    out["persistent"] = (out["parameters"] + out["optimizer_state"] + out["master_weights"]
                         + out["gradient_merge"])
    out["total"] = sum(out[key] for key, _ in MEMORY_ROWS)
    return out


def describe_strategy(strategy: Any, amp: AmpConfig) -> List[str]:
    """One line per relevant field of a fleet `DistributedStrategy` (as `build_strategy` made it)."""
    lines = []
    if strategy.amp:
        c = strategy.amp_configs
        lines.append(f"amp: float16 {'O2 (use_pure_fp16)' if c['use_pure_fp16'] else 'O1'}, "
                     f"init_loss_scaling {c['init_loss_scaling']:g}, dynamic loss scaling "
                     f"{c['use_dynamic_loss_scaling']}")
    elif amp.use_amp:
        lines.append(f"amp: {amp.amp_dtype} {amp.amp_level} through paddle.static.amp.decorate (fleet 2.6.2 "
                     "has no bf16 switch; not in the strategy)")
    else:
        lines.append("amp: off (float32)")
    if strategy.recompute:
        lines.append(f"recompute: on, {len(strategy.recompute_configs['checkpoints'])} checkpoints")
    else:
        lines.append("recompute: off")
    if strategy.sharding:
        c = strategy.sharding_configs
        lines.append(f"sharding: degree {c['sharding_degree']}, hybrid dp {c['hybrid_dp']} (dp {c['dp_degree']}), "
                     f"gradient_merge_acc_step {c['gradient_merge_acc_step']}, segment_broadcast_MB "
                     f"{c['segment_broadcast_MB']:g}")
    else:
        lines.append("sharding: off")
    if strategy.gradient_merge:
        c = strategy.gradient_merge_configs
        lines.append(f"gradient_merge: k_steps {c['k_steps']}, avg {c['avg']}")
    else:
        lines.append("gradient_merge: off" + (" (accumulation via sharding)" if strategy.sharding
                                              and strategy.sharding_configs["gradient_merge_acc_step"] > 1 else ""))
    lines.append(f"fuse_all_reduce_ops: {strategy.fuse_all_reduce_ops}, fuse_grad_size_in_MB: "
                 f"{strategy.fuse_grad_size_in_MB}")
    return lines


def _size(nbytes: int) -> str:
    return f"{nbytes / MiB:12.1f} MiB {nbytes / GiB:9.3f} GiB"


def format_plan(*, topology: Topology, strategy: Any, amp: AmpConfig, param_counts: Mapping[str, int],
                memory: Mapping[str, int], schedule_summary: str = "") -> str:
    """The dry-run report: topology and batch arithmetic, strategy, parameter count, memory table
    and (if given) the task-schedule summary."""
    lines = [
        "== topology ==",
        f"world size {topology.world_size} = dp {topology.dp_degree} x sharding {topology.sharding_degree}",
        f"global batch {topology.global_batch_size} = micro batch {topology.micro_batch_size} x data-parallel world "
        f"{topology.data_world_size} x accumulate steps {topology.accumulate_steps}",
        f"per rank: {topology.micro_batch_size} samples per executor run, "
        f"{topology.micro_batch_size * topology.accumulate_steps} per optimizer step",
        "== strategy ==",
        *describe_strategy(strategy, amp),
        "== parameters ==",
        *(f"{k:<28}{v:>16,}" for k, v in param_counts.items() if k not in ("total", "tensors")),
        f"{'total':<28}{param_counts['total']:>16,} ({param_counts['tensors']} tensors)",
        "== memory per rank ==",
        *(f"{label:<30}{_size(memory[key])}" for key, label in MEMORY_ROWS if memory[key]),
        f"{'persistent (between steps)':<30}{_size(memory['persistent'])}",
        f"{'total (rough peak)':<30}{_size(memory['total'])}",
        "activations are a rough estimate per micro-batch (see ernie_mtl.planning.dryrun.activation_estimate); the "
        "other rows follow fleet's static sharding as documented in ernie_mtl.planning.dryrun",
    ]
    if schedule_summary:
        lines += ["== task schedule ==", schedule_summary.rstrip("\n")]
    return "\n".join(lines)


def estimate(arch: Mapping[str, Any], parallel: ParallelConfig, amp: AmpConfig, *, world_size: int, seq_len: int,
             masked_tokens_per_seq: int, task_heads: Optional[Mapping[str, int]] = None,
             pretraining_heads: bool = True) -> Dict[str, Any]:
    """The arguments of `format_plan` (topology, strategy, parameter counts, memory per rank) for a
    configuration, composing the functions above (validates through Topology)."""
    topo = Topology.from_config(parallel, world_size)
    # The real checkpoints are variables of the built forward; the plan only reports how many there
    # are (the embedding output and every layer's output, as build_pretrain_programs passes them).
    checkpoints: Sequence[str] = ()
    if parallel.use_recompute:
        checkpoints = [f"encoder_layer_{k}_input" for k in range(int(arch["num_hidden_layers"]) + 1)]
    strategy = build_strategy(topo, parallel, amp, recompute_checkpoints=checkpoints)
    counts = count_parameters(arch, pretraining_heads=pretraining_heads, task_heads=task_heads)
    # task heads are built after the backbone; each is taken as one block in the owner split
    sizes = parameter_sizes(arch, pretraining_heads=pretraining_heads) + [int(n) for n in (task_heads or {}).values()]
    act = activation_estimate(arch, micro_batch_size=topo.micro_batch_size, seq_len=seq_len, amp=amp,
                              recompute=parallel.use_recompute, masked_tokens_per_seq=masked_tokens_per_seq)
    memory = memory_estimate(counts["total"], topology=topo, amp=amp, num_tensors=counts["tensors"],
                             owned_params=max(shard_sizes(sizes, topo.sharding_degree)), activation_bytes=act,
                             segment_broadcast_mb=strategy.sharding_configs["segment_broadcast_MB"])
    return {"topology": topo, "strategy": strategy, "amp": amp, "param_counts": counts, "memory": memory}


def plan(arch: Mapping[str, Any], parallel: ParallelConfig, amp: AmpConfig, *, world_size: int, seq_len: int,
         masked_tokens_per_seq: int, task_heads: Optional[Mapping[str, int]] = None,
         pretraining_heads: bool = True, schedule_summary: str = "") -> str:
    """`format_plan` of `estimate(...)`."""
    parts = estimate(arch, parallel, amp, world_size=world_size, seq_len=seq_len,
                     masked_tokens_per_seq=masked_tokens_per_seq, task_heads=task_heads,
                     pretraining_heads=pretraining_heads)
    return format_plan(**parts, schedule_summary=schedule_summary)


# -- the GPU program of a dry run ------------------------------------------------------------------------
# Op types that only set up communication or order CUDA streams: not counted as collectives.
_COMM_SETUP_OPS = ("c_gen_nccl_id", "c_comm_init")
_AMP_OPS = ("check_finite_and_unscale", "update_loss_scaling")
# The communication op types of Paddle's newer collective API (2.6 has them beside the c_* ops; Paddle 3 uses
# them, under a "pd_op." prefix in PIR programs): counted too, so a program full of them is never "none".
_NEW_COLLECTIVES = frozenset({"all_reduce", "all_gather", "all_to_all", "alltoall", "broadcast", "reduce",
                              "reduce_scatter", "barrier", "send_v2", "recv_v2", "partial_send", "partial_recv",
                              "partial_allgather", "p_send", "p_recv", "dist_concat", "mp_allreduce_sum"})


def collective_type(op_type: str) -> Optional[str]:
    """The collective an op type is (its name without a "pd_op." prefix), or None: c_* ops but the
    communicator set-up and stream-ordering ones, and the newer API's ops (`_NEW_COLLECTIVES`)."""
    name = op_type[len("pd_op."):] if op_type.startswith("pd_op.") else op_type
    if name.startswith("c_"):
        return None if name in _COMM_SETUP_OPS + GPU_SYNC_OPS else name
    return name if name in _NEW_COLLECTIVES else None


@dataclass
class ProgramFacts:
    """What one rank's built programs hold (`program_facts`)."""

    main_ops: int  # every block of the training program
    main_blocks: int
    startup_ops: int
    casts: Dict[str, int]  # "to_16bit", "from_16bit", "other" (int/bool casts)
    amp_ops: Dict[str, int]  # check_finite_and_unscale, update_loss_scaling
    rings: Dict[int, List[int]]  # ring id -> global ranks of the communicator (c_comm_init's endpoints)
    collectives: Dict[int, Dict[str, int]]  # training program: ring id -> op type -> count
    startup_collectives: Dict[int, Dict[str, int]]  # start-up program, communicator set-up excluded
    conditional_blocks: int  # gradient merge's update (every accumulate_steps micro-batches)
    persistable_bytes: int  # persistable tensors of the training program: what the rank keeps between steps


def program_facts(main: Any, startup: Any, *, endpoints: Sequence[str]) -> ProgramFacts:
    """Read `ProgramFacts` from a built training program and its start-up program; `endpoints` are the
    job's endpoints in rank order (the communicators' endpoint lists map back to ranks)."""
    from paddle.base import core


    VarType = core.VarDesc.VarType
    low = {int(VarType.FP16), int(VarType.BF16)}

    def ops(program):
        return [op for block in program.blocks for op in block.ops]

    def collectives(op_list):
        out: Dict[int, Dict[str, int]] = {}
        for op in op_list:
            name = collective_type(op.type)
            if name is not None:
                ring = out.setdefault(int(op.attr("ring_id")) if op.has_attr("ring_id") else 0, {})
                ring[name] = ring.get(name, 0) + 1
        return out

    main_ops, startup_ops = ops(main), ops(startup)
    casts = {"to_16bit": 0, "from_16bit": 0, "other": 0}
    for op in main_ops:
        if op.type == "cast":
            key = ("to_16bit" if int(op.attr("out_dtype")) in low else
                   "from_16bit" if int(op.attr("in_dtype")) in low else "other")
            casts[key] += 1
    rank_of = {e: i for i, e in enumerate(endpoints)}
    rings = {int(op.attr("ring_id")): sorted(rank_of.get(e, -1) for e in op.attr("endpoints").split(","))
             for op in startup_ops if op.type == "c_comm_init"}
    persistable = 0
    for var in main.global_block().vars.values():
        if var.persistable and var.type == VarType.LOD_TENSOR and all(d >= 0 for d in var.shape):
            persistable += int(np.prod(var.shape, dtype=np.int64)) * core.size_of_dtype(var.dtype)
    return ProgramFacts(
        main_ops=len(main_ops), main_blocks=main.num_blocks, startup_ops=len(startup_ops), casts=casts,
        amp_ops={op_type: sum(op.type == op_type for op in main_ops) for op_type in _AMP_OPS}, rings=rings,
        collectives=collectives(main_ops), startup_collectives=collectives(startup_ops),
        conditional_blocks=sum(op.type == "conditional_block" for op in main_ops), persistable_bytes=persistable)


def _ranks(ranks: Sequence[int]) -> str:
    """0-7, 0,4,...,28 or 0,3,5: a rank list, short."""
    r = list(ranks)
    if len(r) > 2 and r == list(range(r[0], r[-1] + 1)):
        return f"{r[0]}-{r[-1]}"
    if len(r) > 3 and len({b - a for a, b in zip(r, r[1:])}) == 1:
        return f"{r[0]},{r[1]},...,{r[-1]}"
    return ",".join(map(str, r))


def _ring_label(ring: int, ranks: Optional[List[int]], topo: Topology) -> str:
    """`ring 1 (ranks 0-1: rank 0's sharding group)`: the ring's members and what they are in `topo`."""
    if ranks is None:
        return f"ring {ring}"
    s, dp, n = topo.sharding_degree, topo.dp_degree, topo.world_size
    roles = []
    if ranks == list(range(n)):
        roles.append(f"all {n} ranks")
    if s > 1 and ranks == list(range(s)):
        roles.append("rank 0's sharding group")
    if s > 1 and dp > 1 and ranks == [k * s for k in range(dp)]:
        roles.append("rank 0's data-parallel group")
    return f"ring {ring} (ranks {_ranks(ranks)}" + (f": {', '.join(roles)})" if roles else ")")


def _counts(ops: Mapping[str, int]) -> str:
    return ", ".join(f"{op_type} {n}" for op_type, n in sorted(ops.items()))


def format_gpu_program(facts: ProgramFacts, *, topology: Topology, amp: AmpConfig,
                       memory: Optional[Mapping[str, int]] = None) -> List[str]:
    """The dry run's `== GPU program ==` section: what rank 0's built program holds (op counts, AMP
    casts, collectives per communication ring, gradient merge, persistable memory next to the
    memory table's estimate)."""
    c = facts.casts
    lines = [f"== GPU program (rank 0 of {topology.world_size}: built on this machine as a CUDA build of paddle "
             "builds it, not run) ==",
             f"training program: {facts.main_ops:,} ops in {facts.main_blocks} block(s); start-up program: "
             f"{facts.startup_ops:,} ops"]
    total = sum(c.values())
    if amp.use_amp:
        lines.append(f"amp {amp.amp_dtype} {amp.amp_level}: {total} cast ops ({c['to_16bit']} to {amp.amp_dtype}, "
                     f"{c['from_16bit']} back from it, {c['other']} other); {_counts(facts.amp_ops)}")
    else:
        lines.append(f"amp: off (float32): {total} cast op(s), {c['to_16bit']} to 16 bits")
    if facts.collectives:
        lines.append("collectives per ring (training program):")
        lines += [f"  {_ring_label(r, facts.rings.get(r), topology)}: {_counts(ops)}"
                  for r, ops in sorted(facts.collectives.items())]
    else:
        lines.append("collectives: none in the training program" + (" (one rank)" if topology.world_size == 1 else ""))
    if facts.rings:
        setup = ("start-up program: NCCL communicators (c_gen_nccl_id + c_comm_init) for ring(s) "
                 + ", ".join(str(r) for r in sorted(facts.rings)))
        setup += "".join(f"; {_counts(ops)} on ring {r}" for r, ops in sorted(facts.startup_collectives.items()))
        lines.append(setup)
    if facts.conditional_blocks:
        lines.append(f"gradient merge: {facts.conditional_blocks} conditional_block (the update runs once every "
                     f"{topology.accumulate_steps} micro-batches)")
    else:
        lines.append(f"gradient merge: no conditional_block (accumulate steps {topology.accumulate_steps})")
    kept = f"persistable tensors of rank 0's training program: {facts.persistable_bytes / MiB:.1f} MiB"
    if memory is not None:
        kept += f" (the memory table's persistent row, for the most loaded rank: {memory['persistent'] / MiB:.1f} MiB)"
    lines.append(kept)
    return lines


def build_gpu_program(cfg, topo: Topology, tasks, *, total_steps: int, endpoints: Sequence[str]):
    """The programs rank 0 of `topo.world_size` GPU workers would build for `cfg`, built on this machine
    through `compat.emulate_gpu_program` (fp16 op lists of a GPU build, NCCL communicator ops), with
    the builder the trainer uses (`build.build_run_programs`). Never run. Fleet's sharding dumps of the
    programs go to a temporary folder (the builder's default), fleet's prints to stderr (stdout is the
    plan); static mode is restored as it was."""
    import contextlib
    import sys

    with static_mode(), contextlib.redirect_stdout(sys.stderr), \
            emulate_gpu_program(0, topo.world_size, endpoints=endpoints):
        return build_run_programs(cfg, topo, tasks, total_steps=total_steps)


def dry_run(cfg) -> str:
    """`run_multitask_static.py --dry_run`: the plan of a validated RunConfig, without training.

    World size: PADDLE_TRAINERS_NUM (set by the launcher, or by hand to plan a cluster job from a
    laptop). The run plan (ernie_mtl/planning/plan.py) reads the task files (example counts drive sampling
    and quotas); head parameters are counted on heads created lazily (`paddle.LazyGuard`: shapes,
    no memory, no program). With `--device gpu` (accepted on a CPU build for a dry run) the program
    rank 0 would run on GPUs is built, never run, and described (`format_gpu_program`). Warnings
    about the plan (ernie_mtl/planning/plan.py `plan_warnings`) come last."""
    from ernie_mtl.planning.plan import corpus_warnings, flag_mode_schedule, flag_mode_steps, plan_warnings, prepare

    world_size = ProcessInfo.from_env().world_size
    resolved = cfg.model.resolve()
    arch = dict(resolved.arch)
    topo = Topology.from_config(cfg.parallel, world_size)
    resume_lines, point, continuation, raw = resume_plan(cfg, topo)
    if cfg.flag_mode:
        parts = estimate(arch, cfg.parallel, cfg.amp, world_size=world_size, seq_len=cfg.data.max_seq_len,
                         masked_tokens_per_seq=cfg.data.max_predictions_per_seq, pretraining_heads=True)
        run_samples = (point.train_samples.get(cfg.setup.tasks[0].name) if point is not None else None) or \
            cfg.optim.max_steps * topo.global_batch_size
        corpus = _corpus_plan(cfg, topo, train_samples=run_samples)
        sections = [format_plan(**parts), "== data ==", *corpus.lines()]
        warnings = corpus_warnings(corpus.epoch_counts("train"), what="--input_dir",
                                   global_batch=topo.global_batch_size, flag_mode=True, max_steps=cfg.optim.max_steps)
        _, _, unresumed = flag_mode_schedule(cfg, topo, run_samples, point)
        tasks, total_steps = None, flag_mode_steps(run_samples, topo, point)
        if continuation is not None:
            resume_lines += _checks_lines(cfg, raw, continuation, _flag_mode_tasks(cfg), unresumed=unresumed)
    else:
        info = ProcessInfo(rank=0, world_size=world_size, local_rank=0)
        run_plan = prepare(cfg, info=info, topo=topo, barrier=lambda *args, **kwargs: None, log=lambda message: None,
                           is_builder=True, load_dev=False, resume=point)
        if continuation is not None:
            resume_lines += _checks_lines(cfg, raw, continuation, run_plan.tasks, unresumed=run_plan.unresumed_steps)
        heads = head_parameter_counts(cfg.model.model_type, arch, run_plan.tasks,
                                      use_task_id=cfg.setup.mtl.use_task_id)
        longest = max(task.spec.max_seq_len for task in run_plan.tasks)
        summary = (f"task schedule (planned {run_plan.planned.total_steps} optimizer steps = LR horizon):\n"
                   + run_plan.schedule.summary())
        from ernie_mtl.planning.refine import refine_targets, stages_table

        if refine_targets(cfg):
            summary += "\n" + stages_table(cfg, run_plan, topo.slots_per_step)
        parts = estimate(arch, cfg.parallel, cfg.amp, world_size=world_size, seq_len=longest, masked_tokens_per_seq=20,
                         task_heads=heads, pretraining_heads=False)
        sections = [format_plan(**parts, schedule_summary=summary)]
        warnings = plan_warnings(run_plan, topo, flag_mode=False)
        tasks, total_steps = run_plan.tasks, run_plan.planned.total_steps
    if continuation is not None:
        resume_lines.append(f"the run continues to step {total_steps}")
    sections = ["== resume ==", *resume_lines, *sections]
    if resolve_device(cfg.train.device) == "gpu":
        if tasks is None:  # flag mode: the one pretrain task, its corpus not loaded (the program needs none)
            tasks = _flag_mode_tasks(cfg)
        endpoints = [f"127.0.0.1:{6170 + i}" for i in range(world_size)]  # stand-ins: only their order matters
        programs = build_gpu_program(cfg, topo, tasks, total_steps=total_steps, endpoints=endpoints)
        sections += format_gpu_program(program_facts(programs.main, programs.startup, endpoints=endpoints),
                                       topology=topo, amp=cfg.amp, memory=parts["memory"])
    if warnings:
        sections += ["== warnings ==", *warnings]
    return "\n".join(sections)


def resume_plan(cfg, topo: Topology):
    """(lines, ResumePoint, Continuation, train_state.json) of the checkpoint this command would resume
    (None for each without one):
    found and verified as the run finds it (a damaged checkpoint, or --resume none over checkpoints,
    is refused with the run's own message), then how it continues on `topo`
    (ernie_mtl/checkpoint/reshard.decide): the same topology, resharded, another global batch, or
    refused with what would be needed (CheckpointError, exit status 2, as the run would)."""
    from ernie_mtl.checkpoint.reshard import ReshardError, decide
    from ernie_mtl.checkpoint.store import CheckpointError, Checkpointer, read_train_state_file
    from ernie_mtl.planning.plan import resume_point

    def unused(prefix: str) -> None:
        raise AssertionError("the dry run reads no program state")

    train_cfg = cfg.train
    finder = Checkpointer(train_cfg.output_dir, rank=0, world_size=topo.world_size, per_rank_state=False,
                          save_program_state=unused, load_program_state=unused, keep_last=train_cfg.keep_last,
                          log=lambda message: None)
    ref = finder.resolve(train_cfg.resume, overwrite=train_cfg.overwrite_output_dir)
    if ref is None:
        why = ("--resume none" if train_cfg.resume == "none" else f"no checkpoint in {train_cfg.output_dir}")
        start = (f"; warm start from --init_from {train_cfg.init_from} (its weights"
                 f"{' and optimizer state' if train_cfg.init_optimizer else ''}, a new step 0, LR schedule and task "
                 "schedule)"
                 if train_cfg.init_from else "")
        return [f"a new run ({why}){start}"], None, None, None
    raw = read_train_state_file(ref.path)
    try:
        c = decide(raw, topo.to_dict(), flag_mode=cfg.flag_mode, allow_batch_change=train_cfg.allow_batch_change,
                   where=str(ref.path))
    except ReshardError as e:
        raise CheckpointError(str(e)) from None
    lines = [f"checkpoint {ref.path}", *c.summary()]
    if train_cfg.init_from:
        lines.append(f"--init_from {train_cfg.init_from} is not used: the run resumes its own checkpoint")
    return lines, resume_point(ref, c, topo), c, raw


def _checks_lines(cfg, raw, continuation, tasks, *, unresumed: int) -> List[str]:
    """The resume checks the run makes when it loads the checkpoint (seed, tasks, data identity, LR
    settings): a difference the run would refuse is refused here, with the run's message."""
    from types import SimpleNamespace

    from ernie_mtl.checkpoint.store import CheckpointError, check_differences, resume_refusal
    from ernie_mtl.planning.plan import resume_checks

    checks = resume_checks(cfg, SimpleNamespace(tasks=tasks, unresumed_steps=unresumed))
    diffs = check_differences(raw, checks, free=("total_steps",) if continuation.kind == "batch_change" else ())
    if diffs:
        raise CheckpointError(resume_refusal(continuation.path, diffs))
    return ["seed, tasks, data and learning-rate settings: as the checkpoint recorded them"]


def _flag_mode_tasks(cfg) -> List[Any]:
    """The task objects of a flag-mode run (the one `pretrain` task), without loading their data."""

    ctx = TaskContext(vocab_file=str(cfg.data.vocab_file), seed=cfg.train.seed, model_type=cfg.model.model_type,
                      log=lambda message: None, cache_dir=cfg.data.data_cache)
    return [get_task_type(spec.reader)(spec, ctx) for spec in cfg.setup.tasks]


def _corpus_plan(cfg, topo: Topology, *, train_samples: Optional[int] = None):
    """The MixturePlan of `--input_dir` for the run: per corpus its weight, documents, samples planned
    and (`lines()`, `epoch_counts()`) epochs (arithmetic and one pass of the compiled helper; no index
    is built). `train_samples`: the run's (default --max_steps global batches; a resumed run's are
    its checkpoint's)."""
    from ernie_mtl.planning.plan import TEST_ITERS_PER_EVAL_ITER

    d = cfg.data
    gb = topo.global_batch_size
    eval_samples = cfg.train.eval_iters * gb
    counts = [train_samples or cfg.optim.max_steps * gb, eval_samples, TEST_ITERS_PER_EVAL_ITER * eval_samples]
    sample_cfg = PretrainSampleConfig(max_seq_len=d.max_seq_len, short_seq_prob=d.short_seq_prob,
                                      binary_head=cfg.model.binary_head, masked_lm_prob=d.masked_lm_prob,
                                      max_predictions_per_seq=d.max_predictions_per_seq, max_ngrams=d.max_ngrams,
                                      seed=cfg.train.seed)
    mixture = parse_mixture(d.input_dir, what="--input_dir")
    return plan_mixture(mixture, split=d.split, num_samples=counts, cfg=sample_cfg)


def head_parameter_counts(model_type: str, arch: Mapping[str, Any], tasks, *, use_task_id: bool = False
                          ) -> Dict[str, int]:
    """Parameters of every head group (shared heads once; a tied embedding counts as the backbone's),
    from heads created under `paddle.LazyGuard` in dynamic mode: exact shapes, nothing allocated, no
    program. The heads see the backbone's config and, for a tied LM decoder, a lazily created
    word-embedding parameter of the backbone's shape (the backbone itself is counted in closed form)."""
    from types import SimpleNamespace

    import numpy as np
    import paddle


    was_static = not paddle.in_dynamic_mode()
    paddle.disable_static()
    try:
        with paddle.LazyGuard():
            _, config = backbone_config(model_type, {k: v for k, v in arch.items() if k != "model_type"},
                                        use_task_id=use_task_id, num_tasks=len(tasks))
            embedding = paddle.create_parameter([config.vocab_size, config.hidden_size], "float32")
            backbone = SimpleNamespace(embeddings=SimpleNamespace(word_embeddings=SimpleNamespace(weight=embedding)))
            enc = Encoded(sequence_output=None, pooled_output=None, backbone=backbone, config=config, feeds={})
            counts: Dict[str, int] = {}
            groups = group_of(tasks)
            for task in tasks:
                group = groups[task.spec.name]
                if f"head {group}" in counts:
                    continue
                head = task.create_head(enc)
                counts[f"head {group}"] = int(sum(int(np.prod(p.shape)) for p in head.parameters()
                                                  if p is not embedding))
        return counts
    finally:
        if was_static:
            paddle.enable_static()
