"""Parallel topology (a small pure object) and the fleet strategy (a pure function of it).

Rank layout, as fleet's static ShardingOptimizer and PaddleNLP's topology lay it out: the
sharding groups are runs of consecutive ranks, so `global_rank = dp_rank * sharding_degree +
sharding_rank`. Every (dp, sharding) rank reads different samples: the data-parallel world has
`dp_degree * sharding_degree` members and a rank's data rank is its global rank.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence

from ernie_mtl.dist.console import fleet_log_level
from ernie_mtl.config import AmpConfig, ConfigError, ParallelConfig

if TYPE_CHECKING:  # pragma: no cover
    from paddle.distributed.fleet import DistributedStrategy


@dataclass(frozen=True)
class Topology:
    """How many processes, how they are grouped, and how a global batch is cut into micro-batches.

    Build it with `Topology.create(...)` or `Topology.from_config(...)`, which validate; the
    constructor itself trusts its arguments.
    """

    world_size: int
    dp_degree: int
    sharding_degree: int
    micro_batch_size: int
    global_batch_size: int

    @property
    def data_world_size(self) -> int:
        """Number of ranks that read different samples (dp x sharding)."""
        return self.dp_degree * self.sharding_degree

    @property
    def accumulate_steps(self) -> int:
        """Micro-batches per rank per optimizer step."""
        return self.global_batch_size // (self.micro_batch_size * self.data_world_size)

    def data_rank(self, global_rank: int) -> int:
        """Position of `global_rank` in the data-parallel world (which samples it reads)."""
        self._check_rank(global_rank)
        return self.dp_rank(global_rank) * self.sharding_degree + self.sharding_rank(global_rank)

    def dp_rank(self, global_rank: int) -> int:
        """Index of the sharding group `global_rank` belongs to."""
        self._check_rank(global_rank)
        return global_rank // self.sharding_degree

    def sharding_rank(self, global_rank: int) -> int:
        """Position of `global_rank` inside its sharding group."""
        self._check_rank(global_rank)
        return global_rank % self.sharding_degree

    def _check_rank(self, global_rank: int) -> None:
        if not 0 <= global_rank < self.world_size:
            raise ValueError(f"rank {global_rank} is outside 0..{self.world_size - 1}")

    def to_dict(self) -> Dict[str, int]:
        """JSON-friendly description (stored in checkpoints, compared on resume)."""
        return {**asdict(self), "accumulate_steps": self.accumulate_steps}

    @classmethod
    def create(cls, world_size: int, *, micro_batch_size: int, global_batch_size: Optional[int] = None,
               dp_degree: int = -1, sharding_degree: int = 1) -> "Topology":
        """Validated topology. `dp_degree=-1` infers it from the world size; a global batch of
        None means no accumulation. Raises ConfigError listing every problem."""
        problems: List[str] = []
        if world_size < 1:
            problems.append(f"world size {world_size} must be >= 1")
        if sharding_degree < 1:
            problems.append(f"--sharding_degree {sharding_degree} must be >= 1")
        if micro_batch_size < 1:
            problems.append(f"--micro_batch_size {micro_batch_size} must be >= 1")
        if dp_degree == -1 and world_size >= 1 and sharding_degree >= 1:
            if world_size % sharding_degree:
                problems.append(f"--sharding_degree {sharding_degree} does not divide the number of processes "
                                f"{world_size}; launch a multiple of {sharding_degree} processes or change "
                                "--sharding_degree")
            dp_degree = max(world_size // sharding_degree, 1)
        elif dp_degree < 1:
            problems.append(f"--dp_degree {dp_degree} must be >= 1 (or -1 to infer it from the number of "
                            "processes)")
        elif sharding_degree >= 1 and dp_degree * sharding_degree != world_size:
            problems.append(f"--dp_degree {dp_degree} x --sharding_degree {sharding_degree} = "
                            f"{dp_degree * sharding_degree} must equal the number of processes {world_size}; "
                            f"launch {dp_degree * sharding_degree} processes or set --dp_degree -1 to infer it")
        if problems:
            raise ConfigError(problems)
        unit = micro_batch_size * dp_degree * sharding_degree
        if global_batch_size is None:
            global_batch_size = unit
        elif global_batch_size < 1 or global_batch_size % unit:
            below = (global_batch_size // unit) * unit
            nearest = " or ".join(str(v) for v in (below, below + unit) if v > 0)
            raise ConfigError([
                f"--global_batch_size {global_batch_size} is not a multiple of --micro_batch_size "
                f"{micro_batch_size} x data-parallel world {dp_degree * sharding_degree} (dp {dp_degree} x "
                f"sharding {sharding_degree}) = {unit}; nearest valid: {nearest}"])
        return cls(world_size=world_size, dp_degree=dp_degree, sharding_degree=sharding_degree,
                   micro_batch_size=micro_batch_size, global_batch_size=global_batch_size)

    @classmethod
    def from_config(cls, cfg: ParallelConfig, world_size: int) -> "Topology":
        """Topology of `cfg` on `world_size` processes (validates `cfg` too)."""
        cfg.validate()
        return cls.create(world_size, micro_batch_size=cfg.micro_batch_size,
                          global_batch_size=cfg.global_batch_size, dp_degree=cfg.dp_degree,
                          sharding_degree=cfg.sharding_degree if cfg.use_sharding else 1)


def build_strategy(topo: Topology, parallel_cfg: ParallelConfig, amp_cfg: AmpConfig, *,
                   recompute_checkpoints: Sequence[str] = ()) -> "DistributedStrategy":
    """The fleet strategy for `topo` (pure: builds a new object, touches nothing global).

    - Data parallelism is fleet's collective default (gradients all-reduced in fused buckets,
      parameters broadcast from rank 0 at start-up).
    - Sharding: `sharding_configs` with the degree and, when dp > 1, the hybrid dp degree.
    - Gradient accumulation: `gradient_merge` (k_steps, averaged) without sharding; with sharding
      `sharding_configs["gradient_merge_acc_step"]` instead. Never both: fleet then silently drops
      sharding and data parallelism. Sharding with accumulation also needs `required_flags()`.
    - AMP float16: fleet AMP with the custom lists and (dynamic) loss scaling; O2 sets
      `use_pure_fp16` with `use_fp16_guard` (the paddlenlp models wrap their forward in
      `fp16_guard`, the loss stays float32); the float32 parameters are cast after the startup
      program by `Programs.initialize`. AMP bfloat16: fleet 2.6.2 has no bf16 switch, so the strategy carries no
      AMP and `build_pretrain_programs` decorates the optimizer with
      `paddle.static.amp.decorate(dtype="bfloat16")` before fleet wraps it (see model.py).
    - Recompute: checkpoints are the variable names of every encoder layer's output, so each
      layer is recomputed in the backward pass (no checkpoints = no recompute, PaddleNLP's bug).
      They exist only once the forward is built: pass this function (partially applied) to
      `build_pretrain_programs`, which supplies them.
    """
    import paddle.distributed.fleet as fleet

    strategy = fleet.DistributedStrategy()
    acc = topo.accumulate_steps
    if topo.sharding_degree > 1:
        strategy.sharding = True
        strategy.sharding_configs = {
            "sharding_degree": topo.sharding_degree,
            "dp_degree": topo.dp_degree,
            "hybrid_dp": topo.dp_degree > 1,
            "gradient_merge_acc_step": acc,
            "segment_broadcast_MB": 32,
            "mp_degree": 1,
            "pp_degree": 1,
        }
    elif acc > 1:
        strategy.gradient_merge = True
        strategy.gradient_merge_configs = {"k_steps": acc, "avg": True}
    if amp_cfg.use_amp and amp_cfg.amp_dtype == "float16":
        strategy.amp = True
        strategy.amp_configs = {
            "init_loss_scaling": amp_cfg.init_loss_scaling,
            "use_dynamic_loss_scaling": amp_cfg.use_dynamic_loss_scaling,
            "custom_white_list": list(amp_cfg.custom_white_list),
            "custom_black_list": list(amp_cfg.custom_black_list),
            "use_pure_fp16": amp_cfg.amp_level == "O2",
            "use_fp16_guard": True,
        }
    if parallel_cfg.use_recompute:
        if not recompute_checkpoints:
            raise ValueError("recompute needs checkpoints (the encoder layers' outputs); without them fleet "
                             "recomputes nothing. Let build_pretrain_programs call build_strategy.")
        strategy.recompute = True
        strategy.recompute_configs = {"checkpoints": list(recompute_checkpoints)}
    return strategy


RUN_FLAGS = ("FLAGS_new_executor_sequential_run",)  # the flags required_flags may set


def required_flags(topo: Topology) -> Dict[str, Any]:
    """Paddle flags a run with this topology needs; apply with `paddle.set_flags` (or export them
    as environment variables) before the first `exe.run`.

    `FLAGS_new_executor_sequential_run`: sharding's gradient-merge `conditional_block` declares no
    inputs or outputs, so the standalone executor may reorder it; results were about 1e-2 off on
    CPU without the flag (platform notes). Set for sharding with accumulation, GPU included, until
    shown unnecessary there.
    """
    flags: Dict[str, Any] = {}
    if topo.sharding_degree > 1 and topo.accumulate_steps > 1:
        flags["FLAGS_new_executor_sequential_run"] = True
    return flags


def init_fleet(topo: Topology, *, role_maker: Any = None) -> None:
    """`fleet.init(is_collective=True)` and a check that the launcher's world matches `topo`."""
    import paddle.distributed.fleet as fleet

    fleet.init(role_maker=role_maker, is_collective=True, log_level=fleet_log_level())
    if fleet.worker_num() != topo.world_size:
        raise ConfigError([f"the launcher started {fleet.worker_num()} processes but the topology expects "
                           f"{topo.world_size} (dp {topo.dp_degree} x sharding {topo.sharding_degree})"])
