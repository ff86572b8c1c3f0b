"""Several nodes for real, on one machine: two `paddle.distributed.launch` processes joining at one
rendezvous address (`scripts/run_cpu.sh` with MASTER/NNODES, the launch code of scripts/run.sh),
one CPU process each, the same command run twice as two nodes would run it.

- The job's parameters equal one process on the combined batch (flag mode and multi-task mode).
- A node dies mid-run (its rank and its launcher SIGKILLed): the surviving node exits non-zero in a
  bounded time; running the two-node command again resumes from model_last and ends bitwise equal
  to an uninterrupted run.
- Through the watchdog wired into run_multitask_static.py: the survivor's log names the lost rank
  (found by the diagnosis after the failed collective, not by waiting out ERNIE_MTL_PEER_TIMEOUT) and
  how to resume; orphaned ranks exit when their launcher is killed. A frozen node is
  tests/e2e/test_watchdog.py's (a rank script wired as the entry point).
Every process a test starts is killed at its end, found by a marker in its environment."""
import zlib  # noqa: F401  (before paddle)

import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from ernie_mtl.dist import ports

from helpers import (Job, free_port, global_yaml, launch_logs, metrics, proc_alive, proc_cmdline, proc_ppid, state,
                     wait_for)

# a lost rank is found within heartbeat windows: these run alone (tests/conftest.py)
EXCLUSIVE = {"lost_node", "survivor", "orphaned"}

ROOT = Path(__file__).resolve().parents[2]
RUN_CPU = str(ROOT / "scripts" / "run_cpu.sh")
ENTRY = str(ROOT / "run_multitask_static.py")
HOOKS = ROOT / "tests" / "plugins" / "test_hooks.py"


def hooks(*names):
    """The test-only callbacks (kill_at_step, dump_state; driven by ERNIE_MTL_TEST_KILL_AT_STEP and
    ERNIE_MTL_TEST_DUMP_DIR) as command-line flags, once the trainer takes them from a plugin file;
    before that, the trainer reads the variables itself and no flag is needed."""
    return ["--plugins", str(HOOKS), "--callbacks", ",".join(names)] if HOOKS.is_file() else []


def flag_config(demo, path, **flags):
    """A pretraining YAML for the tiny ERNIE: dropout off and exactly one masked token per sample, so
    two half batches average to the combined batch (see test_trainer)."""
    vocab_size = sum(1 for _ in open(demo / "vocab.txt", encoding="utf-8"))
    keys = dict(device="cpu", input_dir=str(demo / "corpus"), tokenizer_name_or_path=str(demo / "vocab.txt"),
                model_name_or_path="ernie-tiny-test", vocab_size=vocab_size, max_seq_len=64, split="'90,5,5'",
                num_workers=0, max_predictions_per_seq=1, max_ngrams=1, short_seq_prob=0, max_lr=5e-3, min_lr=1e-4,
                warmup_rate=0.2, global_batch_size=8, logging_freq=1, eval_freq=3, eval_iters=1, save_steps=100,
                hidden_dropout_prob=0, attention_probs_dropout_prob=0,
                cpu_kernels="exact")  # runs of different shapes are compared: one fixed kernel set
    keys.update(flags)
    path.write_text("".join(f"{k}: {v}\n" for k, v in keys.items()))
    return path


class Nodes:
    """`scripts/run_cpu.sh` started twice with one MASTER: two nodes of one job."""

    def __init__(self, job, tmp, config, output_dir, *args, port=None):
        self.job, self.tmp, self.output_dir = job, Path(tmp), Path(output_dir)
        self.port = port or free_port()
        self.config, self.args = config, [str(a) for a in args]
        self.launchers, self.log_dirs = [], []

    def start(self, node_env=({}, {}), tag="run"):
        self.launchers, self.log_dirs = [], []
        for n, extra in enumerate(node_env):
            log_dir = self.tmp / f"{tag}_node{n}_log"  # one machine: each node its own log folder
            env = dict(PYTHON=sys.executable, MASTER=f"127.0.0.1:{self.port}", NNODES="2", NPROC="1",
                       CONFIG=str(self.config),
                       OUTPUT_DIR=str(self.output_dir), LOG_DIR=str(log_dir), **extra)
            self.launchers.append(self.job.launch(["bash", RUN_CPU, *self.args], log=f"{tag}_node{n}", **env))
            self.log_dirs.append(log_dir)
        return self

    def wait(self, timeout=180):
        return [p.wait(timeout=timeout) for p in self.launchers]

    def rank_of(self, n):
        """The global rank node n got (the rendezvous numbers the nodes; the launcher records it)."""
        path = self.log_dirs[n] / "envlog.0"
        wait_for(path.exists, 120, f"node {n} to start its rank")
        line = next(text for text in path.read_text().splitlines() if text.startswith("PADDLE_TRAINER_ID="))
        return int(line.split("=")[1])

    def worker_log(self, n):
        path = self.log_dirs[n] / "workerlog.0"
        return path.read_text(errors="replace") if path.exists() else ""

    def printed_command(self, n, tag="run"):
        text = (self.tmp / f"{tag}_node{n}.out").read_text(errors="replace")
        line = next(t for t in text.splitlines() if t.startswith("+ ") and "paddle.distributed.launch" in t)
        return re.sub(r"--log_dir \S+ ", "", line)

    def report(self, tag="run"):
        out = "".join((self.tmp / f"{tag}_node{n}.out").read_text(errors="replace")[-2500:] for n in (0, 1))
        return out + "".join(self.worker_log(n)[-2500:] for n in (0, 1))


def one_process(job, config, output_dir, *args, env=None):
    proc = job.launch([sys.executable, ENTRY, "--config", str(config), "--output_dir", str(output_dir),
                       *[str(a) for a in args]], log=f"one_{Path(output_dir).name}", **(env or {}))
    code = proc.wait(timeout=240)
    assert code == 0, (job.tmp / f"one_{Path(output_dir).name}.out").read_text()[-3000:]


@pytest.fixture(scope="module")
def flag_runs(demo, tmp_path_factory):
    """Two nodes of one process with micro-batch 2 (global batch 8), 6 steps with a checkpoint every 2: the
    reference run of this module. (The one-process run it is compared with is made by the test that
    compares: the exclusive pass sets this fixture up again and does not need it.)"""
    tmp = tmp_path_factory.mktemp("flag")
    job = Job(tmp)
    try:
        config = flag_config(demo, tmp / "flag.yaml", max_steps=6, checkpoint_steps=2)
        nodes = Nodes(job, tmp, config, tmp / "two", "--micro_batch_size", 2, *hooks("dump_state")).start(
            node_env=({"ERNIE_MTL_TEST_DUMP_DIR": str(tmp / "dump")},) * 2)
        codes = nodes.wait()
        assert codes == [0, 0], nodes.report()
        yield {"tmp": tmp, "config": config, "two": tmp / "two", "dump": tmp / "dump", "nodes": nodes}
    finally:
        job.kill_all()


def assert_bitwise_equal_runs(a, b):
    for tag in ("train/loss", "train/lr", "eval/loss"):
        assert metrics(a, tag) == metrics(b, tag), tag
    sa, sb = state(Path(a) / "model_last/state/rank_0"), state(Path(b) / "model_last/state/rank_0")
    assert sorted(sa) == sorted(sb) and any("moment1" in k for k in sa)
    for name in sa:
        assert np.array_equal(sa[name], sb[name]), name


@pytest.mark.slow
def test_two_nodes_equal_one_process_on_the_combined_batch(flag_runs, job, tmp_path):
    nodes, two = flag_runs["nodes"], flag_runs["two"]
    one_process(job, flag_runs["config"], tmp_path / "one", "--micro_batch_size", 4)  # the same global batch 8
    assert nodes.printed_command(0) == nodes.printed_command(1)  # the same command on both nodes
    command = nodes.printed_command(0)
    assert "--master 127.0.0.1:" in command and "--nnodes 2 --nproc_per_node 1" in command
    assert sorted(nodes.rank_of(n) for n in (0, 1)) == [0, 1]
    saved = json.loads((two / "model_last/train_state.json").read_text())
    assert saved["step"] == 6 and saved["topology"]["world_size"] == 2
    single = state(tmp_path / "one" / "model_last/state/rank_0")
    rank0, rank1 = state(flag_runs["dump"] / "rank_0"), state(flag_runs["dump"] / "rank_1")
    params = sorted(set(saved["name_map"].values()))
    assert params and set(params) <= set(rank0)
    for name in params:
        np.testing.assert_array_equal(rank0[name], rank1[name], err_msg=name)  # the nodes all-reduce
        np.testing.assert_allclose(rank0[name], single[name], rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.slow
def test_two_nodes_multitask_equal_one_process(data, tmp_path):  # noqa: F811
    """Multi-task mode (classification + the plugin's regression): per-task batch 4, a global batch of
    2 micro-batches, on two nodes == in one process with accumulation 2 (the same task and examples
    per slot, ernie_mtl/planning/schedule.py)."""
    job = Job(tmp_path)
    try:
        common = dict(num_epochs=1, max_steps=8, eval_freq=1000, checkpoint_steps=1000, save_steps=1000,
                      task_instance="sentiment, score", target_tag="1, 1", mix_ratio="1.0, 1.0", plugins=["plugins.py"],
                      dropout=0.0, micro_batch_size=8, global_batch_size=16,
                      cpu_kernels="exact")  # different shapes compared: one fixed kernel set
        one_process(job, global_yaml(data, "mn1.yaml", save_path=str(tmp_path / "one"), **common), tmp_path / "one",
                    "--tasks.sentiment.batch_size=4", "--tasks.score.batch_size=4")
        cfg = global_yaml(data, "mn2.yaml", save_path=str(tmp_path / "two"), **common)
        nodes = Nodes(job, tmp_path, cfg, tmp_path / "two", "--tasks.sentiment.batch_size=4",
                      "--tasks.score.batch_size=4").start()
        assert nodes.wait() == [0, 0], nodes.report()
        assert nodes.printed_command(0) == nodes.printed_command(1)
    finally:
        job.kill_all()
    ta = json.loads((tmp_path / "one/model_last/train_state.json").read_text())
    tb = json.loads((tmp_path / "two/model_last/train_state.json").read_text())
    assert ta["step"] == tb["step"] == 8 and tb["topology"]["world_size"] == 2
    assert ta["sampler"]["counts"] == tb["sampler"]["counts"]
    a, b = state(tmp_path / "one/model_last/state/rank_0"), state(tmp_path / "two/model_last/state/rank_0")
    # The key-projection biases are left out, as in test_multitask: softmax is shift-invariant per
    # query, so their gradient is 0 in exact arithmetic and their values are Adam-amplified rounding noise.
    noise = {v for k, v in ta["name_map"].items() if k.endswith("self_attn.k_proj.bias")}
    compared = [v for v in ta["name_map"].values() if v not in noise]
    assert len(compared) > 30
    for name in compared:
        np.testing.assert_allclose(a[name], b[name], rtol=1e-5, atol=1e-5, err_msg=name)


def kill_node(job, nodes, n):
    """SIGKILL node n: its launcher and its rank (the rank runs in a session of its own)."""
    launcher = nodes.launchers[n]
    for pid in [p for p in job.ranks() if proc_ppid(p) == launcher.pid] + [launcher.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def start_and_lose_a_node(job, nodes, at_step=2, node_env=({}, {})):
    """Both nodes run (`nodes` built with `hooks("kill_at_step")`, the same command on both); node 1's
    rank SIGKILLs itself right after step `at_step`'s checkpoint (the test hook, asked for in node
    1's environment only), and its launcher is SIGKILLed at once: node 1 is gone as after a crash. Returns
    (survivor's exit status, seconds from the loss to its exit, the rank node 1 had)."""
    nodes.start(node_env=(node_env[0], {**node_env[1], "ERNIE_MTL_TEST_KILL_AT_STEP": str(at_step)}), tag="killed")
    lost_rank = nodes.rank_of(1)

    def node_1_rank():
        return [p for p in job.ranks() if proc_ppid(p) == nodes.launchers[1].pid]

    # the listing that found it: node 1's rank may reach its kill step before a second listing
    (rank_pid,) = wait_for(node_1_rank, 120, "node 1's rank")
    wait_for(lambda: not proc_alive(rank_pid), 180, "node 1's rank to reach the kill step")
    kill_node(job, nodes, 1)
    t0 = time.monotonic()
    code = nodes.launchers[0].wait(timeout=300)
    return code, time.monotonic() - t0, lost_rank


@pytest.mark.slow
def test_a_lost_node_stops_the_survivor_and_the_same_command_resumes_bitwise(flag_runs, tmp_path):
    job = Job(tmp_path)
    out = tmp_path / "resumed"
    try:
        nodes = Nodes(job, tmp_path, flag_runs["config"], out, "--micro_batch_size", 2, *hooks("kill_at_step"))
        code, took, lost_rank = start_and_lose_a_node(job, nodes, node_env=({"NODE_RANK": "0"}, {"NODE_RANK": "1"}))
        assert lost_rank == 1
        print(f"lost rank {lost_rank}: the survivor exited with {code} after {took:.1f} s")
        text = nodes.worker_log(0)
        assert code == 75, nodes.report("killed")
        # the survivor's collective failed at once (gloo, a peer's sockets closed); the diagnosis names the rank
        # whose heartbeat stopped: the fast path, not the verdict after ERNIE_MTL_PEER_TIMEOUT (120 s)
        assert f"ernie_mtl watchdog: rank {1 - lost_rank}: lost rank {lost_rank} (node 127.0.0.1)" in text, text[-3000:]
        assert "ERNIE_MTL_PEER_TIMEOUT=" not in text, text[-3000:]
        assert f"Run the same command again on every node to resume from {out / 'model_last'}." in text
        assert json.loads((out / "model_last/train_state.json").read_text())["step"] == 2
        # the same two-node command again, on both nodes: resumes and finishes
        nodes.start(tag="rerun")
        assert nodes.wait() == [0, 0], nodes.report("rerun")
        logs = nodes.worker_log(0) + nodes.worker_log(1)
        assert f"resumed from {out / 'model_last'} at step 2" in logs
    finally:
        job.kill_all()
    assert_bitwise_equal_runs(flag_runs["two"], out)  # equal to the uninterrupted two-node run


@pytest.mark.slow
@pytest.mark.parametrize("lost", [0])
def test_the_survivor_log_names_the_lost_rank_and_how_to_resume(flag_runs, tmp_path, lost):
    """NODE_RANK places the lost node on rank 0: the job's store, in its process, is gone too (losing
    rank 1 is checked by the resume test above)."""
    job = Job(tmp_path)
    out = tmp_path / "lost"
    try:
        nodes = Nodes(job, tmp_path, flag_runs["config"], out, "--micro_batch_size", 2, *hooks("kill_at_step"))
        code, took, lost_rank = start_and_lose_a_node(
            job, nodes, node_env=({"NODE_RANK": str(1 - lost)}, {"NODE_RANK": str(lost)}))
        assert lost_rank == lost
        print(f"lost rank {lost_rank}: the survivor exited with {code} after {took:.1f} s")
        text = nodes.worker_log(0)
    finally:
        job.kill_all()
    assert code == 75, (code, took)
    if lost_rank == 1:
        assert "ernie_mtl watchdog: rank 0: lost rank 1 (node 127.0.0.1)" in text, text[-3000:]
    else:  # the store lived in rank 0's process: its calls failed at once (not "no answer for" the timeout)
        assert "ernie_mtl watchdog: rank 1: lost contact with the job's TCP store" in text, text[-3000:]
        assert "no answer for" not in text, text[-3000:]
    assert f"Run the same command again on every node to resume from {out / 'model_last'}." in text


# A frozen node (SIGSTOP: sockets stay open, gloo alone waits 9,999,999 s) is tested with a rank
# wired exactly as the entry point in tests/e2e/test_watchdog.py
# (test_a_frozen_node_stops_the_survivor_within_the_timeout); the CLI's wiring of the same watchdog
# is what the two tests above exercise.


@pytest.mark.slow
def test_orphaned_ranks_exit_after_their_launcher_is_killed(demo, tmp_path):  # noqa: F811
    """The 2-process CPU launch of scripts/run_cpu.sh: it chooses the job's ports (none given) outside
    the kernel's range for outgoing connections and trains. SIGKILL of `paddle.distributed.launch` leaves
    its ranks running in their own sessions; they must notice and exit, so a killed job frees its devices."""
    job = Job(tmp_path)
    out = tmp_path / "orphans"
    config = flag_config(demo, tmp_path / "long.yaml", max_steps=500, checkpoint_steps=1000, eval_freq=1000)
    try:
        launcher = job.launch(["bash", RUN_CPU, "--micro_batch_size", "2"], log="orphans", PYTHON=sys.executable,
                              NPROC="2", PORT_RANGE=None,
                              CONFIG=str(config), OUTPUT_DIR=str(out), LOG_DIR=str(tmp_path / "log"))
        wait_for(lambda: (out / "train_metrics.jsonl").exists(), 180, "training to start")
        lines = (tmp_path / "orphans.out").read_text().splitlines()
        assert lines[0] == "+ " + ports.shell_line({})  # no PORT_RANGE given: the script chose one and says so
        assert lines[1].startswith("+ ") and "--nproc_per_node 2" in lines[1]
        envlog = (tmp_path / "log" / "envlog.0").read_text()
        assert "OMP_NUM_THREADS=1\n" in envlog  # the job's own setting reached the ranks unchanged
        # the job's ports (rank 0's store, every rank's endpoint) lie outside the kernel's range for outgoing
        # connections, so none can be taken by a connection before its rank binds it
        env = dict(line.split("=", 1) for line in envlog.splitlines() if "=" in line)
        eph = ports.ephemeral_range()
        used = [env["PADDLE_MASTER"]] + env["PADDLE_TRAINER_ENDPOINTS"].split(",")
        assert eph is None or all(not eph[0] <= int(e.rsplit(":", 1)[1]) <= eph[1] for e in used), (used, eph)
        ranks = [p for p in job.ranks() if proc_ppid(p) == launcher.pid]
        assert len(ranks) == 2, (ranks, [(proc_cmdline(p), proc_ppid(p)) for p in job.pids()], launcher.pid)
        os.kill(launcher.pid, signal.SIGKILL)
        t0 = time.monotonic()
        deadline = t0 + 120  # against a hang only: the guard polls every second
        while any(proc_alive(p) for p in ranks) and time.monotonic() < deadline:
            time.sleep(0.1)
        took = time.monotonic() - t0
        alive = [p for p in ranks if proc_alive(p)]
        print(f"orphans: {len(ranks) - len(alive)} of {len(ranks)} ranks gone {took:.1f} s after the launcher")
    finally:
        job.kill_all()
    logs = launch_logs(tmp_path / "log")
    assert not alive, (alive, took, logs)
    texts = [(tmp_path / "log" / f"workerlog.{r}").read_text(errors="replace") for r in (0, 1)]
    # the first rank to poll sees its launcher gone; the other may instead be stopped by the watchdog
    # when that rank's sockets close (it names the lost rank): either way it says why it stopped
    assert any(f"ernie_mtl watchdog: rank {r}: its launcher (pid {launcher.pid}) is gone" in texts[r]
               for r in (0, 1)), logs
    assert all(f"ernie_mtl watchdog: rank {r}:" in texts[r] for r in (0, 1)), logs
