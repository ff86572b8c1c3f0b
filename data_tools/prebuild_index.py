"""Build the sample-index caches of a pretraining corpus ahead of a run, so that GPUs do not sit
idle while rank 0 builds them. Pass the same data and sampling flags as the run; the caches
land where the run looks for them (default `<corpus dir>/index-cache`), keyed by a hash of
everything that shapes them, so a run with other flags simply builds its own.

    python -m data_tools.prebuild_index --input_prefix demo_data/corpus --split 949,50,1 \
        --max_seq_len 512 --global_batch_size 64 --max_steps 100000 --eval_freq 1000 --eval_iters 10
"""
from __future__ import annotations

import argparse
import sys
import time

from data_tools.cli_utils import str2bool


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input_prefix", required=True, help="corpus prefix (the path without .bin/.idx)")
    p.add_argument("--cache_dir", default=None, help="index cache folder (default: <corpus dir>/index-cache)")
    p.add_argument("--split", default="949,50,1", help="train,valid,test document ratio")
    p.add_argument("--max_seq_len", type=int, default=512)
    p.add_argument("--short_seq_prob", type=float, default=0.1)
    p.add_argument("--binary_head", type=str2bool, nargs="?", const=True, default=True,
                   help="next-sentence/sentence-order head on: samples need at least two sentences")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--num_samples", default=None,
                   help="train,valid,test sample counts; default: derived from the run flags below")
    p.add_argument("--global_batch_size", type=int, default=None)
    p.add_argument("--max_steps", type=int, default=None)
    p.add_argument("--eval_freq", type=int, default=500)
    p.add_argument("--eval_iters", type=int, default=10)
    args = p.parse_args(argv)

    from ernie_mtl.data.pretrain import PretrainSampleConfig, build_pretrain_datasets, required_samples

    if args.num_samples:
        try:
            counts = [int(x) for x in args.num_samples.split(",")]
        except ValueError:
            p.error(f"--num_samples {args.num_samples!r} must be three integers, e.g. 6400000,70400,6400")
    elif args.global_batch_size and args.max_steps:
        counts = required_samples(global_batch_size=args.global_batch_size, max_steps=args.max_steps,
                                  eval_freq=args.eval_freq, eval_iters=args.eval_iters)
    else:
        p.error("give either --num_samples train,valid,test or --global_batch_size and --max_steps")
    cfg = PretrainSampleConfig(max_seq_len=args.max_seq_len, short_seq_prob=args.short_seq_prob,
                               binary_head=args.binary_head, seed=args.seed)
    start = time.perf_counter()
    try:
        datasets = build_pretrain_datasets(args.input_prefix, split=args.split, num_samples=counts, cfg=cfg,
                                           vocab=None, cache_dir=args.cache_dir)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for name, ds in datasets.items():
        print(f"{name:5s}: {0 if ds is None else len(ds):>12,d} samples "
              f"(documents {ds.doc_range[0]}..{ds.doc_range[1] - 1})" if ds is not None else f"{name:5s}: skipped")
    print(f"index caches ready in {time.perf_counter() - start:.2f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
