"""Would a GPU be fed? The host's work per optimizer step next to the GPU step times implied by
published rates, with 0, 1, 2 and 4 data-loading workers (ernie_mtl/engine/data_workers.py).

    python benchmarks/bench_host.py --part sim           # feed a simulated GPU (the tables of docs/performance.md)
    python benchmarks/bench_host.py --part sim --sim_exe none   # the loop and the data path alone
    python benchmarks/bench_host.py --part host          # the host path alone (no training)
    python benchmarks/bench_host.py --part loop          # the real training loop on CPU (a lower bound: see below)
    python benchmarks/bench_host.py --profile            # where building a micro-batch spends its time

GPU demand (`PUBLISHED`, `published_rate`). Published single-GPU training rates with mixed precision:
ERNIE-1.0 base at seq 128 on a V100 666.11 seq/s (PaddleNLP PR #1744, static graph); BERT-large (ERNIE-large's
shape) at seq 128 on a V100 224 seq/s (NVIDIA DeepLearningExamples, PyTorch), on an A100 694 seq/s at 128 and
264 seq/s at 512 (NVIDIA DeepLearningExamples, PaddlePaddle). A (GPU, model, length) without its own figure is
scaled by training FLOPs per sequence (6 x non-embedding parameters + 12 x layers x hidden x seq per token)
from that GPU's figure at the same length, else from the same model at the other length: an estimate. The
step is `--batch` sequences (default 32) per rank.

Part `sim` (the one that answers the question): the real training loop (run_multitask_static.py, flag mode)
with its real data-loading workers and feed, on a model with ERNIE-base's 12 layers at a tiny width, where a
plugin replaces the device: every run of the training program queues the GPU's step time of device work,
which runs asynchronously (the run returns once queued) with at most `--sim_ahead` earlier runs still queued,
and a fetch (the loss window, every `--sim_logging_freq` steps) waits for the device. Inside each run the host
does the executor's work per op (`--sim_exe proxy`: the same program run on one sample's first 8 tokens, next
to no arithmetic) or nothing (`none`: the loop and data path alone). Reported per worker count over
`--sim_runs` runs: steps/s achieved against the ideal (1 / the GPU step), the exposed host time (achieved step
period - the GPU step: the device waiting for the host), the trainer's and the workers' CPU per step (from
/proc: every process counted) and the cores per GPU that CPU means at the ideal rate.

Part `host`: a synthetic Chinese-like corpus (whole words of 1-3 characters, as bench_dataset.py),
flag-mode pretraining samples (pair, truncation, whole-word masking), `--batch` per step (one
micro-batch per rank), through the run's own FeedRecipe. 0 workers: the training process builds,
collates and converts each micro-batch to tensors itself (ms per step on its critical path). N
workers: the BackgroundFeeder delivers micro-batches to a loop that does nothing else (steps/s the
data path can sustain per rank, which must exceed what the GPU consumes).

Part `loop`: the real training loop on CPU with a callback that records every Executor.run of the
training program: the time between the end of one run and the start of the next. On CPU every step
takes seconds, so the workers always have a batch ready: this is the loop's own overhead with a batch
waiting, a lower bound of what a GPU would see (part `sim` measures that instead). Also the CPU run's
own tokens/s with each worker count (2 threads for the model, workers 1 thread each).
"""
import zlib  # noqa: F401  (before paddle)

import argparse
import cProfile
import json
import math
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

TARGET_V100, TARGET_A100 = 0.02, 0.05  # exposed host time as a fraction of the GPU step
DELIVERY_TARGET = 3.0  # the host path alone: x the A100 demand per rank


# ERNIE 1.0 large (PaddleNLP's ernie-1.0-large-zh-cw without its vocabulary): FLOP scaling only, never built here
LARGE = dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096)

# Published training throughput, sequences/s on one GPU with mixed precision: (figure, model, seq, source). A
# (GPU, model, seq) without its own figure is scaled by training FLOPs per sequence from the same GPU's figure
# at the same sequence length (another model size), else from the same model at the other length (less sure:
# efficiency changes with the length).
PUBLISHED = {
    "V100": [(666.11, "base", 128, "PaddleNLP PR #1744: ERNIE-1.0 base, PaddleNLP static, AMP, batch 128, V100 16 GB"),
             (224.0, "large", 128, "NVIDIA DeepLearningExamples PyTorch BERT-large, DGX-1 V100 32 GB, AMP, 1 GPU")],
    "A100": [(694.0, "large", 128, "NVIDIA DeepLearningExamples PaddlePaddle BERT-large, DGX A100 80 GB, AMP, 1 GPU"),
             (264.0, "large", 512, "NVIDIA DeepLearningExamples PaddlePaddle BERT-large, DGX A100 80 GB, AMP, 1 GPU")],
}


def arch_of(model):
    if model == "large":
        return dict(arch_of("base"), **LARGE)
    return sp._model_cfg(model, False).resolve().arch


def published_rate(gpu: str, model: str, seq: int):
    """(sequences/s of `model` at `seq` on one `gpu`, how it was derived) from PUBLISHED: the figure itself,
    else one of that GPU at the same length, else of the same model, scaled by training FLOPs per sequence."""
    def rank(entry):
        _, m, s, _ = entry
        return (m, s) == (model, seq), s == seq, m == model

    rate, m, s, source = max(PUBLISHED[gpu], key=rank)
    if (m, s) == (model, seq):
        return rate, source
    scaled = rate * flops_per_seq(arch_of(m), s) / flops_per_seq(arch_of(model), seq)
    return scaled, f"{rate:g} seq/s for {m} at seq {s} ({source}), scaled by training FLOPs per sequence"


def flops_per_seq(arch, seq):
    h, layers, ffn = arch["hidden_size"], arch["num_hidden_layers"], arch["intermediate_size"]
    return seq * (6 * layers * (4 * h * h + 2 * h * ffn) + 12 * layers * h * seq)


def gpu_step_s(model, seq, batch, gpu):
    """Seconds of one step of `batch` sequences of `model` at `seq` on one `gpu` (published_rate)."""
    return batch / published_rate(gpu, model, seq)[0]


# -- the host path alone ---------------------------------------------------------------------------------
def host_recipe(tmp: Path, seq: int, batch: int, steps: int, dropout_seeds: int):
    """(recipe, schedule) of a flag-mode pretraining run over the synthetic corpus."""
    from bench_dataset import synthetic_corpus
    from ernie_mtl.dist.process import ProcessInfo
    from ernie_mtl.dist.topology import Topology
    from ernie_mtl.engine.step_feeds import FeedRecipe
    from ernie_mtl.engine.config_checks import parse
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
    from ernie_mtl.engine.data_workers import BackgroundFeeder

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
        run, main = trainer.exe.run, trainer.programs.main

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


# -- feeding a GPU, simulated --------------------------------------------------------------------------------
_SIM_PLUGIN = '''
import json, os, time
from ernie_mtl.engine.callbacks import Callback, register_callback

TICK = os.sysconf("SC_CLK_TCK")


def _proc_cpu(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _busy():
    fields = [int(x) for x in open("/proc/stat").read().split("\\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / TICK


def _wait_until(t):
    left = t - time.perf_counter()
    if left > 0:
        time.sleep(left)


PROXY_LEN = 8  # tokens of the one sample the proxy run computes


def tiny_feed(feed, batch, seq):
    """The micro-batch `feed` cut to its first sample's first PROXY_LEN tokens (two masked positions): the
    same program runs on it with next to no arithmetic, so its time is the executor's host work per op."""
    import numpy as np

    arrays = {k: v if isinstance(v, np.ndarray) else np.array(v) for k, v in feed.items()}
    out = {}
    for k, v in arrays.items():
        if k.endswith("masked_lm_positions"):
            out[k] = np.array([1, 2], v.dtype)
        elif k.endswith("masked_lm_labels"):
            out[k] = arrays["input_ids"][0, 1:3].reshape(-1, 1).astype(v.dtype)
        elif v.ndim >= 2 and v.shape[0] == batch:
            out[k] = np.ascontiguousarray(v[tuple(slice(0, 1) if a == 0 else slice(0, PROXY_LEN) if n == seq
                                                   else slice(None) for a, n in enumerate(v.shape))])
        else:
            out[k] = v
    return out


@register_callback("bench_gpu_sim")
class GpuSim(Callback):
    """The device of a GPU run, simulated on the host's clock: each run of the training program queues
    a fixed `ERNIE_SIM_STEP_S` of device work, which starts when the host starts issuing the run and the
    device has finished the work queued before it, and cannot end before the host has issued all of it
    (the run's host time); `exe.run` returns when its host work is done (asynchronous, as on a GPU),
    except that at most `ERNIE_SIM_AHEAD` earlier runs may be unfinished on the device when a run is
    issued (the launch queue); a run with a fetch waits for the device (the copy to the host) before
    it returns. What the host does inside the run (`ERNIE_SIM_EXE`): `proxy` runs the training program
    on the first sample's first tokens (the executor's work per op, next to no arithmetic), `none` runs
    nothing (the loop and the data path alone)."""

    def on_train_begin(self, trainer):
        self.step_s = float(os.environ["ERNIE_SIM_STEP_S"])
        self.ahead = int(os.environ["ERNIE_SIM_AHEAD"])
        mode = os.environ.get("ERNIE_SIM_EXE", "proxy")
        batch, seq = int(os.environ["ERNIE_SIM_BATCH"]), int(os.environ["ERNIE_SIM_SEQ"])
        self.tiny = None
        self.device_free = 0.0
        self.runs = []  # main program: (called, issued, host end, device start, device end, fetch wait)
        self.marks = []  # at every step end: (time, main runs, trainer CPU, workers CPU, machine busy, feeder wait)
        self.fetch_wait = 0.0
        self.trainer = trainer
        self.workers = [w.process.pid for w in getattr(trainer.feeder, "workers", [])]
        run, main = trainer.exe.run, trainer.programs.main

        def sim_run(program=None, *args, **kwargs):
            fetch = kwargs.get("fetch_list") if "fetch_list" in kwargs else (args[1] if len(args) > 1 else None)
            called = time.perf_counter()
            if program is main and len(self.runs) > self.ahead:
                _wait_until(self.runs[-1 - self.ahead][4])  # the launch queue is full
            issued = time.perf_counter()
            if program is not main:
                out = run(program, *args, **kwargs)
            elif mode == "proxy":
                if self.tiny is None:
                    self.tiny = tiny_feed(kwargs["feed"], batch, seq)
                out = run(program, *args, **dict(kwargs, feed=self.tiny))
            else:
                out = []
            end = time.perf_counter()
            if program is main:
                start = max(issued, self.device_free)
                self.device_free = max(start + self.step_s, end)
            waited = 0.0
            if fetch:  # the values are copied to the host once the device has computed them
                _wait_until(self.device_free)
                waited = time.perf_counter() - end
                self.fetch_wait += waited
            if program is main:
                self.runs.append((called, issued, end, start, self.device_free, waited))
            return out

        trainer.exe.run = sim_run  # this executor object only
        self.log_s = []  # each log_window's time: the window's fetch (waiting for the device), then the logging
        log_window = trainer.log_window

        def timed_log_window():
            started, waited = time.perf_counter(), self.fetch_wait
            try:
                return log_window()
            finally:
                self.log_s.append((time.perf_counter() - started, self.fetch_wait - waited))

        trainer.log_window = timed_log_window
        self.mark()

    def mark(self):
        own = os.times()
        workers = 0.0
        for pid in self.workers:
            try:
                workers += _proc_cpu(pid)
            except OSError:
                pass
        feeder_wait = getattr(self.trainer.feeder, "wait_s", 0.0)
        self.marks.append((time.perf_counter(), len(self.runs), own.user + own.system, workers, _busy(), feeder_wait,
                           self.fetch_wait))

    def on_step_end(self, trainer, step, tasks):
        self.mark()

    def on_train_end(self, trainer):
        with open(os.environ["ERNIE_SIM_OUT"], "w") as f:
            json.dump({"runs": self.runs, "marks": self.marks, "workers": len(self.workers), "log_s": self.log_s}, f)
'''


def sim_targets(text):
    """"V100:base:128,A100:base:128" -> [(gpu, model, seq)]."""
    out = []
    for item in filter(None, text.split(",")):
        gpu, model, seq = item.split(":")
        if gpu not in PUBLISHED or model not in ("base", "large"):
            raise SystemExit(f"--sim_targets: {item!r}: use GPU:MODEL:SEQ with GPU in {sorted(PUBLISHED)} and "
                             "MODEL base or large")
        out.append((gpu, model, int(seq)))
    return out


def sim_corpus(folder: Path):
    """The synthetic Chinese-like corpus of the host part (whole words, so whole-word masking works)."""
    from bench_dataset import synthetic_corpus

    if not (folder / "corpus.bin").exists():
        synthetic_corpus(folder, 4000)
    return folder / "corpus", folder / "vocab.txt"


def run_sim_once(corpus, vocab, gpu, model, seq, workers, args) -> dict:
    """One run of the real CLI loop against a simulated `gpu` (the `_SIM_PLUGIN` device) whose step is
    `model`'s published step time at `seq` with `args.batch` sequences; returns the run's record."""
    step_s = gpu_step_s(model, seq, args.batch, gpu)
    timed = max(60, min(400, int(math.ceil(args.sim_seconds / step_s))))
    total = args.sim_warmup + timed
    vocab_size = sum(1 for _ in open(vocab, encoding="utf-8"))
    with tempfile.TemporaryDirectory(prefix="ernie_bench_sim_") as tmp:
        work = Path(tmp)
        (work / "sim.py").write_text(_SIM_PLUGIN)
        out_file = work / "sim.json"
        big = str(10 * total)
        cmd = [sys.executable, str(sp.ROOT / "run_multitask_static.py"), "--device", "cpu", "--cpu_kernels", "plain",
               "--model_name_or_path", sp.MODELS["base"], "--vocab_size", str(vocab_size), *args.sim_model.split(),
               *(["--num_hidden_layers", str(LARGE["num_hidden_layers"])] if model == "large" else []),  # its op count
               "--input_dir", str(corpus), "--tokenizer_name_or_path", str(vocab), "--split", "98,1,1",
               "--max_seq_len", str(seq), "--micro_batch_size", str(args.batch), "--global_batch_size", str(args.batch),
               "--max_steps", str(total), "--logging_freq", str(args.sim_logging_freq), "--eval_freq", big,
               "--eval_iters", "1", "--checkpoint_steps", big, "--save_steps", big, "--seed", "1",
               "--num_workers", str(workers), "--prefetch_factor", str(args.prefetch), "--output_dir", str(work / "out"),
               "--plugins", str(work / "sim.py"), "--callbacks", "bench_gpu_sim"]
        # a GPU rank's CPU kernels are few: one math thread (the rest of its cores are the workers')
        env = {**os.environ, "ERNIE_SIM_STEP_S": repr(step_s), "ERNIE_SIM_AHEAD": str(args.sim_ahead),
               "ERNIE_SIM_EXE": args.sim_exe, "ERNIE_SIM_BATCH": str(args.batch), "ERNIE_SIM_SEQ": str(seq),
               "ERNIE_SIM_OUT": str(out_file), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(sp.ROOT), os.environ.get("PYTHONPATH")]))}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp)
        if proc.returncode or not out_file.exists():
            raise SystemExit(f"the simulated run failed ({' '.join(cmd)}):\n{(proc.stdout + proc.stderr)[-3000:]}")
        record = json.loads(out_file.read_text())
    runs, marks = record["runs"], record["marks"]
    a, b = marks[args.sim_warmup], marks[-1]  # the timed range: the steps after warm-up
    steps, first, last = len(marks) - 1 - args.sim_warmup, a[1], b[1]
    span = runs[last - 1][4] - runs[first - 1][4]  # the device's time for the range's work, idle included
    idle = [runs[i][3] - runs[i - 1][4] for i in range(first, last)]
    # the first run after a logging step: the window's fetch drained the device, then the host logged
    after_log = {m[1] for k, m in enumerate(marks) if k and k % args.sim_logging_freq == 0}
    idle_after_log = sum(runs[i][3] - runs[i - 1][4] for i in range(first, last) if i in after_log)
    wall = b[0] - a[0]
    own = (b[2] - a[2]) + (b[3] - a[3])
    between = [runs[i][0] - (runs[i - 1][2] + runs[i - 1][5]) for i in range(first, last)]  # the loop between runs
    return {"gpu": gpu, "model": model, "seq": seq, "workers": workers, "step_s": step_s, "steps": steps,
            "exe": args.sim_exe, "achieved_steps_per_s": steps / span, "ideal_steps_per_s": 1 / step_s,
            "exposed_s": max(0.0, span / steps - step_s), "idle_gap_s": sum(idle) / steps, "idle_after_log_s": idle_after_log / steps,
            "log_window_s": statistics.median(t - w for t, w in record["log_s"]) if record["log_s"] else 0.0, "exposed_max_s": max(idle),
            "run_host_s": statistics.median(r[2] - r[1] for r in runs[first:last]),
            "queue_wait_s": sum(r[1] - r[0] for r in runs[first:last]) / steps,
            "between_runs_s": statistics.median(between), "feeder_wait_s": (b[5] - a[5]) / steps,
            "fetch_wait_s": (b[6] - a[6]) / steps,
            "trainer_cpu_s": (b[2] - a[2]) / steps, "workers_cpu_s": (b[3] - a[3]) / steps,
            "other_cores": max(0.0, ((b[4] - a[4]) - own) / wall), "wall_s": wall}


def run_sim(args):
    results = []
    with tempfile.TemporaryDirectory(prefix="ernie_bench_sim_corpus_") as tmp:
        corpus, vocab = sim_corpus(Path(tmp))
        for r in range(args.sim_runs):
            for gpu, model, seq in args.sim_targets:
                for w in (args.workers if r % 2 == 0 else list(reversed(args.workers))):  # alternate the order
                    sp.wait_for_quiet(args.wait_quiet)
                    res = run_sim_once(corpus, vocab, gpu, model, seq, w, args)
                    res["run"] = r
                    results.append(res)
                    print(f"# sim {gpu} {model} seq {seq}, {w} workers, run {r}: {res['achieved_steps_per_s']:.2f} of "
                          f"{res['ideal_steps_per_s']:.2f} steps/s, exposed {res['exposed_s'] * 1e3:.2f} ms/step "
                          f"({res['exposed_s'] / res['step_s']:.1%}; device idle {res['idle_gap_s'] * 1e3:.2f} ms/step, "
                          f"{res['idle_after_log_s'] * 1e3:.2f} of it after logging steps, worst gap "
                          f"{res['exposed_max_s'] * 1e3:.1f} ms; logging {res['log_window_s'] * 1e3:.1f} ms per logging "
                          "step beyond the fetch); "
                          f"exe.run host {res['run_host_s'] * 1e3:.2f} ms, between runs {res['between_runs_s'] * 1e3:.2f} "
                          f"ms, data wait {res['feeder_wait_s'] * 1e3:.2f} ms/step; CPU trainer "
                          f"{res['trainer_cpu_s'] * 1e3:.1f} + workers {res['workers_cpu_s'] * 1e3:.1f} ms/step; other "
                          f"processes {res['other_cores']:.2f} cores", file=sys.stderr)
    return results


def print_sim(results, args):
    print(f"\n**Feeding a simulated GPU** (the real loop, data-loading workers and feed of a flag-mode pretraining "
          f"run; the device a fixed wait of the GPU's published step time per micro-batch of {args.batch}, "
          f"asynchronous, at most {args.sim_ahead} step(s) queued ahead, fetches wait for it; logging every "
          f"{args.sim_logging_freq} steps; model `{args.sim_model}` on the target's layers (12 base, 24 large), 1 math "
          "thread; "
          f"host work inside each run: {args.sim_exe} (--sim_exe); median of {args.sim_runs} runs, range in "
          "brackets):\n")
    print("| GPU, model, seq | step (ms) | workers | steps/s achieved (ideal) | exposed host ms/step | of the step "
          "| target | exe.run host ms | loop between runs ms | data wait ms/step | CPU ms/step: trainer + workers "
          "| cores per GPU | other processes, cores |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    groups = {}
    for r in results:
        groups.setdefault((r["gpu"], r["model"], r["seq"], r["workers"]), []).append(r)
    rows = []
    for (gpu, model, seq, w), rs in groups.items():
        med = lambda k: statistics.median(x[k] for x in rs)  # noqa: E731
        frac = [x["exposed_s"] / x["step_s"] for x in rs]
        target = TARGET_V100 if gpu == "V100" else TARGET_A100
        cpu = med("trainer_cpu_s") + med("workers_cpu_s")
        row = {"gpu": gpu, "model": model, "seq": seq, "workers": w, "step_s": rs[0]["step_s"],
               "achieved": med("achieved_steps_per_s"), "ideal": rs[0]["ideal_steps_per_s"],
               "exposed_s": med("exposed_s"), "exposed_fraction": statistics.median(frac),
               "exposed_fraction_range": [min(frac), max(frac)], "target": target,
               "met": statistics.median(frac) <= target, "cores_per_gpu": cpu / rs[0]["step_s"],
               "other_cores": [x["other_cores"] for x in rs], "runs": rs}
        rows.append(row)
        print(f"| {gpu}, ERNIE-{model}, {seq} | {row['step_s'] * 1e3:.1f} | {w} | {row['achieved']:.2f} ({row['ideal']:.2f}) "
              f"| {row['exposed_s'] * 1e3:.2f} | {row['exposed_fraction']:.1%} ({min(frac):.1%}-{max(frac):.1%}) "
              f"| <= {target:.0%}: {'met' if row['met'] else 'NOT met'} | {med('run_host_s') * 1e3:.2f} "
              f"| {med('between_runs_s') * 1e3:.2f} | {med('feeder_wait_s') * 1e3:.2f} "
              f"| {med('trainer_cpu_s') * 1e3:.1f} + {med('workers_cpu_s') * 1e3:.1f} | {row['cores_per_gpu']:.2f} "
              f"| {statistics.median(row['other_cores']):.2f} ({min(row['other_cores']):.2f}-{max(row['other_cores']):.2f}) |")
    print("\nexposed host = achieved step period - the GPU's step (the time per step the device waits for the "
          "host); exe.run host = the run's host time (--sim_exe); cores per GPU = the trainer's and the workers' CPU "
          "per step over the GPU's step time (what one rank keeps busy at the ideal rate).")
    return rows


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
    p.add_argument("--part", choices=("host", "loop", "both", "sim"), default="both",
                   help="sim: feed a simulated GPU (the real loop, workers and feed; the device a fixed wait)")
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
    p.add_argument("--sim_targets", default="V100:base:128,A100:base:128",
                   help="GPU:MODEL:SEQ of --part sim, comma-separated (GPU V100 or A100, MODEL base or large)")
    p.add_argument("--sim_runs", type=int, default=3, help="runs per target and worker count of --part sim")
    p.add_argument("--sim_seconds", type=float, default=6.0,
                   help="timed device time per run of --part sim (60-400 steps)")
    p.add_argument("--sim_warmup", type=int, default=20, help="steps before the timed ones (--part sim)")
    p.add_argument("--sim_ahead", type=int, default=1,
                   help="runs the host may have queued on the simulated device beyond the one it issues (the "
                        "launch queue: about one ERNIE-base step of kernels); 0: every run waits for the previous one")
    p.add_argument("--sim_logging_freq", type=int, default=20,
                   help="--logging_freq of the simulated run (the loss window's fetch waits for the device)")
    p.add_argument("--sim_model", default="--hidden_size 16 --num_attention_heads 1 --intermediate_size 32",
                   help="architecture flags of the simulated run's model (the target's layers: 12 for base, 24 for "
                        "large; tiny width: the program has the published model's ops)")
    p.add_argument("--sim_exe", choices=("proxy", "none"), default="proxy",
                   help="the host's work inside each run of the training program: proxy = the program run on one "
                        "sample's first 8 tokens (the executor's host work per op, as a GPU run pays it to launch "
                        "kernels, plus a little arithmetic); none = nothing (the loop and the data path alone)")
    p.add_argument("--json", default="", help="also write the results, the machine and the load to this file")
    args = p.parse_args()
    args.seqs = [int(s) for s in args.seqs.split(",")]
    args.workers = [int(w) for w in args.workers.split(",")]
    args.loop_models = args.loop_models.split(",")
    args.loop_batches = [int(b) for b in args.loop_batches.split(",")]
    machine = sp.machine()
    sp.print_machine(machine)
    if args.profile:
        run_profile(args)
        return
    print("GPU steps of 32 sequences, from published rates (PUBLISHED; seq/s -> ms per step):")
    for gpu in ("V100", "A100"):
        for model in ("base", "large"):
            for seq in (128, 512):
                rate, how = published_rate(gpu, model, seq)
                print(f"  {gpu} ERNIE-{model} seq {seq}: {rate:,.0f} seq/s -> {32 / rate * 1e3:.1f} ms ({how})")
    out = {}
    if args.part == "sim":
        args.sim_targets = sim_targets(args.sim_targets)
        out["sim"] = print_sim(run_sim(args), args)
    if args.part in ("host", "both"):
        rows = run_host(args)
        print_host(rows, args)
        out["host"] = rows
    if args.part in ("loop", "both"):
        results = run_loop(args)
        print_loop(results, args)
        out["loop"] = [{"model": m, "batch": b, "workers": w, "runs": r} for (m, b, w), r in results.items()]
    if args.json:
        sp.write_json(args.json, {"part": args.part, "args": {k: v for k, v in vars(args).items()}, **out}, machine)


if __name__ == "__main__":
    main()
