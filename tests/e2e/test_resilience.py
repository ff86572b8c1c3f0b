"""A cluster's bad days, with real processes: a preemption signal saves a checkpoint at the next step
boundary on every rank (the same step) and the resumed run ends bitwise where an uninterrupted one
ends; a second signal during the save changes nothing; the supervisor restarts a crashed 2-process
job, which then completes with the uninterrupted run's final state, and never retries a user error."""
import zlib  # noqa: F401  (before paddle)

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from helpers import ROOT, ENTRY, jsonl, metrics, ok, state, tiny_args, train, with_hooks

COMMON = dict(micro_batch_size=2, global_batch_size=4, max_steps=8, max_lr=5e-3, min_lr=1e-4, warmup_rate=0.25,
              logging_freq=1, eval_freq=100, eval_iters=1, checkpoint_steps=2, save_steps=100)
# the 2-process runs: sharding 2 (each rank saves its own optimizer-state shard) with accumulation 2
COMMON2 = {**COMMON, "use_sharding": "true", "sharding_degree": 2, "global_batch_size": 8, "eval_freq": 4}
EXIT_PREEMPTED = 76


def saved_ranks(run):
    """The ranks whose state model_last holds (rank_<r>.pdparams, .pdopt, ...)."""
    return sorted({p.name.split(".")[0] for p in (run / "model_last/state").iterdir()})


def assert_same_run(a, b):
    for tag in ("train/loss", "train/lr", "eval/loss"):
        assert metrics(a, tag) == metrics(b, tag), tag  # bitwise
    ranks = saved_ranks(a)
    assert ranks == saved_ranks(b)
    for rank in ranks:
        sa, sb = state(a / "model_last/state" / rank), state(b / "model_last/state" / rank)
        assert sorted(sa) == sorted(sb) and any("moment1" in k for k in sa)
        for name in sa:
            assert np.array_equal(sa[name], sb[name]), (rank, name)


@pytest.mark.slow
def test_a_signal_saves_at_the_step_boundary_and_the_resume_is_bitwise(demo, tmp_path):
    ok(train(tiny_args(demo, tmp_path / "straight", **COMMON), cwd=tmp_path))
    # SIGTERM twice after step 3 (not a checkpoint step): the second arrives while the first is handled
    hit = train(tiny_args(demo, tmp_path / "run", **COMMON), cwd=tmp_path,
                env={"ERNIE_MTL_TEST_SIGNAL_AT_STEP": "3", "ERNIE_MTL_TEST_SIGNAL_TIMES": "2"})
    assert hit.returncode == EXIT_PREEMPTED, hit.stdout[-2000:] + hit.stderr[-2000:]
    assert "preempted (SIGTERM): stopped at step 3" in hit.stdout
    assert json.loads((tmp_path / "run/model_last/train_state.json").read_text())["step"] == 3
    resumed = ok(train(tiny_args(demo, tmp_path / "run", **COMMON), cwd=tmp_path))
    assert "at step 3" in resumed.stdout
    assert_same_run(tmp_path / "straight", tmp_path / "run")
    # USR1 works the same; with --preempt_signals none the signal stops the process at once (no save), saying so
    usr1 = train(tiny_args(demo, tmp_path / "usr1", **COMMON), cwd=tmp_path,
                 env={"ERNIE_MTL_TEST_SIGNAL_AT_STEP": "1", "ERNIE_MTL_TEST_SIGNAL": "USR1"})
    assert usr1.returncode == EXIT_PREEMPTED and "preempted (SIGUSR1): stopped at step 1" in usr1.stdout
    off = train(tiny_args(demo, tmp_path / "off", preempt_signals="none", **COMMON), cwd=tmp_path,
                env={"ERNIE_MTL_TEST_SIGNAL_AT_STEP": "1"})
    assert off.returncode == 128 + signal.SIGTERM, off.stderr[-2000:]
    assert "stopped by SIGTERM during training" in off.stderr and "Traceback" not in off.stderr


@pytest.mark.slow
def test_a_signal_to_the_trainer_and_its_workers_saves_and_leaves_no_worker(demo, tmp_path):
    """--num_workers 2: SIGTERM after step 3 to the trainer and to its data-loading workers (a scheduler
    signalling every process of the job). The workers leave the signal to the trainer, which still gets
    its micro-batches, saves at the step boundary, exits 76 and takes its workers with it."""
    from helpers import proc_alive

    out = tmp_path / "run"
    hit = train(tiny_args(demo, out, **{**COMMON, "num_workers": 2}), cwd=tmp_path,
                env={"ERNIE_MTL_TEST_SIGNAL_AT_STEP": "3", "ERNIE_MTL_TEST_SIGNAL_WORKERS": "1"})
    assert hit.returncode == EXIT_PREEMPTED, hit.stdout[-2000:] + hit.stderr[-2000:]
    assert "preempted (SIGTERM): stopped at step 3" in hit.stdout
    assert json.loads((out / "model_last/train_state.json").read_text())["step"] == 3
    workers = json.loads((out / "signalled_workers.json").read_text())
    assert workers["alive"] == [True, True]  # the signal did not end them
    assert not any(proc_alive(pid) for pid in workers["pids"])  # the trainer's exit did


@pytest.mark.slow
@pytest.mark.parametrize("policy,fault,workers", [("skip", "always", 0), ("stop", "always", 0), ("replay", "once", 0),
                                                  ("replay", "always", 0), ("replay", "always", 2)])
def test_a_non_finite_step_is_skipped_stopped_or_replayed(demo, tmp_path, policy, fault, workers):
    """A fault injected into step 3 (an infinity in the word embedding while the step runs: every time
    it runs, or only the first time). With data-loading workers, the replay and the dump ask the data
    path for step 3 again: the same micro-batches."""
    out = tmp_path / "out"
    proc = train(tiny_args(demo, out, on_anomaly=policy, num_workers=workers, **COMMON), cwd=tmp_path,
                 env={"ERNIE_MTL_TEST_POISON_STEP": "3", "ERNIE_MTL_TEST_POISON": fault})
    text = proc.stdout + proc.stderr
    state_now = json.loads((out / "model_last/train_state.json").read_text())
    params = state(out / "model_last/state/rank_0")
    assert all(np.isfinite(v).all() for v in params.values() if v.dtype.kind == "f")
    if policy == "stop":
        assert proc.returncode == 77 and "step 3 is not finite" in text and "the last good state is saved" in text
        assert state_now["step"] == 3 and params["anomaly_skipped_steps"][0] == 1
        return
    ok(proc)
    counted = [r["train/skipped_steps"] for r in jsonl(out / "train_metrics.jsonl") if "train/skipped_steps" in r]
    if policy == "skip":
        assert counted[:3] == [0.0, 0.0, 1.0] and counted[-1] == 1.0
        assert "skipped 1 non-finite step(s) in this window (1 in all" in text
        assert "anomaly guard (skip): 1 non-finite step(s) skipped" in text
    elif fault == "once":
        assert "a transient fault (hardware?); the replayed update is kept" in text
        assert "replayed 1: 1 transient, 0 reproducible" in text
        # the window's loss is the replay's alone (the device-side sums are put back before the replay)
        logged = metrics(out, "train/loss")
        assert len(logged) == 8 and all(np.isfinite(v) for v in logged.values()), logged
    else:
        assert "the data or the numerics are at fault" in text and "replayed 1: 0 transient, 1 reproducible" in text
        dumped = json.loads((out / "anomalies/step_3_rank0.json").read_text())
        assert dumped["step"] == 3 and len(dumped["micro_batches"]) == 2  # accumulation 2
        assert dumped["micro_batches"][0] == {"task": "pretrain", "slot": 0, "samples": [[8, 0], [9, 0]]}  # step 3
        assert "micro0.input_ids" in np.load(out / "anomalies/step_3_rank0.npz").files


def launch(argv, *, cwd, log_dir, env=None):
    """paddle.distributed.launch of the entry point, 2 processes, as a Popen (the caller signals it)."""
    argv = with_hooks([str(a) for a in argv], env)
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--log_dir", str(log_dir),
           ENTRY, *argv]
    return subprocess.Popen(cmd, cwd=cwd, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def straight2(demo, tmp_path_factory):
    """The uninterrupted 2-process run both tests below must end at (sharding 2, accumulation 2). Rank 1
    is a straggler on purpose (it sleeps 0.4 s after every step: its own work, outside the program),
    which the slow-rank watch must name (checked below) and which does not change the numbers."""
    root = tmp_path_factory.mktemp("straight2")
    ok(train(tiny_args(demo, root / "out", slow_rank_windows=2, **COMMON2), cwd=root, launch_procs=2,
             log_dir=root / "logs", env={"ERNIE_MTL_TEST_SLEEP_RANK": "1", "ERNIE_MTL_TEST_SLEEP_S": "0.4"}))
    return root / "out"


@pytest.mark.slow
def test_two_processes_a_slow_rank_is_named(straight2):
    log = (straight2.parent / "logs" / "workerlog.0").read_text(errors="replace")
    warnings = [line for line in log.splitlines() if "slow rank: rank 1" in line]
    assert len(warnings) >= 4 and "2 windows running" in warnings[0], log[-3000:]
    assert "rank 0" not in " ".join(w.split("slow rank:")[1] for w in warnings)
    rows = [r for r in jsonl(straight2 / "train_metrics.jsonl") if "perf/slowest_rank" in r]
    assert len(rows) == 8 and all(r["perf/slowest_rank"] == 1 for r in rows)
    # rank 1's host time holds its 0.4 s sleep (a lower bound, whatever the load) and exceeds rank 0's
    assert all(r["perf/host_s_max"] >= 0.4 and r["perf/host_s_max"] > r["perf/host_s_min"] for r in rows)


@pytest.mark.slow
def test_two_processes_sharded_checkpoints_are_per_rank_and_fleets_dumps_stay_in_the_run(straight2):
    saved = json.loads((straight2 / "model_last/train_state.json").read_text())
    assert saved["step"] == 8 and saved["per_rank_state"] is True and saved["topology"]["sharding_degree"] == 2
    assert saved_ranks(straight2) == ["rank_0", "rank_1"]
    assert sorted(metrics(straight2, "eval/loss")) == [4, 8]
    assert (straight2 / "program_desc/main_sharding_1").is_file()  # fleet's dumps, not in the cwd
    assert not list(straight2.parent.glob("main_sharding*"))


@pytest.mark.slow
def test_two_processes_sigterm_to_the_launcher_saves_one_step_everywhere(demo, straight2, tmp_path):
    """The real path: the scheduler signals `paddle.distributed.launch`, which signals both ranks; they
    agree on one step through the job's store, save it, exit 76; the same command resumes exactly."""
    out, logs = tmp_path / "out", tmp_path / "logs"
    proc = launch(tiny_args(demo, out, **COMMON2), cwd=tmp_path, log_dir=logs)
    deadline = time.monotonic() + 600
    metrics_file = out / "train_metrics.jsonl"
    while not metrics_file.is_file() or len(metrics_file.read_text().splitlines()) < 3:
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-3000:]
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=300)
    text = [(logs / f"workerlog.{r}").read_text(errors="replace") for r in (0, 1)]
    stopped = re.findall(r"stopped at step (\d+)", text[0])
    assert len(stopped) == 1, text[0][-3000:]
    step = int(stopped[0])
    assert 3 <= step < 8 and json.loads((out / "model_last/train_state.json").read_text())["step"] == step
    assert "Traceback" not in text[0] + text[1]
    resumed = ok(train(tiny_args(demo, out, **COMMON2), cwd=tmp_path, launch_procs=2, log_dir=tmp_path / "logs2"))
    assert "resumed from" in (tmp_path / "logs2" / "workerlog.0").read_text()
    assert resumed.returncode == 0
    assert_same_run(straight2, out)


@pytest.mark.slow
def test_the_supervisor_restarts_a_crashed_job_which_completes_exactly(demo, straight2, tmp_path):
    """Rank 1 is SIGKILLed once after step 5 (the newest checkpoint is step 4); the watchdog stops the
    job, the supervisor logs the cause and runs the command again, which resumes and completes."""
    out = tmp_path / "out"
    argv = with_hooks([str(a) for a in tiny_args(demo, out, **COMMON2)],
                      {"ERNIE_MTL_TEST_KILL_ONCE_MARKER": str(tmp_path / "killed")})
    cmd = [sys.executable, "-m", "ernie_mtl.dist.supervisor", "--max_restarts", "2", "--backoff", "1", "--",
           sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--log_dir",
           str(tmp_path / "logs"), ENTRY, *argv]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ERNIE_MTL_TEST_KILL_ONCE_MARKER": str(tmp_path / "killed"),
           "ERNIE_MTL_TEST_KILL_ONCE_AT_STEP": "5", "ERNIE_MTL_TEST_KILL_ONCE_RANK": "1",
           "ERNIE_MTL_PEER_TIMEOUT": "20"}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (tmp_path / "killed").is_file()
    assert "restart 1 of 2" in proc.stderr and "the job completed after 1 restart(s)" in proc.stderr
    assert_same_run(straight2, out)


def test_the_supervisor_never_retries_a_user_error_and_keeps_its_budget(tmp_path):
    from ernie_mtl.dist.supervisor import Supervisor

    logged, slept = [], []
    user = Supervisor([sys.executable, "-c", "import sys; sys.exit(2)"], max_restarts=3, backoff=1, max_backoff=4,
                      log=logged.append, sleep=slept.append)
    assert user.run() == 2 and user.restarts == 0 and slept == [] and "user error" in logged[-1]
    logged.clear()
    crash = Supervisor([sys.executable, "-c", "import sys; print('RuntimeError: boom'); sys.exit(3)"],
                       max_restarts=3, backoff=1, max_backoff=3, log=logged.append, sleep=slept.append)
    assert crash.run() == 3 and crash.restarts == 3
    assert slept == [1, 2, 3]  # doubling, capped
    assert "exit status 3; last error line: RuntimeError: boom" in logged[0] and "budget (3) is spent" in logged[-1]
    done = Supervisor([sys.executable, "-c", "pass"], max_restarts=1, backoff=1, max_backoff=1, log=logged.append,
                      sleep=slept.append)
    assert done.run() == 0
    bad = subprocess.run([sys.executable, "-m", "ernie_mtl.dist.supervisor", "--max_restarts", "-1", "--", "true"],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert bad.returncode == 2 and "--max_restarts -1 must be >= 0" in bad.stderr


def test_the_straggler_watch_names_a_rank_only_after_several_windows():
    from ernie_mtl.engine.stragglers import StragglerWatch

    class Gather:  # what every rank would hand in: (step seconds, own seconds per step)
        def __init__(self, rounds):
            self.rounds = iter(rounds)

        def gather(self, what, mine):
            return next(self.rounds)

    even, slow = [(1.0, 0.01), (1.0, 0.01), (1.0, 0.01)], [(1.0, 0.01), (1.0, 0.5), (1.0, 0.01)]
    watch = StragglerWatch(Gather([slow, slow, even, slow, slow, slow]), 0, 3, factor=0.2, windows=3,
                           endpoints=["10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1"])
    said = [watch.window(10, 10.0, 1.0)[1] for _ in range(6)]
    assert said[:5] == [None] * 5  # two slow windows, a normal one resets the count, two more
    assert said[5].startswith("slow rank: rank 1 (node 10.0.0.2): 500 ms of its own work per step against 10 ms "
                              "on the other ranks, 3 windows running")
    scalars, _ = StragglerWatch(Gather([slow]), 0, 3, factor=0.2, windows=1).window(10, 10.0, 1.0)
    assert scalars["perf/slowest_rank"] == 1 and scalars["perf/host_s_max"] == 0.5
    assert not StragglerWatch(None, 0, 1, factor=0.2, windows=1).enabled
    assert not StragglerWatch(None, 0, 2, factor=0, windows=1).enabled
