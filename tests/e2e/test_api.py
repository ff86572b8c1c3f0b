"""The Python API in the process that calls it (a notebook's situation): a multi-task run from a dict
with inline tasks returns what it wrote, runs twice in one process with equal losses, leaves Paddle's
mode and flags as it found them, takes callbacks as objects, raises typed errors instead of exiting,
and predicts, evaluates, exports and plans from Python. (Equality with the command line, in one
process and launched on two, is in tests/e2e/test_golden.py.)"""
import zlib  # noqa: F401  (before paddle)

import json

import pytest

import ernie_mtl
from helpers import jsonl


def run_config(data, out, **extra):
    """The demo-like three-task run as a dict, tasks inline (no task files)."""
    return {
        "task_instance": "sentiment, wordseg", "target_tag": "1, 1", "mix_ratio": "1.0, 1.0",
        "tasks": {"sentiment": {"reader": "cls", "train_file": "cls_train.tsv", "dev_file": "cls_dev.tsv",
                                "test_file": "cls_dev.tsv", "n_classes": 2},
                  "wordseg": {"reader": "seq_label", "train_file": "seg_train.tsv", "dev_file": "seg_dev.tsv",
                              "label_map": "label_map.json"}},
        "model_name_or_path": "ernie-tiny-test", "vocab_path": "vocab.txt", "vocab_size": 69, "max_seq_len": 32,
        "batch_size": 8, "num_epochs": 1, "learning_rate": 5e-3, "device": "cpu", "eval_freq": 10,
        "print_every_n_steps": 10, "random_seed": 5, "save_path": str(out), "num_workers": 0, **extra}


class Recorder(ernie_mtl.Callback):
    def __init__(self):
        self.steps, self.evaluated = [], []

    def on_step_end(self, trainer, step, tasks):
        self.steps.append(step)

    def on_evaluate(self, trainer, task, metrics):
        self.evaluated.append(task)


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory):
    import paddle

    out = tmp_path_factory.mktemp("api") / "run"
    dynamic = paddle.in_dynamic_mode()
    recorder = Recorder()
    result = ernie_mtl.train(run_config(data, out), base_dir=data, callbacks=[recorder])
    assert paddle.in_dynamic_mode() == dynamic  # the caller's mode is back
    return result, recorder, out


@pytest.mark.slow
def test_train_returns_what_it_wrote(trained):
    result, recorder, out = trained
    state = json.loads((out / "model_last" / "train_state.json").read_text())
    assert result.steps == state["step"] > 0 and result.output_dir == out
    assert result.test == json.loads((out / "test_results.json").read_text())
    assert set(result.test) == {"sentiment"} and {"last", "best"} <= set(result.test["sentiment"])
    assert set(result.eval) == {"sentiment", "wordseg"} and "f1" in result.eval["wordseg"]
    logged = [r for r in jsonl(out / "train_metrics.jsonl") if "eval/sentiment/acc" in r][-1]
    assert result.eval["sentiment"]["acc"] == logged["eval/sentiment/acc"]
    assert set(result.exports) == {"sentiment", "wordseg"} and all(p.is_dir() for p in result.exports.values())
    assert set(result.best_checkpoints) <= {"sentiment", "wordseg"} and result.last_checkpoint == out / "model_last"
    # the callback object saw every step and every evaluation
    assert recorder.steps == list(range(1, result.steps + 1))
    assert {"sentiment", "wordseg"} <= set(recorder.evaluated)


@pytest.mark.slow
def test_a_second_run_in_the_same_process_trains_the_same(trained, data, tmp_path):
    result, _, out = trained
    again = ernie_mtl.train(run_config(data, tmp_path / "again"), base_dir=data)
    first = [{k: v for k, v in r.items() if k.startswith("train/") and k.endswith("loss")}
             for r in jsonl(out / "train_metrics.jsonl")]
    second = [{k: v for k, v in r.items() if k.startswith("train/") and k.endswith("loss")}
              for r in jsonl(tmp_path / "again" / "train_metrics.jsonl")]
    assert again.steps == result.steps and first == second and any(first)


@pytest.mark.slow
def test_predict_evaluate_export_from_python(trained, data, tmp_path):
    result, _, out = trained
    records = ernie_mtl.predict(out, "sentiment", data / "pred.tsv", output=tmp_path / "p.json")
    assert len(records) == 2 and all(abs(sum(r["probs"]) - 1) < 1e-5 for r in records)
    assert json.loads((tmp_path / "p.json").read_text()) == records
    plain = ernie_mtl.predict(out, "sentiment", data / "pred.tsv", output=tmp_path / "plain.json", cpu_kernels="plain")
    for a, b in zip(plain, records):  # the plain predictor (no oneDNN) predicts what the default one does
        assert a["label"] == b["label"] and max(abs(x - y) for x, y in zip(a["probs"], b["probs"])) < 1e-4
    report = ernie_mtl.evaluate(out, "wordseg", data / "seg_dev.tsv", checkpoint=out / "model_last",
                                eval_output=tmp_path / "e.json")
    assert report["examples"] == 64 and 0 <= report["metrics"]["f1"] <= 1
    exported = ernie_mtl.export(out / "model_last", "sentiment", tmp_path / "o" / "sentiment" / "infer_model")
    manifest = json.loads((exported / "manifest.json").read_text())
    assert manifest["task"] == "sentiment" and manifest["step"] == result.steps  # model_last's weights
    again = ernie_mtl.predict(tmp_path / "o", "sentiment", data / "pred.tsv")
    assert [len(r["probs"]) for r in again] == [2, 2]


def test_errors_are_typed_and_name_the_culprit(data, tmp_path):
    with pytest.raises(ernie_mtl.ConfigError) as e:  # a bad flag value, as a keyword argument
        ernie_mtl.train(run_config(data, tmp_path / "x"), base_dir=data, max_lr=-1, min_lr=-2)
    assert e.value.problems == ["--max_lr -1.0 must be > 0, e.g. 1e-4",  # every problem of the values at once
                                "--min_lr -2.0 must be within [0, --max_lr -1.0], e.g. 1e-5"]
    with pytest.raises(ernie_mtl.ConfigError) as e:  # a bad task key
        ernie_mtl.train(run_config(data, tmp_path / "x"), base_dir=data, tasks={"sentiment": {"reader": "nope"}})
    assert len(e.value.problems) == 1 and e.value.problems[0].startswith(
        "--tasks.sentiment.reader: unknown reader 'nope'; known task types: ['cls', "), e.value.problems
    assert not (tmp_path / "x").exists()  # refused before anything was written
    with pytest.raises(ernie_mtl.ConfigError, match="key 'max_lr': sets --max_lr -1 but configuration mapping: "
                                                    "key 'learning_rate' already sets it to 0.005; keep one"):
        ernie_mtl.load_config(run_config(data, tmp_path / "x", max_lr=-1), base_dir=data)  # two names, one value
    with pytest.raises(ernie_mtl.ConfigError, match="unknown argument '--no_such_flag'"):
        ernie_mtl.load_config(run_config(data, tmp_path / "x"), base_dir=data, no_such_flag=1)
    with pytest.raises(ernie_mtl.ConfigError, match="key 'tasks' does not define it"):
        cfg = run_config(data, tmp_path / "x")
        del cfg["tasks"]["wordseg"]
        ernie_mtl.load_config(cfg, base_dir=data)


def test_plan_from_python_for_a_gpu_job(data, tmp_path):
    text = ernie_mtl.plan(run_config(data, tmp_path / "plan"), base_dir=data, world_size=4, device="gpu",
                          use_sharding=True, sharding_degree=2)
    assert "GPU program (rank 0 of 4" in text and "c_broadcast" in text
    assert not (tmp_path / "plan").exists()  # a plan writes nothing
