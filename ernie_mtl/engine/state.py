"""The train state a checkpoint carries besides the program state, and what a resume hands back.

Everything an exact resume needs is derived from the task schedule's state (the task sequence
position, per-task micro-batch counts -- hence reader positions and epochs -- and finished
targets), plus the LR scheduler (with any re-plan), the callbacks' state (best metrics, early
stopping counters), the exports done and, on CPU, the kernels the programs ran with (`cpu_kernels`:
a resume on the same machine reruns them, ernie_mtl/engine/session.decide_cpu_kernels). Dropout
needs nothing: its seeds are a pure function of (seed, step, slot, op). The EMA's averages are
variables of the program state.

`resume_checks` lists what must not change for the run to continue exactly (besides the topology,
which the store compares): the seed, every task's resolved spec, the identity of the training data
(content-based: ernie_mtl/data/identity.py) and the LR horizon.

`restore(...)` returns a `ResumeState` (or None for a new run); the loop applies it itself
(`Trainer.continue_from`), so nothing outside the loop writes the loop's fields.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional, Protocol

from ernie_mtl.checkpoint.layout import METRICS_FILE, TEST_RESULTS
from ernie_mtl.checkpoint.reshard import Continuation
from ernie_mtl.checkpoint.store import CheckpointRef, TrainState, existing_outputs
from ernie_mtl.engine.reporting import consumed_samples
from ernie_mtl.planning.plan import resume_checks  # noqa: F401  (re-exported: the session's import)

if TYPE_CHECKING:  # annotations only: no import at run time (no cycle)
    from ernie_mtl.engine.session import Session


class Stateful(Protocol):
    """A component that carries part of the train state (torchtitan's `Stateful`): what it must keep for
    an exact resume, and how it takes it back."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> None: ...


class LRState:
    """The LR scheduler as a `Stateful` (Paddle's schedulers name the second method set_state_dict)."""

    def __init__(self, scheduler):
        self.scheduler = scheduler

    def state_dict(self) -> Dict[str, Any]:
        return self.scheduler.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.scheduler.set_state_dict(state)


# Where each component's state lives in a checkpoint's train state (train_state.json): the task schedule
# and the LR scheduler at the top, the others under `extra` (the format every checkpoint already has).
TOP_LEVEL = ("sampler", "lr_scheduler")
COMPONENTS = ("sampler", "lr_scheduler", "exported", "callbacks")


def train_state(session: Session, *, step: int, components: Mapping[str, Stateful]) -> TrainState:
    """The train state at optimizer step `step`: each component's `state_dict()` (`COMPONENTS`) and what
    the session knows of the run (config, topology, name map, data identity, tasks, the CPU kernels)."""
    s = session
    states = {name: components[name].state_dict() for name in COMPONENTS}
    group_of = {task_name: g.name for g in s.programs.groups for task_name in g.tasks}
    extra = {"resume_checks": s.resume_checks, "arch": dict(s.programs.arch), "exported": states["exported"],
             "flag_mode": s.cfg.flag_mode, "train_samples": dict(s.plan.train_samples),
             "cpu_kernels": s.kernels.to_json() if s.kernels is not None else None,
             "callbacks": states["callbacks"],
             "tasks": [{"name": task.spec.name, "reader": task.name, "group": group_of[task.spec.name],
                        "is_target": task.spec.is_target, "spec": task.spec.to_json(),
                        "manifest": task.manifest()} for task in s.plan.tasks]}
    return TrainState(step=step, consumed_samples=consumed_samples(s.plan), lr_scheduler=states["lr_scheduler"],
                      rng={}, sampler=states["sampler"], config=s.cfg.to_dict(), topology=s.topo.to_dict(),
                      name_map=s.programs.name_map, extra=extra)


@dataclass
class ResumeState:
    """What a resumed run continues from (the program state is already loaded)."""

    ref: CheckpointRef
    step: int
    lr_scheduler: Dict[str, Any]
    sampler: Dict[str, Any]
    exported: Dict[str, int] = field(default_factory=dict)
    callbacks: Dict[str, Any] = field(default_factory=dict)  # by class name: enabling a callback later still resumes
    continuation: Optional[Continuation] = None  # how it continues on this topology (None: as written)

    def apply(self, components: Mapping[str, Stateful]) -> None:
        """Give every component its state back (`COMPONENTS`)."""
        for name in COMPONENTS:
            components[name].load_state_dict(getattr(self, name))


def restore(checkpointer, ref: Optional[CheckpointRef], topo, checks: Dict[str, Any], *,
            continuation: Optional[Continuation] = None, sampler: Optional[Dict[str, Any]] = None
            ) -> Optional[ResumeState]:
    """Load the program state of checkpoint `ref` (resolved and verified when the session opened:
    ernie_mtl/engine/session.resolve_resume), compared with this run's topology and `checks` -- or,
    on another topology (`continuation`, ernie_mtl/engine/elastic.py), regathered by name -- and
    return what the loop continues from; None for a new run. `sampler`: the task schedule's state
    re-expressed for this topology (RunPlan.resume_sampler), instead of the checkpoint's own."""
    if ref is None:
        return None
    state = checkpointer.load(ref, topology=topo.to_dict(), check=checks, continuation=continuation)
    return ResumeState(ref=ref, step=state.step, lr_scheduler=state.lr_scheduler,
                       sampler=sampler if sampler is not None else state.sampler,
                       exported=dict(state.extra.get("exported", {})), callbacks=state.extra.get("callbacks", {}),
                       continuation=continuation)


def clear_previous_run(output_dir: str, *, is_rank0: bool, barrier, writer, log) -> None:
    """--resume none --overwrite_output_dir: the previous run's checkpoints, exports and records go
    (rank 0 removes them; every rank waits), so nothing of it is later taken for this run's."""
    root = Path(output_dir)
    if is_rank0:
        old = existing_outputs(root) + [p for p in (root / METRICS_FILE, root / TEST_RESULTS) if p.exists()]
        old += [p.parent for p in root.glob("*/infer_model")]
        for path in old:
            if path.is_dir():
                shutil.rmtree(path)
            elif path.name != METRICS_FILE:
                path.unlink()
        writer.restart_file()
        if old:
            log(f"--overwrite_output_dir: removed the previous run's {', '.join(sorted(p.name for p in old))}")
    barrier("overwrite")
