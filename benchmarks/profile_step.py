"""Where one training step's CPU time goes, by op type (paddle.profiler), side by side for variants.

    python benchmarks/profile_step.py                                   # pretraining + 3-task step, base size
    python benchmarks/profile_step.py --task pretrain --variants threads1,plain,serial+onednn
    python benchmarks/profile_step.py --model small --batch 16 --top 15

Each (task, variant) runs in its own process (threads and executor flags must be set before paddle
is imported): one warm-up step, `--steps` timed steps without the profiler (the step time reported: steps
during which other processes used CPU are repeated, up to 3x), then `--steps` profiled steps (the op
table; the CPU other processes used meanwhile is printed). `pretrain` is flag-mode pretraining (MLM + sentence
order); `multitask` is masked LM + classification + CRF tagging on one ERNIE, one micro-batch of each
task per step, reported per micro-batch. Variants are `+`-joined parts (benchmarks/step_programs.py):
plain (threads from ernie_mtl.dist.threads), threads1 (Paddle's default of one thread), serial, inplace,
onednn[=op types], seed (dropout seeds fed as Seed inputs, as the training engine does), nodrop.

Op time is the profiler's time inside each op (kernel, shape inference, layout transforms), summed
per op type; "ops total" may differ from the step time by executor overhead and the profiler's own
cost. The machine's load average is printed with the table: trust figures only from a quiet machine.
"""
import zlib  # noqa: F401  (before paddle)

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(os.path.abspath(__file__)).parent))
import step_programs as sp  # noqa: E402  (also puts the repository on sys.path)

DEFAULT_VARIANTS = "threads1,plain,serial+onednn"


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def child(args) -> dict:
    variant = sp.parse_variant(args.variant)
    threads = sp.prepare_env(variant)
    import paddle
    import paddle.profiler as profiler
    from paddle.profiler.profiler_statistic import StatisticData

    step = sp.build_step(args.task, args.model, args.batch, args.seq, variant)
    applied = _applied(step, variant)
    scope, exe = paddle.static.Scope(), paddle.static.Executor(paddle.CPUPlace())
    step.initialize(exe, scope)
    per_step = 3 if args.task == "multitask" else 1  # micro-batches in one step (one per task)
    i = 0

    def run_step():
        nonlocal i
        for _ in range(per_step):
            exe.run(step.main, feed=step.feed(i), fetch_list=[step.loss], scope=scope)
            step.after_run()
            i += 1

    run_step()  # warm-up: kernel selection, allocations
    kept, _ = sp.timed_steps(lambda _i: run_step(), args.steps)
    walls = [t / per_step for t, _ in kept]
    others = [c for _, c in kept]
    # the profiled window (paddle's profiler runs once per process: a disturbed window is reported, not redone)
    prof = profiler.Profiler(targets=[profiler.ProfilerTarget.CPU])
    prof.start()
    with sp.OtherLoad() as other:
        for _ in range(args.steps):
            run_step()
            prof.step()
    prof.stop()
    others.append(other.cores)
    stats = StatisticData(prof.profiler_result.get_data(), prof.profiler_result.get_extra_info())
    micro = args.steps * per_step
    ops = {name: [item.call / micro, item.cpu_time / 1e6 / micro]
           for name, item in stats.event_summary.items.items()}
    return {"task": args.task, "variant": args.variant, "threads": threads, "applied": applied,
            "step_ms": 1e3 * statistics.median(walls), "step_ms_all": [1e3 * w for w in walls], "ops": ops,
            "load": loadavg(), "other_cores": others}


def _applied(step, variant) -> str:
    parts = []
    if "onednn" in variant:
        n = sum(1 for b in step.main.blocks for op in b.ops if op.desc.has_attr("use_mkldnn") and op.attr("use_mkldnn"))
        parts.append(f"oneDNN on {n} ops")
    if step.seed_vars:
        parts.append(f"Seed input on {len(step.seed_vars)} dropout ops")
    return "; ".join(parts) or "as built"


def run_variant(task, variant, args) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--_child", "--task", task, "--variant", variant,
           "--model", args.model, "--batch", str(args.batch), "--seq", str(args.seq), "--steps", str(args.steps)]
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")} \
        if not args.keep_env else dict(os.environ)
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode:
        sys.exit(f"{task} / {variant} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def table(results, top: int) -> str:
    """Markdown: op type rows (by the first variant's time), a column per variant."""
    first = results[0]["ops"]
    names = sorted(set().union(*(r["ops"] for r in results)), key=lambda n: -first.get(n, [0, 0])[1])
    shown, rest = names[:top], names[top:]
    head = "| op type | calls | " + " | ".join(f"{r['variant']} ms (share)" for r in results) + " |"
    lines = [head, "|" + "---|" * (2 + len(results))]
    totals = [sum(v[1] for v in r["ops"].values()) for r in results]

    def cell(r, total, ms):
        return f"{ms:,.1f} ({ms / total:.0%})" if ms else "-"

    for n in shown:
        calls = next(r["ops"][n][0] for r in results if n in r["ops"])
        lines.append(f"| {n} | {calls:g} | " + " | ".join(
            cell(r, t, r["ops"].get(n, [0, 0])[1]) for r, t in zip(results, totals)) + " |")
    if rest:
        lines.append(f"| {len(rest)} other types | | " + " | ".join(
            cell(r, t, sum(r["ops"].get(n, [0, 0])[1] for n in rest)) for r, t in zip(results, totals)) + " |")
    lines.append("| **ops total** | | " + " | ".join(f"**{t:,.0f}**" for t in totals) + " |")
    base = results[0]["step_ms"]
    lines.append("| **step (unprofiled, median)** | | " + " | ".join(
        f"**{r['step_ms']:,.0f}** ({base / r['step_ms']:.2f}x)" for r in results) + " |")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default="both", choices=("pretrain", "multitask", "both"))
    p.add_argument("--model", default="base", help="tiny, small, base, or an architecture name")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--variants", default=DEFAULT_VARIANTS, help=f"comma-separated (default {DEFAULT_VARIANTS})")
    p.add_argument("--steps", type=int, default=2, help="timed steps, and profiled steps (default 2)")
    p.add_argument("--top", type=int, default=20, help="op types shown (the rest summed)")
    p.add_argument("--json", help="also write the raw results to this file")
    p.add_argument("--keep_env", action="store_true",
                   help="pass OMP_NUM_THREADS/MKL_NUM_THREADS of this shell to the runs (default: each variant decides)")
    p.add_argument("--wait_quiet", type=float, default=0,
                   help="before each run, wait up to this many seconds for the machine to be 90%% idle")
    p.add_argument("--_child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--variant", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args._child:
        print(json.dumps(child(args)))
        return
    from ernie_mtl.dist.machine import describe_machine  # the machine every figure below came from

    machine = describe_machine()
    print("\n".join(machine.header()), flush=True)
    tasks = ("pretrain", "multitask") if args.task == "both" else (args.task,)
    everything = []
    for task in tasks:
        results = []
        for variant in args.variants.split(","):
            idle = sp.wait_for_quiet(args.wait_quiet)
            before = f"{loadavg()}, {idle:.0%} idle"
            r = run_variant(task, variant, args)
            r["load_before"] = before
            results.append(r)
            print(f"# {task} / {variant}: {r['step_ms']:,.0f} ms per micro-batch (steps {', '.join(f'{x:,.0f}' for x in r['step_ms_all'])}); "
                  f"{r['threads']}; {r['applied']}; load {before} -> {r['load']}; other processes used "
                  f"{', '.join(f'{c:.2f}' for c in r['other_cores'])} cores during the kept timed steps and the profile",
                  file=sys.stderr)
        unit = "micro-batch (one of each task per step)" if task == "multitask" else "step"
        print(f"\n### {task}: {args.model}, batch {args.batch} x seq {args.seq}, ms per {unit}\n")
        print(table(results, args.top))
        print("\nCPU used by other processes during each variant's timed steps (cores, max): " + "; ".join(
            f"{r['variant']} {max(r['other_cores']):.2f}" for r in results))
        everything += results
    if args.json:
        sp.write_json(args.json, {"results": everything}, machine)


if __name__ == "__main__":
    main()
