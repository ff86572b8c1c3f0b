"""ernie_mtl.dist.watchdog: the peer watch against an in-memory store with a controlled clock (verdicts,
the ring, store loss, diagnosis after a failed collective, rank 0 outliving its peers), the orphan
guard in real processes, and both under the real `paddle.distributed.launch` with real gloo: a rank
script wired exactly as the entry point must be (tests/e2e/test_multinode.py runs the CLI itself)."""
import zlib  # noqa: F401  (before paddle)

import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from ernie_mtl.dist import watchdog
from ernie_mtl.dist.watchdog import EXIT_PEER_LOST, PeerWatch
from helpers import ROOT, free_port, proc_alive, proc_ppid, wait_for

# these launch ranks under the real launcher: run alone (tests/conftest.py); the rest is in-process or one child
EXCLUSIVE = {"test_a_frozen_node", "test_a_rank_exiting_mid_run", "test_no_false_alarm"}

ENDPOINTS = ["10.0.0.1:6070", "10.0.0.2:6070", "10.0.0.3:6070"]


class FakeStore:
    """The calls PeerWatch makes on Paddle's TCPStore, over a dict shared by every 'rank'."""

    def __init__(self):
        self.data = {}
        self.broken = None  # an exception every call raises (the store's host is gone)

    def add(self, key, value):
        if self.broken:
            raise self.broken
        self.data[key] = int(self.data.get(key, 0)) + value
        return self.data[key]

    def set(self, key, value):
        if self.broken:
            raise self.broken
        self.data[key] = bytes(value)

    def get(self, key):
        if self.broken:
            raise self.broken
        return self.data[key]


class Clock:
    """A clock the test moves; `calls` counts the readings (a watch thread reads it once per round)."""

    def __init__(self):
        self.t = 1000.0
        self.calls = 0

    def __call__(self):
        self.calls += 1
        return self.t


def make(rank, world, store, clock, died, **kw):
    kw.setdefault("timeout_s", 10.0)
    kw.setdefault("interval_s", 1.0)
    return PeerWatch(rank, world, lambda: store, endpoints=ENDPOINTS[:world], store_desc="the store at 10.0.0.1:7000",
                     die=died.append, clock=clock, **kw)


def test_a_silent_peer_is_lost_after_the_timeout_and_the_verdict_reaches_every_rank(tmp_path):
    store, clock, died = FakeStore(), Clock(), []
    watchdog.set_resume_point(str(tmp_path / "model_last"))
    r0, r1, r2 = (make(r, 3, store, clock, died) for r in range(3))
    for _ in range(5):  # all alive: no verdict
        for w in (r0, r1, r2):
            w.check_once()
        clock.t += 1.0
    assert died == []
    for _ in range(10):  # rank 1 stops beating; 10 s is not yet more than the timeout
        r0.check_once()
        r2.check_once()
        clock.t += 1.0
    assert died == []
    clock.t += 1.5
    r0.check_once()  # rank 0 watches rank 1 (the ring: r -> r+1)
    assert len(died) == 1
    assert died[0].startswith("rank 0: lost rank 1 (node 10.0.0.2): no heartbeat for 12 s (ERNIE_MTL_PEER_TIMEOUT=10)")
    assert died[0].endswith(f"Run the same command again on every node to resume from {tmp_path}/model_last "
                            "(no checkpoint there yet: that run starts from the beginning).")
    r2.check_once()  # rank 2 watches rank 0, who is fine, but reads the verdict
    assert died[1].startswith("rank 2: lost rank 1 (node 10.0.0.2): no heartbeat") and "(verdict of rank 0)" in died[1]


def test_the_ring_skips_ranks_that_left_normally(tmp_path):
    store, clock, died = FakeStore(), Clock(), []
    r0, r1, r2 = (make(r, 3, store, clock, died) for r in range(3))
    r1.finish()  # rank 1 completed its run
    assert r0._watched() == 2
    for _ in range(15):
        r0.check_once()
        r2.check_once()
        clock.t += 1.0
    assert died == []  # rank 1's beat stands still, but it left: no verdict
    r2.finish()
    assert r0._watched() is None


def test_a_store_that_fails_or_stops_answering_means_rank_0_is_lost(tmp_path):
    store, clock, died = FakeStore(), Clock(), []
    watch = make(1, 2, store, clock, died, timeout_s=0.6, interval_s=0.05)
    store.broken = ValueError("(InvalidArgument) TCP send error. Details: Broken pipe.")
    watch.start()
    wait_for(lambda: died, 60, "the verdict on a failing store")  # a generous bound: no timing is asserted
    assert died[0].startswith("rank 1: lost contact with the store at 10.0.0.1:7000, which lives in rank 0 "
                                       "(node 10.0.0.1): it failed: ValueError: (InvalidArgument) TCP send error.")

    # a store call that never returns (the host vanished without closing the connection): the verdict comes
    # when the silence, on the watch's own clock, passes timeout + interval, and not before
    hung, died, clock = FakeStore(), [], Clock()
    release = threading.Event()
    hung.add = lambda key, value: release.wait()  # noqa: E731
    watch = PeerWatch(1, 2, lambda: hung, endpoints=ENDPOINTS[:2], store_desc="the store", die=died.append,
                      timeout_s=0.5, interval_s=0.02, clock=clock)
    try:
        watch.start()
        clock.t += 0.5 + 0.02  # the bound itself: not yet
        seen = clock.calls
        wait_for(lambda: clock.calls >= seen + 3, 60, "the store guard to look three times")
        assert died == []
        clock.t += 0.01
        wait_for(lambda: died, 60, "the verdict")
    finally:
        release.set()
    assert died[0].startswith("rank 1: lost contact with the store, which lives in rank 0 (node 10.0.0.1): "
                              "no answer for 1 s"), died


def test_after_a_failed_collective_the_diagnosis_names_the_ranks_that_stopped(tmp_path):
    store, clock, died = FakeStore(), Clock(), []
    r0, r1, r2 = (make(r, 3, store, clock, died) for r in range(3))
    for w in (r0, r1, r2):
        w.check_once()

    def rank_2_beats(_seconds):  # during the window rank 2 is alive; rank 1 is dead
        store.add("ernie_mtl/watch/beat/2", 1)

    r0._sleep = rank_2_beats
    text = r0.diagnose()
    assert text.startswith("lost rank 1 (node 10.0.0.2): no heartbeat for 2 s after a collective failed")
    r0.on_uncaught(RuntimeError("std::exception"))
    assert died[-1].startswith("rank 0: lost rank 1 (node 10.0.0.2)")
    r2.check_once()  # the verdict reaches the others
    assert died[-1].startswith("rank 2: lost rank 1")


def test_a_rank_failing_with_its_own_error_stops_the_others_naming_it(tmp_path):
    store, clock, died = FakeStore(), Clock(), []
    r0, r1 = (make(r, 2, store, clock, died) for r in range(2))
    r0.check_once()
    r1.check_once()
    r1._sleep = lambda s: store.add("ernie_mtl/watch/beat/0", 1)  # rank 0 alive during the diagnosis
    r1.on_uncaught(ValueError("bad value in batch 7\nsecond line"))
    assert died == []  # its own error: it exits as it would have (the traceback was printed)
    r0.check_once()
    assert died == ["rank 0: rank 1 (node 10.0.0.2) failed with its own error (ValueError: bad value in batch 7); "
                    "see that rank's log. The job cannot continue. " + watchdog.resume_hint()]
    r0.on_uncaught(KeyboardInterrupt())  # ignored


def test_a_rank_exiting_before_the_end_stops_the_others_naming_it():
    """A user error or sys.exit mid-run ends the process without an exception: the peers would wait
    for it in a collective (forever with NCCL); its exit hook tells them."""
    store, clock, died = FakeStore(), Clock(), []
    r0, r1, r2 = (make(r, 3, store, clock, died) for r in range(3))
    for w in (r0, r1, r2):
        w.check_once()
    r2._sleep = lambda s: None
    r2.stop()  # atexit, without finish()
    assert died == []
    r1.check_once()
    assert died == ["rank 1: rank 2 (node 10.0.0.3) exited before the end of the run; see that rank's log. "
                    "The job cannot continue. " + watchdog.resume_hint()]


def test_rank_0_stays_until_its_live_peers_have_left():
    """The store lives in rank 0: leaving first would look like a loss to a rank still finishing."""
    store, clock, died = FakeStore(), Clock(), []
    r0, r1 = (make(r, 2, store, clock, died) for r in range(2))
    rounds = []

    def rank_1_finishing(_seconds):
        rounds.append(1)
        clock.t += 0.5
        store.add("ernie_mtl/watch/beat/1", 1)  # still working ...
        if len(rounds) == 30:
            r1.finish()  # ... then done

    r0._sleep = rank_1_finishing
    r0.finish()
    r0.stop()  # at exit
    assert len(rounds) == 30 and died == []
    # a silent peer is not waited for beyond the timeout
    store, clock = FakeStore(), Clock()
    r0 = make(0, 2, store, clock, died)
    r0._sleep = lambda s: setattr(clock, "t", clock.t + 1.0)
    r0.finish()
    r0.stop()
    assert 10 <= clock.t - 1000.0 <= 13


def test_resume_hint_and_settings(tmp_path, monkeypatch):
    from ernie_mtl.engine.run import resume_point

    (tmp_path / "model_last").mkdir()
    point = resume_point(str(tmp_path))
    watchdog.set_resume_point(point["resume_point"], point["resume_ready"])
    assert watchdog.resume_hint().endswith("(no checkpoint there yet: that run starts from the beginning).")
    (tmp_path / "model_last" / "train_state.json").write_text("{}")
    assert watchdog.resume_hint() == f"Run the same command again on every node to resume from {tmp_path}/model_last."
    with pytest.raises(ValueError, match="ERNIE_MTL_PEER_TIMEOUT='soon' must be a positive number of seconds"):
        watchdog._env_float({"ERNIE_MTL_PEER_TIMEOUT": "soon"}, "ERNIE_MTL_PEER_TIMEOUT", 120)
    with pytest.raises(ValueError, match="ERNIE_MTL_PEER_TIMEOUT='0'"):
        watchdog._env_float({"ERNIE_MTL_PEER_TIMEOUT": "0"}, "ERNIE_MTL_PEER_TIMEOUT", 120)
    assert watchdog.store_address({"PADDLE_MASTER": "10.0.0.1:7000"}) == ("10.0.0.1", 7000)
    assert watchdog.store_address({"PADDLE_TRAINER_ENDPOINTS": "10.0.0.5:6070,10.0.0.6:6070"}) == ("10.0.0.5", 6070)
    assert watchdog.store_address({}) is None
    assert watchdog.describe_ranks([9, 8], ["a:1"] * 8 + ["10.0.0.2:1", "10.0.0.2:2"]) == \
        "ranks 8 (node 10.0.0.2), 9 (node 10.0.0.2)"


# ------------------------------------------------------------------------------------------
# the orphan guard, in real processes (no paddle)

GUARDED_CHILD = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, {root!r})
    from ernie_mtl.dist import watchdog
    guard = watchdog.install_orphan_guard()
    print("guarded" if guard else "unguarded", os.getpid(), file=sys.stderr, flush=True)
    time.sleep(120)
""")

PARENT = textwrap.dedent("""
    import os, subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", {child!r}], start_new_session=True)  # as the launcher does
    print(child.pid, flush=True)
    time.sleep(120)
""")


def test_orphan_guard_stops_a_child_whose_parent_was_killed(tmp_path):
    child = GUARDED_CHILD.format(root=str(ROOT))
    env = {**os.environ, "ERNIE_MTL_ORPHAN_GUARD": "1", "ERNIE_MTL_ORPHAN_POLL": "0.2"}
    log = open(tmp_path / "child.log", "w")
    parent = subprocess.Popen([sys.executable, "-c", PARENT.format(child=child)], stdout=subprocess.PIPE,
                              stderr=log, env=env, text=True)
    child_pid = None
    try:
        child_pid = int(parent.stdout.readline())
        deadline = time.monotonic() + 30
        while "guarded" not in (tmp_path / "child.log").read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        parent.kill()  # SIGKILL: the parent cannot clean up
        parent.wait()
        wait_for(lambda: not proc_alive(child_pid), 120, "the orphaned child to stop")  # against a hang only
    finally:
        if child_pid and proc_alive(child_pid):
            os.kill(child_pid, signal.SIGKILL)
        parent.kill()
    text = (tmp_path / "child.log").read_text()
    assert f"ernie_mtl watchdog: rank ?: its launcher (pid {parent.pid}) is gone" in text


def test_the_orphan_guard_acts_at_the_first_poll_after_its_launcher_is_gone():
    """The bound of the guard is one poll: counted in polls (its sleeps), not in seconds."""
    parents = iter([4242, 4242, 4242, 1])  # the launcher (pid 4242) dies after the third poll
    sleeps, stopped = [], threading.Event()
    messages = []
    guard = watchdog.OrphanGuard(4242, "3", 0.5, lambda m: (messages.append(m), stopped.set()),
                                 getppid=lambda: next(parents), sleep=sleeps.append)
    guard.start()
    assert stopped.wait(60)
    assert sleeps == [0.5, 0.5, 0.5]  # three polls saw the launcher; the fourth acted
    assert messages[0].startswith("rank 3: its launcher (pid 4242) is gone (parent is now pid 1); stopping")


def test_leave_runs_exit_handlers_flushes_and_keeps_the_status(tmp_path):
    """How a launched rank ends (ernie_mtl/main.py): its exit handlers (the peer watch's stop, VisualDL)
    and buffered output must not be lost by skipping the interpreter's teardown."""
    script = ("import atexit, sys; sys.path.insert(0, %r)\n"
              "from ernie_mtl.dist import watchdog\n"
              "atexit.register(lambda: open(%r, 'w').write('handled'))\n"
              "sys.stdout.write('buffered, not flushed')\n"
              "watchdog.leave(3)\n"
              "print('never reached')\n") % (str(ROOT), str(tmp_path / "handler"))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONUNBUFFERED": ""})
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout == "buffered, not flushed"
    assert (tmp_path / "handler").read_text() == "handled"


def test_no_guard_without_a_launcher():
    """A plain run (its parent is a shell or pytest) is never guarded: it may outlive its terminal."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PADDLE_", "ERNIE_MTL_ORPHAN"))}
    proc = subprocess.run([sys.executable, "-c",
                           "import sys; sys.path.insert(0, %r); from ernie_mtl.dist import watchdog; "
                           "print(watchdog.install_orphan_guard())" % str(ROOT)], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.stdout.strip() == "None", proc.stderr
    assert watchdog.install_orphan_guard({"ERNIE_MTL_ORPHAN_GUARD": "0", "PADDLE_TRAINER_ID": "0",
                                          "PADDLE_BACKUP_ENV_PATH": "x"}) is None
    assert watchdog.launched_by_paddle({"PADDLE_TRAINER_ID": "1", "PADDLE_BACKUP_ENV_PATH": "/l/backup_env.1.json"},
                                       ppid=os.getpid())
    assert not watchdog.launched_by_paddle({"PADDLE_TRAINER_ID": "1"}, ppid=os.getpid())


# ------------------------------------------------------------------------------------------
# under the real launcher, real gloo: a rank script wired as run_multitask_static.py must be

RANK_SCRIPT = textwrap.dedent("""
    import zlib, os, sys, time
    sys.path.insert(0, {root!r})
    from ernie_mtl.dist import watchdog
    watchdog.install_orphan_guard()                     # first: before paddle is imported
    import numpy as np
    import paddle
    try:
        from ernie_mtl.dist.process import ProcessInfo, init_distributed
    except ImportError:  # before the process set-up moved to ernie_mtl/dist/process.py
        from ernie_mtl.distributed import ProcessInfo, init_distributed
    info = ProcessInfo.from_env()
    init_distributed(info)
    from ernie_mtl.engine.run import resume_point
    watchdog.start_peer_watch(info, **resume_point(os.environ["OUT"]))  # right after the distributed set-up
    main, start = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, start):
        x = paddle.static.data("x", [64], "float32")
        from paddle.base.layer_helper import LayerHelper
        helper = LayerHelper("c_allreduce_sum")
        out = helper.create_variable_for_type_inference("float32")
        helper.append_op(type="c_allreduce_sum", inputs={{"X": [x]}}, outputs={{"Out": [out]}},
                         attrs={{"ring_id": 0, "use_calc_stream": True}})
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(start)
    steps = int(os.environ.get("STEPS", "100000"))
    for step in range(1, steps + 1):
        total = exe.run(main, feed={{"x": np.ones(64, "float32")}}, fetch_list=[out])[0]
        assert total[0] == info.world_size
        if step % 20 == 0:
            print("step", step, flush=True)
        time.sleep(0.02)
        if step == int(os.environ.get("EXIT_AT_STEP_RANK_%d" % info.rank, "0")):
            watchdog.leave(2)                           # as a user error ends a rank: no exception
    time.sleep(float(os.environ.get("EXTRA_S_RANK_%d" % info.rank, "0")))  # e.g. a rank finishing late
    watchdog.finish()                                   # the run is complete on this rank
    print("finished", flush=True)
    watchdog.leave(0)                                   # as the entry point leaves (no C++ teardown)
""")


def launcher_args(log_dir, *rendezvous, nproc=1):
    return [sys.executable, "-m", "paddle.distributed.launch", *rendezvous, "--nproc_per_node", str(nproc),
            "--log_dir", str(log_dir), "rank.py"]


def two_nodes(job, tmp_path, **env):
    """Two launchers on this machine joining at one rendezvous address, one process each."""
    (tmp_path / "rank.py").write_text(RANK_SCRIPT.format(root=str(ROOT)))
    master = ["--master", f"127.0.0.1:{free_port()}", "--nnodes", "2"]
    nodes = [job.launch(launcher_args(tmp_path / f"log{n}", *master), log=f"node{n}", OUT=str(tmp_path / "out"), **env)
             for n in (0, 1)]
    logs = [tmp_path / f"log{n}" / "workerlog.0" for n in (0, 1)]
    wait_for(lambda: all(p.exists() and "step 20" in p.read_text(errors="replace") for p in logs), 90,
             "both nodes to train")
    rank_of = [int(next(line for line in (tmp_path / f"log{n}" / "envlog.0").read_text().splitlines()
                        if line.startswith("PADDLE_TRAINER_ID=")).split("=")[1]) for n in (0, 1)]
    return nodes, logs, rank_of


def node_processes(job, launcher):
    """The launcher and its rank (the rank's parent is the launcher until the launcher dies)."""
    return [launcher.pid] + [p for p in job.ranks() if proc_ppid(p) == launcher.pid]


# Orphaned ranks (launcher SIGKILLed) and a killed node (rank 0 or rank 1 lost, the survivor names it
# and says how to resume) are tested with the real entry point in tests/e2e/test_multinode.py; the
# rank script here covers what needs a rank of its own: a frozen node, a rank leaving early, a late rank.


@pytest.mark.slow
def test_a_frozen_node_stops_the_survivor_within_the_timeout(job, tmp_path):
    """SIGSTOP of a node (launcher and rank) keeps its sockets open, as a power loss or a network
    partition does: gloo would wait 9,999,999 s. The watch stops the survivor after the timeout."""
    nodes, logs, rank_of = two_nodes(job, tmp_path, ERNIE_MTL_PEER_TIMEOUT="8")
    lost = rank_of.index(1)  # freeze the node of rank 1: rank 0 (the store's host) survives
    frozen = node_processes(job, nodes[lost])
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    survivor = nodes[1 - lost]
    try:
        code = survivor.wait(timeout=180)  # against a hang only: the watch's own clock is checked below
    finally:
        for pid in frozen:
            os.kill(pid, signal.SIGKILL)
    assert code == EXIT_PEER_LOST
    text = logs[1 - lost].read_text()
    # the verdict of the timeout (not of a failed collective: gloo alone would wait), after at least the timeout
    silence = re.search(r"ernie_mtl watchdog: rank 0: lost rank 1 \(node 127\.0\.0\.1\): no heartbeat for (\d+) s "
                        r"\(ERNIE_MTL_PEER_TIMEOUT=8\)", text)
    assert silence and int(silence.group(1)) >= 8, text[-3000:]
    # as the entry point names it: the checkpoint folder, and that this run had saved none yet
    assert (f"Run the same command again on every node to resume from {tmp_path}/out/model_last "
            "(no checkpoint there yet: that run starts from the beginning)." in text), text[-3000:]


@pytest.mark.slow
def test_a_rank_exiting_mid_run_without_an_exception_stops_the_job(job, tmp_path):
    (tmp_path / "rank.py").write_text(RANK_SCRIPT.format(root=str(ROOT)))
    launcher = job.launch(launcher_args(tmp_path / "log", nproc=2), log="launcher", OUT=str(tmp_path / "out"),
                          EXIT_AT_STEP_RANK_1="30")
    assert launcher.wait(timeout=120) != 0
    text = (tmp_path / "log" / "workerlog.0").read_text()
    assert "ernie_mtl watchdog: rank 0: rank 1 (node 127.0.0.1) exited before the end of the run" in text, text[-2000:]


@pytest.mark.slow
def test_no_false_alarm_when_a_rank_finishes_long_after_rank_0(job, tmp_path):
    """Rank 1 works on for longer than the timeout after rank 0 is done: rank 0 (the store's host)
    waits for it, and nobody is declared lost."""
    (tmp_path / "rank.py").write_text(RANK_SCRIPT.format(root=str(ROOT)))
    launcher = job.launch(launcher_args(tmp_path / "log", nproc=2), log="launcher", OUT=str(tmp_path / "out"),
                          STEPS="40", EXTRA_S_RANK_1="6", ERNIE_MTL_PEER_TIMEOUT="3")
    assert launcher.wait(timeout=120) == 0, (tmp_path / "launcher.out").read_text()[-3000:]
    for r in (0, 1):
        text = (tmp_path / "log" / f"workerlog.{r}").read_text()
        assert "finished" in text and "lost" not in text
