"""PaddlePALM's example scripts, ported by their import line and data paths (examples/palm/), run on the
tiny generated data and model: they train, save PALM's `ckpt.step<N>`, predict in PALM's file formats,
and each scores exactly what the command line scores with the equivalent YAML on the same data; the
trainings themselves are bitwise the command line's (same checkpoint bytes), the multi-task one
compared loss by loss. Scripts and command lines run in the test process (helpers.run_in_process, as a
user's own Python or a notebook runs a script) with OMP_NUM_THREADS=1; the two-process test launches
the script and the command line as real processes."""
import zlib  # noqa: F401  (before paddle)

import json
import os
import shutil
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers import ROOT, launch_logs, logged_losses, ok, run_cli, run_here, run_in_process, state

pytestmark = pytest.mark.slow
ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def ex(tmp_path_factory):
    """A copy of examples/palm with its data and tiny model prepared."""
    root = tmp_path_factory.mktemp("palm") / "examples"
    shutil.copytree(ROOT / "examples" / "palm", root,
                    ignore=shutil.ignore_patterns("data", "outputs", "params", "vocab.txt", "__pycache__"))
    ok(subprocess.run([sys.executable, "prepare_data.py"], cwd=root, env={**os.environ, **ENV}, capture_output=True,
                      text=True, timeout=300))
    return root


def script(ex, example, name="run.py"):
    """Run one ported example script where PALM's README runs it (its own folder), in this process as a
    notebook or a user's own Python runs it (helpers.run_in_process; the two-process test launches it)."""
    def run_path(argv):
        sys.argv = [name]
        sys.path.insert(0, str(ex / example))  # the script's folder, as `python run.py` puts it first
        try:
            runpy.run_path(name, run_name="__main__")
        finally:
            sys.path.remove(str(ex / example))
        return 0

    argv = sys.argv
    try:
        return ok(run_in_process([], cwd=ex / example, env=ENV, command=run_path))
    finally:
        sys.argv = argv


_DONE = {}


def once(ex, example, *names):
    for name in names or ("run.py",):
        if (example, name) not in _DONE:
            _DONE[example, name] = script(ex, example, name)
    return ex / example / "outputs"


def cli(tmp, config, *argv, cwd):
    """The command line on the YAML `config` (a dict), then `argv` (--do_predict / --do_eval) if any."""
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(config, allow_unicode=True), encoding="utf-8")
    if not argv:
        return ok(run_here(["--config", path], cwd=cwd, env=ENV))
    return ok(run_here(list(argv), cwd=cwd, env=ENV))


def common(ex, out, **keys):
    """What every PALM example sets: the tiny ERNIE 1.0 params (architecture from the ernie_config.json
    beside them), its vocabulary, PALM's Adam (no clipping) and the saver."""
    model = ex / "pretrain" / "tiny-ernie"
    return {"save_path": str(out), "backbone": "ernie", "pretrain_model_path": str(model / "params"),
            "vocab_path": str(model / "vocab.txt"), "grad_clip": 0, "min_lr": 0, "do_lower_case": False,
            "for_cn": False, "device": "cpu", **keys}


def state_files(checkpoint):
    return json.loads((Path(checkpoint) / "train_state.json").read_text())["files"]


def lines(path):
    return [json.loads(line) for line in open(path, encoding="utf-8")]


def gold_column(path, column):
    rows = open(path, encoding="utf-8").read().splitlines()
    index = rows[0].split("\t").index(column)
    return [r.split("\t")[index] for r in rows[1:]]


def accuracy(pred, gold):
    assert len(pred) == len(gold)
    return sum(int(p) == int(g) for p, g in zip(pred, gold)) / len(gold)


# -- classification, predict, train_with_eval ----------------------------------------------------------
CLASSIFICATION = {"task_instance": "chnsenticorp", "random_seed": 1, "learning_rate": 5e-3, "weight_decay": 0.01,
                  "warmup_steps": 8, "decay_steps": 80, "max_seq_len": 256, "batch_size": 8, "save_steps": 20,
                  "print_every_n_steps": 20}


@pytest.fixture(scope="module")
def classification_cli(ex, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cls_cli")
    data = ex / "classification" / "data"
    cfg = common(ex, tmp / "out", **CLASSIFICATION, tasks={"chnsenticorp": {
        "reader": "cls", "train_file": str(data / "train.tsv"), "n_classes": 2, "dropout": 0.1, "num_epochs": 10}})
    cli(tmp, cfg, cwd=tmp)
    cli(tmp, cfg, "--do_predict", "--task", "chnsenticorp", "--output_dir", tmp / "out", "--pred_file",
        data / "test.tsv", "--device", "cpu", cwd=tmp)
    return tmp / "out"


def test_classification_trains_saves_and_predicts_as_the_command_line(ex, classification_cli):
    out = once(ex, "classification")
    for step in (20, 40, 60, 80):  # PALM's checkpoint names, links to the engine's checkpoints
        assert os.readlink(out / f"ckpt.step{step}") == f"model_{step}"
    assert state_files(out / "model_last") == state_files(classification_cli / "model_last")  # bitwise the same
    gold = gold_column(ex / "classification" / "data" / "test.tsv", "label")
    palm = lines(out / "predict" / "predictions.json")  # PALM's format: one JSON object per line
    assert set(palm[0]) == {"index", "label", "logits",
                            "probs"} and [p["index"] for p in palm] == list(range(len(gold)))
    ours = json.loads((classification_cli / "chnsenticorp" / "predictions.json").read_text())
    assert accuracy([p["label"] for p in palm], gold) == accuracy([r["label"] for r in ours], gold) >= 0.9
    print("classification accuracy, PALM script and command line:", accuracy([p["label"] for p in palm], gold))
    assert (out / "chnsenticorp" / "infer_model" / "manifest.json").is_file()  # PALM 1.x's export layout


def test_predict_example_predicts_from_pretrained_parameters_with_a_warning(ex):
    """PALM's examples/predict as it is: load_predict_model(pretrained params) predicts with an untrained
    (seeded random) head; the script warns so, writes PALM's file, and predicts the same when run again."""
    out = once(ex, "predict")
    log = _DONE["predict", "run.py"].stderr
    assert "the head Classify is untrained" in log and "pretrained parameters" in log, log[-2000:]
    gold = gold_column(ex / "predict" / "data" / "test.tsv", "label")
    first = lines(out / "predict" / "predictions.json")
    assert len(first) == len(gold) and set(first[0]) == {"index", "label", "logits", "probs"}
    script(ex, "predict")
    assert lines(out / "predict" / "predictions.json") == first
    print("predict example from pretrained parameters: accuracy", accuracy([p["label"] for p in first], gold))


def test_train_with_eval_steps_through_the_iterator_as_train_does(ex, classification_cli):
    out = once(ex, "train_with_eval")  # fit_reader's iterator + train_one_step; set_saver after fit_reader
    assert sorted(p.name for p in out.glob("ckpt.step*")) == ["ckpt.step20", "ckpt.step40", "ckpt.step60",
                                                              "ckpt.step80"]
    assert state_files(out / "model_last") == state_files(classification_cli / "model_last")


def test_two_processes_the_script_trains_what_the_command_line_trains(ex, tmp_path):
    """PALM's classification example launched on 2 processes (`python -m paddle.distributed.launch
    --nproc_per_node 2 run.py`, every rank running the script) and the command line launched the same way
    on the same YAML: the same checkpoint bytes and logged losses; rank 0 writes the predictions, which
    score what the command line's exported model predicts. batch_size is per process, as PALM's was per
    device, so the run has half the steps: the script's checkpoint path is its one other change."""
    folder = ex / "classification_2proc"
    folder.mkdir()
    (folder / "data").symlink_to(ex / "classification" / "data")
    source = (ex / "classification" / "run.py").read_text(encoding="utf-8")
    assert "str(80)" in source
    (folder / "run.py").write_text(source.replace("str(80)", "str(40)"), encoding="utf-8")
    ok(run_cli([], entry=folder / "run.py", cwd=folder, launch_procs=2, log_dir=tmp_path / "palm_logs",
               env={"PYTHONPATH": str(ROOT), **ENV}))
    out = folder / "outputs"
    assert os.readlink(out / "ckpt.step40") == "model_40" and not (out / "ckpt.step60").exists()
    data = ex / "classification" / "data"
    cfg = common(ex, tmp_path / "out", **CLASSIFICATION, tasks={"chnsenticorp": {
        "reader": "cls", "train_file": str(data / "train.tsv"), "n_classes": 2, "dropout": 0.1, "num_epochs": 10}})
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg, allow_unicode=True), encoding="utf-8")
    proc = run_cli(["--config", tmp_path / "config.yaml"], cwd=tmp_path, launch_procs=2,
                   log_dir=tmp_path / "cli_logs", env=ENV)
    assert proc.returncode == 0, launch_logs(tmp_path / "cli_logs")
    assert state_files(out / "ckpt.step40") == state_files(tmp_path / "out" / "model_40")
    assert logged_losses(out) == logged_losses(tmp_path / "out") and len(logged_losses(out)) == 2
    cli(tmp_path, cfg, "--do_predict", "--task", "chnsenticorp", "--output_dir", tmp_path / "out", "--pred_file",
        data / "test.tsv", "--device", "cpu", cwd=tmp_path)
    gold = gold_column(data / "test.tsv", "label")
    palm = [p["label"] for p in lines(out / "predict" / "predictions.json")]
    ours = [r["label"] for r in json.loads((tmp_path / "out" / "chnsenticorp" / "predictions.json").read_text())]
    assert accuracy(palm, gold) == accuracy(ours, gold) >= 0.9
    print("2 processes: PALM script and command line, same checkpoint bytes; accuracy", accuracy(palm, gold))


# -- matching, tagging, mrc --------------------------------------------------------------------------
def test_matching_scores_as_the_command_line(ex, tmp_path):
    out = once(ex, "matching")
    data = ex / "matching" / "data"
    name = "Quora_Question_Pairs_matching"  # PALM's trainer name 'Quora Question Pairs matching', folder-safe
    cfg = common(ex, tmp_path / "out", task_instance=name, random_seed=1, learning_rate=5e-3, weight_decay=0.0,
                 warmup_steps=1, decay_steps=12, max_seq_len=128, batch_size=16, save_steps=4,
                 print_every_n_steps=50, tasks={name: {"reader": "match", "train_file": str(data / "train.tsv"),
                                                      "n_classes": 2, "dropout": 0.1, "num_epochs": 3}})
    cli(tmp_path, cfg, cwd=tmp_path)
    cli(tmp_path, cfg, "--do_predict", "--task", name, "--output_dir", tmp_path / "out", "--pred_file",
        data / "test.tsv", "--device", "cpu", cwd=tmp_path)
    assert state_files(out / "ckpt.step12") == state_files(tmp_path / "out" / "model_12")
    gold = gold_column(data / "test.tsv", "label")
    palm = [p["label"] for p in lines(out / "predict" / "predictions.json")]
    ours = [r["label"] for r in json.loads((tmp_path / "out" / name / "predictions.json").read_text())]
    assert palm == ours and accuracy(palm, gold) == accuracy(ours, gold)
    print("matching accuracy, PALM script and command line:", accuracy(palm, gold))


def test_tagging_scores_as_the_command_line(ex, tmp_path):
    from ernie_mtl.tasks.seq_label import chunk_metrics

    out = once(ex, "tagging")
    data = ex / "tagging" / "data"
    cfg = common(ex, tmp_path / "out", task_instance="msra_ner", random_seed=1, learning_rate=5e-3,
                 weight_decay=0.01, warmup_steps=2, decay_steps=24, max_seq_len=256, batch_size=16, save_steps=12,
                 print_every_n_steps=10, tasks={"msra_ner": {
                     "reader": "seq_label", "train_file": str(data / "train.tsv"),
                     "label_map": str(data / "label_map.json"), "use_crf": True, "dropout": 0.1, "num_epochs": 6}})
    cli(tmp_path, cfg, cwd=tmp_path)
    report = tmp_path / "eval.json"  # PALM's script predicts with its mid-run checkpoint, ckpt.step12
    cli(tmp_path, cfg, "--do_eval", "--task", "msra_ner", "--output_dir", tmp_path / "out", "--checkpoint",
        tmp_path / "out" / "model_12", "--eval_file", data / "test.tsv", "--eval_output", report, "--device", "cpu",
        cwd=tmp_path)
    assert state_files(out / "ckpt.step12") == state_files(tmp_path / "out" / "model_12")
    tags = {i: t for t, i in json.loads((data / "label_map.json").read_text()).items()}
    gold = [g.split("\x02") for g in gold_column(data / "test.tsv", "label")]
    palm = lines(out / "predict" / "predictions.json")  # one list of ids per line: [CLS], one per token, [SEP]
    assert all(len(p) == len(g) + 2 and p[0] == p[-1] == 6 for p, g in zip(palm, gold))
    pred = [[tags[i] for i in p[1:1 + len(g)]] for p, g in zip(palm, gold)]  # what PALM's evaluate.py reads
    f1 = chunk_metrics(gold, pred, "IOB2")["f1"]
    assert f1 == json.loads(report.read_text())["metrics"]["f1"]
    print("tagging chunk F1 at ckpt.step12, PALM script and command line:", f1)


def test_mrc_scores_as_the_command_line(ex, tmp_path):
    out = once(ex, "mrc")
    data = ex / "mrc" / "data"
    cfg = common(ex, tmp_path / "out", task_instance="cmrc2018", learning_rate=5e-3, weight_decay=0.01,
                 warmup_steps=1, decay_steps=16, max_seq_len=512, batch_size=8, save_steps=8, do_lower_case=True,
                 print_every_n_steps=20, tasks={"cmrc2018": {
                     "reader": "mrc", "train_file": str(data / "train.json"), "max_query_len": 64, "doc_stride": 128,
                     "remove_noanswer": True, "max_answer_len": 128, "num_epochs": 2}})
    cli(tmp_path, cfg, cwd=tmp_path)
    cli(tmp_path, cfg, "--do_predict", "--task", "cmrc2018", "--output_dir", tmp_path / "out", "--pred_file",
        data / "dev.json", "--device", "cpu", cwd=tmp_path)
    assert state_files(out / "ckpt.step16") == state_files(tmp_path / "out" / "model_16")
    palm = json.loads((out / "predict" / "predictions.json").read_text())  # PALM's {question id: answer}
    nbest = json.loads((out / "predict" / "nbest_predictions.json").read_text())
    assert set(nbest) == set(palm) and all(nbest[q][0]["text"] == palm[q] for q in palm)
    ours = json.loads((tmp_path / "out" / "cmrc2018" / "predictions.json").read_text())
    gold = {q["id"]: q["answers"][0]["text"] for d in json.loads((data / "dev.json").read_text())["data"]
            for p in d["paragraphs"] for q in p["qas"]}
    em = {name: sum(answers[q] == a for q, a in gold.items()) / len(gold) for name, answers in
          (("palm", palm), ("cli", ours))}
    assert palm == ours and em["palm"] == em["cli"]
    print("mrc exact match, PALM script and command line:", em)


# -- multi-task ---------------------------------------------------------------------------------------
def test_multi_task_losses_are_bitwise_the_yaml_runs(ex, tmp_path):
    """PALM's multi-task example (MultiHeadTrainer, mix ratios, the slot reference, ATIS files with their
    trailing \\x02) and the same run written as YAML: every logged loss equal, bit for bit; then PALM's
    two predict scripts score what the command line's evaluation of the same checkpoint scores."""
    from ernie_mtl.tasks.seq_label import chunk_metrics

    out = once(ex, "multi-task", "run.py", "predict_slot.py", "predict_intent.py")
    atis = ex / "multi-task" / "data" / "atis"
    cfg = common(ex, tmp_path / "out", task_instance="slot, intent", mix_ratio="1.0, 1.0", target_tag="1, 1",
                 num_epochs=20, random_seed=0, learning_rate=5e-3, weight_decay=0.01, warmup_steps=12,
                 decay_steps=120, max_seq_len=128, batch_size=16, save_steps=52, print_every_n_steps=5,
                 tasks={"slot": {"reader": "seq_label", "train_file": str(atis / "atis_slot" / "train.tsv"),
                                 "label_map": str(atis / "atis_slot" / "label_map.json"), "use_crf": True,
                                 "dropout": 0.1},
                        "intent": {"reader": "cls", "train_file": str(atis / "atis_intent" / "train.tsv"),
                                   "n_classes": 26, "dropout": 0.1}})
    cli(tmp_path, cfg, cwd=tmp_path)
    palm_losses, yaml_losses = logged_losses(out), logged_losses(tmp_path / "out")
    assert palm_losses == yaml_losses and len(palm_losses) == 160 // 5
    print("multi-task: logged losses equal bitwise at", len(palm_losses), "logging steps")
    assert state_files(out / "ckpt.step156") == state_files(tmp_path / "out" / "model_156")
    for task, test in (("slot", atis / "atis_slot" / "test.tsv"), ("intent", atis / "atis_intent" / "test.tsv")):
        report = tmp_path / f"{task}.json"
        cli(tmp_path, cfg, "--do_eval", "--task", task, "--output_dir", tmp_path / "out", "--checkpoint",
            tmp_path / "out" / "model_156", "--eval_file", test, "--eval_output", report, "--device", "cpu",
            cwd=tmp_path)
        metrics = json.loads(report.read_text())["metrics"]
        if task == "intent":
            palm = [p["label"] for p in lines(out / "predict-intent" / "predictions.json")]
            assert accuracy(palm, gold_column(test, "label")) == metrics["acc"]
            print("intent accuracy, PALM script and command line:", metrics["acc"])
        else:
            tags = {i: t for t, i in json.loads((atis / "atis_slot" / "label_map.json").read_text()).items()}
            gold = [g.rstrip("\x02").split("\x02") for g in gold_column(test, "label")]
            palm = lines(out / "predict-slot" / "predictions.json")
            f1 = chunk_metrics(gold, [[tags[i] for i in p[1:1 + len(g)]] for p, g in zip(palm, gold)], "IOB2")["f1"]
            assert f1 == metrics["f1"]
            print("slot chunk F1, PALM script and command line:", f1)


# -- the trainer in the caller's process: stepping, predict and evaluate returning results; Controller ------
def test_get_one_batch_and_train_one_step_follow_the_run_and_results_are_returned(ex, tmp_path):
    from ernie_mtl import palm

    model, data = ex / "pretrain" / "tiny-ernie", ex / "classification" / "data"
    config = json.loads((model / "ernie_config.json").read_text())
    reader = palm.reader.ClassifyReader(str(model / "vocab.txt"), 64, seed=2)
    reader.load_data(str(data / "train.tsv"), 16, num_epochs=1)
    ernie = palm.backbone.ERNIE.from_config(config)
    trainer = palm.Trainer("sentiment")
    loss = trainer.build_forward(ernie, palm.head.Classify(2, 32))
    trainer.build_backward(palm.optimizer.Adam(loss, 5e-3))
    trainer.fit_reader(reader)
    trainer.set_saver(str(tmp_path / "out"), save_steps=2)
    trainer.configure(device="cpu")
    batch = trainer.get_one_batch()
    assert trainer.get_one_batch().prepared is batch.prepared  # the same step until it is trained
    assert {"token_ids", "position_ids", "segment_ids", "input_mask", "task_ids", "sentiment.label_ids"} <= set(batch)
    assert batch["token_ids"].shape[0] == 16 and batch["input_mask"].shape[-1] == 1
    out = trainer.train_one_step(batch)
    assert list(out) == ["sentiment.loss"] and trainer.cur_train_step == 1
    with pytest.raises(ValueError, match="not the run's next one"):
        trainer.train_one_step(batch)
    with pytest.raises(ValueError, match=r"the batch lacks \['input_mask'\]"):  # a batch the script built
        trainer.train_one_step({"token_ids": batch["token_ids"]})
    result = trainer.train(print_steps=1)  # the rest of the run: 64 rows / 16 = 4 steps in all
    assert result.steps == 4 and os.readlink(tmp_path / "out" / "ckpt.step4") == "model_4"
    predict_reader = palm.reader.ClassifyReader(str(model / "vocab.txt"), 64, phase="predict")
    predict_reader.load_data(str(data / "test.tsv"), 8)
    head = palm.head.Classify(2, 32, phase="predict")
    trainer.build_predict_forward(palm.backbone.ERNIE.from_config(config, phase="predict"), head)
    trainer.fit_reader(predict_reader, phase="predict")
    records = trainer.predict()  # no load_ckpt: the trained weights (PALM re-initialised them here)
    assert records == head.get_results() and len(records) == 32 and not (tmp_path / "out" / "predict").exists()
    metrics = trainer.evaluate()
    assert metrics["acc"] == accuracy([r["label"] for r in records], gold_column(data / "test.tsv", "label"))


def test_palm_1_controller_trains_and_predicts_a_yaml_config(ex, tmp_path):
    from ernie_mtl import palm

    model, data = ex / "pretrain" / "tiny-ernie", ex / "classification" / "data"
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "senti.yaml").write_text(
        f"train_file: {data / 'train.tsv'}\npred_file: {data / 'test.tsv'}\nreader: cls\nparadigm: cls\nn_classes: 2\n")
    (tmp_path / "config.yaml").write_text(
        "task_instance: senti\nsave_path: out\nbackbone: ernie\n"
        f"backbone_config_path: {model / 'ernie_config.json'}\nvocab_path: {model / 'vocab.txt'}\n"
        "max_seq_len: 64\nbatch_size: 16\nnum_epochs: 1\noptimizer: adam\nlearning_rate: 5e-3\n"
        "warmup_proportion: 0.1\nweight_decay: 0.01\nprint_every_n_steps: 2\ndevice: cpu\n")
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        controller = palm.Controller("config.yaml", task_dir="tasks", argv=[])
        controller.load_pretrain(str(model / "params"))
        result = controller.train()
        records = palm.Controller("config.yaml", task_dir="tasks", for_train=False, argv=[]).pred("senti")
    finally:
        os.chdir(cwd)
    assert result.steps == 4 and (tmp_path / "out" / "senti" / "infer_model" / "manifest.json").is_file()
    assert len(records) == 32 and json.loads((tmp_path / "out" / "senti" / "predictions.json").read_text()) == records


def test_load_ckpt_then_train_resumes_exactly(ex, tmp_path):
    """A run stopped after step 4 (close()) and continued from PALM's ckpt.step4 ends with the same bytes
    as the run that never stopped."""
    from ernie_mtl import palm

    model, data = ex / "pretrain" / "tiny-ernie", ex / "classification" / "data"
    config = json.loads((model / "ernie_config.json").read_text())

    def trainer(out):
        reader = palm.reader.ClassifyReader(str(model / "vocab.txt"), 64, seed=4)
        reader.load_data(str(data / "train.tsv"), 16, num_epochs=2)
        t = palm.Trainer("sentiment")
        loss = t.build_forward(palm.backbone.ERNIE.from_config(config), palm.head.Classify(2, 32, 0.1))
        t.build_backward(palm.optimizer.Adam(loss, 5e-3, palm.lr_sched.TriangularSchedualer(2, 8)), weight_decay=0.01)
        t.fit_reader(reader)
        t.load_pretrain(str(model / "params"))
        t.set_saver(str(out), save_steps=4)
        t.configure(device="cpu")
        return t

    whole = trainer(tmp_path / "whole").train(print_steps=1)
    assert whole.steps == 8
    first = trainer(tmp_path / "parts")
    for _ in range(5):  # a fifth step is taken but never saved: the resumed run redoes it
        first.train_one_step(first.get_one_batch())
    first.close()
    second = trainer(tmp_path / "parts")
    second.load_ckpt(str(tmp_path / "parts" / "ckpt.step4"))
    assert second.train(print_steps=1).steps == 8
    assert state_files(tmp_path / "parts" / "model_last") == state_files(tmp_path / "whole" / "model_last")
    assert logged_losses(tmp_path / "parts")["8"] == logged_losses(tmp_path / "whole")["8"]


def test_a_single_task_trainer_refines_from_the_multi_task_checkpoint(ex, tmp_path):
    """MT-DNN's second stage in the PALM face: after the multi-task example, a single-task Trainer that
    load_ckpt()s its checkpoint starts a new run from its weights -- the backbone and its own task's head,
    bitwise -- and trains (the multi-task run's other head is not used)."""
    import numpy as np

    from ernie_mtl import palm
    from ernie_mtl.engine.callbacks import Callback

    out = once(ex, "multi-task", "run.py")
    source = out / "ckpt.step156"
    model, atis = ex / "pretrain" / "tiny-ernie", ex / "multi-task" / "data" / "atis" / "atis_intent"
    config = json.loads((model / "ernie_config.json").read_text())

    class Begin(Callback):
        def on_train_begin(self, trainer):
            self.values = {k: np.array(trainer.scope.find_var(v).get_tensor())
                           for k, v in trainer.programs.name_map.items()}

    begin = Begin()
    reader = palm.reader.ClassifyReader(str(model / "vocab.txt"), 128, seed=0)
    reader.load_data(str(atis / "train.tsv"), 16, num_epochs=1)
    t = palm.Trainer("intent")
    loss = t.build_forward(palm.backbone.ERNIE.from_config(config), palm.head.Classify(26, config["hidden_size"], 0.1))
    t.build_backward(palm.optimizer.Adam(loss, 1e-3), weight_decay=0.01)
    t.fit_reader(reader)
    t.load_ckpt(str(source))
    t.set_saver(str(tmp_path / "refine"), save_steps=1000)
    t.configure(device="cpu")
    t.add_callback(begin)
    result = t.train(print_steps=2)
    assert result.steps == -(-reader.num_examples // 16) > 1  # one epoch from step 0: a new run, not a resume
    saved = json.loads((source / "train_state.json").read_text())["name_map"]
    values = state(source / "state" / "rank_0")
    taken = [k for k in begin.values if k.startswith(("ernie.", "heads.intent."))]
    assert any(k.startswith("heads.intent.") for k in taken)
    assert all(np.array_equal(begin.values[k], values[saved[k]]) for k in taken)
