"""Preemption: a scheduler's warning signal becomes a checkpoint at the next step boundary, saved by
every rank at the same step, then an exit with a status that says "saved, run me again".

Schedulers warn before they kill: SLURM sends SIGTERM (or the signal of `--signal`, e.g. USR1) a grace
period before SIGKILL, Kubernetes SIGTERM `terminationGracePeriodSeconds` before, and
`paddle.distributed.launch` forwards SIGTERM to its ranks and kills them 30 s later. Without this, the
progress since the last `--checkpoint_steps` is lost.

Mechanism. The entry point asks for it (`run.train(..., preempt_signals=...)`: signal handlers are
process-wide state, so the engine installs them only when told, at the start of its loop, and puts
the previous ones back when the loop ends). The handlers set a flag and nothing else, so a second signal during the save changes nothing:
the save finishes, or the SIGKILL that follows the grace period stops it, and the checkpoint
protocol leaves the previous checkpoint intact either way (ernie_mtl/checkpoint/store.py).

Agreement. Every rank must save the same step. Ranks get the signal at slightly different moments,
so they do not each decide; rank 0 does. A rank that got the signal adds to the job store's counter
`preempt/requests`; at every step boundary rank 0 reads that counter (and its own flag) and, when a
request is there at boundary s, publishes stop step s + 1 (`preempt/at`); every rank reads
`preempt/at` at its boundaries and saves when it reaches that step. No rank can pass boundary s + 1
before rank 0 has published it: step s + 1 needs rank 0's collectives, which it starts only after
publishing. The cost is one store round trip per step per rank (none with one process).
"""
from __future__ import annotations

import signal
from typing import Dict, Iterable, Optional, Sequence

EXIT_PREEMPTED = 76  # documented in docs/launch.md: saved at a step boundary because of a signal; run again
SIGNAL_NAMES = ("TERM", "USR1", "USR2", "INT", "HUP")  # config/cli.PREEMPT_SIGNALS: the flag's check
_REQUESTED = {"signal": None}  # the signal received, set by the handler (process-wide)


def parse_signals(value: str) -> Sequence[str]:
    """`"TERM,USR1"` -> ("TERM", "USR1"); "none" -> (); ValueError naming a bad item."""
    names = tuple(s.strip().upper().removeprefix("SIG") for s in str(value).split(",") if s.strip())
    if names in ((), ("NONE",)):
        return ()
    bad = [n for n in names if n not in SIGNAL_NAMES]
    if bad:
        raise ValueError(f"--preempt_signals {value!r}: {bad} not among {list(SIGNAL_NAMES)} (or none)")
    return names


def install(names: Iterable[str]) -> Dict[int, object]:
    """Make each signal of `names` request a checkpoint-and-exit at the next step boundary; returns
    the previous handlers (for `restore`). Call it once the run's modules are imported: importing
    paddlenlp replaces the SIGTERM handler (measured with Paddle 2.6.2 / PaddleNLP 2.8.1), so the
    trainer installs these at the start of its loop."""
    previous = {}
    for name in names:
        signum = getattr(signal, f"SIG{name}")
        previous[signum] = signal.signal(signum, _handler)
        # restart interrupted system calls: Paddle's TCP store (C++) raises on EINTR ("TCP receive error.
        # Details: Interrupted system call") instead of retrying, so a signal arriving during a store call
        # would fail the run it is meant to save
        signal.siginterrupt(signum, False)
    return previous


def restore(previous: Dict[int, object]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


def _handler(signum, frame) -> None:  # noqa: ARG001
    if _REQUESTED["signal"] is None:
        _REQUESTED["signal"] = signal.Signals(signum).name.removeprefix("SIG")


def requested() -> Optional[str]:
    """The signal that asked for a stop in this process (or None)."""
    return _REQUESTED["signal"]


def reset() -> None:
    _REQUESTED["signal"] = None


class Preempted(Exception):
    """Training stopped at a step boundary because of a signal; the checkpoint of that step is saved."""

    def __init__(self, step: int, signal_name: str, path: str):
        super().__init__(f"stopped by SIG{signal_name} at step {step}: saved {path}; run the same command again "
                         f"to resume (exit status {EXIT_PREEMPTED})")
        self.step, self.signal_name, self.path = step, signal_name, path


class StopAgreement:
    """Whether this rank stops at the current step boundary (the same step on every rank)."""

    def __init__(self, rank: int, world_size: int, store=None):
        self.rank, self.world, self.store = rank, world_size, store
        self.posted = False
        self.stop_at: Optional[int] = None

    def at_boundary(self, step: int) -> bool:
        """Call after optimizer step `step` completed, on every rank; True: save and stop now."""
        if self.world == 1 or self.store is None:
            return requested() is not None
        if requested() is not None and not self.posted:
            self.store.add("ernie_mtl/preempt/requests", 1)
            self.posted = True
        if self.stop_at is None:
            if self.rank == 0:
                if self.store.add("ernie_mtl/preempt/requests", 0) > 0:
                    self.stop_at = step + 1
                    self.store.add("ernie_mtl/preempt/at", self.stop_at + 1)  # 0 = none
            else:
                published = self.store.add("ernie_mtl/preempt/at", 0)
                if published > 0:
                    self.stop_at = published - 1
        return self.stop_at is not None and step >= self.stop_at
