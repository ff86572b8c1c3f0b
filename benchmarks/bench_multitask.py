"""Per-step cost of the multi-task machinery, side by side in one run (never a timed test).

    python benchmarks/bench_multitask.py                     # ERNIE-base size, CPU
    python benchmarks/bench_multitask.py --size small --steps 12
    python benchmarks/bench_multitask.py --repo /path/to/older/checkout   # the same runs on another version

Every variant is a real `run_multitask_static.py` run (the training loop, data, logging) on the
same generated data: a one-task run (`pretrain` alone: what flag-mode pretraining trains), three
tasks on one ERNIE (pretrain + cls + seq_label: heads not drawn in a step are frozen), and the
three tasks with `use_ema: true`. Batch 8 x seq 128 for every task, accumulation 1, dropout on;
evaluation and checkpoints are out of the timed steps. The figure is the median seconds per
optimizer step over the steps after `--warmup` (from train_metrics.jsonl, logging every step),
and each variant's ratio to the one-task run.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SIZES = {"small": "ernie-small", "base": "ernie-1.0-base-zh"}
CHARS = [chr(c) for c in range(0x4E00, 0x4E00 + 3000)]


def make_data(root: Path, seed: int = 0) -> dict:
    """vocab, a .bin/.idx corpus, a classification and a sequence-labelling task over the same chars."""
    sys.path.insert(0, str(ROOT))
    from data_tools import create_pretraining_data

    rng = np.random.default_rng(seed)
    specials = ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"]
    (root / "vocab.txt").write_text("\n".join(specials + CHARS + ["##" + c for c in CHARS]) + "\n", encoding="utf-8")

    def sentence(n):
        return "".join(rng.choice(CHARS, n))

    docs = ["\n".join(sentence(int(rng.integers(20, 60))) + "。" for _ in range(8)) for _ in range(400)]
    (root / "docs.txt").write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    assert create_pretraining_data.main(["--input", str(root / "docs.txt"), "--vocab_file", str(root / "vocab.txt"),
                                         "--output_prefix", str(root / "corpus"), "--workers", "1"]) == 0
    rows = [f"{i % 2}\t{sentence(120)}" for i in range(400)]
    (root / "cls.tsv").write_text("label\ttext_a\n" + "\n".join(rows) + "\n", encoding="utf-8")
    rows = []
    for _ in range(400):
        chars = rng.choice(CHARS, 120)
        rows.append("\x02".join(chars) + "\t" + "\x02".join(rng.choice(list("BMES"), 120)))
    (root / "seg.tsv").write_text("text_a\tlabel\n" + "\n".join(rows) + "\n", encoding="utf-8")
    (root / "labels.json").write_text('{"B": 0, "M": 1, "E": 2, "S": 3}', encoding="utf-8")
    tasks = root / "tasks"
    tasks.mkdir(exist_ok=True)
    (tasks / "corpus.yaml").write_text("reader: pretrain\ntrain_file: ../corpus\nsplit: '98,1,1'\n", encoding="utf-8")
    (tasks / "sentiment.yaml").write_text("reader: cls\ntrain_file: ../cls.tsv\nn_classes: 2\n", encoding="utf-8")
    (tasks / "wordseg.yaml").write_text("reader: seq_label\ntrain_file: ../seg.tsv\nlabel_map: ../labels.json\n",
                                        encoding="utf-8")
    return {"vocab_size": 5 + 2 * len(CHARS)}


def config(root: Path, name: str, *, tasks: str, size: str, steps: int, vocab_size: int, **extra) -> Path:
    import yaml

    n = len(tasks.split(","))
    cfg = {"task_instance": tasks, "target_tag": ", ".join(["0"] * n), "mix_ratio": ", ".join(["1.0"] * n),
           "task_dir": "tasks", "model_name_or_path": SIZES[size], "vocab_path": str(root / "vocab.txt"),
           "vocab_size": vocab_size, "max_seq_len": 128, "batch_size": 8, "max_steps": steps, "device": "cpu",
           "logging_freq": 1, "eval_freq": 100000, "checkpoint_steps": 100000, "save_steps": 100000,
           "num_workers": 0, "save_path": str(root / "out" / name), "learning_rate": "1e-4", **extra}
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg, allow_unicode=True), encoding="utf-8")
    return path


def run(repo: Path, cfg: Path, out: Path, warmup: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(repo)}
    proc = subprocess.run([sys.executable, str(repo / "run_multitask_static.py"), "--config", str(cfg),
                           "--resume", "none"], cwd=cfg.parent, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{cfg.name} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    rows = [json.loads(line) for line in open(out / "train_metrics.jsonl", encoding="utf-8")]
    per_step = [1.0 / r["perf/steps_per_s"] for r in rows if "perf/steps_per_s" in r and r["step"] > warmup]
    return statistics.median(per_step[:-1] or per_step)  # the last window also holds the final checkpoint


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", choices=sorted(SIZES), default="base")
    p.add_argument("--steps", type=int, default=8, help="optimizer steps per variant (the first --warmup untimed)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repo", default=str(ROOT), help="checkout whose run_multitask_static.py is timed")
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from ernie_mtl.dist.machine import describe_machine  # the machine every figure below came from

    machine = describe_machine()
    print("\n".join(machine.header()), flush=True)
    repo = Path(args.repo).resolve()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        meta = make_data(root)
        variants = {
            "1 task (pretrain)": dict(tasks="corpus"),
            "3 tasks": dict(tasks="corpus, sentiment, wordseg"),
            "3 tasks + EMA": dict(tasks="corpus, sentiment, wordseg", use_ema=True, ema_decay=0.999),
        }
        results = {}
        for k, (label, v) in enumerate(variants.items()):
            cfg = config(root, f"v{k}", size=args.size, steps=args.steps, vocab_size=meta["vocab_size"], **v)
            results[label] = run(repo, cfg, root / "out" / f"v{k}", args.warmup)
            print(f"{label:<20} {results[label]:8.3f} s/step", flush=True)
    base = results["1 task (pretrain)"]
    print(f"\n{args.size} size, batch 8 x seq 128 per task, {repo}")
    print("| variant | s/step | vs 1 task |\n|---|---|---|")
    for label, value in results.items():
        print(f"| {label} | {value:.3f} | {value / base:.2f}x |")
    print(f"load average at the end: {open('/proc/loadavg').read().split()[:3]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
