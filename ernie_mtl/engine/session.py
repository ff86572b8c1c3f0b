"""Everything a run sets up before its first step, in order: the process and its place in the job
(static mode, gloo on CPU, topology, fleet), the run plan (tasks, data, schedule), the programs
(built once), and the executor with the programs initialised. `open_session(cfg)` returns them as
one `Session`, which the loop, evaluation and export read.

Runs in one process one after another (a notebook cell run twice) each get a fresh `Scope`, so no
parameter of an earlier run leaks into a later one.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Sequence

from ernie_mtl.checkpoint import layout
from ernie_mtl.checkpoint.reshard import Continuation
from ernie_mtl.checkpoint.store import CheckpointRef, Checkpointer, read_train_state_file
from ernie_mtl.config import ConfigError, parse_cpu_kernels
from ernie_mtl.engine.elastic import (check_init_from, continuation_for, is_checkpoint, portable_state, warm_start,
                                      write_state)
from ernie_mtl.dist import preemption
from ernie_mtl.dist.process import ProcessInfo, StoreBarrier, executor_mode, resolve_device, start_process
from ernie_mtl.dist.topology import Topology
from ernie_mtl.planning.plan import RunPlan, prepare, resume_checks, resume_point
from ernie_mtl.program.builder import Programs, build_run_programs
from ernie_mtl.dist.compat import is_cpu_build, strip_gpu_sync_ops
from ernie_mtl.program.cpu_kernels import tune_for_cpu, use_onednn_ops
from ernie_mtl.program.kernel_choice import (KernelCache, KernelChoice, Measure, machine_identity, measure_choice,
                                             reconcile)

if TYPE_CHECKING:  # annotations only: no import at run time (no cycle)
    from ernie_mtl.config import RunConfig


@dataclass
class Session:
    """A run, set up: what the loop, the evaluator and the exporter need."""

    cfg: Any  # RunConfig
    info: ProcessInfo
    log: Any  # logging.Logger
    topo: Topology
    barrier: StoreBarrier
    plan: RunPlan
    programs: Programs
    exe: Any  # paddle.static.Executor
    scope: Any  # paddle.static.Scope holding this run's variables
    resume_from: Optional[CheckpointRef] = None  # the checkpoint --resume designates, verified (None: new run)
    continuation: Optional[Continuation] = None  # how it continues on this topology (ernie_mtl/engine/elastic.py)
    warm_start: Optional[str] = None  # --init_from of a new run: what was loaded (the line to log)
    kernels: Optional[KernelChoice] = None  # CPU runs: the kernels the programs run with (checkpoints record it)
    resume_checks: Dict[str, Any] = field(default_factory=dict)  # what must not change to resume (planning.plan)

    @property
    def is_rank0(self) -> bool:
        return self.info.rank == 0

    @property
    def process(self) -> Process:
        return Process(info=self.info, log=self.log, topo=self.topo, barrier=self.barrier)

    @property
    def data_rank(self) -> int:
        return self.topo.data_rank(self.info.rank)

    def checkpointer(self, *, log) -> Checkpointer:
        """The checkpoint store of this run: every rank writes its own state under sharding (the
        state differs per rank), rank 0 alone otherwise; the program state is saved and loaded
        through paddle.static on this session's training program (without the loss sums of the
        metrics window, program/loss_sums.py: they are not model state)."""
        import paddle

        state = self.programs.state_program
        return Checkpointer(
            self.cfg.train.output_dir, rank=self.info.rank, world_size=self.info.world_size,
            per_rank_state=self.topo.sharding_degree > 1, keep_last=self.cfg.train.keep_last, barrier=self.barrier,
            log=log, save_program_state=lambda prefix: paddle.static.save(state, prefix),
            load_program_state=lambda prefix: paddle.static.load(state, prefix, self.exe),
            write_state=lambda values, what: write_state(self, values, what), topology=self.topo.to_dict(),
            state_format=self.cfg.train.checkpoint_format, portable_state=lambda choose: portable_state(self, choose),
            checkpoint_steps=self.cfg.train.checkpoint_steps, save_steps=self.cfg.train.save_steps)

    def scope_guard(self):
        """Run the block with this session's scope as paddle's global scope (what `exe.run` and
        `paddle.static.save/load` read)."""
        import paddle

        return paddle.static.scope_guard(self.scope)


@dataclass
class Process:
    """This process in its job, set up once (static mode, gloo, fleet): the stages of a run (the
    multi-task stage, then each refine stage: ernie_mtl/engine/stages.py) open their sessions in it."""

    info: ProcessInfo
    log: Any
    topo: Topology
    barrier: StoreBarrier


def start_job(cfg: RunConfig, *, on_distributed: Optional[Callable[[ProcessInfo], None]] = None) -> Process:
    """`start_process` and the job's barrier."""
    from ernie_mtl.dist.compat import require_supported_paddle

    require_supported_paddle()  # every face trains through here (the PALM face too)
    info, log, topo = start_process(cfg, on_distributed=on_distributed)
    return Process(info=info, log=log, topo=topo, barrier=StoreBarrier(info))


def open_session(cfg: RunConfig, *, on_distributed: Optional[Callable[[ProcessInfo], None]] = None,
                 notes: Sequence[str] = (), process: Optional[Process] = None) -> Session:
    """Set up the run `cfg` (a validated RunConfig). `on_distributed(info)` runs once the job's store
    exists (the command line's peer watch); `notes` are logged first (the entry point's thread and
    executor decisions). `process`: the job an earlier stage of the run set up (same topology)."""
    import paddle

    if process is None:
        process = start_job(cfg, on_distributed=on_distributed)
    elif Topology.from_config(cfg.parallel, process.info.world_size) != process.topo:
        raise ValueError("a later stage of a run must keep the topology of the first")
    info, log, topo, barrier = process.info, process.log, process.topo, process.barrier
    for line in [*notes, *cfg.setup.reports]:
        log.info(line)
    resume_from = resolve_resume(cfg, info, log)  # a damaged checkpoint is refused before any data or program work
    # ... and so is one that cannot continue on this topology (another global batch), with what would be needed
    continuation = continuation_for(cfg, resume_from, topo, log=log.info if info.rank == 0 else None)
    init_from = cfg.train.init_from if resume_from is None else None
    if cfg.train.init_from and resume_from is not None and info.rank == 0:
        log.info(f"--init_from {cfg.train.init_from} is not used: this run resumes its own checkpoint "
                 f"{resume_from.path} (a warm start applies to a new run only)")
    if init_from:
        check_init_from(init_from, with_optimizer=cfg.train.init_optimizer)
    plan = prepare(cfg, info=info, topo=topo, barrier=barrier, log=log.info,
                   resume=resume_point(resume_from, continuation, topo))
    programs = build_programs(cfg, topo, plan)
    if programs.fused_optimizer is not None and info.rank == 0:
        fused = programs.fused_optimizer
        log.info(f"--fuse_optimizer: {fused['adamw']} parameter updates in {fused['fused_adam']} fused_adam ops")
    preemption.guard_again()  # in case a library imported while building replaced the handlers
    if init_from and not is_checkpoint(init_from):
        programs.weights = init_from  # a PaddleNLP directory: loaded by initialisation (before AMP O2's cast)
    kernels = cpu_kernel_choice(cfg, info, barrier, programs, plan, resume_from, log)
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope):
        try:
            exe = make_executor(cfg, info, programs, log, kernels=kernels)
        except ConfigError as e:
            if init_from and programs.weights == init_from:
                raise ConfigError([f"--init_from {init_from}: {p}" for p in e.problems]) from None
            raise
    session = Session(cfg=cfg, info=info, log=log, topo=topo, barrier=barrier, plan=plan, programs=programs, exe=exe,
                      scope=scope, resume_from=resume_from, continuation=continuation, kernels=kernels,
                      resume_checks=resume_checks(cfg, plan))
    if init_from and is_checkpoint(init_from):
        session.warm_start = warm_start(session, init_from, with_optimizer=cfg.train.init_optimizer)
    elif init_from:
        session.warm_start = (f"warm start from the PaddleNLP weights of {init_from} (task heads other than its "
                              "pretraining heads start fresh); a new run from step 0")
    return session


def resolve_resume(cfg: RunConfig, info: ProcessInfo, log) -> Optional[CheckpointRef]:
    """The checkpoint `--resume` designates (None: a new run), found and verified -- every file's
    size and SHA-1, train_state.json field by field -- first thing, so a damaged or inconsistent
    checkpoint stops the run within seconds instead of after index caches and programs are built.
    Whether the run can continue from it exactly (topology, data, seed) is checked when it is loaded."""
    def unused(prefix: str) -> None:
        raise AssertionError("resolve_resume reads no program state")

    finder = Checkpointer(cfg.train.output_dir, rank=info.rank, world_size=info.world_size, per_rank_state=False,
                          save_program_state=unused, load_program_state=unused, keep_last=cfg.train.keep_last,
                          log=log.info if info.rank == 0 else (lambda message: None))
    return finder.resolve(cfg.train.resume, overwrite=cfg.train.overwrite_output_dir)


def build_programs(cfg: RunConfig, topo: Topology, plan: RunPlan) -> Programs:
    """The run's programs, the LR horizon being the planned number of optimizer steps; fleet's
    sharding dumps of the programs kept under `<output_dir>/program_desc`."""
    return build_run_programs(cfg, topo, plan.tasks, total_steps=plan.planned.total_steps,
                              dump_dir=os.path.join(cfg.train.output_dir, layout.PROGRAM_DESC))


def cpu_kernel_choice(cfg: RunConfig, info: ProcessInfo, barrier, programs: Programs, plan: RunPlan,
                      resume_from: Optional[CheckpointRef], log, *, measure: Optional[Measure] = None,
                      cache_path: Optional[os.PathLike] = None) -> Optional[KernelChoice]:
    """The CPU kernels of this run (None on GPU: nothing is timed there). Rank 0 decides
    (`decide_cpu_kernels`) and every rank receives its decision, so all ranks run the same kernels and
    the checkpoint records one choice; a note about a resume is logged as a warning."""
    if resolve_device(cfg.train.device) != "cpu":
        return None
    payload = None
    if info.rank == 0:
        choice, note = decide_cpu_kernels(cfg, programs, plan, resume_from, measure=measure, cache_path=cache_path)
        payload = {"choice": choice.to_json(), "note": note}
    shared = barrier.share("cpu kernels", payload)
    if shared["note"]:
        log.warning(shared["note"])
    return KernelChoice.from_json(shared["choice"])


def decide_cpu_kernels(cfg: RunConfig, programs: Programs, plan: RunPlan, resume_from: Optional[CheckpointRef], *,
                       measure: Optional[Measure] = None, cache_path: Optional[os.PathLike] = None):
    """(the kernels, a note or None) for --cpu_kernels: auto times the candidates on the built training
    program (kernel_choice.measure_choice: the kernel cache first) at the largest micro-batch and
    sequence length of the run's tasks; other modes are fixed. A resumed run reconciles that with the
    checkpoint's record (`kernel_choice.reconcile`: auto keeps the recorded kernels)."""
    mode, types = parse_cpu_kernels(cfg.train.cpu_kernels)
    if mode == "auto":
        batch = max(task.spec.batch_size for task in plan.tasks)
        seq = max(task.spec.max_seq_len for task in plan.tasks)
        cache = KernelCache(cache_path, machine=machine_identity())
        current = measure_choice(programs.main, batch=batch, seq=seq, cache=cache, measure=measure)
    else:
        current = KernelChoice.fixed(mode, types)
    return reconcile(current, recorded_kernels(resume_from))


def recorded_kernels(ref: Optional[CheckpointRef]) -> Optional[KernelChoice]:
    """The CPU kernels checkpoint `ref` was trained with: its record, or for a checkpoint written before
    kernels were recorded, what its `cpu_kernels` boolean meant then (true: `exact`, false: plain).
    None: a new run, or a checkpoint of a GPU run."""
    if ref is None:
        return None
    raw = read_train_state_file(ref.path)
    record = raw.get("extra", {}).get("cpu_kernels")
    if isinstance(record, dict):
        return KernelChoice.from_json(record, source="checkpoint")
    legacy = raw.get("config", {}).get("train", {}).get("cpu_kernels")
    if isinstance(legacy, bool) and "cpu_kernels" not in raw.get("extra", {}):
        return (KernelChoice.fixed("exact") if legacy else KernelChoice(mode="plain")).with_(source="checkpoint")
    return None


def tune_programs(programs: Programs, kernels: KernelChoice) -> str:
    """CPU runs, before the programs first run: `cpu_kernels.tune_for_cpu` on the training program
    (oneDNN on the chosen op types, bias gradients by matmul unless plain) and oneDNN on the chosen
    forward types of the evaluation program (it has no gradients). The export program is left alone:
    an exported inference model stays device-neutral. Returns the line for the start-up log."""
    if not kernels.onednn and not kernels.bias_grads:
        return f"CPU kernels: {kernels.describe()}"
    line = tune_for_cpu(programs.main, onednn_types=kernels.onednn, bias_grads=kernels.bias_grads)
    forward = kernels.forward_types()
    changed = use_onednn_ops(programs.test, forward) if forward else {}
    notes = "".join(f" ({n})" for n in kernels.notes)
    return (f"CPU kernels: {kernels.describe()}; {line}; evaluation program: oneDNN kernels on "
            f"{sum(changed.values())} ops{notes}")


def make_executor(cfg: RunConfig, info: ProcessInfo, programs: Programs, log, *,
                  kernels: Optional[KernelChoice] = None):
    """The executor for --device, with `programs` made runnable here (CPU: GPU sync ops stripped),
    on CPU tuned with `kernels` (`tune_programs`; logged with the executor in use; a fixed
    --cpu_kernels mode needs none given), and initialised in the current scope (startup, pretrained
    weights, AMP O2 cast, EMA)."""
    import paddle


    if is_cpu_build():
        strip_gpu_sync_ops(programs.main, programs.startup, programs.test)
    device = resolve_device(cfg.train.device)
    if cfg.amp.use_amp and device == "cpu":
        log.warning("--use_amp on CPU: a CPU build inserts no float16 casts, so this run computes in float32 "
                    "(with loss scaling); AMP takes effect on GPUs")
    if device == "cpu":
        if kernels is None:
            mode, types = parse_cpu_kernels(cfg.train.cpu_kernels)
            if mode == "auto":
                raise ValueError("make_executor: --cpu_kernels auto needs the run's measured KernelChoice "
                                 "(engine.session.cpu_kernel_choice)")
            kernels = KernelChoice.fixed(mode, types)
        log.info(f"{tune_programs(programs, kernels)}; {executor_mode()}")
    place = paddle.CPUPlace() if device == "cpu" else paddle.CUDAPlace(info.local_rank)
    exe = paddle.static.Executor(place)
    programs.initialize(exe)
    return exe
