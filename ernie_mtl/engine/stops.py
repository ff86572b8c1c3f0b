"""Why a run stops before its schedule is done, as one request the loop acts on at a step boundary.

Two guards end a run early: the anomaly policy (`--on_anomaly stop`, engine/anomaly.py) and preemption
(a scheduler's signal, dist/preemption.py). Each posts a `Stop` to the run's `StopRequests` instead of
saving and raising itself; the loop, after a step's checkpoints, takes the request, saves model_last
unless it was just saved, logs the stop's line and raises its exception. So "save, then raise" is
written once, and the guards need neither the checkpointer nor the loop.

`Preemption` is the loop's side of dist/preemption.py: the handlers installed for the loop and put back
after it, the agreement on the step every rank stops at, and a request that arrived during the last
step (the run then stops before the last evaluation, exports and final test).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Optional, Sequence

from ernie_mtl.dist import preemption


@dataclass
class Stop:
    """A request to end the run at this step boundary, with model_last saved."""

    reason: str  # "anomaly" | "preemption"
    error: Callable[[int, str], BaseException]  # the exception to raise, given the step and model_last's path
    line: Optional[Callable[[int, str], str]] = None  # the log line, given the step and the path


class StopRequests:
    """The run's pending stop: the first request wins (an anomaly stop before a preemption of the same step)."""

    def __init__(self) -> None:
        self.pending: Optional[Stop] = None

    def request(self, stop: Stop) -> None:
        if self.pending is None:
            self.pending = stop

    def take(self) -> Optional[Stop]:
        stop, self.pending = self.pending, None
        return stop


def preempted() -> Stop:
    """The Stop of a preemption signal (the one this process got, or another rank's)."""
    name = preemption.requested() or "TERM (on another rank)"

    def line(step: int, path: str) -> str:
        return f"preempted (SIG{name}): stopped at step {step} with {path} saved; run the same command again to resume"

    return Stop("preemption", error=lambda step, path: preemption.Preempted(step, name, path), line=line)


class Preemption:
    """Preemption signals for one loop (none when `signals` is empty); see the module docstring."""

    def __init__(self, signals: Sequence[str], *, rank: int, world_size: int, store, share) -> None:
        self.signals = tuple(signals)
        self.world_size = world_size
        self.share = share  # rank 0's value on every rank (StoreBarrier.share)
        self.agreement = preemption.StopAgreement(rank, world_size, store) if self.signals else None
        self._previous: Dict[int, object] = {}

    def start(self) -> None:
        """The loop begins: the signals are deferred to the next step boundary."""
        self._previous = preemption.install(self.signals)
        preemption.set_phase("training")

    def at_boundary(self, step: int) -> Optional[Stop]:
        """After optimizer step `step` (not the last one): the Stop every rank agrees on, or None."""
        if self.agreement is None or not self.agreement.at_boundary(step):
            return None
        return preempted()

    def after_loop(self) -> Optional[Stop]:
        """The loop is over: the signals stop the process at once again; a request that came during the
        last step (on any rank) is this run's Stop."""
        self.restore()
        preemption.set_phase("the last evaluation, the exports and the final test (training is finished)")
        if self.agreement is None:
            return None
        pending = self.agreement.pending()
        if self.world_size > 1:
            pending = self.share("preemption requested during the last step", pending)
        return preempted() if pending else None

    def restore(self) -> None:
        """Put the handlers back (idempotent)."""
        preemption.restore(self._previous)
        self._previous = {}
