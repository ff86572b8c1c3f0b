"""PaddlePALM's extension contract on the engine, without training: user-defined heads, readers and
backbones keep PALM's methods, become one `palm` task bound to the script's objects, are refused with
the reason where a feature cannot apply, and are built into the engine's programs under sharding,
accumulation, AMP and idle-head freezing (the program a GPU rank would run, built on CPU). Also PALM's
1.x keys, the Controller's command-line overrides and the prediction device.
(Training with them: tests/e2e/test_palm_extend.py.)"""
import zlib  # noqa: F401  (before paddle)

import functools
import json
import os

import numpy as np
import pytest

from ernie_mtl import palm
from ernie_mtl.config import ConfigError

SPECIALS = ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"]
CHARS = list("好坏的了是在我有")
CONFIG = {"attention_probs_dropout_prob": 0.1, "hidden_act": "relu", "hidden_dropout_prob": 0.1, "hidden_size": 32,
          "initializer_range": 0.02, "max_position_embeddings": 64, "num_attention_heads": 2,
          "num_hidden_layers": 2, "sent_type_vocab_size": 2, "vocab_size": len(SPECIALS) + len(CHARS)}


@pytest.fixture
def files(tmp_path):
    (tmp_path / "vocab.txt").write_text("\n".join(SPECIALS + CHARS) + "\n", encoding="utf-8")
    (tmp_path / "cls.tsv").write_text("label\ttext_a\n" + "".join(f"{i % 2}\t{'好' if i % 2 else '坏'}的了\n"
                                                                  for i in range(20)), encoding="utf-8")
    (tmp_path / "seq.tsv").write_text("text_a\tlabel\n" + "好\x02坏\tB-X\x02I-X\n" * 10, encoding="utf-8")
    (tmp_path / "label_map.json").write_text(json.dumps({"B-X": 0, "I-X": 1, "O": 2}))
    return tmp_path


class Sentiment(palm.head.Head):
    """A PALM head: its parameters named from scope_name, an extra layer the built-in heads do not have."""

    def __init__(self, input_dim, phase="train"):
        super().__init__(phase)
        self.input_dim = input_dim

    @property
    def inputs_attrs(self):
        reader = {"label_ids": [[-1], "int64"]} if self.phase == "train" else {}
        return {"reader": reader, "backbone": {"sentence_embedding": [[-1, self.input_dim], "float32"]}}

    def build(self, inputs, scope_name=""):
        import paddle

        hidden = paddle.static.nn.fc(inputs["backbone"]["sentence_embedding"], 8, activation="relu")
        logits = paddle.static.nn.fc(hidden, 2, weight_attr=paddle.ParamAttr(name=scope_name + "out_w"),
                                     bias_attr=paddle.ParamAttr(name=scope_name + "out_b"))
        if self.phase == "train":
            label = paddle.unsqueeze(inputs["reader"]["label_ids"], -1)
            return {"loss": paddle.mean(paddle.nn.functional.cross_entropy(logits, label))}
        return {"logits": logits}


class PalmStyle(palm.head.Head):
    """Written like PALM's own heads: no call to Head.__init__, `_is_training` instead."""

    def __init__(self, phase="train"):
        self._is_training = phase == "train"


class OwnClassify(palm.head.Classify):
    """A built-in head whose subclass builds its own graph."""

    def build(self, inputs, scope_name=""):
        import paddle

        logits = paddle.static.nn.fc(inputs["backbone"]["sentence_embedding"], self.num_classes,
                                     weight_attr=paddle.ParamAttr(name=scope_name + "own_w"))
        if self.phase == "train":
            label = paddle.unsqueeze(inputs["reader"]["label_ids"], -1)
            return {"loss": paddle.mean(paddle.nn.functional.cross_entropy(logits, label))}
        return {"logits": logits}


class Rows(palm.reader.Reader):
    """A PALM reader over (token ids, label) rows, seeded order."""

    def __init__(self, rows, seed=0, phase="train", vocab_path=None):
        super().__init__(phase)
        self.rows, self.seed, self.vocab_path = rows, seed, vocab_path

    def load_data(self, input_file, batch_size, num_epochs=None, file_format="tsv", shuffle_train=True):
        pass  # PALM asks load_data to set the batch size: the base records it when a reader does not

    @property
    def outputs_attr(self):
        return {"token_ids": [[-1, -1], "int64"], "input_mask": [[-1, -1, 1], "float32"], "label_ids": [[-1], "int64"]}

    def _iterator(self):
        order = np.random.RandomState(self.seed).permutation(len(self.rows)) if self.seed is not None else \
            np.random.permutation(len(self.rows))
        for start in range(0, len(order), self.batch_size):
            picked = [self.rows[i] for i in order[start:start + self.batch_size]]
            ids = np.array([ids for ids, _ in picked], dtype="int64")
            yield {"token_ids": ids, "input_mask": np.ones(ids.shape + (1,), "float32"),
                   "label_ids": np.array([label for _, label in picked], "int64")}

    @property
    def num_examples(self):
        return len(self.rows)


class Bow(palm.backbone.Backbone):
    def __init__(self, vocab_size, hidden, phase="train"):
        super().__init__(phase)
        self.vocab_size, self.hidden = vocab_size, hidden

    @property
    def inputs_attr(self):
        return {"token_ids": [[-1, -1], "int64"], "input_mask": [[-1, -1, 1], "float32"]}

    @property
    def outputs_attr(self):
        return {"sentence_embedding": [[-1, self.hidden], "float32"]}

    def build(self, inputs, scope_name=""):
        import paddle

        emb = paddle.static.nn.embedding(inputs["token_ids"], [self.vocab_size, self.hidden],
                                         param_attr=paddle.ParamAttr(name="bow_emb"))
        return {"sentence_embedding": paddle.mean(emb * inputs["input_mask"], axis=1)}


ROWS = [([1, 5 + i % 8, 5 + (i * 3) % 8, 2], i % 2) for i in range(12)]


def trainer_of(files, head, *, reader=None, backbone=None, name="senti", tmp=None):
    if reader is None:
        reader = palm.reader.ClassifyReader(str(files / "vocab.txt"), 16, seed=3)
        reader.load_data(str(files / "cls.tsv"), 4, num_epochs=1)
    backbone = backbone or palm.backbone.ERNIE.from_config(CONFIG)
    t = palm.Trainer(name)
    loss = t.build_forward(backbone, head)
    t.build_backward(palm.optimizer.Adam(loss, 1e-3))
    t.fit_reader(reader)
    if tmp is not None:
        t.set_saver(str(tmp / "out"), save_steps=2)
    return t


# -- the contract ---------------------------------------------------------------------------------------
def test_heads_keep_palms_contract_and_a_subclass_of_a_builtin_head_runs_its_own_build(tmp_path):
    from ernie_mtl.palm.head import phase_of, postprocesses_itself, runs_own_build

    assert phase_of(PalmStyle("predict")) == "predict" and phase_of(PalmStyle()) == "train"
    head = Sentiment(32, phase="predict")
    kept = head.batch_postprocess({"logits": np.eye(2), "ids": np.array([7, 8])})  # PALM's default: a record per row
    assert [r["ids"] for r in kept] == [7, 8] and len(head.get_results()) == 2
    head.get_results()[0]["ids"] = 0  # a copy
    assert head.get_results()[0]["ids"] == 7
    head.epoch_postprocess(None, output_dir=str(tmp_path / "out"))
    assert len((tmp_path / "out" / "predict").read_text().splitlines()) == 2  # PALM's file: <output_dir>/<phase>
    with pytest.raises(NotImplementedError, match="PalmStyle.build"):
        PalmStyle().build({})
    assert not runs_own_build(palm.head.Classify(2, 32)) and runs_own_build(OwnClassify(2, 32))
    assert runs_own_build(Sentiment(32))

    class Printing(palm.head.Classify):  # a built-in graph, its own postprocessing
        def batch_postprocess(self, rt_outputs):
            return None

    assert not runs_own_build(Printing(2, 32)) and postprocesses_itself(Printing(2, 32))
    with pytest.raises(ValueError, match="PalmStyle does not implement build"):
        palm.Trainer("x").build_forward(palm.backbone.ERNIE.from_config(CONFIG), PalmStyle())


def test_readers_and_backbones_keep_palms_contract():
    from ernie_mtl.palm.adaptor import BatchStream, batches_per_pass, check_deterministic

    reader = Rows(ROWS, seed=1)
    reader.load_data(__file__, 5)  # the base records what a reader's load_data did not
    assert reader.batch_size == 5 and reader.__dict__["_input_file"] == os.path.abspath(__file__)
    assert batches_per_pass(reader) == 3  # ceil(12 / 5)
    first_pass = [b["label_ids"].tolist() for b in reader._iterator()]
    stream = BatchStream(reader, "t")
    assert [stream.batch(p)["label_ids"].tolist() for p in range(6)] == first_pass * 2  # passes follow each other
    assert stream.batch(1)["label_ids"].tolist() == first_pass[1]  # asked for an earlier position: starts over
    assert check_deterministic(reader) is None
    shaky = Rows(ROWS, seed=None)
    shaky.load_data(__file__, 5)
    assert "differs between two passes" in check_deterministic(shaky, batches=3)
    with pytest.raises(NotImplementedError, match="Rows2._iterator"):
        type("Rows2", (palm.reader.Reader,), {})()._iterator()
    with pytest.raises(NotImplementedError, match="Bare.build"):
        type("Bare", (palm.backbone.Backbone,), {})().build({})
    assert palm.backbone.ERNIE.from_config({**CONFIG, "use_task_emb": True}).flags()["use_task_id"] is True
    assert "use_task_id" not in palm.backbone.ERNIE.from_config(CONFIG).flags()
    with pytest.raises(ValueError, match="BERT has no task embedding"):
        palm.backbone.BERT.from_config({**CONFIG, "type_vocab_size": 2}).__class__(
            32, 2, 2, 13, 64, 2, "relu", 0.1, 0.1, 0.02, use_task_emb=True)


# -- the configuration ----------------------------------------------------------------------------------
def test_a_users_head_reader_or_backbone_is_one_palm_task_bound_in_this_process(files, tmp_path):
    from ernie_mtl.config import TaskSpec
    from ernie_mtl.palm.adaptor import BINDINGS, PalmTask
    from ernie_mtl.tasks.base import TaskContext

    cfg = trainer_of(files, Sentiment(32), tmp=tmp_path).to_config()
    keys = cfg["tasks"]["senti"]
    assert keys["reader"] == "palm" and keys["binding"] == "senti" and keys["train_file"] == str(files / "cls.tsv")
    components = json.loads(keys["components"])
    assert components["head"].endswith(".Sentiment") and components["inner"] == "cls"  # the built-in reader reads
    assert "num_workers" not in cfg and BINDINGS["senti"].head.__class__ is Sentiment
    assert BINDINGS["senti"].scope == "senti."  # PALM's scope_name: the task's name
    reader = Rows(ROWS, seed=1, vocab_path=str(files / "vocab.txt"))
    reader.load_data(str(files / "cls.tsv"), 4)
    cfg = trainer_of(files, Sentiment(16), reader=reader, backbone=Bow(13, 16), name="rows").to_config()
    keys = cfg["tasks"]["rows"]
    assert (keys["batch_size"], cfg["num_workers"], json.loads(keys["components"])["backbone"].endswith(".Bow")) == (
        1, 0, True)  # one reader batch per micro-batch; the reader runs in the training process
    assert cfg["model_name_or_path"] == "ernie-tiny-test"  # never built: the backbone replaces ERNIE
    plain = trainer_of(files, palm.head.Classify(2, 32)).to_config()
    assert plain["tasks"]["senti"]["reader"] == "cls"  # built-in heads and readers stay the engine's task types
    spec = TaskSpec(name="gone", reader="palm", index=0, options={"binding": "nobody", "components": "{...}"})
    with pytest.raises(ConfigError, match="exist only in the process of that script"):
        PalmTask(spec, TaskContext(vocab_file=str(files / "vocab.txt"), seed=0))


def test_what_cannot_apply_is_refused_with_the_reason(files, tmp_path):
    class Wrong(Sentiment):
        @property
        def inputs_attrs(self):
            return {"reader": {"start_positions": [[-1], "int64"]}, "backbone": {"pooled": [[-1, 32], "float32"]}}

    t = trainer_of(files, Wrong(32))
    with pytest.raises(ConfigError, match=r"inputs\['backbone'\] \['pooled'\], which backbone ERNIE does not output"):
        t.to_config()

    class WrongField(Sentiment):
        @property
        def inputs_attrs(self):
            return {"reader": {"start_positions": [[-1], "int64"]}, "backbone": {}}

    with pytest.raises(ConfigError, match=r"inputs\['reader'\] \['start_positions'\], which reader ClassifyReader does "
                                          r"not give \(it gives \[.*'label_ids'"):
        trainer_of(files, WrongField(32)).to_config()
    reader = Rows(ROWS, seed=1, vocab_path=str(files / "vocab.txt"))
    reader.load_data(str(files / "cls.tsv"), 4)
    bow = trainer_of(files, palm.head.Classify(2, 16), reader=reader, backbone=Bow(13, 16))
    bow.load_pretrain(str(files))
    bow.configure(use_recompute=True, num_workers=2)
    with pytest.raises(ConfigError) as e:
        bow.to_config()
    text = str(e.value)
    assert "load_pretrain" in text and "user-defined Bow, which initialises its own parameters" in text
    assert "use_recompute" in text and "num_workers 2" in text
    seq = trainer_of(files, palm.head.SequenceLabel(3, 16), reader=reader, backbone=Bow(13, 16))
    with pytest.raises(ConfigError, match="a user-defined reader .* feeds a head that builds its own graph"):
        seq.to_config()
    mlm = trainer_of(files, palm.head.MaskLM(16, 13, "relu"), backbone=Bow(13, 16))
    with pytest.raises(ConfigError, match="MaskLM ties its output layer to ERNIE/BERT's word embedding"):
        mlm.to_config()
    mixed = trainer_of(files, Sentiment(32))
    mixed.build_predict_forward(palm.backbone.ERNIE.from_config(CONFIG, phase="predict"),
                                palm.head.Classify(2, 32, phase="predict"))
    with pytest.raises(ConfigError, match="one builds its own graph, the other is built in"):
        mixed.to_config()
    nowhere = Rows(ROWS, seed=1, vocab_path=str(files / "vocab.txt"))
    nowhere.load_data(None, 4)
    with pytest.raises(ConfigError, match="load_data's input_file None is not an existing file"):
        trainer_of(files, Sentiment(16), reader=nowhere, backbone=Bow(13, 16)).to_config()


# -- the programs -----------------------------------------------------------------------------------
def build_gpu_program(tasks, *, rank=0, sharding=1, acc=1, amp=None):
    from ernie_mtl.config import AmpConfig, ModelConfig, OptimConfig, ParallelConfig
    from ernie_mtl.dist.compat import emulate_gpu_program
    from ernie_mtl.dist.topology import Topology, build_strategy
    from ernie_mtl.program.builder import build_programs

    parallel = ParallelConfig(use_sharding=sharding > 1, sharding_degree=sharding, micro_batch_size=4,
                              global_batch_size=4 * 2 * acc)
    amp_cfg = AmpConfig(use_amp=True, amp_level=amp) if amp else AmpConfig()
    model = ModelConfig(model_name_or_path="ernie-tiny-test", vocab_size=len(SPECIALS) + len(CHARS))
    optim = OptimConfig(max_lr=1e-3, min_lr=1e-4, max_steps=20, warmup_rate=0.1, weight_decay=0.01)
    topo = Topology.from_config(parallel, 2)
    with emulate_gpu_program(rank, 2):
        return build_programs(model, optim, functools.partial(build_strategy, topo, parallel, amp_cfg), topo, tasks,
                              seed=1, amp_cfg=amp_cfg)


def engine_tasks(files, head, *, backbone=None):
    """The engine's tasks of a PALM run: the user's head on a ClassifyReader, and a built-in tagger."""
    from ernie_mtl.config import TaskSpec
    from ernie_mtl.tasks.base import TaskContext, get_task_type

    t = trainer_of(files, head, backbone=backbone)
    cfg = t.to_config()  # binds the head in this process
    keys = dict(cfg["tasks"]["senti"])
    cls = get_task_type(keys["reader"])
    options = {k: o.default for k, o in cls.options.items()}
    options.update({k: v for k, v in keys.items() if k in cls.options})
    ctx = TaskContext(vocab_file=str(files / "vocab.txt"), seed=0, log=lambda s: None)
    mine = cls(TaskSpec(name="senti", reader=keys["reader"], index=0, train_file=keys["train_file"], batch_size=4,
                        max_seq_len=16, options=options), ctx)
    seq = get_task_type("seq_label")
    options = {k: o.default for k, o in seq.options.items()}
    options.update(label_map=str(files / "label_map.json"), use_crf=True)
    tagger = seq(TaskSpec(name="tags", reader="seq_label", index=1, train_file=str(files / "seq.tsv"), batch_size=4,
                          max_seq_len=16, options=options), ctx)
    return [mine, tagger]


@pytest.mark.parametrize("sharding, acc, amp", [(1, 1, None), (2, 2, "O1"), (1, 2, "O2")])
def test_a_users_head_is_built_trained_frozen_and_checkpointed_under_every_topology(files, sharding, acc, amp,
                                                                                     static_mode):
    """The user's `build` is in the program the run trains (its parameters, named from scope_name, under
    `heads.senti.*`), its parameters form the task's idle group (frozen when only the tagger is drawn;
    the build checks that the freeze covers their whole optimizer state), and AMP and sharding rewrite
    the program around it; its names follow PALM's decay rule."""
    for rank in range(2 if sharding > 1 else 1):
        p = build_gpu_program(engine_tasks(files, Sentiment(32)), rank=rank, sharding=sharding, acc=acc, amp=amp)
        heads = {k: v for k, v in p.name_map.items() if k.startswith("heads.senti.")}
        assert heads["heads.senti.out_w"] == "senti.out_w" and heads["heads.senti.out_b"] == "senti.out_b"
        assert heads["heads.senti.fc_0.w_0"] == "senti.senti.fc_0.w_0"  # PALM's unique_name.guard(scope) names
        groups = {g.name: set(g.params) for g in p.freeze.groups}
        assert set(heads.values()) <= groups["senti"] and not set(heads.values()) & groups["tags"]
        assert "senti.out_b" in p.fwd.no_decay and "senti.out_w" not in p.fwd.no_decay  # PALM's rule by name
        types = [op.type for block in p.main.blocks for op in block.ops]
        reads = {n for block in p.main.blocks for op in block.ops for n in op.input_arg_names}
        assert any(n.split(".cast_")[0] == "senti.out_w" for n in reads)  # the head's own graph computes the loss
        if amp:
            assert "check_finite_and_unscale" in types and "cast" in types
        if sharding > 1:
            assert "c_broadcast" in types and "c_reduce_sum" in types


def test_a_subclass_overriding_build_replaces_the_builtin_classifier(files, static_mode):
    """Fails when a custom `build` is ignored: the built-in classifier's parameters (`heads.senti.weight`,
    a paddle Linear) would be there instead of the subclass's `own_w`."""
    p = build_gpu_program(engine_tasks(files, OwnClassify(2, 32)))
    heads = sorted(k for k in p.name_map if k.startswith("heads.senti."))
    assert heads == ["heads.senti.fc_0.b_0", "heads.senti.own_w"]
    builtin = build_gpu_program(engine_tasks(files, palm.head.Classify(2, 32)))
    assert sorted(k for k in builtin.name_map if k.startswith("heads.senti.")) == ["heads.senti.bias",
                                                                                  "heads.senti.weight"]


def test_a_users_backbone_replaces_ernie_in_the_program(files, static_mode):
    p = build_gpu_program(engine_tasks(files, Sentiment(16), backbone=Bow(13, 16))[:1])
    assert [k for k in p.name_map if not k.startswith("heads.")] == ["backbone.bow_emb"]
    assert not any(k.startswith("ernie.") for k in p.name_map) and p.fwd.recompute_checkpoints == []


# -- prediction's device, PALM 1.x ------------------------------------------------------------------------
def test_prediction_runs_on_the_builds_device(monkeypatch):
    import paddle

    from ernie_mtl.palm.predictor import prediction_place

    assert isinstance(prediction_place(), paddle.CPUPlace)  # this CPU build
    monkeypatch.setattr(paddle, "is_compiled_with_cuda", lambda: True)
    monkeypatch.setattr(paddle.device.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(paddle, "CUDAPlace", lambda i: ("gpu", i))
    monkeypatch.setenv("FLAGS_selected_gpus", "1")
    assert prediction_place() == ("gpu", 1)  # a GPU build predicts on its GPU, as PALM did
    assert isinstance(prediction_place("cpu"), paddle.CPUPlace) and prediction_place("gpu:0") == ("gpu", 0)
    monkeypatch.setattr(paddle.device.cuda, "device_count", lambda: 0)
    assert isinstance(prediction_place(), paddle.CPUPlace)


def test_palm_1x_keys_and_the_controllers_command_line(tmp_path):
    """PALM's PyPI DEMO2 task file as written (pred_output_path) with PALM 1.x's reader keys, and
    `python demo.py --learning_rate 3e-5` overriding the global YAML."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.json").write_text("{}")
    (tmp_path / "vocab.txt").write_text("\n".join(SPECIALS + CHARS) + "\n", encoding="utf-8")
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "mrqa.yaml").write_text(
        "train_file: data/train.json\npred_file: data/train.json\npred_output_path: 'mrqa_output'\nreader: mrc\n"
        "paradigm: mrc\ndoc_stride: 128\nmax_query_len: 64\nmax_answer_len: 30\nn_best_size: 20\nshuffle: false\n"
        "print_first_n: 3\npred_batch_size: 7\n")
    (tmp_path / "config.yaml").write_text(
        "task_instance: mrqa\nsave_path: out\nbackbone: ernie\npretrain_model_path: ernie-tiny-test\n"
        f"vocab_path: {tmp_path / 'vocab.txt'}\nmax_seq_len: 64\nbatch_size: 4\nepoch: 2\noptimizer: adam\n"
        "learning_rate: 5e-5\nvocab_size: 13\n")
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        cfg = palm.Controller("config.yaml", task_dir="tasks", argv=["--learning_rate", "3e-5"])._load([])
        (spec,) = cfg.setup.tasks
        assert cfg.optim.max_lr == 3e-5 and cfg.setup.mtl.num_epochs == 2.0
        assert (spec.shuffle, spec.pred_batch_size, spec.pred_output_path) == (False, 7, "mrqa_output")
        assert any("print_first_n is accepted and not used" in r for r in cfg.setup.reports)
        assert "shuffle" in spec.to_json() and "shuffle" not in cfg.setup.tasks[0].__class__(
            name="x", reader="cls", index=0).to_json()  # records written before the keys compare equal
        with pytest.raises(ConfigError, match="learnin_rate"):
            palm.Controller("config.yaml", task_dir="tasks", argv=["--learnin_rate", "3e-5"])._load([])
    finally:
        os.chdir(cwd)
