"""Everything a run sets up before its first step, in order: the process and its place in the job
(static mode, gloo on CPU, topology, fleet), the run plan (tasks, data, schedule), the programs
(built once), and the executor with the programs initialised. `open_session(cfg)` returns them as
one `Session`, which the loop, evaluation and export read.

Runs in one process one after another (a notebook cell run twice) each get a fresh `Scope`, so no
parameter of an earlier run leaks into a later one.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from ernie_mtl.checkpoint.reshard import Continuation
from ernie_mtl.checkpoint.store import CheckpointRef, Checkpointer
from ernie_mtl.config import ConfigError
from ernie_mtl.engine.elastic import (check_init_from, continuation_for, is_checkpoint, portable_state, warm_start,
                                      write_state)
from ernie_mtl.dist.process import ProcessInfo, StoreBarrier, executor_mode, resolve_device, start_process
from ernie_mtl.dist.topology import Topology
from ernie_mtl.planning.plan import RunPlan, prepare, resume_point
from ernie_mtl.program.builder import Programs, build_run_programs
from ernie_mtl.dist.compat import is_cpu_build, strip_gpu_sync_ops
from ernie_mtl.program.cpu_kernels import tune_for_cpu, use_onednn_ops


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

    @property
    def is_rank0(self) -> bool:
        return self.info.rank == 0

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
            state_format=self.cfg.train.checkpoint_format, portable_state=lambda choose: portable_state(self, choose))

    def scope_guard(self):
        """Run the block with this session's scope as paddle's global scope (what `exe.run` and
        `paddle.static.save/load` read)."""
        import paddle

        return paddle.static.scope_guard(self.scope)


def open_session(cfg, *, on_distributed: Optional[Callable[[ProcessInfo], None]] = None,
                 notes: Sequence[str] = ()) -> Session:
    """Set up the run `cfg` (a validated RunConfig). `on_distributed(info)` runs once the job's store
    exists (the command line's peer watch); `notes` are logged first (the entry point's thread and
    executor decisions)."""
    import paddle

    info, log, topo = start_process(cfg, on_distributed=on_distributed)
    for line in [*notes, *cfg.setup.reports]:
        log.info(line)
    barrier = StoreBarrier(info)
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
    if init_from and not is_checkpoint(init_from):
        programs.weights = init_from  # a PaddleNLP directory: loaded by initialisation (before AMP O2's cast)
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope):
        try:
            exe = make_executor(cfg, info, programs, log)
        except ConfigError as e:
            if init_from and programs.weights == init_from:
                raise ConfigError([f"--init_from {init_from}: {p}" for p in e.problems]) from None
            raise
    session = Session(cfg=cfg, info=info, log=log, topo=topo, barrier=barrier, plan=plan, programs=programs, exe=exe,
                      scope=scope, resume_from=resume_from, continuation=continuation)
    if init_from and is_checkpoint(init_from):
        session.warm_start = warm_start(session, init_from, with_optimizer=cfg.train.init_optimizer)
    elif init_from:
        session.warm_start = (f"warm start from the PaddleNLP weights of {init_from} (task heads other than its "
                              "pretraining heads start fresh); a new run from step 0")
    return session


def resolve_resume(cfg, info: ProcessInfo, log) -> Optional[CheckpointRef]:
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


def build_programs(cfg, topo: Topology, plan: RunPlan) -> Programs:
    """The run's programs, the LR horizon being the planned number of optimizer steps. Built with
    the working directory set to `<output_dir>/program_desc`: fleet's sharding dumps its programs
    into the cwd."""
    dump_dir = os.path.join(cfg.train.output_dir, "program_desc")
    os.makedirs(dump_dir, exist_ok=True)
    with contextlib.chdir(dump_dir):
        return build_run_programs(cfg, topo, plan.tasks, total_steps=plan.planned.total_steps)


def tune_programs(programs: Programs, *, enabled: bool) -> str:
    """CPU runs, before the programs first run: `cpu_kernels.tune_for_cpu` on the training program
    (oneDNN on the exact op types, bias gradients by matmul) and the oneDNN part on the evaluation
    program (the same exact forward ops; it has no gradients). The export program is left alone: an
    exported inference model stays device-neutral. Returns the line for the start-up log."""

    if not enabled:
        return "CPU kernels: as built (--cpu_kernels false)"
    line = tune_for_cpu(programs.main)
    changed = use_onednn_ops(programs.test)
    return f"{line}; evaluation program: oneDNN kernels on {sum(changed.values())} ops"


def make_executor(cfg, info: ProcessInfo, programs: Programs, log):
    """The executor for --device, with `programs` made runnable here (CPU: GPU sync ops stripped),
    on CPU tuned (`tune_programs`, unless --cpu_kernels false; logged with the executor in use), and
    initialised in the current scope (startup, pretrained weights, AMP O2 cast, EMA)."""
    import paddle


    if is_cpu_build():
        strip_gpu_sync_ops(programs.main, programs.startup, programs.test)
    device = resolve_device(cfg.train.device)
    if cfg.amp.use_amp and device == "cpu":
        log.warning("--use_amp on CPU: a CPU build inserts no float16 casts, so this run computes in float32 "
                    "(with loss scaling); AMP takes effect on GPUs")
    if device == "cpu":
        log.info(f"{tune_programs(programs, enabled=cfg.train.cpu_kernels)}; {executor_mode()}")
    place = paddle.CPUPlace() if device == "cpu" else paddle.CUDAPlace(info.local_rank)
    exe = paddle.static.Executor(place)
    programs.initialize(exe)
    return exe
