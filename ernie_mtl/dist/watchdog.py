"""Process lifecycle of a launched rank: it stops when its launcher dies, and a lost node stops the
whole job in a bounded time with a message that names the lost rank and says how to resume.

What Paddle 2.6.2 gives by itself (measured on CPU, read in its source for GPU; docs/launch.md):

- `paddle.distributed.launch` starts every rank in its own session (`os.setsid`). SIGKILL of the
  launcher leaves the ranks running: they are reparented and train on, or block forever in a
  collective, holding their devices.
- The launcher notices only its own ranks. With `--master host:port` (its HTTP key-value server)
  or `--ips`, nothing watches the other nodes after start-up (`HTTPMaster.set_status/get_status`
  are no-ops; only an etcd master has heartbeats).
- Collectives: gloo on CPU fails at once when a peer's sockets are closed by its kernel (process
  killed, machine up): `c_allreduce_sum raises an exception gloo::IoException ... Connection reset
  by peer`, the rank exits 1, its launcher exits 1 a few seconds later. When the peer vanishes
  without closing its sockets (power loss, network partition, a frozen machine; reproduced with
  SIGSTOP), gloo waits: its run timeout is 9,999,999 s. Static-graph NCCL collectives (c_allreduce_sum,
  c_broadcast, ...) have no timeout at all in 2.6 (`PADDLE_PG_TIMEOUT` and
  `FLAGS_enable_async_trace` drive the comm-task watchdog of the dygraph `ProcessGroupNCCL` only).
- The job's TCP store barrier (`StoreBarrier`, ernie_mtl/dist/process.py) gives up after 1800 s.

So two small mechanisms, both threads in each rank (Paddle releases the GIL while a program runs,
in collectives and in TCP-store calls, measured):

1. `install_orphan_guard()`, first thing in the entry point: under the launcher, a thread polls
   `os.getppid()`; when the launcher is gone the rank says so in its log and kills its own process
   group (itself, data-loader workers, gloo's helper processes), so a killed job frees its devices.
   Bound: the poll interval (`ERNIE_MTL_ORPHAN_POLL`, 1 s). Not PR_SET_PDEATHSIG: its signal
   arrives before anything can be logged, and it fires on the death of the parent *thread*.
   A process without a launcher (a plain `python run_multitask_static.py`) is never guarded.
2. `start_peer_watch(info, resume_point)`, right after the distributed set-up (`init_distributed`):
   every rank beats a counter in the job's TCP store (its own client connection) every
   `interval` and watches the next live rank in the ring (r+1, r+2, ... mod N), so every rank is
   watched by one other and the store sees O(N) calls per interval. A watched rank whose counter
   stands still for `ERNIE_MTL_PEER_TIMEOUT` seconds (default 120) is declared lost: the watcher
   writes the verdict into the store and exits; every other rank reads it within one interval
   and exits too, all with status 75 (EX_TEMPFAIL: run again) and the same message. A store that
   stops answering (it lives in global rank 0's process) for as long means rank 0's node is lost.
   Fast path: when a collective fails first (a peer's sockets were reset), the uncaught exception
   goes through `diagnose()`, which finds the peers whose beat stopped within a few intervals and
   names them. A rank that completes its run says so (`finish()`) and is no longer watched; a rank
   that dies of its own error, or exits before the end, announces it, and its peers stop at once,
   naming it (else, on GPUs, they would wait for it in a collective forever).

Bound for a surviving node: `timeout + 2 x interval` (about 124 s by default) from the loss to its
ranks' exit, then its launcher's own shutdown (about 3 s); a few seconds when the collective fails
first. The timeout must exceed the longest time a live rank can hold the GIL in one C call, and
must be longer than a NCCL collective may legitimately wait (slow peers at a barrier are fine:
their heartbeat threads keep beating).

The message, in every surviving rank's log (and in the launcher's "ERROR LOG DETAIL" tail):
`ernie_mtl watchdog: rank 0: lost rank 1 (node 10.0.0.2): no heartbeat for 120 s ... Run the same
command again on every node to resume from <output_dir>/model_last.`

This module must not import paddle at import time (the orphan guard is installed before it).
"""
from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time
from typing import Callable, Dict, List, Mapping, Optional, Sequence

EXIT_PEER_LOST = 75  # EX_TEMPFAIL: the job failed through no fault of this rank; run it again
PEER_TIMEOUT_ENV = "ERNIE_MTL_PEER_TIMEOUT"
PEER_INTERVAL_ENV = "ERNIE_MTL_PEER_INTERVAL"
ORPHAN_POLL_ENV = "ERNIE_MTL_ORPHAN_POLL"
ORPHAN_GUARD_ENV = "ERNIE_MTL_ORPHAN_GUARD"  # 0: never guard; 1: guard even without a recognised launcher
DEFAULT_PEER_TIMEOUT = 120.0
DEFAULT_PEER_INTERVAL = 2.0
DEFAULT_ORPHAN_POLL = 1.0
PREFIX = "ernie_mtl watchdog"
KEY = "ernie_mtl/watch"
_LAUNCHER_MARKS = ("paddle.distributed.launch", "paddle/distributed/launch", "fleetrun")

_resume_point: Optional[str] = None  # the checkpoint the resume hint names (the caller knows the layout)
_resume_ready: Callable[[], bool] = lambda: False  # whether it holds a complete checkpoint yet
_dying = threading.Lock()  # the first thread to decide that this process must go wins


# ---------------------------------------------------------------------------------------------
# shared helpers


def set_resume_point(checkpoint: Optional[str], ready: Optional[Callable[[], bool]] = None) -> None:
    """The checkpoint the resume hint names (`<output_dir>/model_last`) and how to tell whether it is
    complete yet. `start_peer_watch` sets it; the faces pass their layout's names (this module knows none)."""
    global _resume_point, _resume_ready
    _resume_point, _resume_ready = checkpoint, ready or (lambda: False)


def resume_hint(checkpoint: Optional[str] = None, ready: Optional[Callable[[], bool]] = None) -> str:
    last = checkpoint or _resume_point
    is_ready = ready if ready is not None else (_resume_ready if checkpoint is None else (lambda: False))
    if not last:
        return "Run the same command again on every node to resume from the run's last checkpoint."
    if is_ready():
        return f"Run the same command again on every node to resume from {last}."
    return (f"Run the same command again on every node to resume from {last} "
            "(no checkpoint there yet: that run starts from the beginning).")


def _say(text: str) -> None:
    """One line on stderr, unbuffered (this may run while the main thread holds sys.stderr)."""
    try:
        os.write(2, f"\n{PREFIX}: {text}\n".encode("utf-8", "replace"))  # \n: after a progress bar's \r
    except OSError:
        pass


def _env_float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        from data_tools.cli_utils import UserError

        raise UserError(f"{name}={raw!r} must be a positive number of seconds, e.g. {name}={default:g}")
    return value


# ---------------------------------------------------------------------------------------------
# 1. orphaned ranks


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def launched_by_paddle(env: Mapping[str, str] = os.environ, ppid: Optional[int] = None) -> bool:
    """True when this process is a rank started by `paddle.distributed.launch`: its parent runs the
    launcher, or (parent already gone) the environment holds what only the 2.6 launcher sets."""
    ppid = os.getppid() if ppid is None else ppid
    if any(mark in _cmdline(ppid) for mark in _LAUNCHER_MARKS):
        return True
    return "PADDLE_TRAINER_ID" in env and "PADDLE_BACKUP_ENV_PATH" in env


class OrphanGuard:
    """Stops this rank when its launcher (the parent process at install time) is gone."""

    def __init__(self, launcher_pid: int, rank: str, poll_s: float,
                 on_orphan: Optional[Callable[[str], None]] = None, *, getppid: Callable[[], int] = os.getppid,
                 sleep: Callable[[float], None] = time.sleep):
        self.launcher_pid = launcher_pid
        self.rank = rank
        self.poll_s = poll_s
        self._on_orphan = on_orphan or _kill_own_group
        self._getppid, self._sleep = getppid, sleep  # tests count polls instead of timing them
        self._thread = threading.Thread(target=self._run, name="ernie-mtl-orphan-guard", daemon=True)

    def start(self) -> "OrphanGuard":
        self._thread.start()
        return self

    def _run(self) -> None:
        while True:
            ppid = self._getppid()
            if ppid != self.launcher_pid:
                self._on_orphan(
                    f"rank {self.rank}: its launcher (pid {self.launcher_pid}) is gone (parent is now pid {ppid}); "
                    "stopping this rank and its child processes so the job frees its devices. " + resume_hint())
                return
            self._sleep(self.poll_s)


def _kill_own_group(message: str) -> None:
    if not _dying.acquire(blocking=False):
        return
    _say(message)
    pid = os.getpid()
    try:
        if os.getpgid(0) == pid:  # the launcher made this rank a session and group leader
            os.killpg(pid, signal.SIGKILL)  # this process, data-loader workers, gloo's helper processes
    except OSError:
        pass
    os._exit(EXIT_PEER_LOST)


def install_orphan_guard(env: Mapping[str, str] = os.environ, *, poll_s: Optional[float] = None,
                         on_orphan: Optional[Callable[[str], None]] = None) -> Optional[OrphanGuard]:
    """Call first thing in the entry point (before paddle is imported; it imports nothing heavy).
    Returns the guard, or None when this process was not started by a launcher (or
    ERNIE_MTL_ORPHAN_GUARD=0). ERNIE_MTL_ORPHAN_GUARD=1 guards under any parent."""
    mode = env.get(ORPHAN_GUARD_ENV, "").strip()
    if mode == "0":
        return None
    ppid = os.getppid()
    if mode != "1" and not launched_by_paddle(env, ppid):
        return None
    poll = poll_s if poll_s is not None else _env_float(env, ORPHAN_POLL_ENV, DEFAULT_ORPHAN_POLL)
    rank = env.get("PADDLE_TRAINER_ID", "?")
    guard = OrphanGuard(ppid, rank, poll, on_orphan)
    if ppid == 1:  # the launcher died before this line ran
        guard._on_orphan(f"rank {rank}: started without a live launcher (parent is pid 1); stopping. " + resume_hint())
        return guard
    return guard.start()


# ---------------------------------------------------------------------------------------------
# 2. lost peers


def job_endpoints(env: Mapping[str, str] = os.environ) -> List[str]:
    """Every rank's endpoint in global-rank order (the launcher's PADDLE_TRAINER_ENDPOINTS)."""
    return [e for e in env.get("PADDLE_TRAINER_ENDPOINTS", "").split(",") if e]


def store_address(env: Mapping[str, str] = os.environ) -> Optional[tuple]:
    """(host, port) of the job's TCP store, as Paddle finds it: PADDLE_MASTER, else the first endpoint."""
    endpoint = env.get("PADDLE_MASTER") or (job_endpoints(env) or [""])[0]
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit():
        return None
    return host, int(port)


def describe_ranks(ranks: Sequence[int], endpoints: Sequence[str]) -> str:
    """'rank 1 (node 10.0.0.2)' / 'ranks 8, 9 (node 10.0.0.2), 12 (node 10.0.0.3)'."""
    parts = []
    for r in sorted(ranks):
        node = endpoints[r].rpartition(":")[0] if r < len(endpoints) else ""
        parts.append(f"{r} (node {node})" if node else str(r))
    return ("rank " if len(parts) == 1 else "ranks ") + ", ".join(parts)


class PeerWatch:
    """Heartbeats through the job's TCP store; see the module docstring.

    Keys (under ernie_mtl/watch/): `beat/<r>` counters, `ended/<r>` and `ended_count` for ranks
    leaving normally, `abort` + `abort_msg` for the verdict that stops every rank.

    `connect()` returns a store client with `add(key, int) -> int`, `set(key, bytes)` and
    `get(key) -> bytes` (Paddle's `core.TCPStore`); `die(message)` ends the process (tests inject
    both). All store calls of this object go through one lock: a Paddle store client is one socket.
    """

    def __init__(self, rank: int, world_size: int, connect: Callable[[], object], *, endpoints: Sequence[str] = (),
                 store_desc: str = "the job's TCP store", timeout_s: float = DEFAULT_PEER_TIMEOUT,
                 interval_s: float = DEFAULT_PEER_INTERVAL, die: Optional[Callable[[str], None]] = None,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep):
        self.rank, self.world_size = rank, world_size
        self.endpoints = list(endpoints)
        self.store_desc = store_desc
        self.timeout_s, self.interval_s = timeout_s, interval_s
        self._connect = connect
        self._die = die or _exit_peer_lost
        self._clock, self._sleep = clock, sleep
        self._store = None
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._last_ok = clock()
        self._seen: Dict[int, tuple] = {}  # peer -> (beat count, time it last changed)
        self._threads: List[threading.Thread] = []
        self._finished = False
        self._pid = os.getpid()  # a forked child inherits the hooks and the socket, not the watch

    # -- store access ------------------------------------------------------------------------
    def _add(self, key: str, value: int) -> int:
        with self._lock:
            if self._store is None:
                self._store = self._connect()
            return int(self._store.add(f"{KEY}/{key}", value))

    def _set(self, key: str, text: str) -> None:
        with self._lock:
            self._store.set(f"{KEY}/{key}", text.encode("utf-8"))

    def _get(self, key: str) -> str:  # only for keys whose counter said they exist (get waits for a key)
        with self._lock:
            return bytes(self._store.get(f"{KEY}/{key}")).decode("utf-8", "replace")

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> "PeerWatch":
        self._last_ok = self._clock()
        for target, name in ((self._beat_loop, "ernie-mtl-peer-watch"), (self._stall_loop, "ernie-mtl-store-guard")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def finish(self) -> None:
        """The run is complete on this rank: it may now leave at any time, and its peers stop
        watching it. Call it on the successful path, before the process exits."""
        if self._finished or os.getpid() != self._pid:
            return
        self._finished = True
        self._stopped.set()
        try:
            self._add(f"ended/{self.rank}", 1)
            self._add("ended_count", 1)
        except Exception:  # noqa: BLE001  (rank 0's store is gone: nothing left to tell)
            pass

    def stop(self) -> None:
        """Process exit (atexit). Finished: rank 0 waits until every other rank has finished too, or
        has stopped beating for the timeout (the store lives in its process, and a store that
        vanished under a rank still finishing would look like a loss). Not finished (a user error,
        `sys.exit` mid-run): the verdict tells the peers, which would otherwise wait for this rank
        in a collective; it lingers an interval so they can read it."""
        if os.getpid() != self._pid:
            return
        if self._finished:
            if self.rank == 0:
                try:
                    self._wait_for_peers_to_leave()
                except Exception:  # noqa: BLE001  (leaving anyway)
                    pass
            return
        if self._stopped.is_set():  # a verdict was given or read already
            return
        self._stopped.set()
        self._announce(f"{describe_ranks([self.rank], self.endpoints)} exited before the end of the run; "
                       "see that rank's log. The job cannot continue.")

    def _announce(self, text: str) -> None:
        """This rank's own verdict, for the others; stay an interval and a half so they read it."""
        try:
            self._set("abort_msg", text)
            self._add("abort", 1)
            self._sleep(1.5 * self.interval_s)
        except Exception:  # noqa: BLE001
            pass

    def _wait_for_peers_to_leave(self) -> None:
        seen: Dict[int, tuple] = {}
        remaining = set(range(1, self.world_size))
        while remaining and not self._add("abort", 0):
            now = self._clock()
            for r in sorted(remaining):
                if self._add(f"ended/{r}", 0):
                    remaining.discard(r)
                    continue
                count = self._add(f"beat/{r}", 0)
                if r not in seen or seen[r][0] != count:
                    seen[r] = (count, now)
                elif now - seen[r][1] > self.timeout_s:
                    return  # a silent rank: nothing to wait for
            if remaining:
                self._sleep(min(0.5, self.interval_s))

    # -- the watch -----------------------------------------------------------------------------
    def _watched(self) -> Optional[int]:
        """The next rank in the ring that has not left normally (None: every other rank has)."""
        for step in range(1, self.world_size):
            peer = (self.rank + step) % self.world_size
            if not self._add(f"ended/{peer}", 0):
                return peer
        return None

    def check_once(self) -> None:
        """One round: beat, look for a verdict, check the watched peer. Raises on store errors."""
        self._add(f"beat/{self.rank}", 1)
        if self._add("abort", 0):
            self._stop_with(self._get("abort_msg"))
            return
        peer = self._watched()
        if peer is not None:
            count = self._add(f"beat/{peer}", 0)
            now = self._clock()
            seen = self._seen.get(peer)
            if seen is None or seen[0] != count:
                self._seen[peer] = (count, now)
            elif now - seen[1] > self.timeout_s:
                self._verdict(f"lost {describe_ranks([peer], self.endpoints)}: no heartbeat for {now - seen[1]:.0f} s "
                              f"({PEER_TIMEOUT_ENV}={self.timeout_s:g}); its process or node stopped. "
                              "The job cannot continue.")
                return
        self._last_ok = self._clock()

    def _beat_loop(self) -> None:
        while not self._stopped.is_set():
            try:
                self.check_once()
            except Exception as e:  # noqa: BLE001  (a store that fails means its host is gone)
                if not self._stopped.is_set():
                    self._stop_with(self._store_lost_text(f"it failed: {type(e).__name__}: {_first_line(e)}"))
                return
            self._stopped.wait(self.interval_s)

    def _stall_loop(self) -> None:
        """A store call that never returns (its host vanished without closing the connection)."""
        while not self._stopped.wait(self.interval_s):
            silent = self._clock() - self._last_ok
            if silent > self.timeout_s + self.interval_s:
                self._stop_with(self._store_lost_text(f"no answer for {silent:.0f} s"))
                return

    def _store_lost_text(self, why: str) -> str:
        return (f"lost contact with {self.store_desc}, which lives in {describe_ranks([0], self.endpoints)}: {why}. "
                "Rank 0's process or node stopped. The job cannot continue.")

    def _verdict(self, text: str) -> None:
        """Stop this rank, and every other one through the store (each reads it within an interval)."""
        try:
            self._set("abort_msg", f"{text} (verdict of rank {self.rank})")
            self._add("abort", 1)
        except Exception:  # noqa: BLE001  (this rank stops anyway; the others find out by themselves)
            pass
        self._stop_with(text)

    def _stop_with(self, text: str) -> None:
        self._stopped.set()
        self._die(f"rank {self.rank}: {text} {resume_hint()}")

    # -- after an uncaught exception -------------------------------------------------------------
    def diagnose(self, window_s: Optional[float] = None) -> Optional[str]:
        """Why did a collective fail? A verdict already in the store, or the peers whose beat stands
        still over `window_s` (default two and a half intervals). None: every peer is alive."""
        window = 2.5 * self.interval_s if window_s is None else window_s
        peers = [r for r in range(self.world_size) if r != self.rank]
        try:
            if self._add("abort", 0):
                return self._get("abort_msg")
            before = {r: self._add(f"beat/{r}", 0) for r in peers}
            self._sleep(window)
            if self._add("abort", 0):
                return self._get("abort_msg")
            stale = [r for r in peers if self._add(f"beat/{r}", 0) == before[r] and not self._add(f"ended/{r}", 0)]
        except Exception as e:  # noqa: BLE001
            return self._store_lost_text(f"it failed: {type(e).__name__}: {_first_line(e)}")
        if not stale:
            return None
        return (f"lost {describe_ranks(stale, self.endpoints)}: no heartbeat for {window:.0f} s after a "
                "collective failed; its process or node stopped. The job cannot continue.")

    def on_uncaught(self, exc: BaseException) -> None:
        """For an exception about to end this rank (after its traceback is printed). A peer lost
        (a collective failed because of it): stop with the verdict, status 75. This rank's own
        error: tell every other rank (they stop at once, naming it), linger for an interval so
        they can read it from the store that rank 0 hosts, then return (the usual exit status)."""
        if isinstance(exc, SystemExit) or self._stopped.is_set() or os.getpid() != self._pid:
            return
        text = self.diagnose()
        if text is not None:
            self._verdict(text)
            return
        reason = f"{type(exc).__name__}: {_first_line(exc)}"[:300]
        self._stopped.set()
        self._announce(f"{describe_ranks([self.rank], self.endpoints)} failed with its own error ({reason}); "
                       "see that rank's log. The job cannot continue.")


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [""])[0][:200].rstrip(".")


def _exit_peer_lost(message: str) -> None:
    if not _dying.acquire(blocking=False):
        return
    _say(message)
    try:
        sys.stdout.flush()
    except Exception:  # noqa: BLE001
        pass
    os._exit(EXIT_PEER_LOST)


def leave(code: int) -> None:
    """A rank of a multi-process job leaves once its run is over and its exit handlers have run,
    without the interpreter's teardown: there Paddle's C++ objects of the job (the TCP store client,
    gloo's context) are destroyed in an unspecified order, and now and then a rank that completed
    aborted with "terminate called without an active exception" (SIGABRT), which its launcher reports
    as a failed job. Everything of the run is closed by then (checkpoints, VisualDL, logs)."""
    import logging

    atexit._run_exitfuncs()  # the peer watch's stop() among them
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


_watch: Optional[PeerWatch] = None


def _paddle_store(host: str, port: int, timeout_s: float):
    """A client of the job's TCP store of its own (Paddle's global client is one socket and is used
    by the main thread). num_workers=0: it does not count as a worker at start-up. It is never
    destroyed: its destructor would send STOP, which the store's server counts as a rank leaving."""
    import ctypes

    from paddle.base import core

    core.create_or_get_global_tcp_store()  # the job's store: rank 0 serves it once every rank has come
    store = core.TCPStore(host, port, False, 0, max(1, int(timeout_s)))
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(store))  # never destroyed (see above)
    return store


def finish() -> None:
    """This rank completed its run (call on the successful path of a run that started the watch)."""
    if _watch is not None:
        _watch.finish()


def start_peer_watch(info, resume_point: Optional[str] = None, *, resume_ready: Optional[Callable[[], bool]] = None,
                     env: Mapping[str, str] = os.environ, timeout_s: Optional[float] = None,
                     interval_s: Optional[float] = None, install_hooks: bool = True) -> Optional[PeerWatch]:
    """Call once per rank right after the distributed set-up (`init_distributed(info)`: the job's
    store exists then), and `finish()` when the run has completed on this rank. Returns the watch,
    or None with one process. With `install_hooks`, an uncaught exception goes through
    `PeerWatch.on_uncaught` (sys.excepthook) and the process exit through `PeerWatch.stop` (atexit):
    an exit without `finish()` stops the other ranks, naming this one. `resume_point`, `resume_ready`:
    the checkpoint a lost job resumes from, named in the verdict (`set_resume_point`)."""
    global _watch
    set_resume_point(resume_point, resume_ready)
    if info.world_size <= 1:
        return None
    address = store_address(env)
    if address is None:
        _say(f"rank {info.rank}: no PADDLE_MASTER or PADDLE_TRAINER_ENDPOINTS: peers are not watched")
        return None
    timeout = timeout_s if timeout_s is not None else _env_float(env, PEER_TIMEOUT_ENV, DEFAULT_PEER_TIMEOUT)
    interval = interval_s if interval_s is not None else _env_float(
        env, PEER_INTERVAL_ENV, min(DEFAULT_PEER_INTERVAL, max(0.2, timeout / 10)))
    host, port = address
    endpoints = job_endpoints(env)
    watch = PeerWatch(info.rank, info.world_size, lambda: _paddle_store(host, port, timeout),
                      endpoints=endpoints, store_desc=f"the job's TCP store at {host}:{port}",
                      timeout_s=timeout, interval_s=interval)
    watch._add(f"beat/{info.rank}", 1)  # connect now (every rank: the job's store starts with all of them)
    _watch = watch.start()
    if install_hooks:
        previous = sys.excepthook

        def hook(exc_type, exc, tb):
            previous(exc_type, exc, tb)  # the traceback first, as without the watch
            watch.on_uncaught(exc)

        sys.excepthook = hook
        atexit.register(watch.stop)
    _say(f"rank {info.rank}: watching {describe_ranks([(info.rank + 1) % info.world_size], endpoints)} "
         f"through the job's TCP store at {host}:{port}; a rank silent for {timeout:g} s stops the job "
         f"({PEER_TIMEOUT_ENV})")
    return _watch
