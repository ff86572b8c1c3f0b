"""The two-stage recipe (multi-task, then each target refined alone) as one run, with the other recipes
on: learned loss balancing, annealed sampling, task-adaptive masked LM. Real command-line runs of a
tiny ERNIE on the generated tasks of tests/helpers.make_mtl_data."""
import zlib  # noqa: F401  (before paddle)

import json
import os

import numpy as np
import pytest

from helpers import global_yaml, jsonl, ok, state
from helpers import run_here as run


def _target(data, name="senti_r", **keys):
    text = ("reader: cls\nparadigm: cls\ntrain_file: ../cls_train.tsv\ndev_file: ../cls_dev.tsv\n"
            "test_file: ../cls_dev.tsv\nn_classes: 2\n" + "".join(f"{k}: {v}\n" for k, v in keys.items()))
    (data / "tasks" / f"{name}.yaml").write_text(text, encoding="utf-8")


def _by_structured(folder, values=None):
    """A checkpoint's (or `values`': a dump of the same run) parameters under structured names."""
    names = json.loads((folder / "train_state.json").read_text())["name_map"]
    values = values if values is not None else state(folder / "state" / "rank_0")
    return {k: values[v] for k, v in names.items()}


@pytest.mark.slow
def test_refine_stage_trains_the_target_alone_from_the_multitask_weights(data, tmp_path):
    _target(data, tapt="true")
    out = tmp_path / "run"
    keys = dict(save_path=str(out), task_instance="senti_r, wordseg", target_tag="1, 0", mix_ratio="1.0, 1.0",
                num_epochs=2, eval_freq=10, refine=True, refine_epochs=2, refine_learning_rate="2e-3",
                loss_balance="uncertainty", sampling="proportional", temperature_end="inf",
                callbacks=["idle_check"], plugins=["plugins.py"])
    cfg = global_yaml(data, "r1.yaml", **keys)
    dry = ok(run(["--config", cfg, "--dry_run"], cwd=tmp_path)).stdout
    assert "2. refine senti_r" in dry and "p_i -> end" in dry and "senti_r_tapt" in dry
    proc = ok(run(["--config", cfg], cwd=tmp_path))
    log = proc.stdout + proc.stderr
    assert "stages of this run" in log and f"warm start from {out}/model_last" in log
    record = json.loads((out / "stages.json").read_text())["stages"]
    assert record["multitask"]["done"] and record["senti_r"]["done"] and record["senti_r"]["steps"] == 40

    # the multi-task stage: the log-variances learned, and frozen with their task's head when it was not drawn
    first = _by_structured(out / "model_last")
    assert {k for k in first if k.startswith("loss_balance.")} == {
        f"loss_balance.{t}.log_var" for t in ("senti_r", "wordseg", "senti_r_tapt")}
    assert all(first[k] != 0 for k in first if k.startswith("loss_balance."))
    rows = jsonl(out / "idle_check.jsonl")
    assert any("create_parameter" in " ".join(g["vars"]) for r in rows for g in r["groups"].values())
    for r in rows:
        for g in r["groups"].values():
            assert g["sampled"] or g["changed"] == [], (r["step"], g["changed"])

    # the refine stage: only the target drawn; the other heads as the multi-task stage left them; no log-variances
    refined = _by_structured(out / "refine/senti_r/model_last")
    assert not any(k.startswith("loss_balance.") for k in refined)
    frozen = [k for k in refined if k.startswith(("heads.wordseg.", "heads.senti_r_tapt."))
              and not k.endswith("decoder.weight")]  # the masked-LM decoder is the (trained) word embedding
    assert frozen and all(np.array_equal(first[k], refined[k]) for k in frozen)
    assert not np.array_equal(first["heads.senti_r.weight"], refined["heads.senti_r.weight"])
    sampled = [r for r in jsonl(out / "refine/senti_r/train_metrics.jsonl") if "train/senti_r/sampled" in r]
    assert sampled and all(r["train/senti_r/sampled"] == 1 and r["train/wordseg/sampled"] == 0 for r in sampled)
    assert list((out / "visualdl").iterdir()) and list((out / "refine/senti_r/visualdl").iterdir())

    # the refined model is the final one; the multi-task stage's is kept beside it
    final = (out / "senti_r/infer_model/model.pdiparams").read_bytes()
    assert final == (out / "refine/senti_r/senti_r/infer_model/model.pdiparams").read_bytes()
    assert final != (out / "senti_r/infer_model_multitask/model.pdiparams").read_bytes()
    results = json.loads((out / "test_results.json").read_text())["senti_r"]
    own = json.loads((out / "refine/senti_r/test_results.json").read_text())["senti_r"]
    assert results["last"] == own["last"] and set(results["multitask"]) >= {"last"}
    assert results["multitask"]["last"] == record["multitask"]["test"]["senti_r"]["last"]

    # --do_eval reads the refined model unless told otherwise
    reports = {}
    for stage in ("final", "multitask"):
        target = tmp_path / f"eval_{stage}.json"
        ok(run(["--do_eval", "--task", "senti_r", "--eval_file", data / "cls_dev.tsv", "--output_dir", out,
                "--stage", stage, "--eval_output", target], cwd=tmp_path))
        reports[stage] = json.loads(target.read_text())
    assert reports["final"]["metrics"] == pytest.approx(results["last"]["metrics"]) or \
        reports["final"]["metrics"] == pytest.approx(results.get("best", {}).get("metrics"))
    assert "infer_model_multitask" in reports["multitask"]["source"]

    # the same command again trains nothing; a changed refine budget trains only the refine stage again
    again = ok(run(["--config", cfg], cwd=tmp_path))
    assert "stage 1 (multi-task) is complete" in again.stderr + again.stdout
    assert "stage 2 (refine senti_r) is complete" in again.stderr + again.stdout
    cfg2 = global_yaml(data, "r2.yaml", **dict(keys, refine_epochs=1))
    third = ok(run(["--config", cfg2], cwd=tmp_path))
    assert "stage 1 (multi-task) is complete" in third.stderr + third.stdout
    assert "its settings changed" in third.stderr + third.stdout
    assert json.loads((out / "stages.json").read_text())["stages"]["senti_r"]["steps"] == 20
    assert _by_structured(out / "model_last").keys() == first.keys()


@pytest.mark.slow
def test_two_processes_and_interrupted_runs_equal_through_the_stages(data, tmp_path):
    """Two gloo processes, and one process with accumulation 2 killed in the multi-task stage, killed at
    its very last step (before the refine stage began) and preempted in the refine stage, end bitwise
    equal in both stages' weights and in the test results."""
    _target(data)
    common = dict(task_instance="senti_r, wordseg", target_tag="1, 0", mix_ratio="1.0, 1.0", num_epochs=1,
                  refine=True, refine_steps=10, micro_batch_size=8, global_batch_size=16, hidden_dropout_prob=0.1,
                  eval_freq=6, checkpoint_steps=4, save_steps=1000, print_every_n_steps=1, loss_balance="uncertainty",
                  sampling="temperature", temperature=2, temperature_end="inf")
    straight = tmp_path / "straight"
    ok(run(["--config", global_yaml(data, "t1.yaml", save_path=str(straight), **common)], cwd=tmp_path,
           launch_procs=2))
    steps = json.loads((straight / "stages.json").read_text())["stages"]["multitask"]["steps"]
    assert steps > 8
    resumed = tmp_path / "resumed"
    cfg = global_yaml(data, "t2.yaml", save_path=str(resumed), **common)
    for env, status in (({"ERNIE_MTL_TEST_KILL_AT_STEP": "8"}, -9),
                        ({"ERNIE_MTL_TEST_KILL_AT_STEP": str(steps), "ERNIE_MTL_TEST_HOOK_STAGE": "multitask"}, -9),
                        ({"ERNIE_MTL_TEST_SIGNAL_AT_STEP": "6", "ERNIE_MTL_TEST_HOOK_STAGE": "refine"}, 76)):
        proc = run(["--config", cfg], cwd=tmp_path, env=env)
        assert proc.returncode == status, (env, proc.stderr[-3000:])
    assert not (resumed / "refine/senti_r/model_last").exists() or \
        json.loads((resumed / "refine/senti_r/model_last/train_state.json").read_text())["step"] == 6
    ok(run(["--config", cfg], cwd=tmp_path))
    for folder in ("model_last", "refine/senti_r/model_last"):
        a, b = _by_structured(straight / folder), _by_structured(resumed / folder)
        assert a.keys() == b.keys()
        assert [k for k in a if not np.array_equal(a[k], b[k])] == [], folder
    assert json.loads((straight / "test_results.json").read_text()) == \
        json.loads((resumed / "test_results.json").read_text())
    assert os.path.getsize(straight / "senti_r/infer_model/model.pdiparams") > 0


@pytest.mark.parametrize("balance", ["uncertainty", "normalize"])
def test_loss_balancing_starts_from_pretrained_weights(data, tmp_path, balance):
    """A PaddleNLP directory holds the backbone only: the learned log-variances (`uncertainty`) start at 0
    beside it instead of being asked of the file (the benchmark's first pretrained uncertainty run was
    refused: "model_state.pdparams lacks 4 of the model's parameters: loss_balance.<task>.log_var")."""
    import paddle

    from ernie_mtl.config.model import ARCHITECTURES
    from helpers import VOCAB

    pretrained = tmp_path / "pretrained"
    with paddle.base.dygraph.guard():
        from paddlenlp.transformers import ErnieConfig, ErnieForPretraining

        paddle.seed(3)
        arch = {k: v for k, v in ARCHITECTURES["ernie-tiny-test"].items() if k != "model_type"}
        model = ErnieForPretraining(ErnieConfig(**dict(arch, vocab_size=len(VOCAB))))
        model.save_pretrained(str(pretrained))
        weights = {k: v.numpy() for k, v in model.state_dict().items()}
    out = tmp_path / "run"
    cfg = global_yaml(data, f"pre_{balance}.yaml", save_path=str(out), model_name_or_path=str(pretrained),
                      task_instance="sentiment, wordseg", target_tag="1, 1", mix_ratio="1.0, 1.0", num_epochs=1,
                      loss_balance=balance)
    dump = tmp_path / "begin"
    ok(run(["--config", cfg, "--max_steps", "2"], cwd=tmp_path,
           env={"ERNIE_MTL_TEST_DUMP_DIR": dump, "ERNIE_MTL_TEST_DUMP_WHEN": "begin"}))
    start = _by_structured(out / "model_last", state(dump / "rank_0"))
    assert np.array_equal(start["ernie.embeddings.word_embeddings.weight"],
                          weights["ernie.embeddings.word_embeddings.weight"])
    balance_vars = sorted(k for k in start if k.startswith("loss_balance."))
    if balance == "uncertainty":
        assert balance_vars == ["loss_balance.sentiment.log_var", "loss_balance.wordseg.log_var"]
        assert all(float(np.asarray(start[k]).ravel()[0]) == 0.0 for k in balance_vars)
    else:
        assert balance_vars == []
