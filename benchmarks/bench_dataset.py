"""Pretraining samples/s out of ErniePretrainDataset (pair construction + whole-word n-gram
masking) in one process at max_seq_len 512. Target: >= 1,000 samples/s per process.

    python benchmarks/bench_dataset.py                      # synthetic corpus (generated)
    python benchmarks/bench_dataset.py --corpus demo_data/corpus --vocab demo_data/vocab.txt
"""
import zlib  # noqa: F401  (before paddle-adjacent imports)
import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from data_tools.indexed_dataset import IndexedDatasetBuilder
from ernie_mtl.data.masking import VocabInfo
from ernie_mtl.data.pretrain import PretrainSampleConfig, build_pretrain_datasets, collate_pretrain


def synthetic_corpus(root: Path, docs: int, seed: int = 0):
    """Chinese-like corpus: 3000 characters with '##' word-continuation markers, 1-3 char words."""
    chars = [chr(0x4E00 + k) for k in range(3000)]
    tokens = ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"] + chars + ["##" + c for c in chars]
    (root / "vocab.txt").write_text("\n".join(tokens) + "\n", encoding="utf-8")
    rng = np.random.default_rng(seed)
    with IndexedDatasetBuilder(str(root / "corpus"), np.uint16) as b:
        for _ in range(docs):
            for _ in range(int(rng.integers(10, 40))):
                n_words = int(rng.integers(5, 25))
                lens = rng.integers(1, 4, size=n_words)
                firsts = rng.integers(5, 3005, size=n_words)
                sent = []
                for first, n in zip(firsts.tolist(), lens.tolist()):
                    sent.append(first)
                    sent += (rng.integers(5, 3005, size=n - 1) + 3000).tolist()
                b.add_sentence(np.array(sent))
            b.end_document()
        b.finalize()
    return str(root / "corpus"), str(root / "vocab.txt")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", default=None)
    p.add_argument("--vocab", default=None)
    p.add_argument("--docs", type=int, default=5000, help="documents of the synthetic corpus")
    p.add_argument("--samples", type=int, default=3000)
    p.add_argument("--max_seq_len", type=int, default=512)
    p.add_argument("--batch", type=int, default=32)
    args = p.parse_args()
    from ernie_mtl.dist.machine import describe_machine  # the machine every figure below came from

    machine = describe_machine()
    print("\n".join(machine.header()), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        corpus, vocab_file = (args.corpus, args.vocab) if args.corpus else synthetic_corpus(Path(tmp), args.docs)
        vocab = VocabInfo.from_file(vocab_file)
        cfg = PretrainSampleConfig(max_seq_len=args.max_seq_len, seed=1)
        ds = build_pretrain_datasets(corpus, split="1", num_samples=(args.samples, 0, 0), cfg=cfg, vocab=vocab,
                                     cache_dir=str(Path(tmp) / "cache"), log=lambda m: None)["train"]
        n = min(args.samples, len(ds))
        order = np.random.default_rng(0).permutation(len(ds))[:n]
        ds[int(order[0])]  # warm the page cache and imports
        start = time.perf_counter()
        tokens = 0
        for k in range(0, n, args.batch):
            batch = [ds[int(i)] for i in order[k:k + args.batch]]
            tokens += sum(len(s[0]) for s in batch)
            collate_pretrain(batch, pad_id=vocab.pad_id)
        seconds = time.perf_counter() - start
    rate = n / seconds
    print("| corpus | max_seq_len | samples | seconds | samples/s | tokens/sample | target |")
    print("|---|---|---|---|---|---|---|")
    print(f"| {'synthetic' if not args.corpus else args.corpus} | {args.max_seq_len} | {n} | {seconds:.2f} | "
          f"{rate:,.0f} | {tokens / n:.0f} | >= 1,000 ({rate / 1000:.2f}x) |")


if __name__ == "__main__":
    main()
