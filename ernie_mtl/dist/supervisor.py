"""Bounded automatic restart: run a training command again when it fails, so a lost node or a crashed
rank at 3 a.m. costs minutes, not the night.

    python -m ernie_mtl.dist.supervisor --max_restarts 3 -- \\
        python -m paddle.distributed.launch --nproc_per_node 8 run_multitask_static.py --config run.yaml
    MAX_RESTARTS=3 sh scripts/run.sh ...          # the launch scripts wrap their command the same way

The command is the same each time: a training run resumes from its newest intact checkpoint by
itself (`--resume auto`, the default), so the restarted job continues exactly where the last
checkpoint left it. What happens on each exit status:

- 0: done.
- 2: a user error (a flag, a file, a damaged checkpoint): never retried, it would fail the same way.
- 76 (EXIT_PREEMPTED, ernie_mtl/dist/preemption.py) or this supervisor itself signalled (the
  scheduler is taking the job away): stop, passing the signal to the command and waiting for it to
  save; the scheduler requeues the job.
- anything else (a crash, 75 from the watchdog's lost rank, a signal): logged with its cause (the
  exit status or signal, and the last lines the command printed that look like an error), then run
  again after a backoff (doubling from `--backoff`, at most `--max_backoff`), at most `--max_restarts`
  times; then the last status is returned.
"""
from __future__ import annotations

import argparse
import collections
import signal
import subprocess
import sys
import time
from typing import Callable, List, Optional, Sequence

from ernie_mtl.dist.preemption import EXIT_PREEMPTED

EXIT_USER_ERROR = 2
PREFIX = "ernie_mtl supervisor"
_ERROR_HINTS = ("Error", "error:", "Traceback", "watchdog", "lost rank", "Killed", "terminate")


def cause(status: int, tail: Sequence[str]) -> str:
    """A readable cause of a failed run: its status or signal, and the last error-looking line."""
    what = f"killed by SIG{signal.Signals(-status).name}" if status < 0 else f"exit status {status}"
    if status == 75:
        what += " (the watchdog stopped the job: a rank or node was lost)"
    elif status == 74:
        what += " (a data-loading worker was lost: killed, stopped or stuck)"
    line = next((ln for ln in reversed(tail) if any(h in ln for h in _ERROR_HINTS)), None)
    return f"{what}" + (f"; last error line: {line.strip()[:300]}" if line else "")


class Supervisor:
    def __init__(self, command: Sequence[str], *, max_restarts: int, backoff: float, max_backoff: float,
                 log: Callable[[str], None] = lambda message: print(f"{PREFIX}: {message}", file=sys.stderr, flush=True),
                 sleep: Callable[[float], None] = time.sleep):
        self.command, self.max_restarts, self.backoff, self.max_backoff = list(command), max_restarts, backoff, \
            max_backoff
        self.log, self.sleep = log, sleep
        self.child: Optional[subprocess.Popen] = None
        self.signalled: Optional[int] = None
        self.restarts = 0

    def _forward(self, signum, frame) -> None:  # noqa: ARG002
        self.signalled = signum
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signum)

    def run_once(self) -> int:
        tail: collections.deque = collections.deque(maxlen=40)
        try:
            self.child = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                          bufsize=1, errors="replace")
        except OSError as e:  # the command vanished or is not executable (checked at start, may change since)
            self.last_tail = [f"cannot start {self.command[0]}: {e.strerror or e}"]
            self.log(self.last_tail[0])
            return EXIT_USER_ERROR
        for line in self.child.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            tail.append(line)
        status = self.child.wait()
        self.last_tail = list(tail)
        return status

    def run(self) -> int:
        for name in ("SIGTERM", "SIGINT", "SIGUSR1", "SIGHUP"):
            signal.signal(getattr(signal, name), self._forward)
        delay = self.backoff
        while True:
            status = self.run_once()
            if status == 0:
                if self.restarts:
                    self.log(f"the job completed after {self.restarts} restart(s)")
                return 0
            if self.signalled is not None or status == EXIT_PREEMPTED:
                why = f"SIG{signal.Signals(self.signalled).name}" if self.signalled else "preemption"
                self.log(f"stopped by {why} (exit status {status}): not restarting; the newest checkpoint is kept, "
                         "run the same command again (or let the scheduler requeue it) to resume")
                return status if status else EXIT_PREEMPTED
            if status == EXIT_USER_ERROR:
                self.log("exit status 2, a user error (see the message above): not restarting, it would fail "
                         "the same way")
                return status
            if self.restarts >= self.max_restarts:
                self.log(f"failed ({cause(status, self.last_tail)}); the restart budget ({self.max_restarts}) is "
                         "spent: giving up")
                return status
            self.restarts += 1
            self.log(f"failed ({cause(status, self.last_tail)}); restart {self.restarts} of {self.max_restarts} "
                     f"in {delay:g} s, resuming from the newest intact checkpoint")
            self.sleep(delay)
            if self.signalled is not None:  # signalled while waiting: do not start again
                return EXIT_PREEMPTED
            delay = min(delay * 2, self.max_backoff)


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        print(f"{PREFIX}: give the command after --, e.g. python -m ernie_mtl.dist.supervisor --max_restarts 3 -- "
              "python run_multitask_static.py --config run.yaml", file=sys.stderr)
        return EXIT_USER_ERROR
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="python -m ernie_mtl.dist.supervisor",
                                     description=__doc__.strip().splitlines()[0])
    parser.add_argument("--max_restarts", type=int, default=3, help="restarts after failures (default 3)")
    parser.add_argument("--backoff", type=float, default=10.0, help="seconds before the first restart (doubling)")
    parser.add_argument("--max_backoff", type=float, default=300.0, help="longest wait between restarts")
    args = parser.parse_args(argv[:split])
    command = argv[split + 1:]
    problems = [f"--{k} {getattr(args, k)} must be a finite number >= 0 (seconds)" if k != "max_restarts" else
                f"--{k} {getattr(args, k)} must be >= 0"
                for k in ("max_restarts", "backoff", "max_backoff")
                if not (0 <= getattr(args, k) < float("inf"))] + (["no command after --"] if not command else [])
    if command and not problems:
        import shutil

        if shutil.which(command[0]) is None:
            problems.append(f"the command {command[0]!r} is not found (not an executable file, nor on PATH); give "
                            "the program to supervise, e.g. python -m paddle.distributed.launch ... or python "
                            "run_multitask_static.py ...")
    if problems:
        print(f"{PREFIX}: " + "; ".join(problems), file=sys.stderr)
        return EXIT_USER_ERROR
    return Supervisor(command, max_restarts=args.max_restarts, backoff=args.backoff,
                      max_backoff=args.max_backoff).run()


if __name__ == "__main__":
    sys.exit(main())
