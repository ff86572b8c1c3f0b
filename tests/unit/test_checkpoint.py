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
from ernie_mtl.checkpoint import store
from ernie_mtl.checkpoint import Checkpointer, CheckpointError, TrainState, find_latest, kept_checkpoints

pytestmark = pytest.mark.usefixtures("static_mode")  # static mode for this module, restored after


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
    assert cp.resolve("none", overwrite=True) is None
    with pytest.raises(CheckpointError, match="--resume none but .* holds checkpoints .*--overwrite_output_dir"):
        cp.resolve("none")  # never a silent overwrite of existing checkpoints
    assert cp.resolve(str(tmp_path / "model_3")).step == 3
    with pytest.raises(CheckpointError, match="model_1/train_state.json is missing: .* is not a complete checkpoint"):
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

    monkeypatch.setattr(store.os, "rename", crashing_rename)
    with pytest.raises(KeyboardInterrupt):
        cp.save("model_last", TrainState(step=2, consumed_samples=2))
    monkeypatch.setattr(store.os, "rename", real_rename)
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


# ------------------------------------------------------------------------------ integrity (hostile input)
def _tree(root):
    """Every file under `root` with its bytes (to prove nothing was changed)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("damage", ["garbage", "truncated", "deleted", "step_string", "pdparams_truncated",
                                    "pdopt_deleted", "pdparams_flipped"])
def test_a_damaged_newest_checkpoint_is_refused_and_left_untouched(tmp_path, program, damage):
    main, exe, scope, _ = program
    cp = _checkpointer(tmp_path, main, exe, scope)
    cp.save("model_2", TrainState(step=2, consumed_samples=2))
    cp.save("model_last", TrainState(step=3, consumed_samples=3))
    last = tmp_path / "model_last"
    state_file = last / "train_state.json"
    if damage == "garbage":
        state_file.write_text("garbage{{{")
    elif damage == "truncated":
        state_file.write_bytes(state_file.read_bytes()[:40])
    elif damage == "deleted":
        state_file.unlink()
    elif damage == "step_string":
        import json

        raw = json.loads(state_file.read_text())
        raw["step"] = "3"
        state_file.write_text(json.dumps(raw))
    elif damage == "pdparams_truncated":
        f = last / "state" / "rank_0.pdparams"
        f.write_bytes(f.read_bytes()[:-7])
    elif damage == "pdopt_deleted":
        (last / "state" / "rank_0.pdopt").unlink()
    else:
        f = last / "state" / "rank_0.pdparams"
        data = bytearray(f.read_bytes())
        data[len(data) // 2] ^= 0xFF
        f.write_bytes(bytes(data))
    before = _tree(tmp_path)
    with pytest.raises(CheckpointError) as e:
        cp.resolve("auto")
    message = str(e.value)
    assert "model_last" in message and ("damaged" in message or "missing" in message)
    assert "model_2 (step 2)" in message and "--resume PATH" in message  # the intact alternative
    assert find_latest(tmp_path).step == 2  # what scanning finds, but auto-resume does not silently take
    assert cp.resolve(str(tmp_path / "model_2")).step == 2
    assert _tree(tmp_path) == before  # not a byte changed


def test_a_failed_save_leaves_every_checkpoint_and_no_temporary_folder(tmp_path, program):
    main, exe, scope, _ = program
    cp = _checkpointer(tmp_path, main, exe, scope)
    cp.save("model_last", TrainState(step=1, consumed_samples=1))
    before = _tree(tmp_path)

    def full_disk(prefix):
        open(prefix + ".pdparams", "wb").write(b"partial")
        raise OSError(28, "No space left on device", prefix + ".pdparams")

    cp._save_state = full_disk
    with pytest.raises(CheckpointError, match="cannot write checkpoint .*model_last: .*No space left on device; "
                                              "free disk space.*previous checkpoints are unchanged"):
        cp.save("model_last", TrainState(step=2, consumed_samples=2))
    assert _tree(tmp_path) == before and not list(tmp_path.glob(".*tmp*"))


def _realistic_state(step=3):
    """What the trainer writes: 2 tasks (batch 2 and 4), accumulation 2, two data-parallel ranks: 4
    slots (micro-batches of all ranks) per step."""
    return TrainState(step=step, consumed_samples=4 * 2 + (4 * step - 4) * 4, lr_scheduler={"last_epoch": step},
                      sampler={"position": 4 * step, "slots_per_step": 4, "counts": [4, 4 * step - 4], "base": [0, 0]},
                      topology={"dp_degree": 2, "sharding_degree": 1},
                      extra={"tasks": [{"spec": {"batch_size": 2}}, {"spec": {"batch_size": 4}}]})


@pytest.mark.parametrize("edit,expected", [
    (lambda r: r.update(step=5), ["step 5 disagrees with the folder name model_3", "lr_scheduler.last_epoch 3",
                                  "sampler.position 12"]),
    (lambda r: r.update(step=-1), ["step -1 is negative"]),
    (lambda r: r.update(consumed_samples=7), ["consumed_samples 7 disagrees with the task schedule's 40"]),
    (lambda r: r["sampler"].update(counts=[1, 1]), ["sampler.counts [1, 1] do not sum to sampler.position 12"]),
    (lambda r: r.pop("topology"), ["no 'topology'"]),
    (lambda r: r.pop("files"), ["no 'files'"]),
    (lambda r: r.update(world_size="2"), ["world_size is str"]),
    (lambda r: r.update(per_rank_state="yes"), ["per_rank_state is 'yes'"]),
])
def test_a_train_state_that_contradicts_itself_is_damaged(tmp_path, program, edit, expected):
    import json

    main, exe, scope, _ = program
    cp = _checkpointer(tmp_path, main, exe, scope)
    cp.save("model_3", _realistic_state())
    assert cp.resolve(str(tmp_path / "model_3")).step == 3  # as written: consistent
    state_file = tmp_path / "model_3" / "train_state.json"
    raw = json.loads(state_file.read_text())
    edit(raw)
    state_file.write_text(json.dumps(raw))
    with pytest.raises(CheckpointError) as e:
        cp.resolve(str(tmp_path / "model_3"))
    assert "model_3/train_state.json is damaged" in str(e.value) and "Nothing in" in str(e.value)
    for fragment in expected:
        assert fragment in str(e.value), (fragment, str(e.value))


def test_each_ranks_record_must_agree_with_the_file_list(tmp_path, program):
    import json

    main, exe, scope, _ = program
    cp = _checkpointer(tmp_path, main, exe, scope)
    cp.save("model_2", TrainState(step=2, consumed_samples=2))
    cp.save("model_last", TrainState(step=3, consumed_samples=3))
    sums = tmp_path / "model_last" / "state" / "rank_0.sha1"
    record = json.loads(sums.read_text())
    record["state/rank_0.pdopt"]["size"] += 1
    sums.write_text(json.dumps(record))
    with pytest.raises(CheckpointError, match=r"rank_0.sha1 disagrees with .*train_state.json about "
                                              r"state/rank_0.pdopt .*model_2 \(step 2\)"):
        cp.resolve("auto")
    sums.unlink()
    with pytest.raises(CheckpointError, match=r"rank_0.sha1 is missing"):
        cp.resolve("auto")


def test_a_state_file_written_damaged_is_named_not_blamed_on_the_configuration(tmp_path, program):
    """Truncated before its checksums were taken (they match): the load fails, and the message says
    which file is unreadable instead of guessing at another configuration."""
    import json

    main, exe, scope, _ = program
    cp = _checkpointer(tmp_path, main, exe, scope)
    cp.save("model_2", TrainState(step=2, consumed_samples=2))
    cp.save("model_last", TrainState(step=3, consumed_samples=3))
    opt = tmp_path / "model_last" / "state" / "rank_0.pdopt"
    opt.write_bytes(opt.read_bytes()[:-9])
    entry = {"size": opt.stat().st_size, "sha1": ckpt.sha1_of(opt)}
    for f in (tmp_path / "model_last" / "train_state.json", tmp_path / "model_last" / "state" / "rank_0.sha1"):
        raw = json.loads(f.read_text())
        files = raw["files"] if "files" in raw else raw
        files["state/rank_0.pdopt"] = entry
        f.write_text(json.dumps(raw))
    ref = cp.resolve("auto")
    with pytest.raises(CheckpointError) as e:
        cp.load(ref, topology={}, check={})
    message = str(e.value)
    assert "rank_0.pdopt is damaged (unreadable" in message and "written damaged" in message
    assert "another configuration" not in message and "model_2 (step 2)" in message
