import zlib  # noqa: F401  (before paddle: paddle 2.6.2 exports clashing zlib symbols)

import json

import numpy as np
import pytest
from sklearn.metrics import accuracy_score, f1_score

from ernie_mtl.config import ConfigError
from ernie_mtl.tasks.base import TaskContext, TaskData, TaskSpec
from ernie_mtl.tasks.classification import ClassificationTask, Example, MatchTask, PairExample
from task_harness import TaskHarness, batches_of

SPECIAL = ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"]
CHARS = "好坏天气很不错今日我你他是的了"
PAD, CLS, SEP = 0, 1, 2


def tid(ch: str) -> int:
    return len(SPECIAL) + CHARS.index(ch)


@pytest.fixture
def ctx(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(SPECIAL + list(CHARS)) + "\n", encoding="utf-8")
    return TaskContext(vocab_file=str(vocab), seed=1, log=lambda s: None)


VOCAB_SIZE = len(SPECIAL) + len(CHARS)


def write_tsv(path, header, rows):
    path.write_text("\n".join(["\t".join(header)] + ["\t".join(map(str, r)) for r in rows]) + "\n", encoding="utf-8")
    return str(path)


def make(cls, ctx, name="t", index=0, reuse_tag=None, max_seq_len=32, **kw):
    files = {k: kw.pop(k) for k in ("train_file", "dev_file", "test_file", "pred_file") if k in kw}
    options = {k: o.default for k, o in cls.options.items()}
    options.update(kw)
    spec = TaskSpec(name=name, reader=cls.name, index=index, max_seq_len=max_seq_len, reuse_tag=reuse_tag,
                    options=options, **files)
    return cls(spec, ctx)


def texts(rng, n, with_char):
    """n random strings over CHARS without 好, with 好 inserted when with_char."""
    pool = CHARS.replace("好", "")
    out = []
    for _ in range(n):
        s = list(rng.choice(list(pool), size=rng.randint(3, 8)))
        if with_char:
            s.insert(rng.randint(0, len(s) + 1), "好")
        out.append("".join(s))
    return out


def labelled_rows(seed, n):
    """Balanced rows (label, text): label 1 iff the text contains 好, shuffled."""
    rng = np.random.RandomState(seed)
    rows = [(1, t) for t in texts(rng, n // 2, True)] + [(0, t) for t in texts(rng, n - n // 2, False)]
    return [rows[i] for i in rng.permutation(len(rows))]


# -- readers ------------------------------------------------------------------------------------------
def test_cls_reader_values_and_truncation(ctx, tmp_path):
    path = write_tsv(tmp_path / "train.tsv", ["label", "text_a"], [(1, "好天气"), (0, "坏")])
    task = make(ClassificationTask, ctx, train_file=path, n_classes=2, max_seq_len=4)
    data = task.load("train")
    assert data.has_labels and len(data) == 2
    assert data.features[0] == Example([CLS, tid("好"), tid("天"), SEP], [0, 0, 0, 0], 1)  # 气 cut at 4
    assert data.features[1] == Example([CLS, tid("坏"), SEP], [0, 0, 0], 0)
    batch = task.collate(data.features)
    assert batch["input_ids"].shape == (2, 8) and batch["input_ids"].dtype == np.int64
    assert batch["input_ids"][1].tolist() == [CLS, tid("坏"), SEP] + [PAD] * 5
    assert batch["input_mask"].shape == (2, 1, 1, 8) and batch["input_mask"].dtype == np.float32
    assert batch["label"].tolist() == [1, 0] and batch["label"].dtype == np.int64
    assert [(f.name, f.shape, f.dtype) for f in task.label_feeds()] == [("label", (-1,), "int64")]


def test_cls_label_map(ctx, tmp_path):
    lm = tmp_path / "labels.json"
    lm.write_text(json.dumps({"neg": 0, "pos": 1, "mid": 2}), encoding="utf-8")
    path = write_tsv(tmp_path / "dev.tsv", ["text_a", "label"], [("好", "pos"), ("坏", "neg"), ("天", "mid")])
    task = make(ClassificationTask, ctx, dev_file=path, label_map=str(lm))
    assert task.n_classes == 3
    assert [f.label for f in task.load("dev").features] == [1, 0, 2]
    assert task.manifest()["label_map"] == {"neg": 0, "pos": 1, "mid": 2}

    bad = write_tsv(tmp_path / "bad.tsv", ["label", "text_a"], [("pos", "好"), ("neutral", "坏")])
    with pytest.raises(ConfigError, match=rf"{bad}:3: label 'neutral' is not in label_map .*add it to the map"):
        make(ClassificationTask, ctx, dev_file=bad, label_map=str(lm)).load("dev")
    with pytest.raises(ConfigError, match="n_classes: 2 disagrees with the 3 labels"):
        make(ClassificationTask, ctx, label_map=str(lm), n_classes=2)
    lm.write_text(json.dumps({"neg": 0, "pos": 2}), encoding="utf-8")
    with pytest.raises(ConfigError, match="distinct class id 0..n-1"):
        make(ClassificationTask, ctx, label_map=str(lm))


def test_cls_bad_rows_name_file_and_line(ctx, tmp_path):
    bad_label = write_tsv(tmp_path / "a.tsv", ["label", "text_a"], [(0, "好"), (2, "坏")])
    with pytest.raises(ConfigError, match=rf"{bad_label}:3: label '2' is not a class id in 0..1.*label_map"):
        make(ClassificationTask, ctx, train_file=bad_label, n_classes=2).load("train")
    not_int = write_tsv(tmp_path / "b.tsv", ["label", "text_a"], [("yes", "好")])
    with pytest.raises(ConfigError, match=rf"{not_int}:2: label 'yes'"):
        make(ClassificationTask, ctx, train_file=not_int, n_classes=2).load("train")
    fields = write_tsv(tmp_path / "c.tsv", ["label", "text_a"], [(0, "好"), ("1\t坏\t天",)])
    with pytest.raises(ConfigError, match=rf"{fields}:3: 3 tab-separated fields but the header has 2"):
        make(ClassificationTask, ctx, train_file=fields, n_classes=2).load("train")
    no_header = write_tsv(tmp_path / "d.tsv", ["0", "好"], [(1, "坏")])
    with pytest.raises(ConfigError, match=rf"{no_header}:1: the header row must name"):
        make(ClassificationTask, ctx, train_file=no_header, n_classes=2).load("train")
    with pytest.raises(ConfigError, match="no dev_file is set"):
        make(ClassificationTask, ctx, n_classes=2).load("dev")
    with pytest.raises(ConfigError, match="n_classes is missing.*label_map"):
        make(ClassificationTask, ctx)
    with pytest.raises(ConfigError, match=r"dropout: 1.0 is not in \[0, 1\)"):
        make(ClassificationTask, ctx, n_classes=2, dropout=1.0)


def test_pred_file_without_labels(ctx, tmp_path):
    path = write_tsv(tmp_path / "pred.tsv", ["text_a"], [("好",), ("坏天",)])
    task = make(ClassificationTask, ctx, pred_file=path, n_classes=2)
    data = task.load("pred")
    assert not data.has_labels and [f.label for f in data.features] == [-1, -1]
    assert task.collate(data.features)["label"].tolist() == [0, 0]
    with pytest.raises(ValueError, match="no labels"):
        task.evaluate(data, {"probs": [np.full((2, 2), 0.5, np.float32)]})


def test_match_pointwise_reader(ctx, tmp_path):
    path = write_tsv(tmp_path / "m.tsv", ["label", "text_a", "text_b"], [(1, "好天气很不", "好天"), (0, "坏", "")])
    task = make(MatchTask, ctx, train_file=path, max_seq_len=7)
    assert task.n_classes == 2 and task.strategy == "pointwise"
    f0, f1 = task.load("train").features
    # budget 7 - 3 = 4 tokens: the longer side loses tokens first (5+2 -> 2+2).
    assert f0 == Example([CLS, tid("好"), tid("天"), SEP, tid("好"), tid("天"), SEP], [0, 0, 0, 0, 1, 1, 1], 1)
    assert f1 == Example([CLS, tid("坏"), SEP, SEP], [0, 0, 0, 1], 0)


def test_match_pairwise_reader_follows_palm_columns(ctx, tmp_path):
    train = write_tsv(tmp_path / "train.tsv", ["text_a", "text_b", "text_b_neg"],
                      [("好", "天", "坏气"), ("我", "你", "他")])
    dev = write_tsv(tmp_path / "dev.tsv", ["label", "text_a", "text_b"], [(1, "好", "天"), (0, "好", "坏")])
    task = make(MatchTask, ctx, train_file=train, dev_file=dev, learning_strategy="pairwise")
    feats = task.load("train").features
    assert feats[0] == PairExample(Example([CLS, tid("好"), SEP, tid("天"), SEP], [0, 0, 0, 1, 1]),
                                   Example([CLS, tid("好"), SEP, tid("坏"), tid("气"), SEP], [0, 0, 0, 1, 1, 1]))
    batch = task.collate(feats)
    assert batch["input_ids"].shape == (4, 8)  # positives then negatives
    assert batch["input_ids"][3, :5].tolist() == [CLS, tid("我"), SEP, tid("他"), SEP]
    assert batch["pos_index"].tolist() == [0, 1] and batch["neg_index"].tolist() == [2, 3]
    dev_data = task.load("dev")
    assert [f.label for f in dev_data.features] == [1, 0]
    assert task.collate(dev_data.features)["input_ids"].shape == (2, 8)
    assert [f.name for f in task.label_feeds()] == ["pos_index", "neg_index"]

    pointwise_file = write_tsv(tmp_path / "pw.tsv", ["label", "text_a", "text_b"], [(1, "好", "天")])
    with pytest.raises(ConfigError, match=rf"{pointwise_file}:1: the header row must name the columns "
                                          r"\['text_a', 'text_b', 'text_b_neg'\]"):
        make(MatchTask, ctx, train_file=pointwise_file, learning_strategy="pairwise").load("train")
    bad = write_tsv(tmp_path / "bad.tsv", ["label", "text_a", "text_b"], [(1, "好", "天"), (3, "好", "天")])
    with pytest.raises(ConfigError, match=rf"{bad}:3: label '3' is not a class id in 0..1"):
        make(MatchTask, ctx, dev_file=bad, learning_strategy="pairwise").load("dev")
    with pytest.raises(ConfigError, match="n_classes: 3 with learning_strategy: pairwise"):
        make(MatchTask, ctx, learning_strategy="pairwise", n_classes=3)
    with pytest.raises(ConfigError, match="max_seq_len: 2 leaves no room"):
        make(MatchTask, ctx, max_seq_len=2)
    with pytest.raises(ConfigError, match="learning_strategy: 'listwise'"):
        make(MatchTask, ctx, learning_strategy="listwise")


# -- evaluation and predictions (no model) ---------------------------------------------------------------
def fake_data(labels, split="dev"):
    return TaskData(split, [Example([CLS, SEP], [0, 0], y) for y in labels])


def one_hot(pred, n):
    return np.eye(n, dtype=np.float32)[pred] * 0.8 + 0.2 / n


def test_evaluate_binary_multiclass_and_pairwise(ctx):
    cls2 = make(ClassificationTask, ctx, n_classes=2)
    y, p = [1, 0, 1, 1, 0], [1, 1, 1, 0, 0]
    probs = one_hot(p, 2)
    got = cls2.evaluate(fake_data(y), {"probs": [probs[:3], probs[3:]]})  # two batches, in order
    assert got == pytest.approx({"acc": 0.6, "f1": 2 / 3})  # tp 2, fp 1, fn 1
    assert got == pytest.approx({"acc": accuracy_score(y, p), "f1": f1_score(y, p)})

    cls3 = make(ClassificationTask, ctx, n_classes=3)
    y, p = [0, 1, 2, 2], [0, 2, 2, 1]
    got = cls3.evaluate(fake_data(y), {"probs": [one_hot(p, 3)]})
    assert got == pytest.approx({"acc": 0.5, "macro_f1": (1 + 0 + 0.5) / 3})
    with pytest.raises(ValueError, match="3 rows of 'probs' for 4 dev examples"):
        cls3.evaluate(fake_data(y), {"probs": [one_hot(p[:3], 3)]})

    pair = make(MatchTask, ctx, learning_strategy="pairwise")
    scores = np.array([0.3, -0.2, 0.1, -1.0], np.float32)
    got = pair.evaluate(fake_data([1, 0, 0, 0]), {"score": [scores[:2], scores[2:]]})
    assert got == pytest.approx({"acc": 0.75, "f1": 2 / 3})  # predicted [1, 0, 1, 0]
    assert pair.main_metric in got and cls2.main_metric == "acc"


def test_predictions_format(ctx, tmp_path):
    lm = tmp_path / "labels.json"
    lm.write_text(json.dumps({"neg": 0, "pos": 1}), encoding="utf-8")
    task = make(ClassificationTask, ctx, label_map=str(lm))
    probs = np.array([[0.9, 0.1], [0.25, 0.75], [0.4, 0.6]], np.float32)
    records = task.predictions(fake_data([-1] * 3, "pred"), {"probs": [probs[:2], probs[2:]]})
    assert [r["label"] for r in records] == ["neg", "pos", "pos"]
    assert records[1] == {"index": 1, "label": "pos", "probs": pytest.approx([0.25, 0.75])}
    json.dumps(records)
    plain = make(ClassificationTask, ctx, n_classes=2).predictions(fake_data([-1] * 3, "pred"), {"probs": [probs]})
    assert [r["label"] for r in plain] == [0, 1, 1] and [r["index"] for r in plain] == [0, 1, 2]
    pair = make(MatchTask, ctx, learning_strategy="pairwise")
    recs = pair.predictions(fake_data([-1] * 2, "pred"), {"score": [np.array([0.5, -1.5], np.float32)]})
    assert recs == [{"index": 0, "score": 0.5}, {"index": 1, "score": -1.5}]
    json.dumps(recs)


# -- through the real multi-task forward ----------------------------------------------------------------
def test_dummy_labels_give_finite_losses(ctx, tmp_path):
    cls_file = write_tsv(tmp_path / "c.tsv", ["label", "text_a"], [(1, "好天"), (0, "坏"), (1, "好")])
    pw_file = write_tsv(tmp_path / "p.tsv", ["text_a", "text_b", "text_b_neg"], [("好", "天", "坏")])
    pt_file = write_tsv(tmp_path / "m.tsv", ["label", "text_a", "text_b"], [(1, "好", "天"), (0, "坏", "气")])
    tasks = [make(ClassificationTask, ctx, "c", 0, train_file=cls_file, n_classes=2),
             make(MatchTask, ctx, "p", 1, train_file=pw_file, learning_strategy="pairwise"),
             make(MatchTask, ctx, "m", 2, train_file=pt_file)]
    h = TaskHarness(tasks, vocab_size=VOCAB_SIZE)
    for i, t in enumerate(tasks):
        batch = t.collate(t.load("train").features)
        losses = h.exe.run(h.test, feed=h.feed(i, batch), fetch_list=[h.fwd.task_losses[u.spec.name] for u in tasks],
                           scope=h.scope)
        values = [float(np.asarray(v).reshape(-1)[0]) for v in losses]
        assert np.isfinite(values).all(), (t.spec.name, values)
        if i != 1:  # the pairwise placeholder pairs row 0 with itself: loss = margin exactly
            assert values[1] == pytest.approx(0.5)


def test_cls_learns_and_applies_dropout(ctx, tmp_path):
    train = write_tsv(tmp_path / "train.tsv", ["label", "text_a"], labelled_rows(0, 64))
    dev = write_tsv(tmp_path / "dev.tsv", ["label", "text_a"], labelled_rows(1, 32))
    task = make(ClassificationTask, ctx, train_file=train, dev_file=dev, n_classes=2, dropout=0.125)
    h = TaskHarness([task], vocab_size=VOCAB_SIZE)
    # The classifier dropout is in the training program (backbone dropout is 0 in the harness) and off at test.
    rate = [op for op in h.main.global_block().ops if op.type == "dropout" and op.attr("dropout_prob") == 0.125]
    assert len(rate) == 1 and not rate[0].attr("is_test")
    assert [op.attr("is_test") for op in h.test.global_block().ops
            if op.type == "dropout" and op.attr("dropout_prob") == 0.125] == [True]

    dev_data = task.load("dev")
    labels = [f.label for f in dev_data.features]
    majority = max(labels.count(0), labels.count(1)) / len(labels)
    losses = h.train(0, batches_of(task, task.load("train"), 16), steps=40)
    assert np.mean(losses[-4:]) < 0.5 * np.mean(losses[:4])
    metrics = task.evaluate(dev_data, h.predict(0, batches_of(task, dev_data, 16)))
    assert metrics["acc"] >= majority + 0.25, metrics
    assert set(metrics) == {"acc", "f1"}


def test_pairwise_match_learns_to_rank(ctx, tmp_path):
    rng = np.random.RandomState(3)
    a, pos, neg = texts(rng, 32, False), texts(rng, 32, True), texts(rng, 32, False)
    train = write_tsv(tmp_path / "train.tsv", ["text_a", "text_b", "text_b_neg"], list(zip(a, pos, neg)))
    rng = np.random.RandomState(5)  # pointwise dev rows: 16 matches (b contains 好), 16 non-matches
    dev_rows = [(1, x, y) for x, y in zip(texts(rng, 16, False), texts(rng, 16, True))]
    dev_rows += [(0, x, y) for x, y in zip(texts(rng, 16, False), texts(rng, 16, False))]
    dev = write_tsv(tmp_path / "dev.tsv", ["label", "text_a", "text_b"], dev_rows)
    task = make(MatchTask, ctx, train_file=train, dev_file=dev, learning_strategy="pairwise")
    h = TaskHarness([task], vocab_size=VOCAB_SIZE)
    batches = batches_of(task, task.load("train"), 16)
    losses = h.train(0, batches, steps=30)
    assert losses[0] == pytest.approx(0.5, abs=0.1)  # scores start near 0: loss ~ margin
    assert np.mean(losses[-4:]) < 0.3 * np.mean(losses[:4])
    for batch in batches:
        (score,) = h.predict(0, [batch])["score"]
        n = len(batch["pos_index"])
        assert score.shape == (2 * n,)
        assert (score[:n] > score[n:]).mean() >= 0.9
    dev_data = task.load("dev")
    metrics = task.evaluate(dev_data, h.predict(0, batches_of(task, dev_data, 16)))
    assert metrics["acc"] >= 0.75, metrics  # majority class: 0.5


def test_reuse_tag_shares_one_head(ctx, tmp_path):
    fa = write_tsv(tmp_path / "a.tsv", ["label", "text_a"], labelled_rows(0, 16))
    fb = write_tsv(tmp_path / "b.tsv", ["label", "text_a"], labelled_rows(1, 8))
    ta = make(ClassificationTask, ctx, "a", 0, reuse_tag=0, train_file=fa, n_classes=2)
    tb = make(ClassificationTask, ctx, "b", 1, reuse_tag=0, train_file=fb, n_classes=2)
    h = TaskHarness([ta, tb], vocab_size=VOCAB_SIZE)
    assert [(g.name, g.tasks) for g in h.fwd.groups] == [("a", ["a", "b"])]
    assert len(h.fwd.groups[0].params) == 2
    assert sorted(k for k in h.fwd.name_map if k.startswith("heads.")) == ["heads.a.bias", "heads.a.weight"]
    b_batches = batches_of(tb, tb.load("train"), 8)
    before = h.predict(1, b_batches)["probs"][0]
    w_before = h.param(h.fwd.name_map["heads.a.weight"])
    h.train(0, batches_of(ta, ta.load("train"), 8), steps=3)  # task a only
    assert not np.allclose(h.param(h.fwd.name_map["heads.a.weight"]), w_before)
    after = h.predict(1, b_batches)["probs"][0]
    assert not np.allclose(after, before)
    # The backbone is shared anyway; the head is too: task a's outputs on b's rows are b's outputs. (Checked
    # after training a: with the harness's fixed program seed, two separate heads would start equal.)
    np.testing.assert_array_equal(h.predict(0, b_batches)["probs"][0], after)

    t3 = make(ClassificationTask, ctx, "c", 1, reuse_tag=0, n_classes=3)
    with pytest.raises(ValueError, match=r"share a head.*\('softmax_classifier', 2\) vs \('softmax_classifier', 3\)"):
        TaskHarness([ta, t3], vocab_size=VOCAB_SIZE)
    pair = make(MatchTask, ctx, "p", 1, reuse_tag=0, learning_strategy="pairwise")
    with pytest.raises(ValueError, match="pairwise_score"):
        TaskHarness([ta, pair], vocab_size=VOCAB_SIZE)
