"""Task types `mlm` (TSV texts, dynamic masking) and `pretrain` (.bin/.idx corpus, MLM + pair head)."""
import zlib  # noqa: F401  (before paddle: paddle 2.6.2's bundled zlib clash)

import numpy as np
import paddle
import pytest
from paddle.utils import unique_name

from data_tools import create_pretraining_data
from ernie_mtl.config import ConfigError
from ernie_mtl.data.pretrain import collate_pretrain
from ernie_mtl.tasks.base import TaskContext, TaskSpec, get_task_type
from task_harness import TINY, TaskHarness

SPECIALS = ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"]
CHARS = list("我爱北京天安门人民日报中国今年好大小山水")
VOCAB = SPECIALS + CHARS + ["hello", "world", "##lo", "，", "。"] + ["##" + c for c in CHARS]
IDS = {t: i for i, t in enumerate(VOCAB)}


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    return str(path)


def _tsv(path, texts, header="text_a"):
    path.write_text(header + "\n" + "".join(t + "\n" for t in texts), encoding="utf-8")
    return str(path)


def _task(reader, vocab_file, *, name=None, index=0, seed=11, extra=None, max_seq_len=32, **fields):
    cls = get_task_type(reader)
    options = {k: v.default for k, v in cls.options.items()}
    options.update(fields.pop("options", {}))
    spec = TaskSpec(name=name or reader, reader=reader, index=index, max_seq_len=max_seq_len, options=options,
                    **fields)
    return cls(spec, TaskContext(vocab_file=vocab_file, seed=seed, log=lambda m: None, extra=dict(extra or {})))


# -- mlm reader ---------------------------------------------------------------------------------------------
def test_reader_marks_words_inside_jieba_words_and_truncates(tmp_path, vocab_file):
    task = _task("mlm", vocab_file, train_file=_tsv(tmp_path / "t.tsv", ["我爱北京天安门", "hello world" * 20]),
                 max_seq_len=10)
    data = task.load("train")
    # jieba: 我 / 爱 / 北京 / 天安门 -> the characters continuing a word carry the ##<char> marker
    expected = [IDS[t] for t in ["[CLS]", "我", "爱", "北", "##京", "天", "##安", "##门", "[SEP]"]]
    assert data.features[0].tolist() == expected
    assert len(data.features[1]) == 10 and data.features[1][-1] == IDS["[SEP]"]
    assert data.examples[0] == "我爱北京天安门"
    ids, seg, pos, labels, pair = data.get(0, 0)
    original = ids.copy()
    original[pos] = labels
    # markers never reach the model: inputs and labels use the plain character ids
    assert original.tolist() == [IDS[t] for t in ["[CLS]", "我", "爱", "北", "京", "天", "安", "门", "[SEP]"]]
    assert seg.tolist() == [0] * 9 and pair == 0


def test_reader_errors_name_file_and_line(tmp_path, vocab_file):
    bad_header = _tsv(tmp_path / "h.tsv", ["我爱"], header="text")
    with pytest.raises(ConfigError, match=r"h\.tsv:1: the header row must name the columns \['text_a'\]"):
        _task("mlm", vocab_file, train_file=bad_header).load("train")
    extra_field = _tsv(tmp_path / "f.tsv", ["我爱", "北京\t天安门"])
    with pytest.raises(ConfigError, match=r"f\.tsv:3: 2 tab-separated fields but the header has 1"):
        _task("mlm", vocab_file, train_file=extra_field).load("train")
    with pytest.raises(ConfigError, match="no dev_file is set"):
        _task("mlm", vocab_file, train_file=extra_field).load("dev")
    with pytest.raises(ConfigError, match=r"task 'mlm' \(mlm\): masked_lm_prob 1.5 must be within \(0, 1\)"):
        _task("mlm", vocab_file, options={"masked_lm_prob": 1.5})


def test_dynamic_masking_per_epoch_and_fixed_dev_masks(tmp_path, vocab_file):
    texts = ["我爱北京天安门人民日报中国今年好大小山水"] * 12
    path = _tsv(tmp_path / "t.tsv", texts)
    task = _task("mlm", vocab_file, train_file=path, dev_file=path)
    train = task.load("train")
    again = _task("mlm", vocab_file, train_file=path).load("train")
    other_seed = _task("mlm", vocab_file, train_file=path, seed=12).load("train")
    other_task = _task("mlm", vocab_file, train_file=path, index=1).load("train")

    def masks(data, epoch):
        return [tuple(data.get(i, epoch)[2].tolist()) for i in range(len(data))]

    assert masks(train, 0) == masks(again, 0) and masks(train, 3) == masks(again, 3)  # same (seed, index, epoch)
    assert masks(train, 0) != masks(train, 1)  # a new mask every epoch
    assert masks(train, 0) != masks(other_seed, 0) and masks(train, 0) != masks(other_task, 0)
    assert len(set(masks(train, 0))) > 1  # equal texts, different example indices: different masks
    for i in range(len(train)):
        ids, _, pos, labels, _ = train.get(i, 2)
        assert 1 <= len(pos) <= 3  # budget round(22 * 0.15) = 3 tokens; a word that does not fit is skipped
        assert (labels == task.vocab.base_id[train.features[i][pos]]).all()
    dev = task.load("dev")
    assert dev.transform is None  # evaluation always sees epoch 0's masks
    assert [tuple(s[2].tolist()) for s in dev.features] == [tuple(s[2].tolist()) for s in task.load("dev").features]
    assert masks(dev, 0) == masks(dev, 7)


def test_collate_layout(tmp_path, vocab_file):
    task = _task("mlm", vocab_file, train_file=_tsv(tmp_path / "t.tsv", ["我爱北京", "天安门人民日报中国今年好"]))
    data = task.load("train")
    samples = [data.get(i, 0) for i in range(2)]
    batch = task.collate(samples)
    assert set(batch) == {"input_ids", "segment_ids", "input_mask", "masked_lm_positions", "masked_lm_labels"}
    assert batch["input_ids"].shape == (2, 16) and batch["input_ids"].dtype == np.int64
    assert batch["input_mask"].shape == (2, 1, 1, 16) and batch["input_mask"].dtype == np.float32
    assert batch["masked_lm_positions"].shape == (8,) and batch["masked_lm_labels"].shape == (8, 1)
    n = sum(len(s[2]) for s in samples)
    np.testing.assert_array_equal(batch["masked_lm_positions"][:n],
                                  np.concatenate([samples[0][2], samples[1][2] + 16]))
    assert (batch["masked_lm_labels"][n:] == -1).all()
    assert {f.name for f in task.label_feeds()} == {"masked_lm_positions", "masked_lm_labels"}


# -- heads: keys, tying, gating ---------------------------------------------------------------------------
def _paddlenlp_cls_keys(model_type):
    import paddlenlp.transformers as T

    config_cls, model_cls = {"ernie": (T.ErnieConfig, T.ErnieForPretraining),
                             "bert": (T.BertConfig, T.BertForPretraining)}[model_type]
    with paddle.static.program_guard(paddle.static.Program(), paddle.static.Program()), unique_name.guard():
        keys = model_cls(config_cls(**dict(TINY, vocab_size=len(VOCAB)))).state_dict().keys()
    return {k[len("cls."):] for k in keys if k.startswith("cls.")}


@pytest.fixture(scope="module")
def corpus_prefix(tmp_path_factory, vocab_file):
    """A tiny .bin/.idx corpus: 30 documents of 3-5 sentences over the test vocabulary."""
    root = tmp_path_factory.mktemp("corpus")
    rng = np.random.default_rng(3)
    docs = ["\n".join("".join(rng.choice(CHARS, size=int(rng.integers(4, 9)))) + "。"
                      for _ in range(3 + d % 3)) for d in range(30)]
    (root / "docs.txt").write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    rc = create_pretraining_data.main(["--input", str(root / "docs.txt"), "--vocab_file", vocab_file,
                                       "--output_prefix", str(root / "corpus"), "--cn_whole_word_segment"])
    assert rc == 0
    return str(root / "corpus")


@pytest.mark.parametrize("model_type", ["ernie", "bert"])
def test_head_keys_match_paddlenlp_and_decoder_is_the_embedding(tmp_path, vocab_file, corpus_prefix, model_type):
    path = _tsv(tmp_path / "t.tsv", ["我爱北京"])
    mlm = _task("mlm", vocab_file, train_file=path)
    pre = _task("pretrain", vocab_file, name="pre", index=1, train_file=corpus_prefix, options={"split": "8,1,1"})
    for t in (mlm, pre):
        t.ctx.model_type = model_type
    h = TaskHarness([mlm, pre], vocab_size=len(VOCAB), model_type=model_type)
    names = h.fwd.name_map
    expected = _paddlenlp_cls_keys(model_type)
    assert {k[len("heads.mlm."):] for k in names if k.startswith("heads.mlm.")} == {
        k for k in expected if k.startswith("predictions.")}
    assert {k[len("heads.pre."):] for k in names if k.startswith("heads.pre.")} == expected
    embedding = names[f"{model_type}.embeddings.word_embeddings.weight"]
    for group in ("mlm", "pre"):
        assert names[f"heads.{group}.predictions.decoder.weight"] == embedding
        assert names[f"heads.{group}.predictions.decoder_bias"] == names[f"heads.{group}.predictions.decoder.bias"]
    assert all(embedding not in g.params for g in h.fwd.groups)
    # no orphan decoder copy: every parameter of both programs has a structured name
    known = set(names.values())
    assert {p.name for p in h.main.global_block().all_parameters()} == known
    assert {p.name for p in h.startup.global_block().all_parameters()} == known


def test_dummy_labels_give_zero_mlm_loss_and_finite_pretrain_loss(tmp_path, vocab_file, corpus_prefix):
    mlm = _task("mlm", vocab_file, train_file=_tsv(tmp_path / "t.tsv", ["我爱北京天安门", "人民日报"]))
    pre = _task("pretrain", vocab_file, name="pre", index=1, train_file=corpus_prefix, options={"split": "8,1,1"})
    h = TaskHarness([mlm, pre], vocab_size=len(VOCAB))
    pre_data = pre.load("train")
    mlm_data = mlm.load("train")
    pre_batch = pre.collate([pre_data.get(i) for i in range(3)])
    mlm_batch = mlm.collate([mlm_data.get(i, 0) for i in range(2)])
    losses = h.fwd.task_losses
    mlm_loss, pre_loss_on_foreign = h.exe.run(h.test, feed=h.feed(1, pre_batch), scope=h.scope,
                                              fetch_list=[losses["mlm"], losses["pre"]])
    assert float(np.asarray(mlm_loss).reshape(-1)[0]) == 0.0
    (pre_dummy,) = h.exe.run(h.test, feed=h.feed(0, mlm_batch), fetch_list=[losses["pre"]], scope=h.scope)
    assert np.isfinite(pre_dummy).all() and np.isfinite(pre_loss_on_foreign).all()


# -- learning -----------------------------------------------------------------------------------------------
def test_mlm_learns_a_repetitive_corpus(tmp_path, vocab_file):
    # every row the same sentence: a masked token is predictable from its position and neighbours
    texts = ["我爱北京天安门人民日报中国"] * 32
    train_path = _tsv(tmp_path / "train.tsv", texts[:24])
    dev_path = _tsv(tmp_path / "dev.tsv", texts[24:])
    # single characters (no jieba words): a vocab without ## markers
    plain = tmp_path / "vocab.txt"
    plain.write_text("\n".join(VOCAB[:len(SPECIALS) + len(CHARS)]) + "\n", encoding="utf-8")
    task = _task("mlm", str(plain), train_file=train_path, dev_file=dev_path)
    train, dev = task.load("train"), task.load("dev")
    h = TaskHarness([task], vocab_size=len(SPECIALS) + len(CHARS), lr=5e-3)
    batches = [task.collate([train.get(i, epoch) for i in range(b, b + 8)]) for epoch in range(16) for b in (0, 8, 16)]
    losses = h.train(0, batches, steps=len(batches))
    assert np.mean(losses[-6:]) < 0.3 * np.mean(losses[:6])
    dev_batches = [task.collate(dev.features[i:i + 4]) for i in range(0, len(dev), 4)]
    metrics = task.evaluate(dev, h.predict(0, dev_batches))
    labels = np.concatenate([s[3] for s in dev.features])
    majority = np.bincount(labels).max() / len(labels)
    assert metrics["mlm_acc"] > majority + 0.5, (metrics, majority)
    assert metrics["mlm_loss"] < 0.5


# -- evaluation and predictions -------------------------------------------------------------------------
def test_evaluate_and_predictions_by_hand(tmp_path, vocab_file):
    task = _task("mlm", vocab_file, dev_file=_tsv(tmp_path / "d.tsv", ["我爱北京天安门人民", "中国今年好"]))
    dev = task.load("dev")
    counts = [len(s[2]) for s in dev.features]
    labels = np.concatenate([s[3] for s in dev.features])
    wrong = labels.copy()
    wrong[0] = IDS["山"]  # one error
    n = len(labels)
    pad = 8 - n % 8 if n % 8 else 0
    outputs = {"mlm_pred": [np.concatenate([wrong, np.zeros(pad, np.int64)])],
               "mlm_label": [np.concatenate([labels, -np.ones(pad, np.int64)])],
               "mlm_nll": [np.concatenate([np.full(n, 0.5), np.zeros(pad)]).astype(np.float32)]}
    assert task.evaluate(dev, outputs) == pytest.approx({"mlm_acc": (n - 1) / n, "mlm_loss": 0.5})
    records = task.predictions(dev, outputs)
    assert [r["text_a"] for r in records] == ["我爱北京天安门人民", "中国今年好"]
    assert [len(r["masked_positions"]) for r in records] == counts
    assert records[0]["predicted"][0] == "山" and records[0]["predicted"][1:] == records[0]["original"][1:]
    assert records[1]["predicted"] == records[1]["original"]
    with pytest.raises(ValueError, match="outputs hold .* masked-token predictions"):
        task.predictions(dev, {k: [v[0][:1]] for k, v in outputs.items()})


# -- pretrain -----------------------------------------------------------------------------------------------
def test_pretrain_splits_sizes_and_collate(vocab_file, corpus_prefix):
    pre = _task("pretrain", vocab_file, train_file=corpus_prefix, max_seq_len=24, options={"split": "8,1,1"},
                extra={"num_samples": {"train": 150}})
    train, dev, test = pre.load("train"), pre.load("dev"), pre.load("test")
    assert len(train) >= 150 and pre.num_train_examples(train) == len(train)
    natural = _task("pretrain", vocab_file, train_file=corpus_prefix, max_seq_len=24,
                    options={"split": "8,1,1"}).load("train")
    assert len(natural) < 150  # one epoch of 24 documents (no num_samples given)
    assert train.features.split_name == "train" and dev.features.split_name == "valid"
    assert test.features.split_name == "test" and len(dev) > 0 and len(test) > 0
    samples = [train.get(i) for i in range(5)]
    assert all(len(s[0]) <= 24 for s in samples)
    batch, reference = pre.collate(samples), collate_pretrain(samples, pad_id=0)
    assert batch.keys() == reference.keys()
    for k in batch:
        np.testing.assert_array_equal(batch[k], reference[k])
    assert {f.name for f in pre.label_feeds()} == {"masked_lm_positions", "masked_lm_labels", "next_sentence_labels"}
    no_pair = _task("pretrain", vocab_file, train_file=corpus_prefix, options={"binary_head": False, "split": "8,1,1"})
    assert "next_sentence_labels" not in no_pair.collate(samples)
    with pytest.raises(ConfigError, match="has no pred split"):
        pre.load("pred")
    with pytest.raises(ConfigError, match="split 'x' is not a valid train,valid,test ratio"):
        _task("pretrain", vocab_file, train_file=corpus_prefix, options={"split": "x"})
    with pytest.raises(ConfigError, match=r"train_file .*missing': no corpus .*missing.bin/.idx"):
        _task("pretrain", vocab_file, train_file=corpus_prefix + "-missing").load("train")


def test_pretrain_loss_decreases_and_evaluate_by_hand(vocab_file, corpus_prefix):
    pre = _task("pretrain", vocab_file, train_file=corpus_prefix, max_seq_len=32, options={"split": "8,1,1"})
    train = pre.load("train")
    h = TaskHarness([pre], vocab_size=len(VOCAB), lr=5e-3)
    batches = [pre.collate([train.get(i) for i in range(b, b + 8)]) for b in (0, 8)]
    losses = h.train(0, batches, steps=40)
    assert np.mean(losses[-4:]) < 0.7 * np.mean(losses[:4])
    outputs = h.predict(0, batches)
    metrics = pre.evaluate(train, outputs)
    pair_labels = np.array([train.get(i)[4] for i in range(16)])
    assert metrics["nsp_acc"] == pytest.approx(np.mean(np.concatenate(outputs["nsp_pred"]) == pair_labels))
    real = np.concatenate(outputs["mlm_label"]) >= 0
    slots = np.concatenate([train.get(i)[3] for i in range(16)])
    assert metrics["mlm_acc"] == pytest.approx(np.mean(np.concatenate(outputs["mlm_pred"])[real] == slots))
    assert set(metrics) == {"mlm_acc", "mlm_loss", "nsp_acc", "nsp_loss", "loss"}
    # the evaluation loss is the training loss's definition: token-weighted MLM + per-sequence pair loss
    nsp_nll = np.concatenate(outputs["nsp_nll"])
    assert metrics["nsp_loss"] == pytest.approx(float(nsp_nll.mean()))
    assert metrics["loss"] == pytest.approx(metrics["mlm_loss"] + metrics["nsp_loss"])
