"""Would a GPU be fed? The host's work per optimizer step next to the GPU step times implied by
published rates, with 0, 1, 2 and 4 data-loading workers (ernie_mtl/engine/datapath.py).

    python benchmarks/bench_host.py                      # both parts, the tables of docs/performance.md
    python benchmarks/bench_host.py --part host          # the host path alone (no training)
    python benchmarks/bench_host.py --part loop          # the real training loop on CPU
    python benchmarks/bench_host.py --profile            # where building a micro-batch spends its time

GPU demand. PaddleNLP's static ERNIE-1.0 pretraining reaches 666 sequences/s on one V100 with AMP at
sequence length 128 (PaddleNLP PR #1744): 1.50 ms per sample; an A100 runs BERT-base about 3x as fast
(0.50 ms). Those are ERNIE-base at 128; other sizes and lengths are scaled by the training FLOPs per
sequence (6 x non-embedding parameters + 12 x layers x hidden x seq per token), an estimate.

Part `host`: a synthetic Chinese-like corpus (whole words of 1-3 characters, as bench_dataset.py),
flag-mode pretraining samples (pair, truncation, whole-word masking), `--batch` per step (one
micro-batch per rank), through the run's own FeedRecipe. 0 workers: the training process builds,
collates and converts each micro-batch to tensors itself (ms per step on its critical path). N
workers: the BackgroundFeeder delivers micro-batches to a loop that does nothing else (steps/s the
data path can sustain per rank, which must exceed what the GPU consumes).

Part `loop`: the real training loop (run_multitask_static.py, flag mode, --device cpu) with a
callback that records every Executor.run of the training program. Exposed host time per step = the
time between the end of one run and the start of the next, summed over a step's micro-batches:
what a device that cannot run ahead of the host would wait (no step of the timed range logs,
evaluates or saves). On a GPU, runs without a fetch return once queued, so this host time is hidden
behind the device up to the step time; it is the bound that matters when it is not. Also the CPU
run's own tokens/s with each worker count (2 threads for the model, workers 1 thread each).
"""
import zlib  # noqa: F401  (before paddle)

import argparse
import cProfile
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


sys.path.insert(0, str(Path(os.path.abspath(__file__)).parent))
import step_programs as sp  # noqa: E402  (also puts the repository on sys.path)

V100_SEQ_PER_S = 666.0  # PaddleNLP PR #1744: static ERNIE-1.0 base, AMP, seq 128, one V100
A100_FACTOR = 3.0  # A100 vs V100 on BERT-base pretraining, roughly
TARGET_V100, TARGET_A100 = 0.02, 0.05  # exposed host time as a fraction of the GPU step
DELIVERY_TARGET = 3.0  # the host path alone: x the A100 demand per rank


def arch_of(model):
    return sp._model_cfg(model, False).resolve().arch


def flops_per_seq(arch, seq):
    h, layers, ffn = arch["hidden_size"], arch["num_hidden_layers"], arch["intermediate_size"]
    return seq * (6 * layers * (4 * h * h + 2 * h * ffn) + 12 * layers * h * seq)


def gpu_step_s(model, seq, batch, gpu):
    """Seconds of one step of `batch` sequences on one GPU, from the published ERNIE-base seq-128 rate,
    scaled by FLOPs per sequence for other sizes and lengths."""
    rate = V100_SEQ_PER_S * (A100_FACTOR if gpu == "A100" else 1.0)
    scale = flops_per_seq(arch_of(model), seq) / flops_per_seq(arch_of("base"), 128)
    return batch * scale / rate


# -- the host path alone ---------------------------------------------------------------------------------
def host_recipe(tmp: Path, seq: int, batch: int, steps: int, dropout_seeds: int):
    """(recipe, schedule) of a flag-mode pretraining run over the synthetic corpus."""
    from bench_dataset import synthetic_corpus
    from ernie_mtl.dist.process import ProcessInfo
    from ernie_mtl.dist.topology import Topology
    from ernie_mtl.engine.feeding import FeedRecipe
    from ernie_mtl.engine.validate import parse
    from ernie_mtl.planning.plan import prepare

    if not (tmp / "corpus.bin").exists():
        synthetic_corpus(tmp, 3000)
    vocab_size = sum(1 for _ in open(tmp / "vocab.txt", encoding="utf-8"))
    cfg = parse(["--device", "cpu", "--model_name_or_path", sp.MODELS["base"], "--vocab_size", str(vocab_size),
                 "--input_dir", str(tmp / "corpus"), "--tokenizer_name_or_path", str(tmp / "vocab.txt"),
                 "--split", "98,1,1", "--max_seq_len", str(seq), "--micro_batch_size", str(batch),
                 "--global_batch_size", str(batch), "--max_steps", str(steps), "--output_dir", str(tmp / "out")])
    plan = prepare(cfg, info=ProcessInfo(rank=0, world_size=1, local_rank=0), topo=Topology.from_config(cfg.parallel, 1),
                   barrier=lambda *a, **k: None, log=lambda m: None, load_dev=False)
    recipe = FeedRecipe(tasks=list(plan.tasks), train=dict(plan.train), streams=list(plan.streams), seed=cfg.train.seed,
                        data_rank=0, data_world=1, dropout_seeds=dropout_seeds)
    return recipe, plan.schedule


def stage(feed):
    """What the training process does with a numpy feed before the run: tensors (here on the CPU)."""
    from paddle.base import core

    place, out = core.CPUPlace(), {}
    for k, v in feed.items():
        t = core.LoDTensor()
        t.set(v, place)
        out[k] = t
    return out


def host_in_process(recipe, schedule, steps):
    """(wall, CPU) seconds per step to build + collate + make the feed + convert it, in the training process."""
    times = []
    for step in range(steps):
        read = list(schedule.counts)
        drawn = [schedule.next_task()]
        start, cpu = time.perf_counter(), time.process_time()
        for micro in recipe.step(step, drawn, read):
            stage(micro.feed)
        times.append((time.perf_counter() - start, time.process_time() - cpu))
    return times


def cpu_seconds(pid=None):
    """CPU seconds (user + system) used so far by process `pid` (default: this one)."""
    if pid is None:
        t = os.times()
        return t.user + t.system
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def host_background(recipe, schedule, steps, workers, prefetch):
    """What a BackgroundFeeder sustains for a loop that does nothing else, after the workers started
    and the queue filled once: (wall seconds per step, CPU seconds per step of the workers, of the
    training process (its staging thread and loop)), and the workers' hello records."""
    from ernie_mtl.engine.datapath import BackgroundFeeder

    feeder = BackgroundFeeder(recipe, num_workers=workers, prefetch_factor=prefetch, accumulate_steps=1)
    warm = max(2, steps // 10)
    try:
        feeder.start(0, schedule)
        for step in range(steps):
            if step == warm:
                start = (time.perf_counter(), sum(cpu_seconds(w.process.pid) for w in feeder.workers), cpu_seconds())
            read = list(schedule.counts)
            drawn = [schedule.next_task()]
            for _ in feeder.step(step, drawn, read):
                pass
        end = (time.perf_counter(), sum(cpu_seconds(w.process.pid) for w in feeder.workers), cpu_seconds())
        hello = feeder.stats()["workers"]
    finally:
        feeder.close()
    n = steps - warm
    return [(b - a) / n for a, b in zip(start, end)], hello


def run_host(args):
    import paddle  # noqa: F401  (the training process has it: tensors are made through it)

    rows = []
    with tempfile.TemporaryDirectory(prefix="ernie_bench_host_") as tmp:
        for seq in args.seqs:
            steps = args.host_steps
            recipe, schedule = host_recipe(Path(tmp), seq, args.batch, steps * (1 + args.repeats * len(args.workers)),
                                           dropout_seeds=1 + 3 * arch_of("base")["num_hidden_layers"])
            row = {"seq": seq, "batch": args.batch}
            for r in range(args.repeats):
                for w in args.workers:
                    with sp.OtherLoad() as other:
                        if w == 0:
                            times = host_in_process(recipe, schedule, steps)[2:]
                            got = [statistics.median(t[0] for t in times), 0.0, statistics.median(t[1] for t in times)]
                        else:
                            got, hello = host_background(recipe, schedule, steps, w, args.prefetch)
                            row["startup"] = max(row.get("startup", 0), max(h["ready_after_s"] for h in hello))
                    row.setdefault(w, []).append(got)
                    row.setdefault("other", []).append(other.cores)
                    print(f"# host path seq {seq}, {w} workers, repeat {r}: wall {got[0] * 1e3:.2f} ms/step, CPU "
                          f"workers {got[1] * 1e3:.2f} + trainer {got[2] * 1e3:.2f} ms/step; other processes "
                          f"{other.cores:.2f} cores", file=sys.stderr)
            rows.append(row)
    return rows


def print_host(rows, args):
    print(f"\n**The host path alone** (batch {args.batch} per step = per rank; {os.cpu_count()} cores on this machine; "
          f"per step, medians of {args.repeats} repeats; other processes used {min(min(r['other']) for r in rows):.1f}-"
          f"{max(max(r['other']) for r in rows):.1f} cores meanwhile). Wall: 0 workers = on the loop's critical path; "
          "N workers = the step period the data path sustains for a loop that does nothing else. CPU: the work "
          "itself (workers + training process), which the load of other processes does not inflate; 'a core per "
          "worker' = the rate that CPU time gives when each worker and the training process have a core:\n")
    print("| seq | workers | wall ms/step | CPU ms/step (workers + trainer) | samples/s delivered | samples/s with a core "
          "per worker | A100 demand, ERNIE-base | delivered / demand (a core per worker) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        demand = args.batch / gpu_step_s("base", r["seq"], args.batch, "A100")
        for w in args.workers:
            wall = statistics.median(x[0] for x in r[w])
            workers_cpu, trainer_cpu = statistics.median(x[1] for x in r[w]), statistics.median(x[2] for x in r[w])
            cpu = f"{workers_cpu * 1e3:.1f} + {trainer_cpu * 1e3:.1f}" if w else f"{trainer_cpu * 1e3:.1f} (in the loop)"
            rate = args.batch / wall
            # a core per worker: the workers run in parallel, the training process's part (staging) in series
            core = args.batch / max(workers_cpu / w, trainer_cpu) if w else args.batch / trainer_cpu
            print(f"| {r['seq']} | {w} | {wall * 1e3:.1f} | {cpu} | {rate:,.0f} | {core:,.0f} | {demand:,.0f} | "
                  f"{rate / demand:.1f}x ({core / demand:.1f}x){'' if w else ', blocking the loop'} |")
    print(f"\nTarget: delivered >= {DELIVERY_TARGET:.0f}x the A100 demand per rank with <= 4 workers. Worker start-up "
          f"(from its start to its first message: interpreter, imports, recipe): "
          f"{max(r.get('startup', 0) for r in rows):.2f} s at most.")


# -- the real loop -----------------------------------------------------------------------------------------
_GAPS_PLUGIN = '''
import json, os, time
from ernie_mtl.engine.callbacks import Callback, register_callback


@register_callback("bench_gaps")
class BenchGaps(Callback):
    """Every Executor.run of the training program (start, end), and the run count at each step's end."""

    def on_train_begin(self, trainer):
        self.runs, self.steps = [], []
        run, main = trainer.exe.run, trainer.p.main

        def timed(program=None, *args, **kwargs):
            start, cpu = time.perf_counter(), time.thread_time()
            try:
                return run(program, *args, **kwargs)
            finally:
                if program is main:  # wall and this thread's CPU time, at the start and the end
                    self.runs.append((start, time.perf_counter(), cpu, time.thread_time()))

        trainer.exe.run = timed  # this executor object only
        self.steps.append((time.perf_counter(), 0))

    def on_step_end(self, trainer, step, tasks):
        self.steps.append((time.perf_counter(), len(self.runs)))

    def on_train_end(self, trainer):
        stats = trainer.feeder.stats() if hasattr(trainer.feeder, "stats") else {}
        with open(os.environ["ERNIE_BENCH_GAPS"], "w") as f:
            json.dump({"runs": self.runs, "steps": self.steps, "feeder": stats}, f)
'''


def run_loop_once(model, batch, seq, workers, prefetch, steps, warmup):
    from bench_train import write_corpus

    arch = arch_of(model)
    total = warmup + steps
    with tempfile.TemporaryDirectory(prefix="ernie_bench_loop_") as tmp:
        work = Path(tmp)
        prefix, vocab = write_corpus(work, arch["vocab_size"], seq)
        (work / "gaps.py").write_text(_GAPS_PLUGIN)
        out_file = work / "gaps.json"
        big = str(10 * total)
        cmd = [sys.executable, str(sp.ROOT / "run_multitask_static.py"), "--device", "cpu",
               "--model_name_or_path", sp.MODELS.get(model, model), "--vocab_size", str(arch["vocab_size"]),
               "--input_dir", str(prefix), "--tokenizer_name_or_path", str(vocab), "--split", "98,1,1",
               "--max_seq_len", str(seq), "--short_seq_prob", "0", "--micro_batch_size", str(batch),
               "--global_batch_size", str(batch), "--max_steps", str(total), "--warmup_rate", "0",
               "--decay_steps", str(sp.LR_HORIZON), "--logging_freq", big, "--eval_freq", big, "--eval_iters", "1",
               "--checkpoint_steps", big, "--save_steps", big, "--seed", "1", "--num_workers", str(workers),
               "--prefetch_factor", str(prefetch), "--output_dir", str(work / "out"),
               "--plugins", str(work / "gaps.py"), "--callbacks", "bench_gaps"]
        env = {**os.environ, "ERNIE_BENCH_GAPS": str(out_file),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(sp.ROOT), os.environ.get("PYTHONPATH")]))}
        env.pop("OMP_NUM_THREADS", None)
        env.pop("MKL_NUM_THREADS", None)
        with sp.OtherLoad() as other:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp)
        if proc.returncode or not out_file.exists():
            raise SystemExit(f"the real loop failed ({' '.join(cmd)}):\n{(proc.stdout + proc.stderr)[-3000:]}")
        record = json.loads(out_file.read_text())
    runs, marks = record["runs"], record["steps"]
    exposed, exposed_cpu, step_s = [], [], []
    for k in range(1 + warmup, len(marks)):  # step k: runs [marks[k-1].count, marks[k].count)
        first, last = marks[k - 1][1], marks[k][1]
        gaps = range(max(first, 1), last)
        exposed.append(sum(runs[i][0] - runs[i - 1][1] for i in gaps))
        exposed_cpu.append(sum(runs[i][2] - runs[i - 1][3] for i in gaps))  # the loop thread's own CPU in the gaps
        step_s.append(marks[k][0] - marks[k - 1][0])
    return {"exposed": exposed, "exposed_cpu": exposed_cpu, "step_s": step_s, "tokens_per_step": batch * seq,
            "feeder": record["feeder"], "other_cores": other.cores}


def run_loop(args):
    results = {}
    for model in args.loop_models:
        for batch in args.loop_batches:
            for r in range(args.runs):
                for w in (args.workers if r % 2 == 0 else list(reversed(args.workers))):  # alternate the order
                    sp.wait_for_quiet(args.wait_quiet)
                    res = run_loop_once(model, batch, 128, w, args.prefetch, args.loop_steps, args.loop_warmup)
                    results.setdefault((model, batch, w), []).append(res)
                    print(f"# loop {model} b{batch} w{w} run {r}: exposed median {statistics.median(res['exposed']) * 1e3:.2f} "
                          f"ms (loop thread CPU {statistics.median(res['exposed_cpu']) * 1e3:.2f} ms; per step "
                          f"{[round(x * 1e3, 2) for x in res['exposed']]}), step {statistics.median(res['step_s']):.3f} s, "
                          f"other cores {res['other_cores']:.2f}", file=sys.stderr)
    return results


def print_loop(results, args):
    print("\n**The real loop** (CPU, seq 128, 1 micro-batch per step; exposed host time per step = between the "
          "end of one Executor.run and the start of the next; medians over steps, the range over runs):\n")
    print("| model | batch | workers | exposed host ms/step, wall (the loop thread's CPU) | of a V100 step | of an A100 step "
          "| CPU tokens/s (runs) |")
    print("|---|---|---|---|---|---|---|")
    for (model, batch, w), runs in results.items():
        exposed = statistics.median([e for r in runs for e in r["exposed"]])
        exposed_cpu = statistics.median([e for r in runs for e in r["exposed_cpu"]])
        per_run = [r["tokens_per_step"] / statistics.median(r["step_s"]) for r in runs]
        tok = runs[0]["tokens_per_step"] / statistics.median([s for r in runs for s in r["step_s"]])
        v100, a100 = gpu_step_s(model, 128, batch, "V100"), gpu_step_s(model, 128, batch, "A100")
        print(f"| {model} | {batch} | {w} | {exposed * 1e3:.2f} ({exposed_cpu * 1e3:.2f}) | {exposed / v100:.1%} (target <= {TARGET_V100:.0%}; "
              f"step {v100 * 1e3:.1f} ms) | {exposed / a100:.1%} (target <= {TARGET_A100:.0%}; step {a100 * 1e3:.1f} ms) "
              f"| {tok:,.0f} ({', '.join(f'{x:,.0f}' for x in per_run)}) |")
        if model != "base":  # the host's work hardly depends on the model: against the published model's steps too
            bv, ba = gpu_step_s("base", 128, batch, "V100"), gpu_step_s("base", 128, batch, "A100")
            print(f"|  (vs ERNIE-base's GPU steps) | | | | {exposed / bv:.1%} ({exposed_cpu / bv:.1%} CPU) of {bv * 1e3:.1f} ms "
                  f"| {exposed / ba:.1%} ({exposed_cpu / ba:.1%} CPU) of {ba * 1e3:.1f} ms | |")


# -- the profile -------------------------------------------------------------------------------------------
def run_profile(args):
    import paddle  # noqa: F401

    with tempfile.TemporaryDirectory(prefix="ernie_bench_host_") as tmp:
        for seq in args.seqs:
            recipe, schedule = host_recipe(Path(tmp), seq, args.batch, args.host_steps + 5, dropout_seeds=37)
            host_in_process(recipe, schedule, 3)  # imports, page cache
            profile = cProfile.Profile()
            profile.enable()
            times = host_in_process(recipe, schedule, args.host_steps)
            profile.disable()
            print(f"\n## seq {seq}, batch {args.batch}: {statistics.median(times) * 1e3:.2f} ms per step "
                  f"({statistics.median(times) / args.batch * 1e6:.0f} us per sample), under the profiler\n")
            pstats.Stats(profile).sort_stats("tottime").print_stats(18)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", choices=("host", "loop", "both"), default="both")
    p.add_argument("--profile", action="store_true", help="profile building micro-batches in-process, then exit")
    p.add_argument("--seqs", default="128,512", help="sequence lengths of the host path")
    p.add_argument("--batch", type=int, default=32, help="samples per step and rank (host path)")
    p.add_argument("--workers", default="0,1,2,4")
    p.add_argument("--prefetch", type=int, default=2, help="--prefetch_factor")
    p.add_argument("--host_steps", type=int, default=200)
    p.add_argument("--loop_models", default="small,base")
    p.add_argument("--loop_batches", default="32", help="batch per step of the real loop (comma-separated)")
    p.add_argument("--loop_steps", type=int, default=8)
    p.add_argument("--loop_warmup", type=int, default=2)
    p.add_argument("--runs", type=int, default=2, help="real-loop processes per configuration")
    p.add_argument("--repeats", type=int, default=3, help="host-path measurements per configuration")
    p.add_argument("--wait_quiet", type=float, default=0, help="seconds to wait for an idle machine before each run")
    args = p.parse_args()
    args.seqs = [int(s) for s in args.seqs.split(",")]
    args.workers = [int(w) for w in args.workers.split(",")]
    args.loop_models = args.loop_models.split(",")
    args.loop_batches = [int(b) for b in args.loop_batches.split(",")]
    if args.profile:
        run_profile(args)
        return
    print(f"GPU steps from PaddleNLP's ERNIE-1.0 base rate ({V100_SEQ_PER_S:.0f} seq/s, V100, AMP, seq 128; A100 "
          f"{A100_FACTOR:.0f}x): V100 {gpu_step_s('base', 128, 32, 'V100') * 1e3:.1f} ms, A100 "
          f"{gpu_step_s('base', 128, 32, 'A100') * 1e3:.1f} ms per step of 32 sequences")
    if args.part in ("host", "both"):
        print_host(run_host(args), args)
    if args.part in ("loop", "both"):
        print_loop(run_loop(args), args)


if __name__ == "__main__":
    main()
