"""The `mrc` task type: SQuAD reading, sliding windows, labels, head, n-best decoding and EM/F1."""
import zlib  # noqa: F401  (before paddle: paddle 2.6.2's bundled zlib clash)

import json
import random

import numpy as np
import pytest

from ernie_mtl.config import ConfigError
from ernie_mtl.tasks.base import TaskContext, TaskSpec, get_task_type
from ernie_mtl.tasks.mrc import MRCTask
from task_harness import TaskHarness, batches_of

LETTERS = list("abcdefghijklmnopqrstuvwxyz")
VOCAB = (["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]", "#", "?"] + LETTERS
         + list("北京大学是中国的首都哪里"))
DEFAULTS = {k: o.default for k, o in MRCTask.options.items()}


@pytest.fixture
def vocab(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    return str(path)


def squad(tmp_path, name, paragraphs):
    """Write a SQuAD-style file: paragraphs = [(context, [qa dict, ...])]."""
    path = tmp_path / name
    doc = {"version": "test", "data": [{"title": "t", "paragraphs": [
        {"context": c, "qas": qas} for c, qas in paragraphs]}]}
    path.write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    return str(path)


def qa(qid, question, context=None, answer=None, impossible=None):
    out = {"id": qid, "question": question,
           "answers": [] if answer is None else [{"text": answer, "answer_start": context.index(answer)}]}
    if impossible is not None:
        out["is_impossible"] = impossible
    return out


def make_task(vocab, name="mrc", index=0, max_seq_len=64, for_cn=True, **options):
    files = options.pop("files", {})
    spec = TaskSpec(name=name, reader="mrc", index=index, max_seq_len=max_seq_len, for_cn=for_cn,
                    options={**DEFAULTS, **options}, **files)
    return MRCTask(spec, TaskContext(vocab_file=vocab, seed=1))


def hand_outputs(data, picks, batch_size=2, null=None):
    """start/end logits per batch: feature i has logit 10 at picks[i] = (start, end), -10 elsewhere,
    and `null[i]` (if given) on [CLS]."""
    seq = max(len(f["input_ids"]) for f in data.features)
    start = np.full((len(data.features), seq), -10.0, dtype=np.float32)
    end = start.copy()
    for i, (s, e) in enumerate(picks):
        if s is not None:
            start[i, s] = end[i, e] = 10.0
        if null is not None:
            start[i, 0] = end[i, 0] = null[i]
    cut = lambda a: [a[i:i + batch_size] for i in range(0, len(a), batch_size)]  # noqa: E731
    return {"start_logits": cut(start), "end_logits": cut(end)}


def test_registered():
    assert get_task_type("mrc") is MRCTask
    assert MRCTask.main_metric == "f1"


def test_windows_cover_context_and_positions_map_back(vocab, tmp_path):
    words = [LETTERS[i % 26] for i in range(60)]
    context = " ".join(words)
    answer = "s t u"  # words 18..20
    path = squad(tmp_path, "train.json", [(context, [qa("q1", "a b c d e f g h", context, answer)])])
    task = make_task(vocab, max_seq_len=24, doc_stride=8, max_query_len=4, files={"train_file": path})
    data = task.load("train")
    feats = data.features
    room = 24 - 4 - 3
    assert len(feats) == 7  # 17-token windows starting at 0, 8, ..., 48 (the last one reaches word 59)
    for k, f in enumerate(feats):
        assert len(f["input_ids"]) <= 24
        assert f["input_ids"][:6].tolist() == [1] + [VOCAB.index(c) for c in "abcd"] + [2]  # question cut to 4 tokens
        ctx_offsets = [f["offset_mapping"][i] for i in range(len(f["input_ids"])) if f["offset_mapping"][i]]
        assert len(f["offset_mapping"]) == len(f["input_ids"])
        first_word = ctx_offsets[0][0] // 2
        assert first_word == 8 * k and len(ctx_offsets) == min(room, 60 - 8 * k)
        s, e = f["start_position"], f["end_position"]
        if 8 * k <= 18 and 20 < 8 * k + room:
            assert context[f["offset_mapping"][s][0]:f["offset_mapping"][e][1]] == answer
        else:
            assert (s, e) == (0, 0)
    assert [f["start_position"] > 0 for f in feats] == [False, True, True] + [False] * 4
    # The token of a word is the max-context one in exactly one window.
    owners = [k for k, f in enumerate(feats) for pos in range(len(f["input_ids"]))
              if f["token_is_max_context"].get(str(pos)) and f["offset_mapping"][pos][0] == context.index("p")]
    assert owners == [1]
    # Decoding over all windows: a span counts only from the window giving its start the most context
    # (word 18 is 10 words into window 1, only 2 into window 2).
    def decoded_from(k):
        picks = [(f["start_position"], f["end_position"]) if i == k else (None, None) for i, f in enumerate(feats)]
        return task.predictions(data, hand_outputs(data, picks, batch_size=3))["q1"]

    assert decoded_from(1) == answer
    assert decoded_from(2) != answer


def test_chinese_offsets_are_characters(vocab, tmp_path):
    context = "北京是中国的首都"
    path = squad(tmp_path, "dev.json", [(context, [qa("c1", "中国的首都是哪里？", context, "北京")])])
    f = make_task(vocab, files={"dev_file": path}).load("dev").features[0]
    assert context[f["offset_mapping"][f["start_position"]][0]:f["offset_mapping"][f["end_position"]][1]] == "北京"
    assert f["end_position"] - f["start_position"] == 1


def test_unanswerable_points_at_cls_and_needs_with_negative(vocab, tmp_path):
    context = "a b c d e f g h i j k l m n o p"
    path = squad(tmp_path, "train.json", [(context, [qa("u1", "z ?", impossible=True),
                                                     qa("a1", "z ?", context, "k l")])])
    task = make_task(vocab, max_seq_len=12, doc_stride=4, with_negative=True, files={"train_file": path})
    feats = task.load("train").features
    unanswerable = [f for f in feats if f["example_id"] == "u1"]
    assert len(unanswerable) > 1 and all((f["start_position"], f["end_position"]) == (0, 0) for f in unanswerable)
    assert any(f["start_position"] > 0 for f in feats if f["example_id"] == "a1")
    with pytest.raises(ConfigError, match=r"train.json: data\[0\].paragraphs\[0\].qas\[0\] \(id 'u1'\): is_impossible "
                                          r"is true but option with_negative is false; set with_negative"):
        make_task(vocab, files={"train_file": path}).load("train")


def test_remove_noanswer_drops_training_windows_only(vocab, tmp_path):
    context = "a b c d e f g h i j k l m n o p"
    path = squad(tmp_path, "d.json", [(context, [qa("a1", "z", context, "o p")])])
    files = {"train_file": path, "dev_file": path}
    keep = make_task(vocab, max_seq_len=10, doc_stride=3, files=files)
    drop = make_task(vocab, max_seq_len=10, doc_stride=3, remove_noanswer=True, files=files)
    all_windows = keep.load("train").features
    assert len(all_windows) > 2 and sum(f["start_position"] == 0 for f in all_windows) >= 2
    kept = drop.load("train").features
    assert len(kept) >= 1 and all(f["start_position"] > 0 for f in kept)
    assert len(drop.load("dev").features) == len(all_windows)


def test_errors_name_file_path_value_and_fix(vocab, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"data": [\n  {"paragraphs": [}\n]}', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"bad.json:2:\d+: not valid JSON"):
        make_task(vocab, files={"train_file": str(bad)}).load("train")

    missing = squad(tmp_path, "missing.json", [("a b c", [{"id": "m1", "answers": []}])])
    with pytest.raises(ConfigError, match=r"missing.json: data\[0\].paragraphs\[0\].qas\[0\]: missing key 'question'"):
        make_task(vocab, files={"train_file": missing}).load("train")
    not_list = tmp_path / "notlist.json"
    not_list.write_text('{"data": {"paragraphs": []}}', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"notlist.json: data: expected a list, found \{'paragraphs': \[\]\}"):
        make_task(vocab, files={"train_file": str(not_list)}).load("train")

    shifted = squad(tmp_path, "shift.json", [("a b c d", [{"id": "s1", "question": "q",
                                                            "answers": [{"text": "c", "answer_start": 2}]}])])
    with pytest.raises(ConfigError) as err:
        make_task(vocab, files={"train_file": shifted}).load("train")
    msg = str(err.value)
    assert "shift.json: data[0].paragraphs[0].qas[0] (id 's1').answers[0]: answer_start 2 gives 'b'" in msg
    assert "set answer_start to 4" in msg

    no_answer = squad(tmp_path, "none.json", [("a b", [{"id": "n1", "question": "q", "answers": []}])])
    with pytest.raises(ConfigError, match=r"\(id 'n1'\): no answers; give answers"):
        make_task(vocab, files={"dev_file": no_answer}).load("dev")
    # A pred file needs no answers.
    data = make_task(vocab, files={"pred_file": no_answer}).load("pred")
    assert not data.has_labels and len(data.features) == 1

    dup = squad(tmp_path, "dup.json", [("a b", [qa("d", "q", "a b", "a"), qa("d", "q", "a b", "b")])])
    with pytest.raises(ConfigError, match=r"question id 'd' also used at data\[0\].paragraphs\[0\].qas\[0\]"):
        make_task(vocab, files={"train_file": dup}).load("train")

    with pytest.raises(ConfigError, match=r"option doc_stride = 0 must be a positive integer"):
        make_task(vocab, doc_stride=0)


def test_collate_shapes_and_dtypes(vocab, tmp_path):
    context = "a b c d e"
    path = squad(tmp_path, "t.json", [(context, [qa("1", "q", context, "c"), qa("2", "q r s", context, "e")])])
    task = make_task(vocab, files={"train_file": path})
    batch = task.collate(task.load("train").features)
    assert batch["input_ids"].shape == (2, 16) and batch["input_ids"].dtype == np.int64
    assert batch["input_mask"].shape == (2, 1, 1, 16)
    assert batch["start_positions"].tolist() == [5, 9] and batch["end_positions"].tolist() == [5, 9]
    assert batch["start_positions"].dtype == np.int64
    assert batch["segment_ids"][0].tolist()[:9] == [0, 0, 0, 1, 1, 1, 1, 1, 1]
    assert {s.name for s in task.label_feeds()} == {"start_positions", "end_positions"}
    dummy = task.dummy_labels(3, 16)
    assert dummy["start_positions"].shape == (3,) and not dummy["end_positions"].any()


def test_evaluate_and_predictions_on_hand_made_logits(vocab, tmp_path):
    c1, c2 = "a b c d e f", "g h i j k"
    path = squad(tmp_path, "dev.json", [(c1, [qa("q1", "x", c1, "c d")]), (c2, [qa("q2", "x", c2, "h i j k")])])
    task = make_task(vocab, for_cn=False, files={"dev_file": path})
    data = task.load("dev")
    # [CLS] x [SEP] ctx...: context token t sits at position 3 + t.
    outputs = hand_outputs(data, [(3 + 2, 3 + 3), (3 + 1, 3 + 2)], batch_size=1)
    assert task.predictions(data, outputs) == {"q1": "c d", "q2": "h i"}
    metrics = task.evaluate(data, outputs)
    # q1 exact; q2: 2 of 4 gold words, precision 1, recall 0.5 -> F1 2/3.
    assert metrics["em"] == pytest.approx(50.0)
    assert metrics["f1"] == pytest.approx(100 * (1 + 2 / 3) / 2)
    json.dumps(task.predictions(data, outputs))


def test_nbest_decoding_honours_max_answer_len(vocab, tmp_path):
    context = "a b c d e f g h"
    path = squad(tmp_path, "dev.json", [(context, [qa("q", "x", context, "b")])])
    data = make_task(vocab, files={"dev_file": path}).load("dev")
    outputs = hand_outputs(data, [(3 + 1, 3 + 5)])
    outputs["end_logits"][0][0, 3 + 2] = 9.0  # second-best end: span b..c
    assert make_task(vocab, files={"dev_file": path}, max_answer_len=5).predictions(data, outputs) == {"q": "b c d e f"}
    assert make_task(vocab, files={"dev_file": path}, max_answer_len=4).predictions(data, outputs) == {"q": "b c"}


def test_squad_v2_null_answer_and_threshold(vocab, tmp_path):
    context = "a b c d"
    path = squad(tmp_path, "dev.json", [(context, [qa("u", "x", impossible=True), qa("a", "x", context, "c")])])
    files = {"dev_file": path}
    data = make_task(vocab, with_negative=True, files=files).load("dev")
    # Both questions: span "c" scores 20, [CLS] null scores 2 * 11 = 22 -> score diff 2.
    outputs = hand_outputs(data, [(5, 5), (5, 5)], null=[11.0, 11.0])
    strict = make_task(vocab, with_negative=True, files=files)
    assert strict.predictions(data, outputs) == {"u": "", "a": ""}
    m = strict.evaluate(data, outputs)
    assert (m["em"], m["has_ans_f1"], m["no_ans_f1"]) == (50.0, 0.0, 100.0)
    assert m["best_f1"] == pytest.approx(50.0)
    lenient = make_task(vocab, with_negative=True, null_score_diff_threshold=3.0, files=files)
    assert lenient.predictions(data, outputs) == {"u": "c", "a": "c"}
    assert lenient.evaluate(data, outputs)["f1"] == pytest.approx(50.0)


def test_chinese_f1_is_character_level(vocab, tmp_path):
    context = "北京大学是中国的大学"
    path = squad(tmp_path, "dev.json", [(context, [qa("z", "哪里", context, "北京大学")])])
    files = {"dev_file": path}
    data = make_task(vocab, files=files).load("dev")
    outputs = hand_outputs(data, [(4, 5)])  # [CLS] 哪 里 [SEP] 北 京 ...: predicts 北京
    cn = make_task(vocab, for_cn=True, files=files)
    assert cn.predictions(data, outputs) == {"z": "北京"}
    # 2 common characters: precision 2/2, recall 2/4 -> F1 2/3.
    assert cn.evaluate(data, outputs) == pytest.approx({"em": 0.0, "f1": 100 * 2 / 3})
    # Whitespace tokens (English SQuAD): one token each, no overlap.
    assert make_task(vocab, for_cn=False, files=files).evaluate(data, outputs)["f1"] == 0.0


def marker_set(tmp_path, name, n, seed):
    """Contexts of 8 random letters and a '#': the answer is the letter after '#' (learning it takes
    attention to the previous token; about 100 steps with the settings below)."""
    rng = random.Random(seed)
    paragraphs = []
    for i in range(n):
        words = [rng.choice(LETTERS) for _ in range(8)]
        words.insert(rng.randrange(8), "#")
        context = " ".join(words)
        at = context.index("#") + 2
        paragraphs.append((context, [{"id": f"{name}{i}", "question": "?",
                                      "answers": [{"text": context[at], "answer_start": at}]}]))
    return squad(tmp_path, name + ".json", paragraphs)


@pytest.mark.slow
def test_dummy_labels_finite_and_learnable_marker_task(vocab, tmp_path):
    files = {"train_file": marker_set(tmp_path, "train", 256, 1), "dev_file": marker_set(tmp_path, "dev", 32, 2)}
    task = make_task(vocab, max_seq_len=32, files=files)
    other = make_task(vocab, name="other", index=1, max_seq_len=32, files=files)
    train, dev = task.load("train"), task.load("dev")
    harness = TaskHarness([task, other], vocab_size=len(VOCAB), lr=3e-3)
    train_batches = batches_of(task, train, 32)
    dev_batches = batches_of(task, dev, 16)

    # Dummy labels of `other` on a batch of `mrc` give a finite loss.
    (other_loss,) = harness.exe.run(harness.test, feed=harness.feed(0, dev_batches[0]),
                                    fetch_list=[harness.fwd.task_losses["other"]], scope=harness.scope)
    assert np.isfinite(other_loss).all()

    losses = harness.train(0, train_batches, steps=150)
    assert np.mean(losses[-8:]) < 0.25 * np.mean(losses[:8])
    metrics = task.evaluate(dev, harness.predict(0, dev_batches))
    # Trivial baseline: always the first context token (position 3 after [CLS] ? [SEP]).
    baseline = task.evaluate(dev, hand_outputs(dev, [(3, 3)] * len(dev.features)))
    assert baseline["f1"] < 25.0
    assert metrics["f1"] > baseline["f1"] + 50.0, (metrics, baseline)
