"""PaddlePALM's extension contract, trained: a user's head, reader and backbone run inside the engine's
programs (ernie_mtl/palm/adaptor.py) on the tiny generated data of examples/palm: their parameters are
in the checkpoints under structured names, their predictions come from their own graph (recomputed
here from the checkpoint's values), PALM's postprocessing hooks get PALM's arguments, a run resumes
exactly (and is refused when the reader cannot be read again the same way), exports, every prediction
path (checkpoint, exported model, live weights during training, predict_one_batch, joint multi-head
prediction), a batch the script built, and two processes training what one process trains."""
import zlib  # noqa: F401  (before paddle)

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import ROOT, launch_logs, logged_losses, ok, run_cli

pytestmark = pytest.mark.slow
ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def ex(tmp_path_factory):
    """examples/palm's tiny data and pretrained tiny ERNIE (prepare_data.py)."""
    root = tmp_path_factory.mktemp("palm_extend") / "examples"
    shutil.copytree(ROOT / "examples" / "palm", root,
                    ignore=shutil.ignore_patterns("data", "outputs", "params", "vocab.txt", "__pycache__"))
    ok(subprocess.run([sys.executable, "prepare_data.py"], cwd=root, env={**os.environ, **ENV}, capture_output=True,
                      text=True, timeout=300))
    return root


def model_files(ex):
    model = ex / "pretrain" / "tiny-ernie"
    return json.loads((model / "ernie_config.json").read_text()), str(model / "vocab.txt"), str(model / "params")


def checkpoint_values(path):
    """{structured name: array} of a checkpoint's parameters."""
    from ernie_mtl.checkpoint import merged_state

    state = merged_state(Path(path))
    name_map = json.loads((Path(path) / "train_state.json").read_text())["name_map"]
    return {k: np.asarray(state[v]) for k, v in name_map.items()}


def state_files(checkpoint):
    return json.loads((Path(checkpoint) / "train_state.json").read_text())["files"]


# -- the user's components -------------------------------------------------------------------------------
def make_components():
    """Classes written as PALM's users write them (paddle imported in the head's module)."""
    import paddle

    from ernie_mtl import palm

    class SentimentHead(palm.head.Head):
        """Two layers on the pooled vector; records what the trainer hands to its hooks."""

        def __init__(self, num_classes, input_dim, phase="train"):
            super().__init__(phase)
            self.num_classes, self.input_dim = num_classes, input_dim
            self.batches, self.epochs = [], []

        @property
        def inputs_attrs(self):
            reader = {"label_ids": [[-1], "int64"]} if self.phase == "train" else {}
            return {"reader": reader, "backbone": {"sentence_embedding": [[-1, self.input_dim], "float32"]}}

        @property
        def outputs_attr(self):
            if self.phase == "train":
                return {"loss": [[1], "float32"]}
            return {"logits": [[-1, self.num_classes], "float32"], "sentence": [[-1, self.input_dim], "float32"]}

        @property
        def epoch_inputs_attrs(self):
            return {"reader": {"examples": None}} if self.phase == "predict" else {}

        def build(self, inputs, scope_name=""):
            sentence = inputs["backbone"]["sentence_embedding"]
            hidden = paddle.static.nn.fc(sentence, 16, activation="tanh",
                                         weight_attr=paddle.ParamAttr(name=scope_name + "hidden_w"),
                                         bias_attr=paddle.ParamAttr(name=scope_name + "hidden_b"))
            logits = paddle.static.nn.fc(hidden, self.num_classes,
                                         weight_attr=paddle.ParamAttr(name=scope_name + "out_w"),
                                         bias_attr=paddle.ParamAttr(name=scope_name + "out_b"))
            if self.phase == "train":
                label = paddle.unsqueeze(inputs["reader"]["label_ids"], -1)
                return {"loss": paddle.mean(paddle.nn.functional.cross_entropy(logits, label))}
            return {"logits": logits, "sentence": sentence}

        def batch_postprocess(self, rt_outputs):
            self.batches.append({k: np.asarray(v) for k, v in rt_outputs.items()})

        def epoch_postprocess(self, post_inputs, output_dir=None):
            self.epochs.append((post_inputs, output_dir))
            if self.phase == "predict":
                return np.concatenate([b["logits"] for b in self.batches])

    class MlpClassify(palm.head.Classify):
        """The built-in classifier's constructor, its own graph."""

        def build(self, inputs, scope_name=""):
            sentence = inputs["backbone"]["sentence_embedding"]
            hidden = paddle.static.nn.fc(sentence, 16, activation="relu",
                                         weight_attr=paddle.ParamAttr(name=scope_name + "mlp_w"),
                                         bias_attr=paddle.ParamAttr(name=scope_name + "mlp_b"))
            logits = paddle.static.nn.fc(hidden, self.num_classes,
                                         weight_attr=paddle.ParamAttr(name=scope_name + "mlp_out_w"),
                                         bias_attr=paddle.ParamAttr(name=scope_name + "mlp_out_b"))
            if self.phase == "train":
                label = paddle.unsqueeze(inputs["reader"]["label_ids"], -1)
                return {"loss": paddle.mean(paddle.nn.functional.cross_entropy(logits, label))}
            return {"logits": logits, "probs": paddle.nn.functional.softmax(logits)}

        @property
        def inputs_attrs(self):
            reader = {"label_ids": [[-1], "int64"]} if self.phase == "train" else {}
            return {"reader": reader, "backbone": {"sentence_embedding": [[-1, self._input_dim], "float32"]}}

    class CharReader(palm.reader.Reader):
        """`label<TAB>text_a` rows, a character per token; `seed` None: another order every pass."""

        def __init__(self, vocab_path, max_len, seed=0, phase="train"):
            super().__init__(phase)
            self._vocab = {w.rstrip("\n"): i for i, w in enumerate(open(vocab_path, encoding="utf-8"))}
            self.vocab_path, self._max_len, self._seed = vocab_path, max_len, seed

        def load_data(self, input_file, batch_size, num_epochs=None, file_format="tsv", shuffle_train=True):
            self._batch_size, self._num_epochs = batch_size, num_epochs
            rows = [line.rstrip("\n").split("\t") for line in open(input_file, encoding="utf-8")][1:]
            self._rows = [(int(label), text) for label, text in rows]

        @property
        def outputs_attr(self):
            return {"token_ids": [[-1, -1], "int64"], "segment_ids": [[-1, -1], "int64"],
                    "input_mask": [[-1, -1, 1], "float32"], "label_ids": [[-1], "int64"]}

        def _iterator(self):
            order = np.arange(len(self._rows))
            if self._phase == "train":
                rng = np.random.RandomState(self._seed) if self._seed is not None else np.random
                order = rng.permutation(order)
            v = self._vocab
            for start in range(0, len(order), self._batch_size):
                rows = [self._rows[i] for i in order[start:start + self._batch_size]]
                ids = [[v["[CLS]"]] + [v.get(c, v["[UNK]"]) for c in text][:self._max_len - 2] + [v["[SEP]"]]
                       for _, text in rows]
                tokens = np.zeros((len(ids), max(map(len, ids))), "int64")
                mask = np.zeros(tokens.shape + (1,), "float32")
                for k, x in enumerate(ids):
                    tokens[k, :len(x)], mask[k, :len(x)] = x, 1.0
                batch = {"token_ids": tokens, "segment_ids": np.zeros_like(tokens), "input_mask": mask}
                if self._phase == "train":
                    batch["label_ids"] = np.array([label for label, _ in rows], "int64")
                yield batch

        @property
        def num_examples(self):
            return len(self._rows)

        def get_epoch_outputs(self):
            return {"examples": list(self._rows)}

    class BagOfWords(palm.backbone.Backbone):
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
            mask = inputs["input_mask"]
            tokens = paddle.static.nn.embedding(inputs["token_ids"], [self.vocab_size, self.hidden],
                                                param_attr=paddle.ParamAttr(name="bow_emb")) * mask
            return {"sentence_embedding": paddle.sum(tokens, axis=1) / paddle.sum(mask, axis=1)}

    return SentimentHead, MlpClassify, CharReader, BagOfWords


def start_step_callback():
    from ernie_mtl import Callback

    class Start(Callback):
        step = None

        def on_train_begin(self, trainer):
            self.step = trainer.step

    return Start()


def numpy_logits(values, group, sentence):
    """The SentimentHead's graph in NumPy with the checkpoint's values of its parameters."""
    hidden = np.tanh(sentence @ values[f"heads.{group}.hidden_w"] + values[f"heads.{group}.hidden_b"])
    return hidden @ values[f"heads.{group}.out_w"] + values[f"heads.{group}.out_b"]


# -- one task --------------------------------------------------------------------------------------------
def test_a_users_head_trains_is_checkpointed_and_predicts_from_its_own_graph(ex, tmp_path):
    from ernie_mtl import palm

    SentimentHead, _, _, _ = make_components()
    config, vocab, params = model_files(ex)
    data = ex / "classification" / "data"
    reader = palm.reader.ClassifyReader(vocab, 64, seed=2)
    reader.load_data(str(data / "train.tsv"), 16, num_epochs=2)
    ernie = palm.backbone.ERNIE.from_config(config)
    reader.register_with(ernie)
    head = SentimentHead(2, config["hidden_size"])
    trainer = palm.Trainer("senti")
    loss = trainer.build_forward(ernie, head)
    trainer.build_backward(palm.optimizer.Adam(loss, 5e-3))
    trainer.fit_reader(reader)
    trainer.load_pretrain(params)
    trainer.set_saver(str(tmp_path / "out"), save_steps=4)
    trainer.configure(device="cpu")
    assert trainer.train(print_steps=2).steps == 8
    assert len(head.batches) == 8 and all(set(b) == {"loss"} for b in head.batches)  # PALM's train(): each step
    first, last = checkpoint_values(tmp_path / "out" / "ckpt.step4"), checkpoint_values(tmp_path / "out" / "model_last")
    own = sorted(k for k in last if k.startswith("heads.senti."))
    assert own == ["heads.senti.hidden_b", "heads.senti.hidden_w", "heads.senti.out_b", "heads.senti.out_w"]
    assert not np.array_equal(first["heads.senti.out_w"], last["heads.senti.out_w"])  # trained

    pred_reader = palm.reader.ClassifyReader(vocab, 64, phase="predict")
    pred_reader.load_data(str(data / "test.tsv"), 8)
    pred_head = SentimentHead(2, config["hidden_size"], phase="predict")
    declared = trainer.build_predict_forward(palm.backbone.ERNIE.from_config(config, phase="predict"), pred_head)
    assert set(declared) == {"senti.logits", "senti.sentence"}
    trainer.fit_reader(pred_reader, phase="predict")
    logits = trainer.predict(output_dir=str(tmp_path / "pred"))  # the final weights of the run
    assert len(pred_head.batches) == 4 and [len(b["logits"]) for b in pred_head.batches] == [8, 8, 8, 8]
    ((post, out_dir),) = pred_head.epochs  # PALM's epoch_postprocess({'reader': ...}, output_dir)
    assert out_dir == str(tmp_path / "pred") and len(post["reader"]["examples"]) == 32
    sentence = np.concatenate([b["sentence"] for b in pred_head.batches])
    np.testing.assert_allclose(logits, numpy_logits(last, "senti", sentence), rtol=1e-4, atol=1e-5)
    one = trainer.predict_one_batch(trainer.get_one_batch("predict"))
    np.testing.assert_allclose(one["logits"], logits[:8], rtol=1e-5, atol=1e-6)

    again = palm.Trainer("senti")  # a prediction script: PALM's build_predict_forward + load_ckpt + predict
    other = SentimentHead(2, config["hidden_size"], phase="predict")
    again.build_predict_forward(palm.backbone.ERNIE.from_config(config, phase="predict"), other)
    again.load_ckpt(str(tmp_path / "out" / "ckpt.step4"))
    again.fit_reader(pred_reader, phase="predict")
    at4 = again.predict()
    sentence_at4 = np.concatenate([b["sentence"] for b in other.batches])
    np.testing.assert_allclose(at4, numpy_logits(first, "senti", sentence_at4), rtol=1e-4, atol=1e-5)
    assert not np.allclose(at4, logits)  # another checkpoint, other predictions


# -- a user's reader and backbone ---------------------------------------------------------------------
def reader_run(ex, out, *, seed=3, pred_head=True, reader_cls=None):
    from ernie_mtl import palm

    SentimentHead, _, CharReader, BagOfWords = make_components()
    _, vocab, _ = model_files(ex)
    size = sum(1 for _ in open(vocab, encoding="utf-8"))
    reader = (reader_cls or CharReader)(vocab, 32, seed=seed)
    reader.load_data(str(ex / "classification" / "data" / "train.tsv"), 16, num_epochs=2)
    t = palm.Trainer("chars")
    loss = t.build_forward(BagOfWords(size, 16), SentimentHead(2, 16))
    if pred_head:  # known before training: built into the run's programs and exported
        t.build_predict_forward(BagOfWords(size, 16, phase="predict"), SentimentHead(2, 16, phase="predict"))
    t.build_backward(palm.optimizer.Adam(loss, 1e-2))
    t.fit_reader(reader)
    t.set_saver(str(out), save_steps=3)
    t.configure(device="cpu")
    return t


def test_a_users_reader_and_backbone_resume_exactly_export_and_a_shuffling_reader_is_refused(ex, tmp_path):
    from ernie_mtl import palm
    from ernie_mtl.config import ConfigError

    SentimentHead, _, CharReader, BagOfWords = make_components()
    whole = reader_run(ex, tmp_path / "whole")
    assert whole.train(print_steps=1).steps == 8
    first = reader_run(ex, tmp_path / "parts")
    for _ in range(4):  # a fourth step is taken but never saved: the resumed run redoes it
        first.train_one_step(first.get_one_batch())
    first.close()
    second = reader_run(ex, tmp_path / "parts")
    second.load_ckpt(str(tmp_path / "parts" / "ckpt.step3"))
    started = start_step_callback()
    second.add_callback(started)
    assert second.train(print_steps=1).steps == 8
    assert started.step == 3  # resumed: the reader's stream is read again from position 3
    assert state_files(tmp_path / "parts" / "model_last") == state_files(tmp_path / "whole" / "model_last")
    assert logged_losses(tmp_path / "parts")["8"] == logged_losses(tmp_path / "whole")["8"]
    values = checkpoint_values(tmp_path / "whole" / "model_last")
    assert "backbone.bow_emb" in values and not any(k.startswith("ernie.") for k in values)

    manifest = json.loads((tmp_path / "whole" / "chars" / "infer_model" / "manifest.json").read_text())
    assert [f["name"] for f in manifest["fetches"]] == ["logits", "sentence"] and manifest["step"] == 8
    assert [f["name"] for f in manifest["feeds"]] == ["input_ids", "input_mask"]  # the backbone reads no segments
    _, vocab, _ = model_files(ex)
    size = sum(1 for _ in open(vocab, encoding="utf-8"))
    results = {}
    for source in ("chars/infer_model", "model_last"):
        pred_reader = CharReader(vocab, 32, phase="predict")
        pred_reader.load_data(str(ex / "classification" / "data" / "test.tsv"), 8)
        t = palm.Trainer("chars")
        t.build_predict_forward(BagOfWords(size, 16, phase="predict"), SentimentHead(2, 16, phase="predict"))
        (t.load_predict_model if source.endswith("infer_model") else t.load_ckpt)(str(tmp_path / "whole" / source))
        t.fit_reader(pred_reader, phase="predict")
        results[source] = t.predict()
    assert results["model_last"].shape == (32, 2)
    np.testing.assert_allclose(results["chars/infer_model"], results["model_last"], rtol=1e-4, atol=1e-5)

    class Shuffling(CharReader):  # another order on every pass: where a run stopped cannot be found again
        pass

    shaky = reader_run(ex, tmp_path / "parts", seed=None, reader_cls=Shuffling)
    shaky.load_ckpt(str(tmp_path / "parts" / "ckpt.step3"))
    with pytest.raises(ConfigError, match=r"reader Shuffling yields other batches on each pass of _iterator\(\) "
                                          r"\(batch 0, field 'token_ids' differs"):
        shaky.train()


# -- several tasks, live weights, joint prediction ---------------------------------------------------
def test_a_classify_subclass_and_live_joint_and_exported_prediction_in_a_multihead_run(ex, tmp_path):
    """MultiHeadTrainer: a built-in tagger and a Classify subclass with its own graph (its predict head known
    before training: exported when the task finishes). The script trains its first step on a batch it
    built itself; predict() during the run uses the weights of that step (the same as the checkpoint of
    the step); after the run, PALM's joint prediction (one program, both heads) predicts what each
    trainer predicts alone, and the exported model what the checkpoint of its step does."""
    from ernie_mtl import palm

    _, MlpClassify, _, _ = make_components()
    config, vocab, params = model_files(ex)
    hidden = config["hidden_size"]
    atis = ex / "multi-task" / "data" / "atis"
    label_map = str(atis / "atis_slot" / "label_map.json")
    slots = len(json.loads(Path(label_map).read_text()))
    slot_reader = palm.reader.SequenceLabelReader(vocab, 64, label_map, seed=0)
    intent_reader = palm.reader.ClassifyReader(vocab, 64, seed=0)
    slot_reader.load_data(str(atis / "atis_slot" / "train.tsv"), batch_size=16)
    intent_reader.load_data(str(atis / "atis_intent" / "train.tsv"), batch_size=16)
    ernie = palm.backbone.ERNIE.from_config(config)
    t_slot, t_intent = palm.Trainer("slot"), palm.Trainer("intent")
    multi = palm.MultiHeadTrainer([t_slot, t_intent])
    t_slot.build_forward(ernie, palm.head.SequenceLabel(slots, hidden))
    t_intent.build_forward(ernie, MlpClassify(26, hidden))
    pred_ernie = palm.backbone.ERNIE.from_config(config, phase="predict")
    t_intent.build_predict_forward(pred_ernie, MlpClassify(26, hidden, phase="predict"))
    loss = multi.build_forward()
    multi.build_backward(palm.optimizer.Adam(loss, 5e-3), weight_decay=0.01)
    multi.fit_readers_with_mixratio([slot_reader, intent_reader], "slot", 2)
    multi.load_pretrain(params)
    multi.set_saver(str(tmp_path / "out"), save_steps=1)
    multi.configure(device="cpu")
    test_intent = palm.reader.ClassifyReader(vocab, 64, phase="predict")
    test_intent.load_data(str(atis / "atis_intent" / "test.tsv"), 16)
    live = None
    for k, batch in enumerate(multi._batches()):
        if k == 0:  # a batch the script built: PALM's dict (the drawn task's fields, prefixed by its name)
            own = {key: np.array(value) for key, value in batch.items()}
            outputs, task_id = multi.train_one_step(own)
            assert task_id in (0, 1) and list(outputs) == [f"{['slot', 'intent'][task_id]}.loss"]
            continue
        multi.train_one_step(batch)
        if k == 5:
            t_intent.fit_reader(test_intent, phase="predict")
            live = t_intent.predict()  # the run's weights after step 6
    assert multi._result.steps == 16
    values = checkpoint_values(tmp_path / "out" / "model_last")
    assert sorted(k for k in values if k.startswith("heads.intent.")) == [
        "heads.intent.mlp_b", "heads.intent.mlp_out_b", "heads.intent.mlp_out_w", "heads.intent.mlp_w"]
    assert "heads.slot.transitions" in values  # the built-in CRF tagger beside it

    def alone(checkpoint, trainer_name="intent", exported=False):
        t = palm.Trainer(trainer_name)
        head = MlpClassify(26, hidden, phase="predict")
        t.build_predict_forward(pred_ernie, head)
        (t.load_predict_model if exported else t.load_ckpt)(str(checkpoint))
        t.fit_reader(test_intent, phase="predict")
        return np.array([r["logits"] for r in t.predict()])

    np.testing.assert_allclose(np.array([r["logits"] for r in live]), alone(tmp_path / "out" / "model_6"),
                               rtol=1e-5, atol=1e-6)
    manifest = json.loads((tmp_path / "out" / "intent" / "infer_model" / "manifest.json").read_text())
    np.testing.assert_allclose(alone(tmp_path / "out" / "intent" / "infer_model", exported=True),
                               alone(tmp_path / "out" / f"model_{manifest['step']}"), rtol=1e-4, atol=1e-5)

    p_slot, p_intent = palm.Trainer("slot"), palm.Trainer("intent")  # PALM's joint_predict.py
    joint = palm.MultiHeadTrainer([p_slot, p_intent])
    p_intent.build_predict_forward(pred_ernie, MlpClassify(26, hidden, phase="predict"))
    p_slot.build_predict_forward(pred_ernie, palm.head.SequenceLabel(slots, hidden, phase="predict"))
    joint.build_predict_forward()
    joint.load_ckpt(str(tmp_path / "out" / "ckpt.step16"))
    test_slot = palm.reader.SequenceLabelReader(vocab, 64, label_map, phase="predict")
    test_slot.load_data(str(atis / "atis_slot" / "test.tsv"), 16)
    iterator = joint.merge_inference_readers([test_slot, test_intent])
    intent = np.concatenate([joint.predict_one_batch("intent", b)["logits"] for b in iterator("intent")])
    tags = [joint.predict_one_batch("slot", b)["tags"] for b in iterator("slot")]
    assert sum(len(t) for t in tags) == 32
    np.testing.assert_allclose(intent, alone(tmp_path / "out" / "model_last"), rtol=1e-5, atol=1e-6)


def test_the_files_order_and_palms_task_embedding(ex, tmp_path):
    """load_data(shuffle_train=False) trains on the file's order; ERNIE(use_task_emb=True) adds the task
    embedding (PALM's arguments, refused before)."""
    from ernie_mtl import palm

    config, vocab, _ = model_files(ex)
    reader = palm.reader.ClassifyReader(vocab, 64, seed=5)
    reader.load_data(str(ex / "classification" / "data" / "train.tsv"), 16, shuffle_train=False)
    ernie = palm.backbone.ERNIE.from_config({**config, "use_task_emb": True})
    t = palm.Trainer("ordered")
    loss = t.build_forward(ernie, palm.head.Classify(2, config["hidden_size"]))
    t.build_backward(palm.optimizer.Adam(loss, 1e-3))
    t.fit_reader(reader)
    t.set_saver(str(tmp_path / "out"), save_steps=10)
    t.configure(device="cpu")
    batches = [t.get_one_batch()]
    t.train_one_step(batches[0])
    batches.append(t.get_one_batch())
    in_file_order = list(reader._iterator())
    for got, want in zip(batches, in_file_order):
        np.testing.assert_array_equal(got["token_ids"], want["token_ids"])
    assert any("task_type_embeddings" in k for k in t._live_run().trainer.programs.name_map)
    test = palm.reader.ClassifyReader(vocab, 64, phase="predict")  # evaluation with the weights of step 1
    test.load_data(str(ex / "classification" / "data" / "test.tsv"), 8)
    t.build_predict_forward(palm.backbone.ERNIE.from_config({**config, "use_task_emb": True}, phase="predict"),
                            palm.head.Classify(2, config["hidden_size"], phase="predict"))
    t.fit_reader(test, phase="predict")
    records = t.predict()
    gold = [int(line.split("\t")[0]) for line in open(test.input_file, encoding="utf-8").read().splitlines()[1:]]
    assert t.evaluate()["acc"] == np.mean([r["label"] == g for r, g in zip(records, gold)])
    t.close()


# -- two processes ---------------------------------------------------------------------------------------
SCRIPT = '''
import paddle  # first, as a PALM user's script does
import json
import numpy as np
from ernie_mtl import palm

{components}

SentimentHead, _, CharReader, BagOfWords = make_components()
vocab = {vocab!r}
size = sum(1 for _ in open(vocab, encoding="utf-8"))
reader = CharReader(vocab, 32, seed=4)
reader.load_data({train!r}, 8, num_epochs=2)
t = palm.Trainer("chars")
loss = t.build_forward(BagOfWords(size, 16), SentimentHead(2, 16))
t.build_backward(palm.optimizer.Adam(loss, 1e-2))
t.fit_reader(reader)
t.set_saver({out!r}, save_steps=100)
t.configure(device="cpu", **json.loads({flags!r}))
print("steps", t.train(print_steps=1).steps)
'''


def test_two_processes_train_a_users_reader_and_head_as_one_process_with_the_same_global_batch(ex, tmp_path):
    """Every rank runs the script (its own reader, seeded alike); each reads its slots of the batch stream.
    One process accumulating two micro-batches per step trains the same: the same per-step losses and
    parameters, up to the order of a two-term float sum (all-reduce vs accumulation)."""
    _, vocab, _ = model_files(ex)
    train = str(ex / "classification" / "data" / "train.tsv")
    import inspect

    components = inspect.getsource(make_components)
    runs = {}
    for name, procs, flags in (("two", 2, {}), ("one", 0, {"global_batch_size": 16, "micro_batch_size": 8})):
        script = tmp_path / f"{name}.py"
        script.write_text(SCRIPT.format(components=components, vocab=vocab, train=train, out=str(tmp_path / name),
                                        flags=json.dumps(flags)), encoding="utf-8")
        proc = run_cli([], entry=script, cwd=tmp_path, launch_procs=procs, log_dir=tmp_path / f"{name}_logs", env=ENV)
        assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-2000:], launch_logs(tmp_path / f"{name}_logs"))
        runs[name] = tmp_path / name
    assert json.loads((runs["two"] / "model_last" / "train_state.json").read_text())["step"] == 8  # 64 rows / 8 / 2
    two, one = checkpoint_values(runs["two"] / "model_last"), checkpoint_values(runs["one"] / "model_last")
    assert sorted(two) == sorted(one) and "heads.chars.out_w" in two and "backbone.bow_emb" in two
    for key in two:
        np.testing.assert_allclose(two[key], one[key], rtol=1e-5, atol=1e-6, err_msg=key)
    losses_two, losses_one = logged_losses(runs["two"]), logged_losses(runs["one"])
    assert losses_two.keys() == losses_one.keys() and len(losses_two) == 8
