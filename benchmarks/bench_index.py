"""Index-building time: our compiled helper (data_tools.index, wrapper checks and dtype
conversions included) vs our NumPy reference (data_tools.index_reference) vs PaddleNLP's compiled
helper (tool_helpers.helpers), on the same synthetic inputs. Prints a table; never a test.

Corpus: D documents with log-normal sentence counts (mean ~8) and sentence lengths (mean ~30
tokens), seeded. Workloads per D:
  pair mapping   max_seq_len 512 (budget 509 = 512 - 3 special tokens, passed to both helpers),
                 short_seq_prob 0.1, min_num_sent 2, 1 epoch, shuffled rows
  sample index   whole documents (tokens per document), a shuffled document order, seq_len 512
  blending       10 datasets with random weights, D samples
tool_helpers' pair mapping differs by design (Megatron's cut rule, skips documents with a
sentence > 512 tokens, mt19937 draws), so its row count differs slightly; its sample index is the
same algorithm and is checked for equality; its blending uses max(i, 1) instead of i + 1.
Times are the best of --repeat runs (fresh memory is slow to fault in on VMs, so the first run
of a size can be much slower). Outputs of ours and the reference are checked for equality.

    python benchmarks/bench_index.py                       # 1M and 10M documents
    python benchmarks/bench_index.py --docs 1e6 --repeat 5
    python benchmarks/bench_index.py --reference-max-docs 1e6   # skip the slow reference at 10M
"""
import zlib  # noqa: F401  (before anything that may import paddle)
import argparse
import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from data_tools import index as ours  # noqa: E402
from data_tools import index_reference as reference  # noqa: E402

try:
    from tool_helpers import helpers as tool_helpers
except ImportError:  # pragma: no cover - optional peer
    tool_helpers = None

MAX_SEQ_LEN, SHORT_SEQ_PROB, MIN_NUM_SENT, SEED = 512, 0.1, 2, 1234
BUDGET = MAX_SEQ_LEN - 3


@contextlib.contextmanager
def quiet_stdout():
    """tool_helpers prints from C++ (std::cout): silence file descriptor 1, not just sys.stdout."""
    sys.stdout.flush()
    saved, devnull = os.dup(1), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    try:
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


def best_time(fn: Callable[[], object], repeat: int):
    """(best seconds, last result) over `repeat` runs."""
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return min(times), result


def synthetic_corpus(num_docs: int, seed: int = 0):
    """doc_idx int64 [D+1], sentence sizes int32, tokens per document int32."""
    rng = np.random.default_rng(seed)
    counts = np.maximum(1, np.rint(rng.lognormal(np.log(8) - 0.32, 0.8, num_docs))).astype(np.int64)
    doc_idx = np.zeros(num_docs + 1, np.int64)
    np.cumsum(counts, out=doc_idx[1:])
    sizes = np.maximum(1, np.rint(rng.lognormal(np.log(30) - 0.18, 0.6, int(doc_idx[-1])))).astype(np.int32)
    doc_tokens = np.add.reduceat(sizes, doc_idx[:-1]).astype(np.int32)
    return doc_idx, sizes, doc_tokens


def run_size(num_docs: int, repeat: int, run_reference: bool) -> List[Dict]:
    doc_idx, sizes, doc_tokens = synthetic_corpus(num_docs)
    rows: List[Dict] = []

    def record(task: str, ours_fn, theirs_fn: Optional[Callable], ref_fn: Optional[Callable], check):
        t_ours, out_ours = best_time(ours_fn, repeat)
        t_theirs = out_theirs = None
        if theirs_fn is not None and tool_helpers is not None:
            with quiet_stdout():
                t_theirs, out_theirs = best_time(theirs_fn, repeat)
        t_ref = None
        if ref_fn is not None and run_reference:
            t_ref, out_ref = best_time(ref_fn, 1)
            if isinstance(out_ours, tuple):
                assert all(np.array_equal(a, b) for a, b in zip(out_ours, out_ref)), f"{task}: reference differs"
            else:
                assert out_ours.dtype == out_ref.dtype and np.array_equal(out_ours, out_ref), \
                    f"{task}: reference differs"
        rows.append(dict(task=task, docs=num_docs, ours=t_ours, theirs=t_theirs, ref=t_ref,
                         note=check(out_ours, out_theirs)))

    pair_kw = dict(num_epochs=1, max_num_samples=1, max_seq_len=BUDGET, short_seq_prob=SHORT_SEQ_PROB,
                   seed=SEED, min_num_sent=MIN_NUM_SENT)
    record("pair mapping",
           lambda: ours.build_sentence_pair_mapping(doc_idx, sizes, **pair_kw),
           lambda: tool_helpers.build_mapping(doc_idx, sizes, 1, 1, BUDGET, SHORT_SEQ_PROB, SEED,
                                              False, MIN_NUM_SENT),
           lambda: reference.build_sentence_pair_mapping(doc_idx, sizes, **pair_kw),
           lambda a, b: f"rows: ours {len(a):,}" + (f", tool_helpers {len(b):,}" if b is not None else ""))

    order = np.random.default_rng(1).permutation(num_docs).astype(np.int32)
    tokens = int(doc_tokens.sum())
    record("sample index",
           lambda: ours.build_sample_idx(doc_tokens, order, seq_len=MAX_SEQ_LEN, num_epochs=1,
                                         tokens_per_epoch=tokens),
           lambda: tool_helpers.build_sample_idx(doc_tokens, order, MAX_SEQ_LEN, 1, tokens),
           lambda: reference.build_sample_idx(doc_tokens, order, seq_len=MAX_SEQ_LEN, num_epochs=1,
                                              tokens_per_epoch=tokens),
           lambda a, b: f"samples {len(a) - 1:,}" + (
               f"; equal to tool_helpers: {np.array_equal(a, b)}" if b is not None else ""))

    weights = np.random.default_rng(2).random(10) + 0.05

    def theirs_blend():
        dataset_index = np.zeros(num_docs, np.uint8)
        sample_index = np.zeros(num_docs, np.int64)
        tool_helpers.build_blending_indices(dataset_index, sample_index, weights / weights.sum(),
                                            len(weights), num_docs, False)
        return dataset_index, sample_index

    record("blending (10 datasets)",
           lambda: ours.build_blending_indices(weights, num_docs),
           theirs_blend,
           lambda: reference.build_blending_indices(weights, num_docs),
           lambda a, b: f"{num_docs:,} samples")
    return rows


def fmt(seconds: Optional[float]) -> str:
    return "-" if seconds is None else f"{seconds:.3f}"


def ratio(num: Optional[float], den: float) -> str:
    return "-" if num is None else f"{num / den:.1f}x"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--docs", default="1e6,1e7", help="comma-separated document counts (default 1e6,1e7)")
    p.add_argument("--repeat", type=int, default=3, help="runs per timing of ours and tool_helpers; "
                   "the best is reported (the reference runs once)")
    p.add_argument("--reference-max-docs", type=float, default=float("inf"),
                   help="skip the NumPy reference above this many documents (it takes ~20 s per "
                        "workload at 1e7 here)")
    args = p.parse_args(argv)
    from ernie_mtl.dist.machine import describe_machine  # the machine every figure below came from

    machine = describe_machine()
    print("\n".join(machine.header()), flush=True)
    sizes = [int(float(x)) for x in args.docs.split(",") if x.strip()]
    if not sizes or min(sizes) < 1 or args.repeat < 1:
        p.error(f"--docs needs positive counts and --repeat >= 1, got --docs {args.docs} --repeat {args.repeat}")
    if tool_helpers is None:
        print("tool_helpers is not installed: its column stays empty")

    table = []
    for num_docs in sizes:
        run_reference = num_docs <= args.reference_max_docs
        if not run_reference:
            print(f"{num_docs:,} documents: NumPy reference skipped (--reference-max-docs "
                  f"{args.reference_max_docs:g})")
        table += run_size(num_docs, args.repeat, run_reference)

    header = (f"{'workload':<24}{'docs':>12}{'ours s':>9}{'tool_helpers s':>16}{'reference s':>13}"
              f"{'tool_helpers/ours':>19}{'reference/ours':>16}  notes")
    print(f"\nbest of {args.repeat} (reference: 1 run); ours includes the wrapper's checks and conversions")
    print(header)
    print("-" * len(header))
    for r in table:
        print(f"{r['task']:<24}{r['docs']:>12,}{fmt(r['ours']):>9}{fmt(r['theirs']):>16}{fmt(r['ref']):>13}"
              f"{ratio(r['theirs'], r['ours']):>19}{ratio(r['ref'], r['ours']):>16}  {r['note']}")
    slow = [f"{r['task']} @ {r['docs']:,}" for r in table if r["theirs"] is not None and r["theirs"] < r["ours"]]
    under5 = [f"{r['task']} @ {r['docs']:,}" for r in table if r["ref"] is not None and r["ref"] < 5 * r["ours"]]
    print("\ntarget 'at least as fast as tool_helpers': " + ("met" if not slow else "MISSED for " + "; ".join(slow)))
    print("target '>= 5x faster than the reference': " + ("met" if not under5 else "MISSED for " + "; ".join(under5)))

if __name__ == "__main__":
    main()
