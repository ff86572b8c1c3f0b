"""What a user who takes the defaults gets: no pinned threads, `--cpu_kernels auto`, data-loading workers.

The other end-to-end tests pin one thread per process (`OMP_NUM_THREADS=1`) or a kernel mode, which hid
that a run moved from 2 processes to 1 did not continue bitwise under the defaults: 1 process ran its
math on 2 threads, the 2 processes on 1 each, and MKL's results depended on the thread count; the kernel
choice was keyed and timed by the thread count too. Here nothing is pinned: a run gets this machine's
cores (2 on CI) and decides its kernels with `auto`. The run moved from 2 processes to 1 under the
defaults is tests/e2e/test_elastic.py's flag-mode chain (its launches take the user's environment).
"""
import zlib  # noqa: F401  (before paddle)

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ENTRY, run_cli, tiny_args, user_environ, with_hooks


def run(argv, cwd, *, env=None, timeout=600):
    proc = run_cli(argv, cwd=cwd, env=env, timeout=timeout, user_env=True)
    return proc, proc.stdout + proc.stderr


# -- signals in every phase ------------------------------------------------------------------------------------
SIGNAL_RUN = dict(max_steps=3, micro_batch_size=2, global_batch_size=2, checkpoint_steps=1, save_steps=1000,
                  logging_freq=1, eval_freq=1000, num_workers=1)


def signalled_run(demo, out, where, signum, *, stuck=False):
    """(process, output) of a run that pauses at `where` (tests/plugins/test_hooks.py `pause_at`) and gets
    `signum` there; the pause would last 120 s, so a run that ends at all ended because of the signal."""

    env = {"ERNIE_MTL_TEST_PAUSE_AT": where, "ERNIE_MTL_TEST_PAUSE_S": "120", "OMP_NUM_THREADS": "1"}
    if stuck:
        env.update(ERNIE_MTL_TEST_PAUSE_IN_C="1", ERNIE_MTL_STOP_GRACE_S="2")
    argv = with_hooks([str(a) for a in tiny_args(demo, out, **SIGNAL_RUN)], env)
    proc = subprocess.Popen([sys.executable, str(ENTRY)] + argv, cwd=out.parent, env=user_environ(**env),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if f"paused at {where}" in line:
            proc.send_signal(signum)
            break
    try:
        rest, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"the run did not stop on signal {signum} at {where}: {''.join(lines)[-3000:]}")
    return proc, "".join(lines) + rest


def leftovers(out):
    return sorted(str(p.relative_to(out)) for p in Path(out).rglob(".*") if ".tmp" in p.name or p.name.endswith(".old"))


@pytest.mark.parametrize("where,name", [("import", "TERM"), ("start-up", "TERM"), ("train_end", "TERM"),
                                        ("train_end", "INT")])
def test_a_signal_before_or_after_the_loop_stops_the_run_cleanly(demo, tmp_path, where, name):
    """Start-up (parsing: the plugin imports; the trainer built) and after the loop (the last evaluation,
    exports and test): the run stops with 128 + the signal number and one line, no traceback and no
    Paddle FatalError; nothing half-written; the same command again finishes the run."""
    import signal as signals

    signum = getattr(signals, f"SIG{name}")
    out = tmp_path / "run"
    proc, text = signalled_run(demo, out, where, signum)
    assert proc.returncode == 128 + signum, text[-3000:]
    phase = "start-up" if where != "train_end" else "the last evaluation, the exports and the final test"
    assert f"run_multitask_static.py: stopped by SIG{name} during {phase}" in text, text[-3000:]
    assert "Traceback" not in text and "FatalError" not in text and "C++ Traceback" not in text, text[-3000:]
    assert not leftovers(out) if out.exists() else True
    if where == "train_end":
        assert json.loads((out / "model_last/train_state.json").read_text())["step"] == 3
        assert not (out / "test_results.json").exists()  # the final test had not run
        again, logs = run(tiny_args(demo, out, **SIGNAL_RUN), tmp_path, env={"OMP_NUM_THREADS": "1"})
        assert again.returncode == 0, logs[-3000:]
        assert "pretrain" in json.loads((out / "test_results.json").read_text())  # finished now


def test_a_run_stuck_in_a_call_still_stops_after_the_grace_period(demo, tmp_path):
    """The main thread cannot run a Python handler (as inside a long C++ call): the signal thread ends the
    process after ERNIE_MTL_STOP_GRACE_S with the signal's status and says why."""
    import signal as signals

    out = tmp_path / "run"
    proc, text = signalled_run(demo, out, "train_end", signals.SIGTERM, stuck=True)
    assert proc.returncode == 143, text[-3000:]
    assert "ernie-mtl: SIGTERM during the last evaluation, the exports and the final test (training is finished): " \
           "still busy 2 s after the signal, exiting now (status 143)" in text, text[-3000:]
    assert json.loads((out / "model_last/train_state.json").read_text())["step"] == 3


def test_a_preemption_signal_in_the_last_step_stops_before_the_final_test(demo, tmp_path):
    """SIGTERM (a preemption signal) during the last step: the loop ends with the final checkpoint saved and
    the run stops with exit 76 right away, instead of recording the signal while the final evaluation,
    exports and test run on."""
    out = tmp_path / "run"
    proc, logs = run(tiny_args(demo, out, **SIGNAL_RUN), tmp_path,
                     env={"ERNIE_MTL_TEST_SIGNAL_AT_STEP": "3", "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 76, logs[-3000:]
    assert "preempted (SIGTERM): stopped at step 3" in logs and "Traceback" not in logs, logs[-3000:]
    assert json.loads((out / "model_last/train_state.json").read_text())["step"] == 3
    assert not (out / "test_results.json").exists()


def test_resuming_with_another_run_length_is_refused(demo, tmp_path):
    """A finished 3-step run resumed with --max_steps 5 logged "training steps 4..3", trained nothing and
    exited 0: the length is now compared with the checkpoint's, and the message says how to train on."""
    out = tmp_path / "run"
    flags = dict(SIGNAL_RUN, num_workers=0)
    first, logs = run(tiny_args(demo, out, **flags), tmp_path, env={"OMP_NUM_THREADS": "1"})
    assert first.returncode == 0, logs[-3000:]
    before = sorted((p.relative_to(out), p.stat().st_mtime_ns) for p in out.rglob("*") if p.is_file())
    longer, logs = run(tiny_args(demo, out, **dict(flags, max_steps=5)), tmp_path, env={"OMP_NUM_THREADS": "1"})
    assert longer.returncode == 2 and "Traceback" not in logs, logs[-3000:]
    assert f"cannot resume exactly from {out / 'model_last'}: " in logs and "max_steps: checkpoint 3 vs now 5" in logs
    assert f"start a new run with --init_from {out / 'model_last'} --init_optimizer and another --output_dir" in logs
    assert sorted((p.relative_to(out), p.stat().st_mtime_ns) for p in out.rglob("*") if p.is_file()) == before


# -- the data path under the defaults (2 workers): no hang, no SIGBUS, no training on zeros ---------------------
def disturbed_run(demo, tmp_path, what, *, corpus=None, timeout=240):
    """A 12-step run with the default data-loading workers, disturbed after step 2 (tests/plugins/test_hooks.py
    `disturb_data`); (process, output). `corpus`: a private copy of the demo corpus to damage."""
    flags = dict(SIGNAL_RUN, max_steps=12, num_workers=2, checkpoint_steps=2)
    argv = tiny_args(demo, tmp_path / "run", **flags)
    env = {"ERNIE_MTL_TEST_DISTURB": what, "ERNIE_MTL_TEST_DISTURB_AT_STEP": "2", "OMP_NUM_THREADS": "1"}
    if corpus is not None:
        for ext in (".bin", ".idx", ".json"):
            shutil.copy(f"{demo / 'corpus'}{ext}", f"{corpus}{ext}")
        argv[argv.index("--input_dir") + 1] = str(corpus)
        env["ERNIE_MTL_TEST_DISTURB_FILE"] = f"{corpus}.bin"
    return run(argv, tmp_path, env=env, timeout=timeout)


def test_a_stopped_worker_is_named_within_seconds_instead_of_a_hang(demo, tmp_path):
    proc, logs = disturbed_run(demo, tmp_path, "stop_worker")
    assert proc.returncode == 74 and "Traceback" not in logs, logs[-3000:]
    assert "run_multitask_static.py: error: data-loading worker 0 (pid " in logs
    assert "is stopped (process state T: SIGSTOP or a debugger)" in logs
    assert ", building micro-batch 0 of step " in logs and "task pretrain, examples " in logs
    assert json.loads((tmp_path / "run/model_last/train_state.json").read_text())["step"] >= 2  # intact


def test_a_killed_worker_is_one_message_with_a_status_to_retry_on(demo, tmp_path):
    proc, logs = disturbed_run(demo, tmp_path, "kill_worker")
    assert proc.returncode == 74 and "Traceback" not in logs, logs[-3000:]
    assert "data-loading worker 0 (pid " in logs and "was killed by signal SIGKILL" in logs


@pytest.mark.parametrize("what", ["zero_corpus", "truncate_corpus"])
def test_a_corpus_changed_under_the_run_stops_it_naming_the_file(demo, tmp_path, what):
    corpus = tmp_path / "corpus"
    proc, logs = disturbed_run(demo, tmp_path, what, corpus=corpus)
    assert proc.returncode == 2 and "Traceback" not in logs and proc.returncode != -7, logs[-3000:]
    assert f"{corpus}.bin changed while this run was reading it" in logs, logs[-3000:]
    assert "loss: 0.0000" not in logs
