"""The train state a checkpoint carries besides the program state, and resuming from it.

Everything an exact resume needs is derived from the task schedule's state (the task sequence
position, per-task micro-batch counts -- hence reader positions and epochs -- and finished
targets), plus the LR scheduler (with any re-plan), the callbacks' state (best metrics, early
stopping counters) and the exports done. Dropout needs nothing: its seeds are a pure function of
(seed, step, micro-batch, op, rank). The EMA's averages are variables of the program state.

`resume_checks` lists what must not change for the run to continue exactly (besides the topology,
which the checkpointer compares): the seed, every task's resolved spec, the identity of the
training data (content-based: ernie_mtl/data/identity.py) and the LR horizon.
"""
from __future__ import annotations

from typing import Any, Dict

from ernie_mtl.checkpoint import TrainState

UNRESOLVED = object()  # a trainer's resume_from before --resume was resolved (trainer.resolve_resume)


def resume_checks(trainer) -> Dict[str, Any]:
    """What must not change for the run to continue exactly (computed once per run: data hashing)."""
    from ernie_mtl.data.identity import data_identity

    if getattr(trainer, "_resume_checks", None) is None:
        o = trainer.cfg.optim
        trainer._resume_checks = {
            "seed": trainer.cfg.train.seed, "tasks": [t.spec.to_json() for t in trainer.tasks],
            "data": {t.spec.name: data_identity(t.spec.train_file) for t in trainer.tasks},
            "vocab": data_identity(str(trainer.cfg.data.vocab_file)),
            "total_steps": trainer.plan.planned.total_steps, "warmup_rate": o.warmup_rate,
            "decay_steps": o.decay_steps}
    return trainer._resume_checks


def train_state(trainer) -> TrainState:
    t = trainer
    return TrainState(
        step=t.step, consumed_samples=t.consumed_samples, lr_scheduler=t.p.lr_scheduler.state_dict(), rng={},
        sampler=t.schedule.state_dict(), config=t.cfg.to_dict(), topology=t.topo.to_dict(), name_map=t.p.name_map,
        extra={"resume_checks": resume_checks(t), "arch": dict(t.p.arch), "exported": t.exported,
               "flag_mode": t.cfg.flag_mode,
               "callbacks": {type(cb).__name__: cb.state_dict() for cb in t.callbacks},
               "tasks": [{"name": task.spec.name, "reader": task.name, "group": t.group_of[task.spec.name],
                          "is_target": task.spec.is_target, "spec": task.spec.to_json(),
                          "manifest": task.manifest()} for task in t.tasks]})


def resume(trainer) -> bool:
    """Continue from the checkpoint `--resume` designates, if any; returns whether it resumed."""
    t = trainer
    ref = t.resume_from if getattr(t, "resume_from", UNRESOLVED) is not UNRESOLVED else \
        t.checkpointer.resolve(t.cfg.train.resume, overwrite=t.cfg.train.overwrite_output_dir)
    if ref is None:
        if t.cfg.train.resume == "none" and t.cfg.train.overwrite_output_dir:
            _clear_previous_run(t)
        t.print(t.reporter.new_run(t.cfg.train.output_dir))
        return False
    state = t.checkpointer.load(ref, topology=t.topo.to_dict(), check=resume_checks(t))
    t.step = state.step
    t.p.lr_scheduler.set_state_dict(state.lr_scheduler)
    t.schedule.load_state_dict(state.sampler)
    t.exported = dict(state.extra.get("exported", {}))
    saved = state.extra.get("callbacks", {})  # by class name: enabling a callback later still resumes
    for cb in t.callbacks:
        if type(cb).__name__ in saved:
            cb.load_state_dict(saved[type(cb).__name__])
    t.print(t.reporter.resumed(t, ref.path))
    return True


def _clear_previous_run(trainer) -> None:
    """--resume none --overwrite_output_dir: the previous run's checkpoints, exports and records go
    (rank 0 removes them; every rank waits), so nothing of it is later taken for this run's."""
    import shutil
    from pathlib import Path

    from ernie_mtl.checkpoint import existing_outputs

    t = trainer
    root = Path(t.cfg.train.output_dir)
    if t.is_rank0:
        old = existing_outputs(root) + [p for p in (root / "train_metrics.jsonl", root / "test_results.json")
                                        if p.exists()]
        old += [p.parent for p in root.glob("*/infer_model")]
        for path in old:
            if path.is_dir():
                shutil.rmtree(path)
            elif path.name != "train_metrics.jsonl":
                path.unlink()
        t.writer.restart_file()
        if old:
            t.print(f"--overwrite_output_dir: removed the previous run's {', '.join(sorted(p.name for p in old))}")
    t.barrier("overwrite")
