"""The PALM face's components and the configuration its calls amount to (ernie_mtl/palm), without
training: readers count and check like PALM's, heads and backbones become task options and flags,
schedules become the engine's warm-up/decay, trainers assemble one engine configuration; misuse gets
one clear error. (Training through it: tests/e2e/test_palm.py.)"""
import zlib  # noqa: F401  (before paddle)

import json

import pytest

from ernie_mtl import palm
from ernie_mtl.config import ConfigError
from ernie_mtl.palm.run_config import KEEP_ALL
from ernie_mtl.palm.trainer import task_name

SPECIALS = ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"]
CONFIG = {"attention_probs_dropout_prob": 0.1, "hidden_act": "relu", "hidden_dropout_prob": 0.05, "hidden_size": 32,
          "initializer_range": 0.02, "max_position_embeddings": 512, "num_attention_heads": 2,
          "num_hidden_layers": 2, "sent_type_vocab_size": 2, "vocab_size": 64}


@pytest.fixture
def files(tmp_path):
    (tmp_path / "vocab.txt").write_text("\n".join(SPECIALS + list("好坏的了是在我有") + ["a", "b", "c"]) + "\n",
                                        encoding="utf-8")
    (tmp_path / "cls.tsv").write_text("label\ttext_a\n" + "".join(f"{i % 2}\t{'好' if i % 2 else '坏'}的了\n"
                                                                  for i in range(20)), encoding="utf-8")
    (tmp_path / "pair.tsv").write_text("label\ttext_a\ttext_b\n1\ta\tb\n0\tb\tc\n", encoding="utf-8")
    (tmp_path / "seq.tsv").write_text("text_a\tlabel\n" + "a\x02b\tB-X\x02I-X\n" * 10, encoding="utf-8")
    (tmp_path / "label_map.json").write_text(json.dumps({"B-X": 0, "I-X": 1, "O": 2}))
    return tmp_path


def cls_setup(files, name="sentiment", seed=3, epochs=2):
    reader = palm.reader.ClassifyReader(str(files / "vocab.txt"), 16, seed=seed)
    reader.load_data(str(files / "cls.tsv"), 4, num_epochs=epochs)
    ernie = palm.backbone.ERNIE.from_config(CONFIG)
    reader.register_with(ernie)
    trainer = palm.Trainer(name)
    loss = trainer.build_forward(ernie, palm.head.Classify(2, 32, 0.2))
    return trainer, reader, ernie, loss


def test_readers_count_like_palm_and_keep_its_constructors(files):
    reader = palm.reader.ClassifyReader(str(files / "vocab.txt"), 16, seed=1)
    with pytest.raises(RuntimeError, match="load_data"):
        reader.num_examples
    reader.load_data(str(files / "cls.tsv"), 4, num_epochs=3)
    assert (reader.num_examples, reader.num_epochs) == (20, 3)
    ernie = palm.backbone.ERNIE.from_config(CONFIG)
    reader.register_with(ernie)
    assert set(reader.outputs_attr) == {"token_ids", "position_ids", "segment_ids", "input_mask", "task_ids",
                                        "label_ids"}
    pairs = palm.reader.ClassifyReader(str(files / "vocab.txt"), 16, phase="predict")
    pairs.load_data(str(files / "pair.tsv"), 2)
    assert pairs.engine_type() == "match" and pairs.task_keys()["pred_file"] == str(files / "pair.tsv")
    seq = palm.reader.SequenceLabelReader(str(files / "vocab.txt"), 16, str(files / "label_map.json"))
    seq.load_data(str(files / "seq.tsv"), 5)
    assert seq.num_examples == 10 and seq.task_keys()["label_map"] == str(files / "label_map.json")
    with pytest.raises(ValueError, match="lang 'fr'"):
        palm.reader.ClassifyReader(str(files / "vocab.txt"), 16, lang="fr")
    with pytest.raises(ValueError, match="phase 'eval'"):
        palm.reader.ClassifyReader(str(files / "vocab.txt"), 16, phase="eval")
    ordered = palm.reader.ClassifyReader(str(files / "vocab.txt"), 16, seed=1)
    ordered.load_data(str(files / "cls.tsv"), 4, shuffle_train=False)  # PALM's argument: the file's order
    assert ordered.task_keys()["shuffle"] is False and "shuffle" not in reader.task_keys()
    with pytest.raises(ConfigError, match="no such file"):
        reader.load_data(str(files / "nope.tsv"), 4)
    bad = files / "bad.tsv"
    bad.write_text("label\ttext_a\nx\t好\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"bad.tsv:2: label 'x' is not a class id"):
        reader.load_data(str(bad), 4)  # read at once, as PALM did, by the engine's reader


def test_backbones_become_architecture_flags(files):
    ernie = palm.backbone.ERNIE.from_config(CONFIG)
    assert ernie.flags() == {"model_type": "ernie", "hidden_size": 32, "num_hidden_layers": 2,
                             "num_attention_heads": 2, "vocab_size": 64, "max_position_embeddings": 512,
                             "type_vocab_size": 2, "hidden_act": "relu", "intermediate_size": 128,
                             "hidden_dropout_prob": 0.05, "attention_probs_dropout_prob": 0.1}
    bert = palm.backbone.BERT.from_config({**CONFIG, "type_vocab_size": 2, "intermediate_size": 96})
    assert bert.flags()["model_type"] == "bert" and bert.flags()["intermediate_size"] == 96
    assert "task_ids" not in bert.inputs_attr and "task_ids" in ernie.inputs_attr
    with pytest.raises(KeyError, match="hidden_act"):
        palm.backbone.ERNIE.from_config({k: v for k, v in CONFIG.items() if k != "hidden_act"})
    with pytest.raises(ValueError, match="not divisible"):
        palm.backbone.ERNIE.from_config({**CONFIG, "num_attention_heads": 3})


def test_schedules_are_the_engines_warmup_and_decay():
    assert palm.lr_sched.TriangularSchedualer(10, 100).flags(1e-3) == {"warmup_steps": 10, "decay_steps": 100,
                                                                       "min_lr": 0.0}
    assert palm.lr_sched.WarmupSchedualer(5).flags(1e-3) == {"warmup_steps": 5, "min_lr": 1e-3}  # then constant
    assert palm.lr_sched.TriangularScheduler is palm.lr_sched.TriangularSchedualer
    with pytest.raises(ValueError, match="num_train_steps > warmup_steps > 0"):
        palm.lr_sched.TriangularSchedualer(0, 9)
    assert palm.optimizer.Adam(None, 1e-3).flags()["min_lr"] == 1e-3  # no schedule: a constant rate
    assert palm.optimizer.Adam(None, 1e-3).flags()["grad_clip"] == 0.0  # PALM did not clip
    assert palm.optimizer.Adam(None, 1e-3, grad_clip=1.0).flags()["grad_clip"] == 1.0


def test_a_trainer_is_one_engine_configuration(files, tmp_path):
    trainer, reader, ernie, loss = cls_setup(files, name="Chn Senti Corp")
    assert task_name("Chn Senti Corp") == "Chn_Senti_Corp" and loss.names == ["Chn_Senti_Corp"]
    adam = palm.optimizer.Adam(loss, 5e-5, palm.lr_sched.TriangularSchedualer(2, 10))
    with pytest.raises(ConfigError, match=r"fit_reader\(reader\)"):
        trainer.to_config()
    trainer.build_backward(optimizer=adam, weight_decay=0.01)
    trainer.fit_reader(reader)
    trainer.load_pretrain(str(files))
    trainer.set_saver(save_path=str(tmp_path / "out"), save_steps=5)
    cfg = trainer.to_config(print_steps=7)
    assert cfg["tasks"] == {"Chn_Senti_Corp": {
        "reader": "cls", "train_file": str(files / "cls.tsv"), "max_seq_len": 16, "batch_size": 4,
        "do_lower_case": False, "for_cn": False, "n_classes": 2, "dropout": 0.2, "num_epochs": 2}}
    assert {k: cfg[k] for k in ("task_instance", "target_tag", "mix_ratio", "model_type", "model_name_or_path",
                                "tokenizer_name_or_path", "max_lr", "min_lr", "warmup_steps", "decay_steps",
                                "grad_clip", "weight_decay", "seed", "output_dir", "save_steps", "keep_last",
                                "logging_freq", "resume", "overwrite_output_dir", "hidden_size")} == {
        "task_instance": ["Chn_Senti_Corp"], "target_tag": [1], "mix_ratio": [1.0], "model_type": "ernie",
        "model_name_or_path": str(files), "tokenizer_name_or_path": str(files / "vocab.txt"), "max_lr": 5e-5,
        "min_lr": 0.0, "warmup_steps": 2, "decay_steps": 10, "grad_clip": 0.0, "weight_decay": 0.01, "seed": 3,
        "output_dir": str(tmp_path / "out"), "save_steps": 5, "keep_last": KEEP_ALL, "logging_freq": 7,
        "resume": "none", "overwrite_output_dir": True, "hidden_size": 32}
    trainer.configure(use_amp=True, keep_last=2)
    assert trainer.to_config()["use_amp"] is True and trainer.to_config()["keep_last"] == 2


def test_a_multihead_trainer_lists_its_reference_first(files):
    slot = palm.reader.SequenceLabelReader(str(files / "vocab.txt"), 16, str(files / "label_map.json"), seed=0)
    slot.load_data(str(files / "seq.tsv"), 5)
    intent = palm.reader.ClassifyReader(str(files / "vocab.txt"), 16, seed=0)
    intent.load_data(str(files / "cls.tsv"), 4)
    ernie = palm.backbone.ERNIE.from_config(CONFIG)
    t_intent, t_slot, t_aux = palm.Trainer("intent"), palm.Trainer("slot", mix_ratio=0.5), palm.Trainer("aux")
    multi = palm.MultiHeadTrainer([t_intent, t_slot, t_aux])
    t_intent.build_forward(ernie, palm.head.Classify(2, 32))
    t_slot.build_forward(ernie, palm.head.SequenceLabel(3, 32))
    t_aux.build_forward(ernie, palm.head.Classify(2, 32))
    t_aux.set_as_aux()
    t_aux._reuse_head_with = t_intent
    loss = multi.build_forward()
    assert loss.names == ["intent", "slot", "aux"]
    multi.build_backward(palm.optimizer.Adam(loss, 1e-3))
    multi.fit_readers_with_mixratio([intent, slot, intent], "slot", 4)
    cfg = multi.to_config()
    assert cfg["task_instance"] == ["slot", "intent", "aux"]  # the sampling reference is the engine's main task
    assert (cfg["mix_ratio"], cfg["target_tag"], cfg["task_reuse_tag"], cfg["num_epochs"], cfg["sampling"]) == (
        [0.5, 1.0, 1.0], [1, 1, 0], [0, 1, 1], 4.0, "palm")
    assert cfg["tasks"]["slot"]["use_crf"] is True and "num_epochs" not in cfg["tasks"]["slot"]
    # quotas floor(E * m_i * S_ref): slot 4 * 0.5 * 2 = 4, intent 4 * 1 * 2 = 8; the aux task is drawn meanwhile
    assert multi.overall_train_steps >= 12
    with pytest.raises(ValueError, match="sampling_reference 'nope'"):
        multi.fit_readers_with_mixratio([intent, slot, intent], "nope", 1)


def test_misuse_is_one_clear_error(files, tmp_path):
    trainer, reader, ernie, loss = cls_setup(files)
    trainer.fit_reader(reader)
    with pytest.raises(ConfigError, match="build_backward"):
        trainer.to_config()
    other = palm.reader.ClassifyReader(str(files / "vocab.txt"), 16, phase="predict")
    other.load_data(str(files / "cls.tsv"), 4)
    with pytest.raises(ValueError, match="fit_reader\\(phase='train'\\) got a predict-phase"):
        trainer.fit_reader(other)
    seq = palm.reader.SequenceLabelReader(str(files / "vocab.txt"), 16, str(files / "label_map.json"))
    seq.load_data(str(files / "seq.tsv"), 5)
    t2 = palm.Trainer("tags")
    t2.build_forward(ernie, palm.head.SequenceLabel(5, 32))
    t2.build_backward(palm.optimizer.Adam(None, 1e-3))
    t2.fit_reader(seq)
    with pytest.raises(ConfigError, match="num_classes 5 but .*label_map.json has 3 labels"):
        t2.to_config()
    t3 = palm.Trainer("wrong")
    t3.build_forward(ernie, palm.head.MRC(64, 32))
    t3.build_backward(palm.optimizer.Adam(None, 1e-3))
    t3.fit_reader(reader)
    with pytest.raises(ConfigError, match="MRC head reads from MRCReader, not ClassifyReader"):
        t3.to_config()
    with pytest.raises(ConfigError, match="convert=True"):
        trainer.load_pretrain(str(files), convert=True)
    (tmp_path / "params").mkdir()
    (tmp_path / "params" / "word_embedding").write_bytes(b"")
    trainer.build_predict_forward(palm.backbone.ERNIE.from_config(CONFIG, phase="predict"),
                                  palm.head.Classify(2, 32, phase="predict"))
    trainer.load_ckpt(str(tmp_path / "params"))
    with pytest.raises(ConfigError, match="pretrained parameters, not a trained model"):
        trainer._model_source()
    trainer.load_predict_model(str(tmp_path / "params"))  # PALM's examples/predict: allowed, with a warning
    assert trainer._model_source() == ("pretrained", str((tmp_path / "params").resolve()))
    with pytest.raises(ValueError, match="save_type 'model'"):
        trainer.set_saver(str(tmp_path), 5, save_type="model")
    with pytest.raises(ConfigError, match="downloads nothing"):
        palm.downloader.download("pretrain", "ERNIE-v1-zh-base")
    assert isinstance(palm.distribute.gpu_dev_count, int) and palm.distribute.cpu_dev_count >= 1


def test_masked_lm_and_ema_become_a_task_and_flags(files, tmp_path):
    """PALM's MaskLMReader + MaskLM head become an `mlm` task; build_backward(use_ema, ema_decay) the
    engine's EMA flags (a decay outside (0, 1) is refused)."""
    (files / "mlm.tsv").write_text("text_a\n" + "好的了是在我有\n" * 12, encoding="utf-8")
    reader = palm.reader.MaskLMReader(str(files / "vocab.txt"), 16, seed=5)
    reader.load_data(str(files / "mlm.tsv"), 4, num_epochs=1)
    assert reader.num_examples == 12 and reader.engine_type() == "mlm"
    ernie = palm.backbone.ERNIE.from_config(CONFIG)
    reader.register_with(ernie)
    trainer = palm.Trainer("mlm_task")
    loss = trainer.build_forward(ernie, palm.head.MaskLM(32, CONFIG["vocab_size"], "relu"))
    with pytest.raises(ValueError, match="ema_decay 1.5"):
        trainer.build_backward(palm.optimizer.Adam(loss, 1e-3), use_ema=True, ema_decay=1.5)
    trainer.build_backward(palm.optimizer.Adam(loss, 1e-3), use_ema=True, ema_decay=0.99)
    trainer.fit_reader(reader)
    trainer.set_saver(str(tmp_path / "out"), save_steps=3)
    cfg = trainer.to_config()
    mlm = cfg["tasks"]["mlm_task"]
    assert mlm["reader"] == "mlm" and mlm["train_file"] == str(files / "mlm.tsv")
    assert (cfg["use_ema"], cfg["ema_decay"]) == (True, 0.99)


def test_trainer_names_that_collide_are_named():
    with pytest.raises(ValueError, match="trainers 'my task' and 'my_task' collide: both become task 'my_task'"):
        palm.MultiHeadTrainer([palm.Trainer("my task"), palm.Trainer("my_task")])
    with pytest.raises(ValueError, match="trainers 'a' and 'a' have the same name"):
        palm.MultiHeadTrainer([palm.Trainer("a"), palm.Trainer("a")])


def test_a_fresh_palm_run_never_deletes_another_runs_checkpoints(files, tmp_path):
    """PALM overwrote its own outputs when a script ran again, and so does this face; a save_path that holds
    another run's checkpoints (other tasks, or not written through the PALM API) is refused instead of
    emptied."""
    trainer, reader, ernie, loss = cls_setup(files)
    trainer.build_backward(optimizer=palm.optimizer.Adam(loss, 1e-3))
    trainer.fit_reader(reader)
    out = tmp_path / "out"
    for name, extra in (("cli", {"tasks": [{"name": "sentiment"}], "callbacks": {}}),
                        ("palm-other", {"tasks": [{"name": "ner"}], "callbacks": {"PalmLayout": {}}})):
        (out / "model_last").mkdir(parents=True, exist_ok=True)
        (out / "model_last" / "train_state.json").write_text(json.dumps({"step": 7, "extra": extra}))
        trainer.set_saver(save_path=str(out), save_steps=5)
        with pytest.raises(ConfigError) as e:
            trainer.to_config()
        assert f"save_path {out} holds the checkpoints of another run (model_last: step 7" in str(e.value), name
        assert "give this run another save_path" in str(e.value)
    (out / "model_last" / "train_state.json").write_text(json.dumps(
        {"step": 7, "extra": {"tasks": [{"name": "sentiment"}], "callbacks": {"PalmLayout": {}}}}))
    assert trainer.to_config()["overwrite_output_dir"] is True  # this script's own earlier run: replaced, as PALM did


@pytest.mark.slow
def test_a_multihead_trainer_of_one_trainer_trains_step_by_step(files, tmp_path):
    """PALM's step loop (`for batch in fit_readers_with_mixratio(...)`: train_one_step(batch)) with a single
    trainer ended in KeyError '__task_id'."""
    import numpy as np

    reader = palm.reader.ClassifyReader(str(files / "vocab.txt"), 16, seed=1)
    reader.load_data(str(files / "cls.tsv"), 4, num_epochs=1)
    ernie = palm.backbone.ERNIE.from_config(CONFIG)
    reader.register_with(ernie)
    only = palm.Trainer("only")
    multi = palm.MultiHeadTrainer([only])
    only.build_forward(ernie, palm.head.Classify(2, 32))
    multi.build_backward(palm.optimizer.Adam(multi.build_forward(), 1e-3))
    multi.set_saver(str(tmp_path / "out"), 100)
    steps = []
    for batch in multi.fit_readers_with_mixratio([reader], "only", 1):
        outputs, task_id = multi.train_one_step(batch)
        steps.append((task_id, float(np.asarray(outputs["only.loss"]).reshape(-1)[0])))
        if len(steps) == 2:
            break
    assert [t for t, _ in steps] == [0, 0] and all(np.isfinite(loss) for _, loss in steps)
