"""A run driven step by step (ernie_mtl/engine/stepping.py, what PALM's train_one_step uses) is the
command line's run: the same losses, checkpoints and result, and its batches follow the schedule."""
import zlib  # noqa: F401  (before paddle)

import json

import pytest

import ernie_mtl
from helpers import jsonl


def config(out, **extra):
    return {
        "task_instance": "sentiment, wordseg", "target_tag": "1, 1", "mix_ratio": "1.0, 1.0",
        "tasks": {"sentiment": {"reader": "cls", "train_file": "cls_train.tsv", "n_classes": 2},
                  "wordseg": {"reader": "seq_label", "train_file": "seg_train.tsv", "label_map": "label_map.json"}},
        "model_name_or_path": "ernie-tiny-test", "vocab_path": "vocab.txt", "vocab_size": 69, "max_seq_len": 32,
        "batch_size": 16, "num_epochs": 1, "learning_rate": 5e-3, "device": "cpu", "print_every_n_steps": 3,
        "random_seed": 7, "save_path": str(out), "num_workers": 0, "save_steps": 5, **extra}


def losses(out):
    return [{k: v for k, v in r.items() if k.startswith("train/") and k.endswith("/loss")}
            for r in jsonl(out / "train_metrics.jsonl")]


@pytest.mark.slow
def test_a_stepped_run_is_the_command_lines_run(data, tmp_path):
    from ernie_mtl.engine.stepping import SteppedRun

    reference = ernie_mtl.train(config(tmp_path / "ref"), base_dir=data)
    cfg = ernie_mtl.load_config(config(tmp_path / "stepped"), base_dir=data)
    run = SteppedRun(cfg)
    seen = []
    while not run.done:
        batch = run.next_batch()
        assert run.next_batch() is batch  # asked twice before training: the same step
        seen.append(set(run.step(batch)))
        with pytest.raises(ValueError, match="not the run's next one"):
            run.step(batch)  # a batch trains once
    result = run.finish()
    assert run.finish() is result
    assert result.steps == reference.steps == len(seen) and all(s <= {"sentiment", "wordseg"} for s in seen)
    assert losses(tmp_path / "stepped") == losses(tmp_path / "ref") and any(losses(tmp_path / "ref"))
    ref_state = json.loads((tmp_path / "ref" / "model_last" / "train_state.json").read_text())
    state = json.loads((tmp_path / "stepped" / "model_last" / "train_state.json").read_text())
    assert state["files"] == ref_state["files"]  # bitwise the same weights and optimizer state
    assert sorted(p.name for p in (tmp_path / "stepped").glob("model_*")) == \
        sorted(p.name for p in (tmp_path / "ref").glob("model_*"))
    assert set(result.exports) == set(reference.exports)
    with pytest.raises(RuntimeError, match="closed"):
        run.next_batch()


@pytest.mark.slow
def test_a_stepped_run_keeps_the_loops_anomaly_guard(data, tmp_path, monkeypatch):
    """main's resilience is in the steps a stepped run takes: a fault injected into step 3 every time it
    runs (tests/plugins/test_hooks.py poison_step) is replayed, dumped and skipped under --on_anomaly
    replay exactly as in ernie_mtl.train; under stop, `step` raises AnomalyStop with the last good
    state saved and the run is closed, as Trainer.run closes it."""
    from ernie_mtl.engine.anomaly import AnomalyStop
    from ernie_mtl.engine.stepping import SteppedRun
    from helpers import HOOKS

    monkeypatch.setenv("ERNIE_MTL_TEST_POISON_STEP", "3")
    monkeypatch.setenv("ERNIE_MTL_TEST_POISON", "always")
    hooks = {"plugins": HOOKS, "callbacks": "poison_step"}
    reference = ernie_mtl.train(config(tmp_path / "ref", **hooks), base_dir=data, on_anomaly="replay")
    run = SteppedRun(ernie_mtl.load_config(config(tmp_path / "stepped", **hooks), base_dir=data, on_anomaly="replay"))
    while not run.done:
        run.step()
    assert run.finish().steps == reference.steps
    assert losses(tmp_path / "stepped") == losses(tmp_path / "ref")
    for out in ("ref", "stepped"):
        assert json.loads((tmp_path / out / "anomalies" / "step_3_rank0.json").read_text())["step"] == 3
    ref_state = json.loads((tmp_path / "ref" / "model_last" / "train_state.json").read_text())
    state = json.loads((tmp_path / "stepped" / "model_last" / "train_state.json").read_text())
    assert state["files"] == ref_state["files"]

    run = SteppedRun(ernie_mtl.load_config(config(tmp_path / "stop", **hooks), base_dir=data, on_anomaly="stop"))
    run.step()
    run.step()
    with pytest.raises(AnomalyStop, match="step 3 was not finite"):
        run.step()
    assert run.closed and json.loads((tmp_path / "stop" / "model_last" / "train_state.json").read_text())["step"] == 3
    with pytest.raises(RuntimeError, match="closed"):
        run.step()
