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

Outside the loop. The command line guards the whole process (`guard()`, right after Paddle's import:
Paddle installs a C++ SIGTERM handler that dumps a "FatalError" and exits 143 with nothing said, and
once deadlocked allocating memory inside the handler). A SIGTERM, SIGINT or SIGHUP that arrives when
no step boundary can save (start-up: parsing, index building, program building; after the loop: the
last evaluation, the exports, the final test) raises `Terminated` in the main thread: the stack unwinds
(temporary files removed, workers stopped) and the command line exits 128 + the signal number with one
line saying what was running. Everything the project writes goes to a temporary name first, so nothing
is left half-written; running the same command again resumes from the newest complete checkpoint.
When the main thread is inside a long C++ call (a large step, a collective), a helper thread that
wakes on every signal (`signal.set_wakeup_fd`) ends the process after `GRACE_S` seconds (or at once
on a second signal) with the same status, so a stop never waits for the call to return. During the
loop the preemption signals (`--preempt_signals`) are deferred to the next step boundary instead.
"""
from __future__ import annotations

import os
import signal
import threading
from typing import Dict, Iterable, Optional, Sequence

from data_tools.cli_utils import Terminated
from ernie_mtl.config.slices import PREEMPT_SIGNAL_NAMES, parse_preempt_signals

EXIT_PREEMPTED = 76  # documented in docs/launch.md: saved at a step boundary because of a signal; run again
SIGNAL_NAMES = PREEMPT_SIGNAL_NAMES
GUARDED = ("TERM", "INT", "HUP")  # what stops a guarded process outside a step boundary
GRACE_S = float(os.environ.get("ERNIE_MTL_STOP_GRACE_S", "20") or 20)  # then the helper thread ends the process
_REQUESTED = {"signal": None}  # the signal received, set by the handler (process-wide)


class _State:
    """The process's signal state (one per process, like the handlers themselves)."""

    guarded: bool = False  # guard() installed: signals outside a deferral raise Terminated
    deferred: frozenset = frozenset()  # signal names the loop turns into a checkpoint at the next boundary
    phase: str = "start-up"
    stopping: Optional[int] = None  # the signal a Terminated was raised for
    wakeup: Optional[int] = None  # read end of the wakeup pipe (the helper thread's)


def parse_signals(value: str) -> Sequence[str]:
    """`"TERM,USR1"` -> ("TERM", "USR1"); "none" -> (); ValueError naming a bad item (the configuration's
    own parser: config.slices.parse_preempt_signals)."""
    return parse_preempt_signals(value)


def _name(signum: int) -> str:
    return signal.Signals(signum).name.removeprefix("SIG")


def _on_signal(signum, frame) -> None:  # noqa: ARG001
    """The one handler: a deferred signal requests a save at the next step boundary; any other raises
    Terminated (a second one ends the process at once)."""
    name = _name(signum)
    if name in _State.deferred:
        if _REQUESTED["signal"] is None:
            _REQUESTED["signal"] = name
        return
    if not _State.guarded:  # installed for the loop only (the Python API): keep the old behaviour
        if _REQUESTED["signal"] is None:
            _REQUESTED["signal"] = name
        return
    if _State.stopping is not None:
        _exit_now(signum, "a second signal")
    _State.stopping = signum
    raise Terminated(signum, f"stopped by SIG{name} during {_State.phase}; nothing is left half-written (checkpoints, "
                             "caches and exports are written under temporary names first): run the same command "
                             "again to resume from the newest complete checkpoint")


def _exit_now(signum: int, why: str) -> None:
    try:
        os.write(2, f"ernie-mtl: SIG{_name(signum)} during {_State.phase}: {why}, exiting now "
                    f"(status {128 + signum})\n".encode())
    finally:
        os._exit(128 + signum)


def _watch(fd: int) -> None:
    """The helper thread: every signal with a Python handler writes its number to the wakeup pipe; a
    guarded signal that is not deferred ends the process after GRACE_S unless the main thread has by then."""
    deadline_signal: Optional[int] = None
    while True:
        try:
            data = os.read(fd, 64) if deadline_signal is None else _read_with_timeout(fd, GRACE_S)
        except OSError:
            return
        if data is None:  # the grace period passed: the main thread is stuck in a call that does not return
            _exit_now(deadline_signal, f"still busy {GRACE_S:g} s after the signal")
        for signum in data or b"":
            name = _name(signum) if signum in signal.valid_signals() else ""
            if name not in GUARDED or name in _State.deferred:
                continue
            if deadline_signal is not None:
                _exit_now(signum, "a second signal")
            deadline_signal = signum


def _read_with_timeout(fd: int, seconds: float) -> Optional[bytes]:
    import select

    ready, _, _ = select.select([fd], [], [], seconds)
    return os.read(fd, 64) if ready else None


def guard(phase: str = "start-up") -> None:
    """Guard this process (the command line; module docstring): SIGTERM, SIGINT and SIGHUP raise
    `Terminated` outside a step boundary, with a helper thread as the backstop. Call it from the main
    thread after Paddle is imported (its import installs its own handler); `guard_again()` after later
    imports that reset handlers (paddlenlp's import leaves SIGTERM at its default)."""
    _State.phase = phase
    if not _State.guarded:
        r, w = os.pipe()
        os.set_blocking(w, False)
        signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        _State.wakeup = r
        threading.Thread(target=_watch, args=(r,), name="ernie-mtl-signals", daemon=True).start()
    _State.guarded = True
    guard_again()


def guard_again() -> None:
    """Put the guard's handler back on the guarded signals (another library may have replaced it)."""
    if not _State.guarded:
        return
    for name in GUARDED + tuple(_State.deferred):
        signum = getattr(signal, f"SIG{name}")
        signal.signal(signum, _on_signal)
        signal.siginterrupt(signum, False)


def set_phase(text: str) -> None:
    """What the process is doing, for the message of a stop (`Terminated`)."""
    _State.phase = text


def install(names: Iterable[str]) -> Dict[int, object]:
    """Make each signal of `names` request a checkpoint-and-exit at the next step boundary; returns
    the previous handlers (for `restore`). Call it once the run's modules are imported: importing
    paddlenlp replaces the SIGTERM handler (measured with Paddle 2.6.2 / PaddleNLP 2.8.1), so the
    trainer installs these at the start of its loop."""
    previous = {}
    names = tuple(names)
    _State.deferred = frozenset(names)
    for name in names:
        signum = getattr(signal, f"SIG{name}")
        previous[signum] = signal.signal(signum, _on_signal)
        # restart interrupted system calls: Paddle's TCP store (C++) raises on EINTR ("TCP receive error.
        # Details: Interrupted system call") instead of retrying, so a signal arriving during a store call
        # would fail the run it is meant to save
        signal.siginterrupt(signum, False)
    return previous


def restore(previous: Dict[int, object]) -> None:
    """The loop is over: its signals are no longer deferred (a guarded process stops on them again)."""
    _State.deferred = frozenset()
    for signum, handler in previous.items():
        signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
    guard_again()


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

    def pending(self) -> bool:
        """Whether a stop was requested on this rank, or (rank 0) on any rank: rank 0's answer is what the
        trainer shares after the loop (`Trainer.leave_loop`)."""
        mine = requested() is not None
        if self.world == 1 or self.store is None:
            return mine
        if mine and not self.posted:
            self.store.add("ernie_mtl/preempt/requests", 1)
            self.posted = True
        return self.rank == 0 and self.store.add("ernie_mtl/preempt/requests", 0) > 0

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
