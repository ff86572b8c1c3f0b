"""The background data path (`--num_workers N`, N > 0): worker processes build the micro-batches of
the coming steps while the device computes, in exactly the order the schedule and the task streams
define, so a run's losses are bitwise those of `--num_workers 0`.

How, per training process (rank):

- **Workers** are fresh Python interpreters (`subprocess`, not `fork`: a fork of the training
  process would share Paddle's threads' locks, its device context and its sockets to the other
  ranks). Each maps the run's `FeedRecipe` (step_feeds.py), pickled once into an anonymous memory file
  (memfd): the task objects and their training data; corpora and cached sample indices travel as
  file names and are memory-mapped again, never copied. Workers import no Paddle, run one math
  thread each (dist/threads.worker_environment), and take orders from a pipe: "micro-batch m of
  step s, tasks `drawn`, task streams at `read`". Order j goes to worker j mod N. Micro-batch m of
  this rank is slot m*D + r of the step (ernie_mtl/program/randomness.slot_of): `drawn` is the tasks
  of all ranks' slots, and the worker reads the slot's task stream at its slot position
  (step_feeds.position_of), so a worker builds exactly the examples, dropout seeds and idle flags the
  in-process feeder gives that slot, on any topology.
- **Planning.** The trainer plans ahead with a copy of the task schedule: a counter-based RNG, so
  the copy draws what the real schedule will (`slots_per_step` draws per step, all ranks' slots;
  this rank's `accumulate_steps` micro-batches of each step are ordered). It keeps
  `N x prefetch_factor` micro-batches in flight (PyTorch's and PaddleNLP's meaning: batches loaded
  in advance per worker), which bounds the memory the data path holds.
- **Staging.** A thread of the trainer receives the results in order j (from worker j mod N: the
  order holds by construction), turns the arrays into tensors where the program reads them (the
  device; the dropout seeds and idle-group flags on the CPU, where the program splits them), and
  queues them. So the feed of the next micro-batch is on the device before the current one ends.
- **Exactness.** The loop asks for micro-batch (s, m, drawn, read). If the head of the plan is that
  micro-batch, its result is used; if not (a target finished early, which changes the draws), the
  plan restarts from the real schedule and results of the old plan are dropped as they arrive.
  A feed is a pure function of those four values and the recipe, so the loop always gets exactly
  what `--num_workers 0` builds. Nothing is kept per worker: a resumed run plans from the
  checkpointed schedule position.
- **Lifetime.** Workers exit when the trainer closes their order pipe, and when it dies: they ask
  the kernel for SIGKILL when their parent dies (PR_SET_PDEATHSIG; they are started from the main
  thread, whose death is the process's), and a write to a trainer that is gone fails. No orphans.
  They ignore SIGTERM, SIGINT, SIGHUP, SIGUSR1/2: a preemption signal sent to the whole job (or
  process group) is the trainer's to act on; it saves at the next step boundary with their
  micro-batches, then closes them.
- **Errors.** A worker's exception reaches the loop when it asks for that micro-batch, as the
  `SampleError` / `SampleUserError` the in-process feeder raises (task, file, sample, micro-batch,
  step), naming the worker; a worker that dies (killed, out of memory) is named with its exit status.
"""
from __future__ import annotations

import collections
import copy
import json
import mmap
import os
import pickle
import queue
import signal
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, Deque, Dict, Iterator, List, Optional, Sequence, Tuple

from ernie_mtl.engine.step_feeds import (DataWorkerLost, Feeder, FeedRecipe, MicroBatch, SampleError, SampleUserError,
                                     sample_error, to_tensors)

if TYPE_CHECKING:  # annotations only: no import at run time (no cycle)
    from ernie_mtl.engine.session import Session

_POLL_S = 0.2
STOPPED_S = 5.0  # a worker the kernel reports stopped (SIGSTOP, a debugger) this long while it owes a result is lost
_BOOT = ("import zlib, sys\n"  # zlib before anything could import paddle (docs/platform.md)
         "sys.path.insert(0, sys.argv[1])\n"
         "from ernie_mtl.engine.data_workers import worker_main\n"
         "sys.exit(worker_main(sys.argv[2:]))\n")


def open_feeder(session: Session, *, log=None):
    """The feeder the run's `--num_workers` asks for: in-process (0) or background (> 0)."""
    recipe = FeedRecipe.from_session(session)
    data = session.cfg.data
    if data.num_workers <= 0:
        return Feeder(recipe, place=session.exe.place)
    return BackgroundFeeder(recipe, num_workers=data.num_workers, prefetch_factor=data.prefetch_factor,
                            place=session.exe.place, worker_timeout=data.worker_timeout,
                            plugins=session.cfg.setup.mtl.plugins, log=log)


@dataclass
class _Worker:
    index: int
    process: subprocess.Popen
    orders: Connection
    results: Connection
    hello: Dict[str, Any] = field(default_factory=dict)


class _Fatal:
    """The data path cannot go on (a worker died, the staging thread failed)."""

    def __init__(self, error: BaseException):
        self.error = error


class BackgroundFeeder:
    """Micro-batches built ahead by `num_workers` worker processes (module docstring)."""

    def __init__(self, recipe: FeedRecipe, *, num_workers: int, prefetch_factor: int = 2,
                 accumulate_steps: Optional[int] = None, place=None, plugins: Sequence[str] = (), log=None,
                 stage: bool = True, worker_timeout: float = 120.0):
        if num_workers < 1 or prefetch_factor < 1:
            raise ValueError(f"num_workers {num_workers} and prefetch_factor {prefetch_factor} must be >= 1")
        if accumulate_steps is not None and accumulate_steps != recipe.accumulate:
            raise ValueError(f"accumulate_steps {accumulate_steps} differs from the recipe's {recipe.accumulate}")
        self.recipe = recipe
        self.num_workers, self.prefetch_factor = int(num_workers), int(prefetch_factor)
        self.capacity = self.num_workers * self.prefetch_factor  # micro-batches in flight
        self.accumulate_steps = int(recipe.accumulate)  # this rank's micro-batches per step
        self.slots_per_step = self.accumulate_steps * int(recipe.data_world)  # all ranks' (the schedule's draws)
        self.place, self.plugins, self.stage = place, tuple(plugins), stage
        self.worker_timeout = float(worker_timeout)  # seconds the loop waits for one micro-batch (0: forever)
        self.log = log or (lambda message: None)
        self.workers: List[_Worker] = []
        self._staged: "queue.Queue" = queue.Queue()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._schedule = None
        self._shadow = None  # the plan's copy of the schedule, after the planned steps
        self._shadow_step = 0
        self._planned: Deque[Tuple] = collections.deque()  # (step, micro, drawn, read) not yet posted
        self._expected: Deque[Tuple[int, Tuple]] = collections.deque()  # (j, order) posted, in order
        self._order_of: Dict[int, Tuple] = {}  # the recent orders by number (for messages)
        self._next_j = 0  # the next order's number
        self._pulled = 0  # results taken off the staged queue (stale ones included)
        self._current = 0  # first order of the current plan: older results are stale
        self.restarts = 0
        self.wait_s = 0.0  # time the loop waited for a staged micro-batch (exposed data-path time)
        self.opened_s = 0.0
        self._opened_at = 0.0

    # -- lifetime -----------------------------------------------------------------------------------
    def open(self) -> None:
        """Start the workers (they load the recipe while the trainer resumes)."""
        if self.workers:
            return
        started = self._opened_at = time.perf_counter()
        from ernie_mtl.dist.threads import worker_environment

        blob = pickle.dumps(self.recipe, protocol=pickle.HIGHEST_PROTOCOL)
        recipe_fd = _memory_file("ernie-mtl-feed-recipe", blob)
        header = json.dumps({"sys_path": [p for p in sys.path if p], "plugins": list(self.plugins)})
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = worker_environment(os.environ)
        try:
            for w in range(self.num_workers):
                orders_r, orders_w = os.pipe()
                results_r, results_w = os.pipe()
                try:
                    process = subprocess.Popen(
                        [sys.executable, "-c", _BOOT, root, str(orders_r), str(results_w), str(recipe_fd),
                         str(os.getpid()), str(w), header],
                        pass_fds=(orders_r, results_w, recipe_fd), env=env, stdin=subprocess.DEVNULL)
                finally:
                    os.close(orders_r)
                    os.close(results_w)
                self.workers.append(_Worker(w, process, Connection(orders_w, readable=False),
                                            Connection(results_r, writable=False)))
        except BaseException:
            self.close()
            raise
        finally:
            os.close(recipe_fd)  # the workers hold their own descriptors of it
        self._thread = threading.Thread(target=self._receive, name="ernie-mtl-data-path", daemon=True)
        self._thread.start()
        self.opened_s = time.perf_counter() - started
        self.log(f"data path: {self.num_workers} worker process{'es' if self.num_workers > 1 else ''} (1 thread "
                 f"each), up to {self.capacity} micro-batches built ahead (--num_workers {self.num_workers} x "
                 f"--prefetch_factor {self.prefetch_factor}); recipe {len(blob) / 2**20:.1f} MiB")

    def close(self) -> None:
        """Stop the staging thread and the workers (idempotent)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        for w in self.workers:  # a worker blocked writing a result gets EPIPE, one waiting for orders EOF
            for conn in (w.results, w.orders):
                try:
                    conn.close()
                except OSError:
                    pass
        deadline = time.monotonic() + 5
        for w in self.workers:
            try:
                w.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                w.process.kill()
                w.process.wait()
        self.workers = []

    # -- the loop's side ----------------------------------------------------------------------------
    def start(self, step: int, schedule) -> None:
        """Training begins (or resumes) at `step` with `schedule` in its state there: plan ahead."""
        self.open()
        self._schedule = schedule
        self._shadow, self._shadow_step = copy.deepcopy(schedule), step
        self._planned.clear()
        self._top_up()

    def step(self, step: int, drawn: Sequence[int], read: Sequence[int]) -> Iterator[MicroBatch]:
        drawn, read = tuple(int(i) for i in drawn), tuple(int(r) for r in read)
        for m in range(self.accumulate_steps):
            order = (step, m, drawn, read)
            if not self._expected or self._expected[0][1] != order:
                self._restart(order)
            j, _ = self._expected.popleft()
            micro = self._take(j)
            self._top_up()
            yield micro

    def _restart(self, order: Tuple) -> None:
        """The loop drew another micro-batch than planned (the schedule changed): plan anew from the
        real schedule (already past the drawn step); results of the old plan become stale."""
        step, m, drawn, read = order
        self.restarts += 1
        self._current = self._next_j
        self._expected.clear()
        self._planned = collections.deque((step, k, drawn, read) for k in range(m, self.accumulate_steps))
        self._shadow, self._shadow_step = copy.deepcopy(self._schedule), step + 1
        self._top_up()

    def _top_up(self) -> None:
        """Post orders until `capacity` micro-batches of the current plan are in flight."""
        while self._next_j - max(self._pulled, self._current) < self.capacity:
            if not self._planned:
                if self._shadow is None or self._shadow.done:
                    return
                read = tuple(self._shadow.counts)
                drawn = tuple(self._shadow.next_task() for _ in range(self.slots_per_step))
                self._planned.extend((self._shadow_step, m, drawn, read) for m in range(self.accumulate_steps))
                self._shadow_step += 1
            order = self._planned.popleft()
            worker = self.workers[self._next_j % self.num_workers]
            try:
                worker.orders.send((self._next_j, *order))
            except OSError:
                raise self._died(worker) from None
            self._expected.append((self._next_j, order))
            self._order_of[self._next_j] = order
            self._order_of.pop(self._next_j - 2 * self.capacity - 1, None)
            self._next_j += 1

    def _take(self, j: int) -> MicroBatch:
        """Result `j` from the staging queue (stale results before it are dropped). The wait is bounded: a
        worker that owes it and is stopped for STOPPED_S, or has not delivered it in `worker_timeout`
        seconds, is lost (`DataWorkerLost` naming it and what it was building)."""
        started = time.perf_counter()
        stopped_since: Optional[float] = None
        try:
            while True:
                try:
                    item = self._staged.get(timeout=_POLL_S)
                except queue.Empty:
                    if self._thread is None or not self._thread.is_alive():
                        raise RuntimeError("the data path's staging thread stopped without a reason; "
                                           "run with --num_workers 0 to build samples in the training process")
                    waited = time.perf_counter() - started
                    worker = self.workers[j % self.num_workers] if self.workers else None
                    state = _process_state(worker.process.pid) if worker is not None else ""
                    if state in ("T", "t"):
                        stopped_since = stopped_since or time.perf_counter()
                        if time.perf_counter() - stopped_since >= STOPPED_S:
                            raise self._lost(worker, j, f"is stopped (process state {state}: SIGSTOP or a debugger) "
                                                        f"since {time.perf_counter() - stopped_since:.0f} s")
                    else:
                        stopped_since = None
                    if self.worker_timeout > 0 and waited >= self.worker_timeout:
                        what = {"D": " (process state D: waiting for the disk or a network file system)",
                                "Z": " (it has exited)"}.get(state, "")
                        raise self._lost(worker, j, f"has not delivered it in {waited:.0f} s (--worker_timeout "
                                                    f"{self.worker_timeout:g}){what}")
                    continue
                if isinstance(item, _Fatal):
                    self._staged.put(item)  # every later request fails the same way
                    raise item.error
                self._pulled += 1
                got, payload = item
                if got < j:
                    continue  # planned before a restart
                if got != j:
                    raise RuntimeError(f"data path out of order: expected micro-batch #{j}, got #{got} (a bug)")
                if isinstance(payload, BaseException):
                    raise payload
                return payload
        finally:
            self.wait_s += time.perf_counter() - started

    # -- the staging thread ------------------------------------------------------------------------
    def _receive(self) -> None:
        try:
            for w in self.workers:
                w.hello = self._recv(w, expect_hello=True) or {}
                w.hello["ready_after_s"] = time.perf_counter() - self._opened_at  # from start to hello
                if self._stop.is_set():
                    return
            j = 0
            while not self._stop.is_set():
                worker = self.workers[j % self.num_workers]
                message = self._recv(worker)
                if message is None:
                    return
                kind, got = message[0], message[1]
                if got != j:
                    raise RuntimeError(f"worker {worker.index} answered order #{got} where #{j} was due (a bug)")
                if kind == "ok":
                    _, _, task, feed, tokens, slot, examples = message
                    if got >= self._current and self.stage:
                        feed = self._stage_feed(feed)
                    self._staged.put((got, MicroBatch(task, feed, tokens, slot=slot, examples=examples)))
                else:
                    self._staged.put((got, self._worker_error(worker, message)))
                j += 1
        except BaseException as e:  # noqa: BLE001  (handed to the loop)
            self._staged.put(_Fatal(e))

    def _recv(self, worker: _Worker, expect_hello: bool = False):
        """The next message of `worker`, or None once stopping; a dead worker raises."""
        while not self._stop.is_set():
            if not worker.results.poll(_POLL_S):
                continue
            try:
                message = worker.results.recv()
            except (EOFError, OSError):
                raise self._died(worker) from None
            if expect_hello:
                if message[0] != "ready":
                    raise SampleError(f"data-loading worker {worker.index} (pid {worker.process.pid}) could not "
                                      f"start: {message[1]}")
                return message[1]
            return message
        return None

    def _lost(self, worker: Optional[_Worker], j: int, how: str) -> DataWorkerLost:
        order = next((o for k, o in self._expected if k == j), None) or self._order_of.get(j)
        what = self.recipe.describe(*order) if order is not None else f"micro-batch #{j}"
        name = f"data-loading worker {worker.index} (pid {worker.process.pid})" if worker is not None else \
            "the data path"
        return DataWorkerLost(f"{name}, building {what}, {how}. The run stops rather than wait forever; its last "
                              "checkpoint is intact: run the same command again to resume (a worker stuck on a "
                              "network file system: check the mount), or use --num_workers 0 to build samples in the "
                              "training process")

    def _died(self, worker: _Worker) -> Exception:
        try:
            code = worker.process.wait(timeout=2)
        except subprocess.TimeoutExpired:
            code = None
        how = ("is gone" if code is None else f"was killed by signal {signal.Signals(-code).name}" if code < 0
               else f"exited with status {code}")
        hint = " (out of memory? see the kernel log: dmesg)" if code == -signal.SIGKILL else ""
        return DataWorkerLost(f"data-loading worker {worker.index} (pid {worker.process.pid}) {how}{hint} while "
                              "building micro-batches; its output is in this process's log. Run again (the run "
                              "resumes from its last checkpoint), or with --num_workers 0 to build samples in the "
                              "training process")

    @staticmethod
    def _worker_error(worker: _Worker, message) -> BaseException:
        _, _, user, text, detail = message
        where = f" (in data-loading worker {worker.index}, pid {worker.process.pid})"
        return SampleUserError(text + where) if user else SampleError(text + where + (f"\n{detail}" if detail else ""))

    def _stage_feed(self, feed: Dict[str, Any]) -> Dict[str, Any]:
        """Arrays -> tensors where the program reads them (step_feeds.to_tensors): made here, in this
        thread, while the device runs the current micro-batch."""
        return to_tensors(feed, self.place)

    def stats(self) -> Dict[str, Any]:
        return {"workers": [w.hello for w in self.workers], "wait_s": self.wait_s, "restarts": self.restarts,
                "opened_s": self.opened_s}


def _process_state(pid: int) -> str:
    """The kernel's one-letter state of process `pid` (R, S, D, T, t, Z, ...), '' when unknown (not Linux)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def _memory_file(name: str, data: bytes) -> int:
    """A file descriptor of an anonymous in-memory file holding `data` (memfd; an unlinked temporary
    file where memfd is missing): nothing is left behind whatever happens to the process."""
    try:
        fd = os.memfd_create(name, 0)
    except (AttributeError, OSError):
        import tempfile

        fd, path = tempfile.mkstemp(prefix=name)
        os.unlink(path)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    return fd


# -- the worker's side -------------------------------------------------------------------------------------
def _die_with_parent(parent: int) -> None:
    """SIGKILL this process when its parent dies (Linux); exit now if it already has."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(0)


def _ignore_stop_signals() -> None:
    """Leave the stop signals to the trainer. A scheduler's SIGTERM (SLURM signals every process of
    the job step; a terminal's Ctrl-C the whole process group) would otherwise kill the workers
    while the trainer, warned by the same signal, still needs micro-batches to reach the step
    boundary where it saves (dist/preemption.py). Workers end with their trainer either way:
    their order pipe closes, or the trainer dies and PR_SET_PDEATHSIG kills them."""
    for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2"):
        signal.signal(getattr(signal, name), signal.SIG_IGN)


def worker_main(argv: Sequence[str]) -> int:
    """A data-loading worker (started by BackgroundFeeder.open)."""
    started = time.perf_counter()
    orders_fd, results_fd, recipe_fd, parent, index = (int(a) for a in argv[:5])
    _ignore_stop_signals()
    _die_with_parent(parent)
    header = json.loads(argv[5])
    sys.path[:] = header["sys_path"] + [p for p in sys.path if p not in header["sys_path"]]
    orders, results = Connection(orders_fd, writable=False), Connection(results_fd, readable=False)
    try:
        from ernie_mtl.engine.plugins import import_plugins

        problems = import_plugins(header["plugins"], where="plugins")
        if problems:
            raise RuntimeError("; ".join(problems))
        with mmap.mmap(recipe_fd, 0, prot=mmap.PROT_READ) as mapped:
            recipe: FeedRecipe = pickle.loads(mapped)
        os.close(recipe_fd)
    except BaseException as e:  # noqa: BLE001  (reported to the trainer)
        _send(results, ("failed", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        return 1
    _send(results, ("ready", {"pid": os.getpid(), "startup_s": time.perf_counter() - started,
                              "paddle_imported": "paddle" in sys.modules,
                              "threads": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")}}))
    while True:
        try:
            order = orders.recv()
        except (EOFError, OSError):
            return 0
        if order is None:
            return 0
        j, step, micro, drawn, read = order
        try:
            built = recipe.micro(step, micro, drawn, read)
            message: Tuple[Any, ...] = ("ok", j, built.task, built.feed, built.tokens, built.slot, built.examples)
        except SampleUserError as e:
            message = ("error", j, True, str(e), "")
        except SampleError as e:
            message = ("error", j, False, str(e), traceback.format_exc())
        except Exception as e:  # noqa: BLE001  (a bug outside the recipe's own wrapping)
            error = sample_error(f"building micro-batch {micro} of step {step + 1}", e)
            message = ("error", j, isinstance(error, SampleUserError), str(error), traceback.format_exc())
        if not _send(results, message):
            return 0


def _send(conn: Connection, message) -> bool:
    try:
        conn.send(message)
        return True
    except (BrokenPipeError, OSError):  # the trainer is gone or closed the pipe
        return False
