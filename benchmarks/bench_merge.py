"""Merge throughput next to a plain copy of the same bytes.

    python benchmarks/bench_merge.py [--shards 3] [--mb 300] [--repeats 3]

Writes `--shards` corpora of `--mb` MB of tokens in total (uint16 token ids, sentences of 1-80
tokens, documents of 1-30 sentences: about 17% of the bytes are index) with their sidecars into a
temporary folder on the filesystem of --dir, then times, interleaved, best of --repeats:
- merge: `data_tools.merge` (checks every input, copies the token bytes and sizes, streams the
  document ends, writes the pointers, fsyncs the .bin while it writes the index, renames);
- copy: `shutil.copyfile` of every input .bin and .idx (what `cp` does: sendfile, no fsync);
- copy + fsync: the same, each copy fsynced (the merge makes its output durable before renaming).
MB/s = bytes of the inputs (.bin + .idx) per second. The files are in the page cache for every
run (both read the same warm bytes); the copies and the merge write to the same filesystem. A plain
copy returns once the bytes are in the page cache; the merge returns once they are on the disk
(it renames its output into place only then), which is what "copy + fsync" also waits for.
Check `cat /proc/loadavg` first: figures are only comparable on an otherwise idle machine.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from data_tools import merge  # noqa: E402
from data_tools.indexed_dataset import IndexedDatasetBuilder  # noqa: E402


def make_shard(prefix: str, nbytes: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    tokens = documents = sentences = 0
    with IndexedDatasetBuilder(prefix, np.uint16) as b:
        while tokens * 2 < nbytes:
            doc_sentences = rng.integers(1, 31, 2000)
            sizes = rng.integers(1, 81, int(doc_sentences.sum()))
            b.add_documents(rng.integers(0, 20000, int(sizes.sum()), dtype=np.uint16), sizes, doc_sentences)
            tokens += int(sizes.sum())
            documents += len(doc_sentences)
            sentences += len(sizes)
        b.finalize()
    sidecar = {"format": "Megatron-LM MMIDIDX v1 (.bin tokens + .idx index)", "dtype": "uint16",
               "vocab_file": "vocab.txt", "vocab_sha1": "0" * 40, "vocab_size": 20000, "do_lower_case": True,
               "split_sentences": True, "cn_whole_word_segment": True, "jieba_hmm": True, "tokenizer": "fast",
               "json_key": "text", "inputs": [f"{prefix}.jsonl"], "input_bytes": 3 * tokens,
               "documents": documents, "sentences": sentences, "tokens": tokens, "empty_documents_skipped": 0,
               "malformed_lines": 0}
    Path(f"{prefix}.json").write_text(json.dumps(sidecar))


def time_merge(prefixes, out: str) -> float:
    start = time.perf_counter()
    merge.merge(merge.open_inputs(prefixes), out)
    return time.perf_counter() - start


def time_copy(prefixes, out_dir: str, fsync: bool) -> float:
    start = time.perf_counter()
    for p in prefixes:
        for ext in (".bin", ".idx"):
            dst = os.path.join(out_dir, os.path.basename(p) + ext)
            shutil.copyfile(p + ext, dst)
            if fsync:
                with open(dst, "rb") as f:
                    os.fsync(f.fileno())
    return time.perf_counter() - start


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shards", type=int, default=3)
    p.add_argument("--mb", type=float, default=300, help="MB of tokens in all shards together")
    p.add_argument("--repeats", type=int, default=3, help="runs per row (the best is reported)")
    p.add_argument("--dir", default=None, help="where the temporary folder goes (default: the system's)")
    args = p.parse_args()
    from ernie_mtl.dist.machine import describe_machine  # the machine every figure below came from

    machine = describe_machine()
    print("\n".join(machine.header()), flush=True)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        prefixes = [os.path.join(tmp, f"shard{k}") for k in range(args.shards)]
        for k, prefix in enumerate(prefixes):
            make_shard(prefix, int(args.mb * 1e6 / args.shards), seed=k)
        nbytes = sum(os.path.getsize(p + ext) for p in prefixes for ext in (".bin", ".idx"))
        print(f"{args.shards} shards, {nbytes / 1e6:.0f} MB (.bin + .idx) in {tmp}; load average "
              f"{os.getloadavg()[0]:.2f}", flush=True)
        best = {}
        for r in range(args.repeats):
            for name in ("merge", "copy", "copy + fsync"):
                out = os.path.join(tmp, "out")
                os.makedirs(out)
                if name == "merge":
                    seconds = time_merge(prefixes, os.path.join(out, "merged"))
                else:
                    seconds = time_copy(prefixes, out, fsync=name.endswith("fsync"))
                shutil.rmtree(out)
                best[name] = min(best.get(name, float("inf")), seconds)
                print(f"  {name:12s} {seconds:6.2f}s  {nbytes / seconds / 1e6:7.0f} MB/s  load average "
                      f"{os.getloadavg()[0]:.2f}", flush=True)
        print(f"\nMerging {args.shards} shards, {nbytes / 1e6:.0f} MB, best of {args.repeats}")
        print(f"{'':14} | {'MB/s':>6} | merge speed / this speed")
        print("-" * 38)
        for name in ("merge", "copy", "copy + fsync"):
            print(f"{name:<14} | {nbytes / best[name] / 1e6:6.0f} | {best[name] / best['merge']:.2f}x")


if __name__ == "__main__":
    main()
