"""How long a checkpoint save stalls training, per format, at ERNIE 1.0 base size.

    python benchmarks/bench_checkpoint.py                      # base, 1 process and 2 sharded processes
    python benchmarks/bench_checkpoint.py --model small --layouts 1 dp2

Runs the real training command (run_multitask_static.py, flag mode, --device cpu, random init) on a
synthetic corpus with --checkpoint_steps 1, so every step ends with a save of model_last, and reads
the store's own timing from the log ("saved checkpoint ... in T s": from the start of the save to
the swap into place, barriers, SHA-1s and train_state.json included; with several processes the
time rank 0 waited, i.e. until the slowest rank finished). Formats: "paddle" (each rank's
paddle.static.save of its program: rank 0 alone without sharding) and "portable" (every tensor by
structured name in safetensors files, written by every rank in parallel: its own shard under
sharding, a round-robin share otherwise). Layouts: 1 (one process), dp2 (2 data-parallel
processes), sharding2 (2 processes, sharding 2). Prints the median save time of each and the
checkpoint's size. Benchmarks print figures; they are not tests. The first save of a run is
excluded (it allocates); take figures on a quiet machine.
"""
import zlib  # noqa: F401  (before paddle)

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(os.path.abspath(__file__)).parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

MODELS = {"tiny": "ernie-tiny-test", "small": "ernie-small", "base": "ernie-1.0-base-zh"}
LAYOUTS = {"1": (0, []), "dp2": (2, []), "sharding2": (2, ["--use_sharding", "true", "--sharding_degree", "2"])}
SAVED = re.compile(r"saved checkpoint \S+model_last \(step (\d+)\) in ([\d.]+) s")


def run(model: str, layout: str, fmt: str, *, steps: int, work: Path, corpus: Path, vocab: Path) -> list:
    procs, extra = LAYOUTS[layout]
    out = work / f"{layout}-{fmt}"
    from ernie_mtl.config import ModelConfig

    arch = ModelConfig(model_name_or_path=MODELS[model]).resolve().arch
    argv = [sys.executable] + (["-m", "paddle.distributed.launch", "--nproc_per_node", str(procs), "--log_dir",
                                str(work / f"logs-{layout}-{fmt}")] if procs else []) + [
        str(ROOT / "run_multitask_static.py"), "--device", "cpu", "--model_name_or_path", MODELS[model],
        "--vocab_size", str(arch["vocab_size"]), "--input_dir", str(corpus), "--tokenizer_name_or_path", str(vocab),
        "--output_dir", str(out), "--max_seq_len", "128", "--micro_batch_size", "1", "--global_batch_size", "2",
        "--max_steps", str(steps), "--checkpoint_steps", "1", "--save_steps", "100000", "--eval_freq", "100000",
        "--eval_iters", "1", "--logging_freq", "1", "--split", "98,1,1", "--short_seq_prob", "0",
        "--checkpoint_format", fmt, *extra]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=work)
    logs = proc.stdout + proc.stderr
    if procs:
        logs += "".join(p.read_text(errors="replace") for p in sorted((work / f"logs-{layout}-{fmt}").glob("workerlog.*")))
    if proc.returncode:
        raise SystemExit(f"{layout} {fmt} failed:\n{logs[-4000:]}")
    times = {int(m.group(1)): float(m.group(2)) for m in SAVED.finditer(logs)}
    size = sum(f.stat().st_size for f in (out / "model_last").rglob("*") if f.is_file())
    return [times[s] for s in sorted(times) if s > 1], size


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="base", choices=sorted(MODELS))
    parser.add_argument("--layouts", nargs="+", default=["1", "sharding2"], choices=sorted(LAYOUTS))
    parser.add_argument("--formats", nargs="+", default=["paddle", "portable"], choices=["paddle", "portable"])
    parser.add_argument("--steps", type=int, default=4, help="steps per run (a save after each; the first is excluded)")
    args = parser.parse_args(argv)
    from ernie_mtl.dist.machine import describe_machine  # the machine every figure below came from

    machine = describe_machine()
    print("\n".join(machine.header()), flush=True)
    from bench_train import write_corpus
    from ernie_mtl.config import ModelConfig

    vocab_size = ModelConfig(model_name_or_path=MODELS[args.model]).resolve().arch["vocab_size"]
    with tempfile.TemporaryDirectory(prefix="bench_ckpt_") as tmp:
        work = Path(tmp)
        corpus, vocab = write_corpus(work, vocab_size, 128, docs=200)
        print(f"model {args.model} ({MODELS[args.model]}), {args.steps - 1} timed saves per run, load average "
              f"{os.getloadavg()[0]:.2f}")
        for layout in args.layouts:
            for fmt in args.formats:
                times, size = run(args.model, layout, fmt, steps=args.steps, work=work, corpus=corpus, vocab=vocab)
                print(f"{layout:>10} {fmt:>9}: save {statistics.median(times):6.2f} s median "
                      f"({', '.join(f'{t:.2f}' for t in times)}), checkpoint {size / 2**20:,.0f} MiB")
        print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
