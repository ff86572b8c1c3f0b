"""PALM-compatible multi-task configuration: global + task YAMLs -> TaskSpecs, MTL settings, run flags."""
import zlib  # noqa: F401  (before paddle: paddle 2.6.2 exports clashing zlib symbols)

import json
import os
import textwrap

import pytest

from ernie_mtl.config.cli import _FLAGS
from ernie_mtl.config import multitask_yaml as mtl_config
from ernie_mtl.config import ConfigError
from ernie_mtl.config.multitask_yaml import is_multitask_yaml, load_multitask_config, split_task_overrides
from ernie_mtl.engine.config_checks import HOOKS
from ernie_mtl.tasks.base import Option, TaskType, get_task_type, register_task_type

FLAGS = set(_FLAGS)


class _Untrainable(TaskType):
    """Config tests only need the registry entry and options; the data/model methods are never called."""

    main_metric = "acc"

    def load(self, split):
        raise NotImplementedError

    def collate(self, features):
        raise NotImplementedError

    def label_feeds(self):
        raise NotImplementedError

    def dummy_labels(self, batch_size, seq_len):
        raise NotImplementedError

    def create_head(self, enc):
        raise NotImplementedError

    def head_forward(self, head, enc, feeds):
        raise NotImplementedError

    def evaluate(self, data, outputs):
        raise NotImplementedError

    def predictions(self, data, outputs):
        raise NotImplementedError


@register_task_type("cfgtest_cls")
class _Cls(_Untrainable):
    options = {"n_classes": Option(None, "number of classes", required=True),
               "label_map_file": Option(None, "label map JSON"),
               "dropout": Option(0.1, "head dropout")}


@register_task_type("cfgtest_mlm")
class _Mlm(_Untrainable):
    options = {"mask_prob": Option(0.15, "masking probability"), "max_predictions": Option(20, "per sample")}


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


@pytest.fixture
def demo(tmp_path):
    """A PALM demo-style config: 3 tasks, the MLM one auxiliary, two classifiers sharing a head."""
    for name in ("senti/train.tsv", "senti/dev.tsv", "topic/train.tsv", "corpus.txt", "labels.json"):
        write(tmp_path / "data" / name, "x\n")
    write(tmp_path / "tasks" / "senti.yaml", """\
        train_file: ../data/senti/train.tsv
        dev_file: ../data/senti/dev.tsv
        reader: cfgtest_cls
        paradigm: cfgtest_cls
        n_classes: 2
        label_map_file: ../data/labels.json
        """)
    write(tmp_path / "tasks" / "topic.yaml", """\
        train_file: ../data/topic/train.tsv
        reader: cfgtest_cls
        n_classes: 2
        batch_size: 16
        num_epochs: 3
        """)
    write(tmp_path / "tasks" / "mlm.yaml", """\
        train_file: ../data/corpus.txt
        reader: cfgtest_mlm
        paradigm: cfgtest_mlm
        """)
    cfg = write(tmp_path / "config.yaml", """\
        task_instance: "senti, topic, mlm"
        target_tag: 1, 1, 0
        mix_ratio: 1.0, 0.5, 0.5
        task_reuse_tag: 0, 0, 1
        task_dir: tasks
        save_path: output_model/run1
        backbone: ernie
        vocab_path: ../vocab.txt
        do_lower_case: True
        max_seq_len: 128
        batch_size: 32
        num_epochs: 2
        optimizer: adam
        learning_rate: 3e-5
        warmup_proportion: 0.1
        weight_decay: 0.01
        print_every_n_steps: 5
        """)
    return cfg


def load(path, **kw):
    return load_multitask_config(str(path), hooks=HOOKS, flag_names=FLAGS, **kw)


def problems_of(path, **kw):
    with pytest.raises(ConfigError) as e:
        load(path, **kw)
    return e.value.problems


def test_palm_demo_config_parses(demo):
    setup = load(demo)
    root = str(demo.parent)
    senti, topic, mlm = setup.tasks
    assert setup.names == ("senti", "topic", "mlm")
    assert [t.index for t in setup.tasks] == [0, 1, 2]
    assert [t.is_target for t in setup.tasks] == [True, True, False]
    assert [t.mix_ratio for t in setup.tasks] == [1.0, 0.5, 0.5]
    assert [t.reuse_tag for t in setup.tasks] == [0, 0, 1]
    assert senti.train_file == os.path.join(root, "data", "senti", "train.tsv")
    assert senti.dev_file == os.path.join(root, "data", "senti", "dev.tsv") and topic.dev_file is None
    assert senti.options == {"n_classes": 2, "label_map_file": os.path.join(root, "data", "labels.json"),
                             "dropout": 0.1}
    assert mlm.options == {"mask_prob": 0.15, "max_predictions": 20}  # defaults of the task type
    assert (senti.num_epochs, topic.num_epochs) == (None, 3.0)
    assert setup.mtl.num_epochs == 2.0 and setup.mtl.sampling == "palm" and setup.mtl.task_dir == os.path.join(
        root, "tasks")
    assert setup.run_flags == {"output_dir": "output_model/run1", "model_type": "ernie",
                               "tokenizer_name_or_path": "../vocab.txt", "max_lr": "3e-5", "warmup_rate": 0.1,
                               "weight_decay": 0.01, "logging_freq": 5}
    json.dumps(setup.mtl.to_dict())  # JSON-safe for checkpoints
    assert is_multitask_yaml(str(demo)) and not is_multitask_yaml(str(demo.parent / "tasks" / "mlm.yaml"))


def test_broadcast_and_precedence_with_reports(demo):
    setup = load(demo)
    senti, topic, mlm = setup.tasks
    assert [t.max_seq_len for t in setup.tasks] == [128] * 3  # global broadcast
    assert [t.batch_size for t in setup.tasks] == [32] * 3  # global wins over topic.yaml's 16 ...
    assert [r for r in setup.reports if "batch_size" in r] == [  # ... and says so
        f"task topic: key batch_size=16 from {demo.parent / 'tasks' / 'topic.yaml'} overridden by global {demo} (32)"]
    setup = load(demo, cli={"batch_size": "8", "max_seq_len": "64"},
                 task_cli={"mlm": {"batch_size": "4", "mask_prob": "0.2"}})
    assert [t.batch_size for t in setup.tasks] == [8, 8, 4]  # command line > global; --tasks.mlm.* > all
    assert [t.max_seq_len for t in setup.tasks] == [64] * 3
    assert setup.tasks[2].options["mask_prob"] == 0.2
    assert "task mlm: key batch_size=8 from command line --batch_size overridden by command line " \
           "--tasks.mlm.batch_size (4)" in setup.reports


def test_aliases_report_the_flag_they_set(demo):
    reports = load(demo).reports
    assert f"{demo}: key 'learning_rate': PALM's learning_rate sets --max_lr 3e-5" in reports
    assert f"{demo}: key 'save_path': PALM's save_path sets --output_dir output_model/run1" in reports
    text = demo.read_text().replace("backbone: ernie", "backbone: bert-base-uncased")
    demo.write_text(text + "max_lr: 1e-4\n")
    problems = problems_of(demo)
    assert problems == [f"{demo}: key 'max_lr': sets --max_lr '1e-4' but {demo}: key 'learning_rate' already sets "
                        "it to '3e-5'; keep one"]
    demo.write_text(text)
    assert load(demo).run_flags["model_type"] == "bert"
    assert load(demo, cli={"max_lr": "1e-4"}).run_flags["max_lr"] == "1e-4"  # the command line wins


def test_run_flag_in_task_file_palm_style(demo):
    mlm = demo.parent / "tasks" / "mlm.yaml"
    mlm.write_text(mlm.read_text() + "vocab_path: other/vocab.txt\nseed: 5\n")
    setup = load(demo)
    assert setup.run_flags["tokenizer_name_or_path"] == "../vocab.txt" and setup.run_flags["seed"] == 5
    assert any(r.startswith("task mlm: key vocab_path=other/vocab.txt") and "overridden" in r for r in setup.reports)
    topic = demo.parent / "tasks" / "topic.yaml"
    topic.write_text(topic.read_text() + "seed: 6\n")
    assert any("sets --seed 5 but" in p and "keep one" in p for p in problems_of(demo))


def test_backbone_config_path_sets_the_architecture_flags(demo):
    """PALM 1.x's backbone_config_path (an ernie_config.json with ERNIE 1.0's keys) gives the flags."""
    (demo.parent / "ernie_config.json").write_text(json.dumps({
        "attention_probs_dropout_prob": 0.1, "hidden_act": "relu", "hidden_dropout_prob": 0.05, "hidden_size": 64,
        "initializer_range": 0.02, "max_position_embeddings": 513, "num_attention_heads": 4,
        "num_hidden_layers": 3, "sent_type_vocab_size": 2, "vocab_size": 18000}))
    demo.write_text(demo.read_text().replace("backbone: ernie",
                                             "backbone: ernie\nbackbone_config_path: ernie_config.json"))
    setup = load(demo)
    assert {k: setup.run_flags[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                            "intermediate_size", "type_vocab_size", "hidden_act", "vocab_size",
                                            "max_position_embeddings", "hidden_dropout_prob",
                                            "attention_probs_dropout_prob")} == {
        "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4, "intermediate_size": 256,
        "type_vocab_size": 2, "hidden_act": "relu", "vocab_size": 18000, "max_position_embeddings": 513,
        "hidden_dropout_prob": 0.05, "attention_probs_dropout_prob": 0.1}
    assert any("PALM's backbone_config_path sets --vocab_size 18000" in r for r in setup.reports)


@pytest.mark.parametrize("edit, expected", [
    (("mix_ratio: 1.0, 0.5, 0.5", "mix_ratio: 1.0, 0.5"),
     "{cfg}: key 'mix_ratio' has 2 values but task_instance has 3 tasks"),
    (("target_tag: 1, 1, 0", "target_tag: [1, 0]"), "{cfg}: key 'target_tag' has 2 values but task_instance has 3"),
    (("task_reuse_tag: 0, 0, 1", "task_reuse_tag: 0, 0"), "{cfg}: key 'task_reuse_tag' has 2 values"),
    (("target_tag: 1, 1, 0", "target_tag: 1, 2, 0"), "{cfg}: key 'target_tag' [1, 2, 0]: each value must be 1"),
    (("mix_ratio: 1.0, 0.5, 0.5", "mix_ratio: 1.0, x, 0.5"), "{cfg}: key 'mix_ratio': '1.0, x, 0.5' is not numbers"),
    (("batch_size: 32", "batch_sise: 32"), "{cfg}: key 'batch_sise': unknown key (did you mean 'batch_size'?)"),
    (("batch_size: 32", "batch_size: 0"), "global {cfg}: key 'batch_size': 0 is not an integer >= 1"),
    (("optimizer: adam", "optimizer: sgd"), "{cfg}: key 'optimizer': optimizer 'sgd' is not available"),
    (("backbone: ernie", "backbone: gpt"), "{cfg}: key 'backbone': backbone 'gpt' is not supported"),
    (("backbone: ernie", "backbone_config_path: x.json"), "{cfg}: key 'backbone_config_path': "
                                                          "backbone_config_path x.json: cannot read"),
    (("backbone: ernie", "train_file: a.tsv"), "{cfg}: key 'train_file': train_file is a task key"),
    (("task_dir: tasks", "task_dir: nowhere"), "{cfg}: key 'task_dir' 'nowhere': no such directory"),
    (("task_instance: \"senti, topic, mlm\"", "task_instance: \"senti, topic, ner\""),
     "{cfg}: task_instance names 'ner' but its task file {root}/tasks/ner.yaml does not exist"),
    (("task_instance: \"senti, topic, mlm\"", "task_instance: \"senti, senti, mlm\""),
     "{cfg}: key 'task_instance': ['senti'] listed more than once"),
    (("num_epochs: 2", "num_epochs: 2\nsampling: proportional"),
     "{cfg}: key 'mix_ratio' is only used with sampling: palm"),
    (("num_epochs: 2", "num_epochs: 2\nsampling: uniform"), "{cfg}: key 'sampling' 'uniform' is not one of"),
    (("num_epochs: 2", "num_epochs: 2\nplugins: [missing.py]"), "{cfg}: key 'plugins': 'missing.py'"),
    (("task_reuse_tag: 0, 0, 1", "task_reuse_tag: 0, 0, 0"),
     "{cfg}: key 'task_reuse_tag': tasks senti (reader cfgtest_cls) and mlm (reader cfgtest_mlm) share tag 0"),
])
def test_global_errors_name_file_and_key(demo, edit, expected):
    demo.write_text(demo.read_text().replace(*edit))
    problems = problems_of(demo)
    message = expected.format(cfg=demo, root=demo.parent)
    assert any(p.startswith(message) for p in problems), problems


@pytest.mark.parametrize("task, edit, expected", [
    ("topic", ("n_classes: 2\n", ""), "{f}: key 'n_classes' is required by reader 'cfgtest_cls': number of classes"),
    ("topic", ("n_classes: 2", "n_clases: 2"), "{f}: unknown key 'n_clases' (did you mean 'n_classes'?)"),
    ("topic", ("reader: cfgtest_cls", "reader: nosuch"), "{f}: key 'reader': unknown reader 'nosuch'"),
    ("topic", ("reader: cfgtest_cls\n", ""), "{f}: key 'reader' is required"),
    ("senti", ("paradigm: cfgtest_cls", "paradigm: mrc"), "{f}: key 'paradigm' 'mrc' does not go with reader "
                                                          "'cfgtest_cls'; use 'cfgtest_cls'"),
    ("senti", ("../data/senti/dev.tsv", "../data/senti/nodev.tsv"), "{f}: key 'dev_file' '../data/senti/nodev.tsv': "
                                                                    "file not found ({root}/data/senti/nodev.tsv"),
    ("senti", ("../data/labels.json", "nolabels.json"), "{f}: key 'label_map_file' 'nolabels.json': file not found"),
    ("topic", ("train_file: ../data/topic/train.tsv\n", ""), "{f}: key 'train_file' is required"),
    ("topic", ("num_epochs: 3", "num_epochs: -1"), "{f}: key 'num_epochs': -1 is not a number > 0"),
    ("topic", ("num_epochs: 3", "mix_ratio: 3"), "{f}: key 'mix_ratio' is a global setting; move it to {cfg}"),
    ("topic", ("n_classes: 2", "n_classes: 2\ndropout: high"), "{f}: key 'dropout': 'high' is not a number"),
])
def test_task_errors_name_file_and_key(demo, task, edit, expected):
    path = demo.parent / "tasks" / f"{task}.yaml"
    assert edit[0] in path.read_text()
    path.write_text(path.read_text().replace(*edit))
    problems = problems_of(demo)
    message = expected.format(f=path, cfg=demo, root=demo.parent)
    assert any(p.startswith(message) for p in problems), problems


def test_all_problems_are_collected(demo):
    demo.write_text(demo.read_text().replace("batch_size: 32", "batch_sise: 32\ncolour: red"))
    topic = demo.parent / "tasks" / "topic.yaml"
    topic.write_text(topic.read_text().replace("n_classes: 2\n", ""))
    assert len(problems_of(demo)) == 3


def test_command_line_errors(demo):
    assert problems_of(demo, task_cli={"nosuch": {"batch_size": "3"}}) == [
        "--tasks.nosuch.*: no task 'nosuch' in task_instance ['senti', 'topic', 'mlm']"]
    assert problems_of(demo, task_cli={"mlm": {"n_classes": "3"}})[0].startswith(
        "command line --tasks.mlm.n_classes: 'n_classes' is not a key of task mlm (reader cfgtest_mlm)")
    assert problems_of(demo, cli={"bach_size": "3"})[0].startswith(
        "command line --bach_size: unknown key (did you mean 'batch_size'?)")
    rest, overrides = split_task_overrides(["--max_lr", "1", "--tasks.mlm.batch_size=4", "--tasks.senti.dropout",
                                            "0.2", "--seed", "3"])
    assert rest == ["--max_lr", "1", "--seed", "3"]
    assert overrides == {"mlm": {"batch_size": "4"}, "senti": {"dropout": "0.2"}}
    with pytest.raises(ConfigError, match="--tasks.<task>.<key>=<value>"):
        split_task_overrides(["--tasks.mlm=3"])


def test_paths_fall_back_to_the_current_directory(demo, monkeypatch):
    """PALM's demos give data paths relative to the directory the run starts in."""
    topic = demo.parent / "tasks" / "topic.yaml"
    topic.write_text(topic.read_text().replace("../data/topic/train.tsv", "data/topic/train.tsv"))
    monkeypatch.chdir(demo.parent)
    setup = load(demo)
    assert setup.tasks[1].train_file == str(demo.parent / "data" / "topic" / "train.tsv")
    assert any(r.startswith("task topic: train_file: data/topic/train.tsv is not in") for r in setup.reports)


def test_defaults_and_mtl_keys(tmp_path):
    write(tmp_path / "d.txt", "x\n")
    write(tmp_path / "a.yaml", "reader: cfgtest_mlm\ntrain_file: d.txt\n")
    cfg = write(tmp_path / "g.yaml", """\
        task_instance: a
        sampling: temperature
        temperature: 3.33
        examples_cap: 1000
        use_task_id: true
        early_stopping_patience: 3
        use_ema: yes
        ema_decay: 0.999
        """)
    setup = load(cfg)
    (a,) = setup.tasks
    assert (a.is_target, a.mix_ratio, a.reuse_tag, a.batch_size, a.max_seq_len) == (True, 1.0, None, 32, 128)
    m = setup.mtl
    assert (m.sampling, m.temperature, m.examples_cap, m.use_task_id, m.early_stopping_patience, m.use_ema,
            m.ema_decay, m.task_dir) == ("temperature", 3.33, 1000, True, 3, True, 0.999, str(tmp_path))
    assert setup.run_flags == {} and any("no dev_file" in r for r in setup.reports)
    cfg.write_text(cfg.read_text().replace("ema_decay: 0.999", "ema_decay: 1.5"))
    assert problems_of(cfg) == [f"{cfg}: key 'ema_decay': 1.5 is not a number in (0, 1)"]


def test_palm_reader_and_paradigm_names(demo, monkeypatch):
    monkeypatch.setitem(mtl_config.PALM_READERS, "palmcls", "cfgtest_cls")
    monkeypatch.setitem(mtl_config.PALM_PARADIGMS, "cfgtest_cls", ("cfgtest_cls", "cls"))
    senti = demo.parent / "tasks" / "senti.yaml"
    senti.write_text(senti.read_text().replace("reader: cfgtest_cls", "reader: palmcls")
                     .replace("paradigm: cfgtest_cls", "paradigm: cls"))
    setup = load(demo)
    assert setup.tasks[0].reader == "cfgtest_cls"
    assert "task senti: reader palmcls (PALM) is cfgtest_cls" in setup.reports


def test_plugin_registers_a_custom_task_type(tmp_path):
    write(tmp_path / "plugins" / "my_task.py", """\
        from ernie_mtl.tasks.base import Option, TaskType, register_task_type

        @register_task_type("cfgtest_plugin_regression")
        class Regression(TaskType):
            main_metric = "mse"
            higher_is_better = False
            options = {"scale": Option(1.0, "target scale")}
            load = collate = label_feeds = dummy_labels = create_head = head_forward = None
            evaluate = predictions = None
        """)
    write(tmp_path / "data.tsv", "x\n")
    write(tmp_path / "reg.yaml", "reader: cfgtest_plugin_regression\ntrain_file: data.tsv\nscale: 2\n")
    cfg = write(tmp_path / "g.yaml", "task_instance: reg\nplugins: plugins/my_task.py\n")
    setup = load(cfg)
    assert setup.tasks[0].reader == "cfgtest_plugin_regression" and setup.tasks[0].options == {"scale": 2.0}
    assert get_task_type("cfgtest_plugin_regression").main_metric == "mse"
    assert setup.mtl.plugins == (str(tmp_path / "plugins" / "my_task.py"),)
    assert load(cfg).tasks[0].options == {"scale": 2.0}  # loading again does not re-register
    write(tmp_path / "bad.py", "raise RuntimeError('boom')\n")
    cfg.write_text("task_instance: reg\nplugins: [plugins/my_task.py, bad.py]\n")
    assert problems_of(cfg)[0] == f"{cfg}: key 'plugins': importing {tmp_path / 'bad.py'} failed: RuntimeError: boom"
