"""What the engine can do for a validated `RunConfig`, each a function with a typed result (never a
process exit): train, prebuild the index caches, plan (dry run), evaluate a saved model, predict
with an exported model. The command line (ernie_mtl/main.py) is one client; the Python API is
another. User errors are raised as `UserError` subclasses (ConfigError, CheckpointError) carrying
the message the command line prints.
"""
from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, Optional, Sequence

from ernie_mtl.checkpoint.layout import best_dir, export_dir, is_complete, last_dir
from ernie_mtl.dist.process import ProcessInfo, resolve_device
from ernie_mtl.dist.console import get_logger
from ernie_mtl.dist.topology import Topology
from ernie_mtl.planning.dryrun import dry_run
from ernie_mtl.planning.plan import load_eval_split, prepare

if TYPE_CHECKING:  # annotations only: no import at run time (no cycle)
    from ernie_mtl.config import RunConfig
    from ernie_mtl.engine.loop import Trainer


@dataclass
class RunResult:
    """What a training run produced (on every rank; paths are rank 0's files). With refine stages
    (ernie_mtl/engine/stages.py) the fields describe the final models -- a refined target's test
    results, best checkpoint and export are its refine stage's -- and `stages` each stage's own."""

    output_dir: Path
    steps: int  # optimizer steps completed (with refine stages: of the multi-task stage)
    eval: Dict[str, Dict[str, float]] = field(default_factory=dict)  # task -> its latest dev metrics
    test: Dict[str, Any] = field(default_factory=dict)  # test_results.json: task -> {last, best}
    best_checkpoints: Dict[str, Path] = field(default_factory=dict)  # target -> best_<task>/
    exports: Dict[str, Path] = field(default_factory=dict)  # target -> <task>/infer_model
    last_checkpoint: Optional[Path] = None
    stages: Dict[str, Dict[str, Any]] = field(default_factory=dict)  # "multitask" / target -> steps, test, output_dir


@dataclass
class PrebuildResult:
    total_steps: int
    tasks: int
    world_size: int


def train(cfg: RunConfig, *, callbacks: Sequence = (), on_distributed: Optional[Callable[[ProcessInfo], None]] = None,
          notes: Sequence[str] = (), preempt_signals: Sequence[str] = ()) -> RunResult:
    """Train as `cfg` says (resume, train, test, export; then the refine stages, if any); `callbacks`:
    extra Callback objects (they see every stage); `preempt_signals` ("TERM", "USR1", ...): handled
    during the loop (ernie_mtl/dist/preemption.py: save at the next step boundary on every rank, then
    `Preempted` is raised)."""
    from ernie_mtl.engine.callbacks import Callback
    from ernie_mtl.planning.refine import refine_targets

    for cb in callbacks:
        if not isinstance(cb, Callback):
            raise TypeError(f"callbacks: {cb!r} is not an ernie_mtl Callback instance")
    stage = functools.partial(_train_stage, callbacks=callbacks, preempt_signals=preempt_signals)
    if refine_targets(cfg):
        return _train_in_stages(cfg, stage, on_distributed=on_distributed, notes=notes)
    return stage(cfg, None, on_distributed=on_distributed, notes=notes)[0]


def _train_stage(cfg: RunConfig, process, *, callbacks: Sequence, preempt_signals: Sequence[str],
                 on_distributed: Optional[Callable[[ProcessInfo], None]] = None, notes: Sequence[str] = ()):
    """(RunResult, the job's Process) of one training run (a stage of a run with refine stages)."""
    from ernie_mtl.engine.loop import Trainer
    from ernie_mtl.engine.session import open_session
    from ernie_mtl.planning.refine import refine_targets, stages_table

    session = open_session(cfg, on_distributed=on_distributed, notes=notes, process=process)
    if refine_targets(cfg) and session.is_rank0:
        session.log.info(stages_table(cfg, session.plan, session.topo.slots_per_step))
    with session.scope_guard():
        trainer = Trainer(session, callbacks=callbacks, preempt_signals=preempt_signals)
        test = trainer.run()
    session.log.info(trainer.reporter.closing(cfg.train.output_dir))
    return run_result(trainer, test), session.process


def _train_in_stages(cfg: RunConfig, stage, *, on_distributed, notes: Sequence[str]) -> RunResult:
    """The multi-task stage, then each target's refine stage, in one job (ernie_mtl/engine/stages.py)."""
    from ernie_mtl.engine.session import start_job
    from ernie_mtl.engine.stages import MULTITASK, StageRun, run_stages

    process = start_job(cfg, on_distributed=on_distributed)
    pending_notes = list(notes)

    def run_stage(stage_cfg, proc, label: str) -> StageRun:
        result, proc = stage(stage_cfg, proc, notes=[*pending_notes, label])
        pending_notes.clear()
        return StageRun(result=result, process=proc)

    first, done = run_stages(cfg, run_stage, process)
    out = Path(cfg.train.output_dir)
    record = done["record"]["stages"]
    mt = record.get(MULTITASK, {})
    stages = {MULTITASK: {"steps": first.steps if first else mt.get("steps"), "test": done["multitask_test"],
                          "output_dir": out}}
    result = first if first is not None else RunResult(output_dir=out, steps=int(mt.get("steps") or 0))
    result.last_checkpoint = last_dir(out) if is_complete(last_dir(out)) else None
    from ernie_mtl.engine.stages import merged_test_results
    from ernie_mtl.checkpoint.layout import refine_dir

    refined_tests: Dict[str, Dict[str, Any]] = {}
    for target, refined in done["refined"].items():
        folder = refine_dir(out, target)
        entry: Dict[str, Any]
        if isinstance(refined, RunResult):
            entry = {"steps": refined.steps, "test": refined.test, "output_dir": folder}
            result.eval.update({target: refined.eval[target]} if target in refined.eval else {})
        else:
            entry = {"steps": refined.get("steps"), "test": refined.get("test", {}), "output_dir": folder}
        stages[target] = entry
        refined_tests[target] = entry["test"]
        if is_complete(best_dir(folder, target)):
            result.best_checkpoints[target] = best_dir(folder, target)
        if export_dir(out, target).is_dir():
            result.exports[target] = export_dir(out, target)
    result.test = merged_test_results(done["multitask_test"], refined_tests)
    result.stages = stages
    return result


def run_result(trainer: Trainer, test: Dict[str, Any]) -> RunResult:
    """The `RunResult` of a finished `Trainer` (`test`: what its final test returned)."""
    session = trainer.session
    out = Path(session.cfg.train.output_dir)
    targets = [task.spec.name for task in session.plan.tasks if task.spec.is_target]
    return RunResult(output_dir=out, steps=trainer.step, eval=dict(trainer.latest_eval), test=test,
                     best_checkpoints={n: best_dir(out, n) for n in targets if is_complete(best_dir(out, n))},
                     exports={n: export_dir(out, n) for n in trainer.exported if export_dir(out, n).is_dir()},
                     last_checkpoint=last_dir(out) if is_complete(last_dir(out)) else None)


def prebuild(cfg: RunConfig, *, world_size: Optional[int] = None) -> PrebuildResult:
    """`--prebuild_index`: plan the run exactly as training would (same flags and defaults, the world
    size of the launcher's environment unless given) and build every index cache it reads -- train,
    dev and the final test split. No process group, no program."""

    world = world_size or ProcessInfo.from_env().world_size
    info = ProcessInfo(rank=0, world_size=world, local_rank=0)
    log = get_logger(0)
    topo = Topology.from_config(cfg.parallel, world)
    plan = prepare(cfg, info=info, topo=topo, barrier=lambda *args, **kwargs: None, log=log.info, is_builder=True)
    for task in plan.tasks:  # the targets' test splits are in the plan; an auxiliary corpus's too, if it has one
        if task.spec.test_file and task.sized_by_run and task.spec.name not in plan.test:
            load_eval_split(task, "test", plan.eval_batches)
    log.info(f"index caches ready for {plan.planned.total_steps} optimizer steps of {len(plan.tasks)} task(s) "
             f"(world size {world}); the run with the same flags reuses them")
    return PrebuildResult(total_steps=plan.planned.total_steps, tasks=len(plan.tasks), world_size=world)


def plan(cfg: RunConfig) -> str:
    """`--dry_run`: the plan as text (topology, schedule, memory, the GPU program, warnings)."""

    return dry_run(cfg)


def evaluate(cfg: RunConfig) -> Dict[str, Any]:
    """`--do_eval`: a saved model's metrics on a labelled file (the report also written to disk)."""
    import sys

    from ernie_mtl.engine.saved_models import evaluate_saved

    # the report is printed on stdout as JSON: the line about threads and kernels goes to stderr
    return evaluate_saved(cfg.train, use_gpu=resolve_device(cfg.train.device) == "gpu",
                          log=lambda line: print(line, file=sys.stderr, flush=True))


def predict(cfg: RunConfig) -> Path:
    """`--do_predict`: predictions of an exported task model; returns the file written."""
    import os

    from ernie_mtl.engine.saved_models import predict as predict_file, stage_export_dir

    train_cfg = cfg.train
    # --do_predict's checks (engine/config_checks.py)
    assert train_cfg.task is not None and train_cfg.pred_file is not None
    output = train_cfg.predict_output or os.path.join(train_cfg.output_dir, train_cfg.task, "predictions.json")
    return predict_file(stage_export_dir(train_cfg.output_dir, train_cfg.task, train_cfg.stage), train_cfg.pred_file,
                        output,
                        use_gpu=resolve_device(train_cfg.device) == "gpu", cpu_kernels=train_cfg.cpu_kernels)


# -- what a call leaves behind: nothing (the Python faces wrap every engine call in these) ---------------
@contextlib.contextmanager
def static_mode_restored() -> Iterator[None]:
    """Leave Paddle in the mode the caller had (the engine switches to static mode)."""
    import paddle

    dynamic = paddle.in_dynamic_mode()
    try:
        yield
    finally:
        if dynamic and not paddle.in_dynamic_mode():
            paddle.disable_static()
        elif not dynamic and paddle.in_dynamic_mode():
            paddle.enable_static()


@contextlib.contextmanager
def flags_restored() -> Iterator[None]:
    """Paddle flags the engine sets for a topology (ernie_mtl/dist/topology.required_flags) go back."""
    import paddle

    from ernie_mtl.dist.topology import RUN_FLAGS

    before = paddle.get_flags(list(RUN_FLAGS))
    try:
        yield
    finally:
        paddle.set_flags(before)


def resume_point(output_dir: str) -> dict:
    """The watchdog's resume hint for a run in `output_dir`: its model_last, and whether it is complete
    (the watchdog, in the dist layer, does not know the checkpoint layout)."""
    last = last_dir(output_dir)
    return {"resume_point": str(last), "resume_ready": lambda: is_complete(last)}
