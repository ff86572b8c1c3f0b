"""Evaluation that scales and finishes the job: dev sets split across data-parallel ranks
with the outputs gathered (every rank's metrics equal, bit for bit, to one process's, for cls,
seq_label with CRF, mrc and mlm); test files evaluated at the end with the best and the final
weights (test_results.json, VisualDL); `--do_eval` on exported models and checkpoints; export of
the best weights."""
import zlib  # noqa: F401  (before paddle)

import glob
import json
from pathlib import Path

import numpy as np
import pytest

from helpers import ok, run_here

# launches several processes: run alone (tests/conftest.py)

CHARS = list("的了是在我有他这中大国人民日天北上东西南家们主本下京海方边好坏")
SPECIALS = ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"]


def _squad(path: Path, rng, n: int):
    paragraphs = []
    for k in range(n):
        context = "".join(rng.choice(CHARS, 24))
        start = int(rng.integers(0, 20))
        answer = context[start:start + 3]
        paragraphs.append({"context": context, "qas": [{"id": f"q{k}", "question": "".join(rng.choice(CHARS, 4)),
                                                          "answers": [{"text": answer, "answer_start": start}]}]})
    path.write_text(json.dumps({"version": "t", "data": [{"title": "t", "paragraphs": paragraphs}]},
                               ensure_ascii=False), encoding="utf-8")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("evaluation")
    rng = np.random.default_rng(3)
    (root / "vocab.txt").write_text("\n".join(SPECIALS + CHARS) + "\n", encoding="utf-8")
    for split, n in (("train", 40), ("dev", 23), ("test", 19)):  # odd sizes: the last batch is partial
        rows = [f"{i % 2}\t{''.join(rng.choice(CHARS, 7))}" for i in range(n)]
        (root / f"cls_{split}.tsv").write_text("label\ttext_a\n" + "\n".join(rows) + "\n", encoding="utf-8")
        rows = []
        for _ in range(n):
            chars = rng.choice(CHARS, 6)
            rows.append("\x02".join(chars) + "\t" + "\x02".join(rng.choice(list("BMES"), 6)))
        (root / f"seg_{split}.tsv").write_text("text_a\tlabel\n" + "\n".join(rows) + "\n", encoding="utf-8")
        _squad(root / f"qa_{split}.json", rng, n)
        rows = ["".join(rng.choice(CHARS, 10)) for _ in range(n)]
        (root / f"lm_{split}.tsv").write_text("text_a\n" + "\n".join(rows) + "\n", encoding="utf-8")
    (root / "labels.json").write_text('{"B": 0, "M": 1, "E": 2, "S": 3}', encoding="utf-8")
    tasks = root / "tasks"
    tasks.mkdir()
    (tasks / "topic.yaml").write_text("reader: cls\ntrain_file: ../cls_train.tsv\ndev_file: ../cls_dev.tsv\n"
                                      "test_file: ../cls_test.tsv\nn_classes: 2\n")
    (tasks / "tags.yaml").write_text("reader: seq_label\ntrain_file: ../seg_train.tsv\ndev_file: ../seg_dev.tsv\n"
                                     "test_file: ../seg_test.tsv\nlabel_map: ../labels.json\nuse_crf: true\n")
    (tasks / "qa.yaml").write_text("reader: mrc\ntrain_file: ../qa_train.json\ndev_file: ../qa_dev.json\n"
                                   "doc_stride: 8\nmax_query_len: 6\n")
    (tasks / "lm.yaml").write_text("reader: mlm\ntrain_file: ../lm_train.tsv\ndev_file: ../lm_dev.tsv\n")
    return root


def config(root: Path, name: str, **keys) -> Path:
    import yaml

    base = {"task_instance": "topic, tags, qa, lm", "target_tag": "1, 1, 1, 0", "mix_ratio": "1, 1, 1, 1",
            "task_dir": "tasks", "model_name_or_path": "ernie-tiny-test", "vocab_path": str(root / "vocab.txt"),
            "vocab_size": len(SPECIALS) + len(CHARS), "max_seq_len": 32, "batch_size": 4, "num_epochs": 1,
            "learning_rate": "5e-3", "device": "cpu", "num_workers": 0, "logging_freq": 5, "eval_freq": 10,
            "random_seed": 11}
    base.update(keys)
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(base, allow_unicode=True), encoding="utf-8")
    return path


@pytest.mark.slow
def test_evaluation_split_across_two_ranks_equals_one_process(data, tmp_path):
    one_thread = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "ERNIE_MTL_TEST_EVAL_AT_START": "1"}
    for procs in (1, 2):
        out = tmp_path / f"p{procs}"
        # runs of different shapes are compared bitwise: one fixed kernel set, not two measured (--cpu_kernels auto)
        cfg = config(data, f"d{procs}", save_path=str(out), cpu_kernels="exact")
        ok(run_here(["--config", cfg, "--max_steps", "1"], cwd=data,
                   launch_procs=procs if procs > 1 else 0, env=one_thread, log_dir=tmp_path / f"logs{procs}"))
    single = json.loads((tmp_path / "p1" / "eval_at_start_rank0.json").read_text())
    assert set(single) == {"topic", "tags", "qa", "lm"} and all(single[t] for t in single)
    for rank in (0, 1):  # each rank computed the metrics itself, from the outputs of both ranks
        assert json.loads((tmp_path / "p2" / f"eval_at_start_rank{rank}.json").read_text()) == single


@pytest.fixture(scope="module")
def finished(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "out"
    proc = ok(run_here(["--config", config(data, "full", save_path=str(out), num_epochs=3, cpu_kernels=KERNELS)],
                      cwd=data))
    return out, proc.stdout + proc.stderr


KERNELS = "matmul_v2,matmul_v2_grad,softmax"  # the finished run's kernels: pinned, not measured (auto)


@pytest.mark.slow
def test_test_files_are_evaluated_with_the_best_and_the_final_weights(finished, data, tmp_path):
    out, log = finished
    results = json.loads((out / "test_results.json").read_text())
    assert set(results) == {"topic", "tags"}  # the targets with a test_file (qa has none; lm is auxiliary)
    final = json.loads((out / "model_last" / "train_state.json").read_text())["step"]
    for task, metric in (("topic", "acc"), ("tags", "f1")):
        best_step = json.loads((out / f"best_{task}" / "train_state.json").read_text())["step"]
        assert results[task]["last"]["step"] == final and results[task]["best"]["step"] == best_step
        assert metric in results[task]["last"]["metrics"] and metric in results[task]["best"]["metrics"]
        # an independent path: the best checkpoint through the plain forward program (--do_eval --checkpoint)
        proc = ok(run_here(["--do_eval", "--task", task, "--eval_file", data / f"{'cls' if task == 'topic' else 'seg'}"
                           "_test.tsv", "--checkpoint", out / f"best_{task}", "--eval_output",
                           tmp_path / f"{task}.json"],
                          cwd=tmp_path))
        report = json.loads((tmp_path / f"{task}.json").read_text())
        assert report["step"] == best_step and report["metrics"] == pytest.approx(results[task]["best"]["metrics"],
                                                                                 rel=1e-6, abs=1e-7)
        assert json.loads(proc.stdout)["metrics"] == report["metrics"]
    from visualdl.reader.reader import LogReader

    (record,) = glob.glob(str(out / "visualdl" / "vdlrecords.*.log"))
    tags = set(LogReader(file_path=record).get_tags()["scalar"])
    assert {"test/topic/acc", "test_best/topic/acc", "test/tags/f1", "test_best/tags/f1"} <= tags


@pytest.mark.slow
def test_do_eval_with_exported_models_equals_the_best_checkpoint(finished, data, tmp_path):
    """Targets with a dev file export their best weights (export_from: best); --do_eval through Paddle
    Inference on the exported model gives the metrics the best checkpoint gives."""
    out, _ = finished
    for task, eval_file in (("topic", "cls_dev.tsv"), ("tags", "seg_dev.tsv"), ("qa", "qa_dev.json")):
        manifest = json.loads((out / task / "infer_model" / "manifest.json").read_text())
        best_step = json.loads((out / f"best_{task}" / "train_state.json").read_text())["step"]
        assert manifest["export_from"] == "best" and manifest["step"] == best_step
        exported = tmp_path / f"{task}_exported.json"
        ok(run_here(["--do_eval", "--task", task, "--eval_file", data / eval_file, "--output_dir", out,
                    "--eval_output", exported], cwd=tmp_path))
        ckpt = tmp_path / f"{task}_ckpt.json"
        ok(run_here(["--do_eval", "--task", task, "--eval_file", data / eval_file, "--checkpoint", out / f"best_{task}",
                    "--eval_output", ckpt], cwd=tmp_path))
        a, b = json.loads(exported.read_text()), json.loads(ckpt.read_text())
        assert a["examples"] == b["examples"] > 0
        assert a["metrics"] == pytest.approx(b["metrics"], rel=1e-5, abs=1e-6), task
    # mlm has no inference model: its checkpoint is evaluated
    ok(run_here(["--do_eval", "--task", "lm", "--eval_file", data / "lm_dev.tsv", "--checkpoint", out / "model_last",
                "--eval_output", tmp_path / "lm.json"], cwd=tmp_path))
    assert 0 <= json.loads((tmp_path / "lm.json").read_text())["metrics"]["mlm_acc"] <= 1


@pytest.mark.slow
def test_a_checkpoint_is_evaluated_with_the_kernels_its_run_recorded(finished, data, tmp_path):
    """--do_eval --checkpoint runs the checkpoint's forward program with the forward op types its run recorded
    (the run's own evaluation, reproduced to 1e-6 above), on the thread budget, and says so on stderr;
    --cpu_kernels plain runs none, and agrees within float32 rounding."""
    out, _ = finished
    record = json.loads((out / "best_topic" / "train_state.json").read_text())["extra"]["cpu_kernels"]
    assert record["mode"] == "list" and record["onednn"] == sorted(KERNELS.split(","))
    lines, reports = {}, {}
    for kernels in ("auto", "plain"):
        proc = ok(run_here(["--do_eval", "--task", "topic", "--eval_file", data / "cls_test.tsv", "--checkpoint",
                           out / "best_topic", "--cpu_kernels", kernels, "--eval_output", tmp_path / f"{kernels}.json"],
                          cwd=tmp_path, env={"OMP_NUM_THREADS": "2"}))
        (lines[kernels],) = [x for x in proc.stderr.splitlines() if x.startswith("evaluation: ")]
        reports[kernels] = json.loads((tmp_path / f"{kernels}.json").read_text())
        assert json.loads(proc.stdout) == reports[kernels]  # the line kept stdout's JSON report clean
    head = "evaluation: the checkpoint's forward program with oneDNN on "
    tail = " ops (matmul_v2, softmax: the kernels its run recorded), 2 threads"
    assert lines["auto"].startswith(head) and lines["auto"].endswith(tail), lines["auto"]
    assert int(lines["auto"][len(head):-len(tail)]) > 0
    assert lines["plain"] == f"{head}0 ops (none: --cpu_kernels plain), 2 threads"
    assert reports["auto"]["examples"] == reports["plain"]["examples"] == 19
    assert reports["auto"]["metrics"] == pytest.approx(reports["plain"]["metrics"], rel=1e-5, abs=1e-6)


@pytest.mark.slow
def test_predicting_from_a_checkpoint_uses_the_kernels_its_run_recorded(finished, data):
    """predict_checkpoint (PALM's predict from ckpt.step<N>) runs the recorded forward kernels, as --do_eval
    --checkpoint does; plain agrees within float32 rounding."""
    from ernie_mtl.engine.saved_models import predict_checkpoint

    out, _ = finished
    lines, outputs = {}, {}
    for kernels in ("auto", "plain"):
        got = []
        result = predict_checkpoint(out / "best_topic", "topic", str(data / "cls_test.tsv"), cpu_kernels=kernels,
                                    log=got.append)
        (lines[kernels],) = got
        outputs[kernels] = np.concatenate([np.asarray(b, dtype="float64").reshape(len(b), -1)
                                           for b in next(iter(result.outputs.values()))])
    assert "(matmul_v2, softmax: the kernels its run recorded)" in lines["auto"], lines["auto"]
    assert lines["auto"].startswith("prediction: the checkpoint's forward program with oneDNN on ")
    assert "0 ops (none: --cpu_kernels plain)" in lines["plain"]
    assert outputs["auto"].shape[0] == 19
    np.testing.assert_allclose(outputs["auto"], outputs["plain"], rtol=1e-5, atol=1e-6)


def test_do_eval_errors_name_the_file_and_line(finished, data, tmp_path):
    out, _ = finished
    bad = tmp_path / "bad.tsv"
    bad.write_text("label\ttext_a\n1\t好的\n0\t坏\textra\n", encoding="utf-8")
    proc = run_here(["--do_eval", "--task", "topic", "--eval_file", bad, "--output_dir", out], cwd=tmp_path)
    assert proc.returncode == 2 and f"{bad}:3:" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_here(["--do_eval", "--task", "nosuch", "--eval_file", bad, "--output_dir", out], cwd=tmp_path)
    assert proc.returncode == 2 and "tasks exported under --output_dir" in proc.stderr and "'topic'" in proc.stderr
    proc = run_here(["--do_eval", "--task", "nosuch", "--eval_file", bad, "--checkpoint", out / "model_last"],
                   cwd=tmp_path)
    assert proc.returncode == 2 and "holds the tasks ['topic', 'tags', 'qa', 'lm']" in proc.stderr
