"""The static pretraining trainer end to end on CPU with a tiny ERNIE and a real (capped) demo corpus:
loss falls, checkpoint layout and retention, VisualDL tags, the index caches built once. SIGKILL and
resume: tests/e2e/test_datapath.py (one process, with workers) and tests/e2e/test_resilience.py (two
processes with sharding)."""
import zlib  # noqa: F401  (before paddle)

import glob
import json

import pytest

from helpers import ROOT, metrics, ok, state, tiny_args, train  # noqa: F401


@pytest.mark.slow
def test_single_process_loss_falls_checkpoints_and_visualdl(demo, tmp_path):
    out = tmp_path / "run"
    proc = ok(train(tiny_args(demo, out, micro_batch_size=8, max_steps=30, max_lr=5e-3, min_lr=1e-4,
                              warmup_rate=0.1, logging_freq=5, eval_freq=10, eval_iters=2, checkpoint_steps=5,
                              save_steps=10, keep_last=2), cwd=tmp_path))
    losses = metrics(out, "train/loss")
    assert sorted(losses) == [5, 10, 15, 20, 25, 30]
    assert losses[30] < losses[5] - 0.5, losses  # mean of the last 5 steps vs the first 5
    assert sorted(metrics(out, "eval/loss")) == [10, 20, 30]
    # layout: rolling model_last, kept model_<step> pruned to the newest 2, nothing half-written
    names = sorted(p.name for p in out.iterdir())
    assert names == ["best_pretrain", "model_20", "model_30", "model_last", "program_desc", "test_results.json",
                     "train_metrics.jsonl", "visualdl"]
    # flag mode gained best checkpoints (by valid mlm_acc) and the test results file
    results = json.loads((out / "test_results.json").read_text())
    assert results["pretrain"]["last"]["step"] == 30 and "mlm_acc" in results["pretrain"]["last"]["metrics"]
    best = json.loads((out / "best_pretrain/train_state.json").read_text())
    assert results["pretrain"]["best"]["step"] == best["step"]
    saved = json.loads((out / "model_last" / "train_state.json").read_text())
    assert saved["step"] == 30 and saved["consumed_samples"] == 240
    assert saved["topology"]["global_batch_size"] == 8 and saved["config"]["optim"]["max_lr"] == 5e-3
    assert saved["lr_scheduler"]["last_epoch"] == 30
    assert saved["name_map"]["ernie.embeddings.word_embeddings.weight"] in state(out / "model_last/state/rank_0")
    assert json.loads((out / "model_20" / "train_state.json").read_text())["step"] == 20
    assert not glob.glob(str(tmp_path / "main_sharding*"))  # fleet's dumps stay under program_desc
    assert f"VisualDL: visualdl --logdir {out}/visualdl" in proc.stdout
    # VisualDL, read back with its own reader
    from visualdl.reader.reader import LogReader

    (record,) = glob.glob(str(out / "visualdl" / "vdlrecords.*.log"))
    reader = LogReader(file_path=record)
    tags = reader.get_tags()
    assert {"train/loss", "train/mlm_loss", "train/nsp_loss", "train/lr", "perf/tokens_per_s", "perf/steps_per_s",
            "eval/loss", "eval/mlm_loss", "eval/nsp_loss", "test/loss"} <= set(tags["scalar"])
    assert "hparam" in tags["hyper_parameters"] and "config" in tags["text"]
    vdl_loss = {r.id: r.value for r in reader.get_data("scalar", "train/loss")}
    assert sorted(vdl_loss) == sorted(losses)
    for step, value in losses.items():
        assert vdl_loss[step] == pytest.approx(value, rel=1e-6)
    assert all(r.value > 0 for r in reader.get_data("scalar", "perf/tokens_per_s"))


@pytest.mark.slow
def test_prebuild_index_with_the_runs_flags_then_the_run_builds_nothing(demo, tmp_path):
    """`--prebuild_index` plans with the run's own parser and defaults (eval_freq, seed, ...), so the
    run that follows finds every index cache it reads and builds none."""
    argv = tiny_args(demo, tmp_path / "run", micro_batch_size=4, max_steps=3, seed=77)
    pre = ok(train(argv + ["--prebuild_index"], cwd=tmp_path))
    log = pre.stdout + pre.stderr
    assert log.count("built index cache") == 3 and "index caches ready" in log, log  # train, valid, test splits
    assert not (tmp_path / "run" / "model_last").exists()  # nothing trained
    run = ok(train(argv, cwd=tmp_path))
    log = run.stdout + run.stderr
    assert "built index cache" not in log and log.count("reusing index cache") == 3
