"""seq_label task type: reader, alignment, CRF numerics, head training, metrics, predictions."""
import zlib  # noqa: F401  (before paddle: paddle 2.6.2 exports clashing zlib symbols)

import itertools
import json
import re

import numpy as np
import paddle
import pytest

from ernie_mtl.config import ConfigError
from ernie_mtl.tasks.base import TaskContext, TaskSpec, get_task_type
from ernie_mtl.tasks.seq_label import (SeqLabelFeature, SeqLabelTask, chunk_metrics, crf_decode, crf_nll,
                                       detect_scheme)
from tests.task_harness import TaskHarness, batches_of

LETTERS = list("abcdefgh")
VOCAB = ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"] + LETTERS + ["john", "##son", "lives", "in", "new", "##er"]
BMES = {"B": 0, "M": 1, "E": 2, "S": 3}
IOB2 = {"O": 0, "B-PER": 1, "I-PER": 2, "B-LOC": 3, "I-LOC": 4}


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return str(path)


def row(tokens, tags=None):
    return "\x02".join(tokens) + ("" if tags is None else "\t" + "\x02".join(tags))


def make_task(tmp_path, *, label_map=BMES, name="seg", index=0, files=None, log=None, **options):
    vocab = write(tmp_path / "vocab.txt", "\n".join(VOCAB) + "\n")
    opts = {k: o.default for k, o in SeqLabelTask.options.items()}
    if label_map is not None:  # None: no `label_map` option at all
        opts["label_map"] = write(tmp_path / f"label_map_{name}.json", json.dumps(label_map))
    opts.update(options)
    max_seq_len = opts.pop("max_seq_len", 32)
    spec = TaskSpec(name=name, reader="seq_label", index=index, max_seq_len=max_seq_len, options=opts,
                    **(files or {}))
    return SeqLabelTask(spec, TaskContext(vocab_file=vocab, seed=0, log=(log.append if log is not None else print)))


# -- reader --------------------------------------------------------------------------------------------
def test_a_padding_tag_in_the_label_map_is_outside_any_chunk(tmp_path):
    """PALM's ATIS label map starts with "PAD": 0; it is no chunk tag, and scored as O."""
    task = make_task(tmp_path, label_map={"PAD": 0, "O": 1, "B-PER": 2, "I-PER": 3})
    assert task.scheme == "IOB2"
    m = chunk_metrics([["B-PER", "I-PER", "O"]], [["B-PER", "I-PER", "PAD"]], task.scheme)
    assert (m["f1"], m["accuracy"]) == (1.0, 2 / 3)


def test_a_trailing_separator_after_the_last_token_and_tag_is_no_token(tmp_path):
    """PALM's ATIS files (examples/multi-task/process.py) end every token and every tag with \x02."""
    train = write(tmp_path / "train.tsv", "text_a\tlabel\na\x02b\x02c\x02\tB\x02E\x02S\x02\n")
    pred = write(tmp_path / "pred.tsv", "text_a\na\x02b\x02\n")
    task = make_task(tmp_path, files={"train_file": train, "pred_file": pred})
    data = task.load("train")
    assert data.examples[0].tokens == ["a", "b", "c"] and data.examples[0].tags == ["B", "E", "S"]
    assert task.load("pred").examples[0].tokens == ["a", "b"]


def test_reader_aligns_labels_to_first_pieces_of_multi_piece_words(tmp_path):
    train = write(tmp_path / "train.tsv", "text_a\tlabel\n"
                  + row(["Johnson", "lives", "in", "Newer"], ["B-PER", "O", "O", "B-LOC"]) + "\n")
    task = make_task(tmp_path, label_map=IOB2, files={"train_file": train})
    data = task.load("train")
    (f,) = data.features
    ids = {t: i for i, t in enumerate(VOCAB)}
    assert f.input_ids == [ids[t] for t in ["[CLS]", "john", "##son", "lives", "in", "new", "##er", "[SEP]"]]
    assert f.word_starts == [1, 3, 4, 5] and f.num_tokens == 4
    assert f.labels == [0, 1, 1, 0, 0, 3, 3, 0]  # continuation pieces carry their word's tag (CRF chain)
    batch = task.collate(data.features)
    assert batch["input_ids"].shape == batch["labels"].shape == batch["label_weights"].shape == (1, 8)
    assert batch["labels"].dtype == np.int64 and batch["label_weights"].dtype == np.float32
    np.testing.assert_array_equal(batch["label_weights"][0], [0, 1, 0, 1, 1, 1, 0, 0])  # first pieces only
    np.testing.assert_array_equal(batch["input_mask"][0, 0, 0], [0] * 8)
    assert data.examples[0].tags == ["B-PER", "O", "O", "B-LOC"] and task.scheme == "IOB2"

    # Predictions come from first pieces: continuation pieces' (wrong) tags do not matter.
    tags = np.array([[0, 1, 4, 0, 0, 3, 2, 0]])
    assert task.predictions(data, {"tags": [tags]}) == [
        {"index": 0, "tokens": ["Johnson", "lives", "in", "Newer"], "labels": ["B-PER", "O", "O", "B-LOC"]}]
    assert task.evaluate(data, {"tags": [tags]}) == {"precision": 1.0, "recall": 1.0, "f1": 1.0, "accuracy": 1.0}


def test_truncated_tokens_are_predicted_as_fallback_and_counted(tmp_path):
    logs = []
    train = write(tmp_path / "train.tsv", "text_a\tlabel\n"
                  + row(["Johnson", "lives", "in", "Newer"], ["B-PER", "O", "B-LOC", "B-LOC"]) + "\n")
    task = make_task(tmp_path, label_map=IOB2, files={"train_file": train}, log=logs, max_seq_len=5)
    data = task.load("train")
    (f,) = data.features
    assert len(f.input_ids) == 5 and f.word_starts == [1, 3]  # [CLS] john ##son lives [SEP]
    assert logs == ["task seg: train: 2 token(s) of 1 row(s) lie beyond max_seq_len 5; they are predicted as 'O'"]
    tags = np.array([[0, 1, 1, 0, 0, 0, 0, 0]])
    (pred,) = task.predictions(data, {"tags": [tags]})
    assert pred["labels"] == ["B-PER", "O", "O", "O"]  # one tag per file token
    metrics = task.evaluate(data, {"tags": [tags]})
    assert metrics["recall"] == pytest.approx(1 / 3) and metrics["accuracy"] == pytest.approx(2 / 4)


def test_pred_file_needs_only_text_and_untokenizable_tokens_get_unk(tmp_path):
    pred = write(tmp_path / "pred.tsv", "text_a\n" + row(["a", " ", "b"]) + "\n")
    task = make_task(tmp_path, files={"pred_file": pred})
    data = task.load("pred")
    assert not data.has_labels and data.features[0].input_ids == [1, 5, 4, 6, 2]
    batch = task.collate(data.features)
    assert not batch["label_weights"].any() and not batch["labels"].any()
    tags = np.array([[0, 0, 3, 3, 0, 0, 0, 0]])
    assert task.predictions(data, {"tags": [tags]})[0]["labels"] == ["B", "S", "S"]


def test_label_map_config_is_accepted_as_palms_name(tmp_path):
    lm = write(tmp_path / "lm.json", json.dumps(BMES))
    task = make_task(tmp_path, label_map=None, label_map_config=lm)
    assert task.label_map == BMES and task.scheme == "BMES" and task.fallback_tag == "S"
    assert get_task_type("seq_label") is SeqLabelTask


@pytest.mark.parametrize("tags, scheme", [
    (["B", "M", "E", "S"], "BMES"), (["O", "B-PER", "I-PER"], "IOB2"), (["O", "PER-B", "PER-I"], "IOB2"),
    (["O", "B-X", "I-X", "E-X", "S-X"], "IOBES"), (["O", "I-X"], "IOB1"), (["O", "B-X", "L-X", "U-X"], "BILOU")])
def test_scheme_detection(tags, scheme):
    assert detect_scheme(tags) == scheme


@pytest.mark.parametrize("body, message", [
    (row(["a", "b", "c"], ["B", "E"]), "train.tsv:3: text_a has 3 token(s) but label has 2 tag(s)"),
    (row(["a", "b"], ["B", "Q"]), "train.tsv:3: tag(s) ['Q'] are not in label_map"),
    ("\tS", "train.tsv:3: text_a is empty"),
])
def test_bad_rows_name_file_line_and_value(tmp_path, body, message):
    train = write(tmp_path / "train.tsv", "text_a\tlabel\n" + row(["a"], ["S"]) + "\n" + body + "\n")
    task = make_task(tmp_path, files={"train_file": train})
    with pytest.raises(ConfigError, match=re.escape(message)):
        task.load("train")


@pytest.mark.parametrize("label_map, options, message", [
    (None, {}, "seq_label needs `label_map: "),
    ({"B": 0, "E": 2}, {}, "distinct id 0..n-1"),
    ({"NN": 0, "VB": 1}, {}, r"tag\(s\) \['NN', 'VB'\] are not chunk tags"),
    (BMES, {"scheme": "IOB2"}, r"scheme IOB2 has no prefix \['E', 'M', 'S'\]"),
    (BMES, {"scheme": "XYZ"}, "scheme 'XYZ' is unknown"),
    (BMES, {"dropout": 1.5}, "dropout must be a number in"),
    (BMES, {"use_crf": "yes"}, "use_crf must be true or false, got 'yes'"),
])
def test_bad_options_are_config_errors(tmp_path, label_map, options, message):
    with pytest.raises(ConfigError, match=message):
        make_task(tmp_path, label_map=label_map, **options)


def test_unreadable_label_map_names_the_path(tmp_path):
    with pytest.raises(ConfigError, match="label_map .*missing.json: cannot read it"):
        make_task(tmp_path, label_map_config=str(tmp_path / "missing.json"), label_map=None)


# -- CRF numerics ---------------------------------------------------------------------------------------
def _path_score(x, y, T):
    return (T[0, y[0]] + T[1, y[-1]] + sum(x[i, y[i]] for i in range(len(y)))
            + sum(T[2 + y[i - 1], y[i]] for i in range(1, len(y))))


@pytest.mark.parametrize("scale, offset", [(1.0, 0.0), (3.0, 100.0)])  # exp(100) overflows float32
def test_crf_loss_and_viterbi_equal_brute_force(static_mode, scale, offset):
    L, rng = 3, np.random.default_rng(3)
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        em = paddle.static.data("em", [-1, -1, L], "float32")
        tr = paddle.static.data("tr", [L + 2, L], "float32")
        lab = paddle.static.data("lab", [-1, -1], "int64")
        ln = paddle.static.data("ln", [-1], "int64")
        nll, path = crf_nll(em, tr, lab, ln), crf_decode(em, tr, ln)
    exe = paddle.static.Executor(paddle.CPUPlace())
    e = rng.normal(size=(3, 4, L)).astype("float32") * 2
    T = (rng.normal(size=(L + 2, L)) * scale + offset).astype("float32")
    y = rng.integers(0, L, size=(3, 4))
    n = np.array([3, 1, 2])
    got_nll, got_path = exe.run(main, feed={"em": e, "tr": T, "lab": y, "ln": n}, fetch_list=[nll, path])
    for b, k in enumerate(n):
        scores = {p: _path_score(e[b, :k], p, T) for p in itertools.product(range(L), repeat=k)}
        log_z = np.logaddexp.reduce(list(scores.values()))
        assert got_nll[b, 0] == pytest.approx(log_z - scores[tuple(y[b, :k])], rel=1e-4, abs=1e-3)
        assert tuple(got_path[b, :k]) == max(scores, key=scores.get)
        assert not got_path[b, k:].any()


# -- head through the real multi-task forward ------------------------------------------------------------
LEXICON = ["ab", "cde", "f", "gh"]  # every letter has one BMES tag: learnable from the letters alone


def _segmentation_rows(rng, n):
    out = []
    for _ in range(n):
        words = [LEXICON[i] for i in rng.integers(0, len(LEXICON), size=rng.integers(3, 6))]
        tags = [t for w in words for t in (["S"] if len(w) == 1 else ["B"] + ["M"] * (len(w) - 2) + ["E"])]
        out.append(row(list("".join(words)), tags))
    return out


@pytest.fixture(scope="module")
def seg_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("seg")
    rng = np.random.default_rng(0)
    return {"train_file": write(d / "train.tsv", "text_a\tlabel\n" + "\n".join(_segmentation_rows(rng, 32)) + "\n"),
            "dev_file": write(d / "dev.tsv", "text_a\tlabel\n" + "\n".join(_segmentation_rows(rng, 16)) + "\n")}


@pytest.mark.parametrize("use_crf", [False, True])
def test_training_beats_all_s_baseline(tmp_path, static_mode, seg_files, use_crf):
    task = make_task(tmp_path, files=seg_files, use_crf=use_crf, dropout=0.0)
    train, dev = task.load("train"), task.load("dev")
    harness = TaskHarness([task], vocab_size=len(VOCAB), lr=1e-2)
    losses = harness.train(0, batches_of(task, train, 16), steps=40)
    outputs = harness.predict(0, batches_of(task, dev, 8))
    metrics = task.evaluate(dev, outputs)
    baseline = chunk_metrics([e.tags for e in dev.examples], [["S"] * len(e.tags) for e in dev.examples], "BMES")
    assert np.mean(losses[-5:]) < 0.3 * np.mean(losses[:5])
    assert baseline["f1"] < 0.35 and metrics["f1"] > 0.9, (metrics, baseline)
    for batch, tags in zip(batches_of(task, dev, 8), outputs["tags"]):
        assert tags.shape == batch["input_ids"].shape and tags.dtype == np.int64
    preds = task.predictions(dev, outputs)
    assert [len(p["labels"]) for p in preds] == [len(e.tokens) for e in dev.examples]
    if use_crf:  # Viterbi decoding under the learned transitions gives well-formed BMES sequences
        assert all(re.fullmatch("(S|BM*E)+", "".join(p["labels"])) for p in preds)
        # Decoding uses the transitions (not an argmax of emissions): reward every transition into S.
        param = harness.scope.find_var(harness.fwd.name_map["heads.seg.transitions"]).get_tensor()
        table = np.array(param)
        table[:, BMES["S"]] += 100.0
        param.set(table, paddle.CPUPlace())
        preds = task.predictions(dev, harness.predict(0, batches_of(task, dev, 8)))
        assert {t for p in preds for t in p["labels"]} == {"S"}


def test_dummy_labels_give_finite_losses_for_crf_and_softmax(tmp_path, static_mode, seg_files):
    crf = make_task(tmp_path, name="crf", index=0, files=seg_files, use_crf=True)
    soft = make_task(tmp_path, name="soft", index=1, files=seg_files, label_map=IOB2)
    harness = TaskHarness([crf, soft], vocab_size=len(VOCAB))
    # A foreign micro-batch whose first text is empty ([CLS] [SEP]): the CRF chain is clamped to length 1.
    foreign = soft.collate([SeqLabelFeature([1, 2], [0, 0], [], 0),
                            SeqLabelFeature([1, 5, 6, 2], [0, 1, 2, 0], [1, 2], 2)])
    own = crf.collate(crf.load("train").features[:4])
    for task_index, batch in ((1, foreign), (0, own)):
        feed = harness.feed(task_index, batch)
        values = harness.exe.run(harness.main, feed=feed, scope=harness.scope,
                                 fetch_list=[harness.fwd.task_losses["crf"], harness.fwd.task_losses["soft"]])
        assert all(np.isfinite(v).all() for v in values), values
    assert float(values[1]) == 0.0  # softmax dummy weights are all 0


@pytest.mark.parametrize("use_crf", [False, True])
def test_prediction_needs_only_the_backbone_feeds(tmp_path, static_mode, seg_files, use_crf):
    """What an exported inference model runs: the test program pruned to backbone feeds -> `tags`."""
    task = make_task(tmp_path, files=seg_files, use_crf=use_crf)
    harness = TaskHarness([task], vocab_size=len(VOCAB))
    names = harness.fwd.backbone_feed_names
    tags_var = harness.fwd.predictions["seg"]["tags"]
    pruned = paddle.static.normalize_program(harness.test, [harness.fwd.feed_vars[n] for n in names], [tags_var])
    batch = batches_of(task, task.load("dev"), 4)[0]
    (tags,) = harness.exe.run(pruned, feed={n: batch[n] for n in names}, fetch_list=[tags_var.name],
                              scope=harness.scope)
    np.testing.assert_array_equal(tags, harness.predict(0, [batch])["tags"][0])


def test_evaluate_equals_hand_computed_seqeval(tmp_path):
    dev = write(tmp_path / "dev.tsv", "text_a\tlabel\n" + row(list("abcde"), list("BEBME")) + "\n"
                + row(list("fgh"), list("SBE")) + "\n")
    task = make_task(tmp_path, files={"dev_file": dev})
    data = task.load("dev")
    B, E, S = 0, 2, 3  # tags B M E S
    # Two batches (one row each, different widths). Row 1 predicts B E S S S: 1 of its 4 chunks right;
    # row 2 predicts S B E: both right. Gold chunks 4, predicted 6, correct 3; tokens right 2 + 3 of 8.
    outputs = {"tags": [np.array([[0, B, E, S, S, S, 0, 0]]), np.array([[0, S, B, E, 0, 0, 0, 0]])]}
    assert task.evaluate(data, outputs) == pytest.approx(
        {"precision": 3 / 6, "recall": 3 / 4, "f1": 2 * 0.5 * 0.75 / 1.25, "accuracy": 5 / 8})
    assert [p["labels"] for p in task.predictions(data, outputs)] == [list("BESSS"), list("SBE")]
