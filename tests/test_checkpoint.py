"""Checkpointer: exact program-state round trip, retention, newest-complete selection, crash safety."""
import zlib  # noqa: F401
import os
import subprocess
import sys
import textwrap

import numpy as np
import paddle
import pytest

from ernie_mtl import checkpoint as ckpt
from ernie_mtl.checkpoint import Checkpointer, CheckpointError, TrainState, find_latest, kept_checkpoints

paddle.enable_static()


@pytest.fixture()
def program():
    main, startup = paddle.static.Program(), paddle.static.Program()
    main.random_seed = startup.random_seed = 3
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [None, 4], "float32")
        loss = paddle.mean(paddle.static.nn.fc(x, 3) ** 2)
        paddle.optimizer.AdamW(0.1).minimize(loss)
    exe = paddle.static.Executor(paddle.CPUPlace())
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope):
        exe.run(startup)
    return main, exe, scope, loss


def _checkpointer(tmp_path, main, exe, scope, **kw):
    def save(prefix):
        with paddle.static.scope_guard(scope):
            paddle.static.save(main, prefix)

    def load(prefix):
        with paddle.static.scope_guard(scope):
            paddle.static.load(main, prefix, exe)

    return Checkpointer(tmp_path, rank=0, world_size=1, per_rank_state=False, save_program_state=save,
                        load_program_state=load, log=lambda m: None, **kw)


def _persistables(main, scope):
    return {v.name: np.array(scope.find_var(v.name).get_tensor()) for v in main.list_vars()
            if v.persistable and scope.find_var(v.name) is not None and v.name not in ("feed", "fetch")}


def _train(main, exe, scope, loss, steps):
    feed = {"x": np.arange(8, dtype="float32").reshape(2, 4)}
    with paddle.static.scope_guard(scope):
        return [float(exe.run(main, feed=feed, fetch_list=[loss])[0]) for _ in range(steps)]


def test_round_trip_restores_parameters_and_optimizer_state(tmp_path, program):
    main, exe, scope, loss = program
    _train(main, exe, scope, loss, 3)
    saved = _persistables(main, scope)
    assert any("moment1" in k for k in saved)
    cp = _checkpointer(tmp_path, main, exe, scope)
    state = TrainState(step=3, consumed_samples=6, lr_scheduler={"last_epoch": 3}, topology={"dp": 1})
    cp.save("model_last", state)
    after = _train(main, exe, scope, loss, 2)
    ref = cp.resolve("auto")
    assert ref.step == 3 and ref.path.name == "model_last"
    restored = cp.load(ref, topology={"dp": 1}, check={})
    assert restored.consumed_samples == 6 and restored.lr_scheduler == {"last_epoch": 3}
    for k, v in _persistables(main, scope).items():
        np.testing.assert_array_equal(v, saved[k], err_msg=k)
    assert _train(main, exe, scope, loss, 2) == after  # resumed training repeats bitwise


def test_keep_last_and_newest_complete_wins(tmp_path, program):
    main, exe, scope, _ = program
    cp = _checkpointer(tmp_path, main, exe, scope, keep_last=2)
    for step in (1, 2, 3, 4):
        cp.save(f"model_{step}", TrainState(step=step, consumed_samples=step))
    cp.save("model_last", TrainState(step=5, consumed_samples=5))
    assert [r.step for r in kept_checkpoints(tmp_path)] == [3, 4]
    assert find_latest(tmp_path).step == 5
    assert cp.resolve("none") is None
    assert cp.resolve(str(tmp_path / "model_3")).step == 3
    with pytest.raises(CheckpointError, match="--resume .*model_1: no complete checkpoint there"):
        cp.resolve(str(tmp_path / "model_1"))


def test_topology_change_is_refused_with_what_differs(tmp_path, program):
    main, exe, scope, _ = program
    cp = _checkpointer(tmp_path, main, exe, scope)
    cp.save("model_last", TrainState(step=1, consumed_samples=8, topology={"dp_degree": 2, "global_batch_size": 8},
                                     extra={"resume_checks": {"seed": 1}}))
    with pytest.raises(CheckpointError, match=r"dp_degree: checkpoint 2 vs now 4.*--resume none"):
        cp.load(cp.resolve("auto"), topology={"dp_degree": 4, "global_batch_size": 8}, check={})
    with pytest.raises(CheckpointError, match=r"seed: checkpoint 1 vs now 2"):
        cp.load(cp.resolve("auto"), topology={"dp_degree": 2, "global_batch_size": 8}, check={"seed": 2})


def test_crash_between_the_renames_keeps_the_previous_checkpoint(tmp_path, program, monkeypatch):
    main, exe, scope, _ = program
    cp = _checkpointer(tmp_path, main, exe, scope)
    cp.save("model_last", TrainState(step=1, consumed_samples=1))
    real_rename = os.rename
    calls = []

    def crashing_rename(src, dst):
        calls.append(dst)
        if len(calls) == 2:  # the old checkpoint was moved aside; the new one is not in place yet
            raise KeyboardInterrupt("simulated crash")
        real_rename(src, dst)

    monkeypatch.setattr(ckpt.os, "rename", crashing_rename)
    with pytest.raises(KeyboardInterrupt):
        cp.save("model_last", TrainState(step=2, consumed_samples=2))
    monkeypatch.setattr(ckpt.os, "rename", real_rename)
    latest = find_latest(tmp_path)
    assert latest is not None and latest.step == 1
    cp.load(latest, topology={}, check={})


def test_sigkill_during_the_write_leaves_a_loadable_checkpoint(tmp_path):
    """A real process killed with SIGKILL while writing the program state of step 2."""
    script = textwrap.dedent(f"""
        import zlib, os, signal, paddle
        paddle.enable_static()
        from ernie_mtl.checkpoint import Checkpointer, TrainState
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup):
            x = paddle.static.data("x", [None, 4], "float32")
            paddle.optimizer.Adam(0.1).minimize(paddle.mean(paddle.static.nn.fc(x, 3)))
        exe = paddle.static.Executor(paddle.CPUPlace()); exe.run(startup)
        def save(prefix):
            paddle.static.save(main, prefix)
            if os.environ.get("DIE"):
                os.kill(os.getpid(), signal.SIGKILL)   # weights half-way written, no train_state.json yet
        cp = Checkpointer({str(tmp_path)!r}, rank=0, world_size=1, per_rank_state=False, save_program_state=save,
                          load_program_state=lambda p: paddle.static.load(main, p, exe), log=print)
        cp.save("model_last", TrainState(step=1, consumed_samples=1))
        os.environ["DIE"] = "1"
        cp.save("model_last", TrainState(step=2, consumed_samples=2))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr[-2000:]
    latest = find_latest(tmp_path)
    assert latest is not None and latest.step == 1 and latest.path.name == "model_last"
    assert (tmp_path / ".model_last.tmp").exists()  # the interrupted write, never mistaken for a checkpoint
