"""Training throughput on CPU: our static program vs the same ERNIE in a plain paddlenlp dygraph loop (and,
with --paddlenlp, PaddleNLP's run_pretrain_static.py step rebuilt from the script's source, on its own kernels
and on ours), and the model's FLOP/s as a fraction of the fastest matmul this machine offers on the model's
shapes, measured in the same process, and of the machine's estimated FP32 peak. Every output starts with
the machine (ernie_mtl/dist/machine.py); --json writes it with the figures and the load.

    python benchmarks/bench_train.py                                   # small and base, 3 runs each
    python benchmarks/bench_train.py --models base --runs 2 --paddlenlp serial,serial+same_kernels
    python benchmarks/bench_train.py --models base --paired --variants serial+auto,paddlenlp,paddlenlp+same_kernels
    python benchmarks/bench_train.py --models base --isa avx2 ...      # the same on the AVX2 code paths
    python benchmarks/bench_train.py --models base --variants threads1,plain,serial+onednn+biasgrad,serial+auto
    python benchmarks/bench_train.py --models base --paired --variants serial,serial+onednn+biasgrad,serial+auto
    python benchmarks/bench_train.py --models base --short_docs        # padding to the longest sample
    python benchmarks/bench_train.py --models base --real_loop         # the real training loop vs the raw program

Both sides: same architecture, batch, sequence length, AdamW + global-norm clipping, MLM + NSP
loss, random batches in the collate layout, the same OMP/MKL threads (ernie_mtl.dist.threads: the
cores of this process / ranks on this node, unless the environment sets them); each side runs in
its own processes, `--runs` times, alternating, so drifting machine load hits both. Each run times
its steps while measuring the CPU other processes used (/proc/stat minus this process); disturbed
steps are repeated (up to 3x) and the least disturbed kept. Tokens/s is the median over the kept
steps of all runs; the range is the spread of the runs' medians.

The honest ceiling: before building the static program, its process times three float32 matmul
kernels on each of the model's matmul forms (forward, input-gradient and weight-gradient forms of every
linear layer, and the batched attention products): Paddle's plain `matmul_v2` (MKL), Paddle's oneDNN
`matmul_v2` (the same op with `use_mkldnn`), and NumPy's BLAS; median of `--matmul_repeats`, each
printed. The ceiling is the FLOP-weighted rate of the fastest kernel per form: the time the step's
matmuls alone would take on the best this machine offers. "of ceiling" = achieved FLOP/s / that rate
(also shown against Paddle's MKL alone, the previous, flattering ceiling). FLOPs per token = 6 x
non-embedding parameters + 12 x layers x hidden x seq (attention), counted on padded tokens.

Variants of the static side (benchmarks/step_programs.py): plain (threads only), threads1 (Paddle's
default: one thread), serial (FLAGS_new_executor_serial_run), inplace, onednn[=types], biasgrad, auto
(what --cpu_kernels auto chooses here), seed, nodrop; joined with `+`. Benchmarks print ratios; they
are not tests. Take figures on a quiet machine: the load average is printed before and after.
"""
import zlib  # noqa: F401  (before paddle)

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np

sys.path.insert(0, str(Path(os.path.abspath(__file__)).parent))
import step_programs as sp  # noqa: E402  (also puts the repository on sys.path)

PLAN = {"tiny": dict(b=4, steps=10, warmup=2), "small": dict(b=16, steps=12, warmup=2),
        "base": dict(b=8, steps=4, warmup=1)}
DEFAULT_VARIANT = "serial+auto"  # what a --device cpu training run applies (--cpu_kernels auto)


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


# --- the ceiling --------------------------------------------------------------------------------

def matmul_forms(arch, b, seq):
    """(label, x shape, y shape, transpose_x, transpose_y, uses per layer and step) of the model's matmuls."""
    t, h, ffn, heads = b * seq, arch["hidden_size"], arch["intermediate_size"], arch["num_attention_heads"]
    forms = []
    for k, n, uses in ((h, h, 4), (h, ffn, 1), (ffn, h, 1)):  # q, k, v, out; ffn in; ffn out
        forms += [(f"X W [{t},{k}]x[{k},{n}]", [t, k], [k, n], False, False, uses),
                  (f"dY W^T [{t},{n}]x[{n},{k}]", [t, n], [k, n], False, True, uses),
                  (f"X^T dY [{k},{t}]x[{t},{n}]", [t, k], [t, n], True, False, uses)]
    bh, d = b * heads, h // heads
    # scores Q K^T and dP = dO V^T have this form; P V, dV, dQ, dK the other
    forms += [(f"Q K^T {bh}x[{seq},{d}]x[{d},{seq}]", [bh, seq, d], [bh, seq, d], False, True, 2),
              (f"P V {bh}x[{seq},{seq}]x[{seq},{d}]", [bh, seq, seq], [bh, seq, d], False, False, 4)]
    return forms


def _form_flops(xs, ys, tx, ty):
    m, k = (xs[-1], xs[-2]) if tx else (xs[-2], xs[-1])
    n = ys[-2] if ty else ys[-1]
    batch = xs[0] if len(xs) == 3 else 1
    return 2.0 * batch * m * k * n


def _rates(run, flops, repeats):
    """[GFLOP/s of each repeat] of `run()` (one product), about 2 GFLOP per repeat, after one warm-up call."""
    calls = max(1, int(2e9 // flops))
    run()
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            run()
        rates.append(flops * calls / (time.perf_counter() - start) / 1e9)
    return rates


def matmul_ceiling(arch, b, seq, repeats=5):
    """The fastest float32 matmul this process has on the model's forms, from three kernels timed in turn on
    each form: Paddle's plain `matmul_v2` (MKL) and Paddle's oneDNN `matmul_v2` (static programs of the one
    op, `use_mkldnn` off/on, the executor training uses), and NumPy's BLAS (OpenBLAS in the NumPy wheel).
    Median GFLOP/s of `repeats`. Returns {"forms": [...], "mix": {kernel: FLOP-weighted rate}, "ceiling":
    the FLOP-weighted rate of the fastest kernel per form} (rates in FLOP/s): the time the step's matmuls
    alone would take on the best this machine offers."""
    import paddle

    paddle.enable_static()
    exe = paddle.static.Executor(paddle.CPUPlace())
    rng = np.random.RandomState(0)
    kernels = ("mkl", "onednn", "numpy")
    rows, total_flops = [], 0.0
    time_at = {k: 0.0 for k in kernels + ("best",)}
    for label, xs, ys, tx, ty, uses in matmul_forms(arch, b, seq):
        x_np, y_np = rng.uniform(-1, 1, xs).astype("float32"), rng.uniform(-1, 1, ys).astype("float32")
        flops = _form_flops(xs, ys, tx, ty)
        row = {"form": label, "uses": uses}
        for kernel in ("mkl", "onednn"):
            main, startup = paddle.static.Program(), paddle.static.Program()
            with paddle.static.program_guard(main, startup):
                x = paddle.static.data("x", xs, "float32")
                y = paddle.static.data("y", ys, "float32")
                paddle.matmul(x, y, transpose_x=tx, transpose_y=ty)
            for op in main.global_block().ops:
                if op.type == "matmul_v2":
                    op._set_attr("use_mkldnn", kernel == "onednn")
            scope = paddle.static.Scope()
            for name, value in (("x", x_np), ("y", y_np)):
                scope.var(name).get_tensor().set(value, paddle.CPUPlace())
            main.global_block().var("x").persistable = main.global_block().var("y").persistable = True
            rates = _rates(lambda: exe.run(main, scope=scope, fetch_list=[]), flops, repeats)
            row[kernel] = (statistics.median(rates), min(rates), max(rates))
        a = x_np.swapaxes(-1, -2) if tx else x_np
        c = y_np.swapaxes(-1, -2) if ty else y_np
        rates = _rates(lambda: np.matmul(a, c), flops, repeats)
        row["numpy"] = (statistics.median(rates), min(rates), max(rates))
        row["best"] = max(row[k][0] for k in kernels)
        rows.append(row)
        total_flops += flops * uses
        for k in kernels:
            time_at[k] += flops * uses / (row[k][0] * 1e9)
        time_at["best"] += flops * uses / (row["best"] * 1e9)
    return {"forms": rows, "mix": {k: total_flops / time_at[k] for k in kernels}, "ceiling": total_flops / time_at["best"]}


# --- the two sides --------------------------------------------------------------------------------

def run_static(args) -> dict:
    variant = sp.parse_variant(args.variant)
    threads = sp.prepare_env(variant)
    import paddle

    plan = PLAN[args.model]
    arch = sp._model_cfg(args.model, False).resolve().arch
    ceiling = matmul_ceiling(arch, plan["b"], args.seq, args.matmul_repeats) if args.with_ceiling else None
    step = sp.build_step("pretrain", args.model, plan["b"], args.seq, variant)
    paddle.enable_static()
    scope, exe = paddle.static.Scope(), paddle.static.Executor(paddle.CPUPlace())
    step.initialize(exe, scope)
    def train_step(i):
        exe.run(step.main, feed=step.feed(i), fetch_list=[step.loss], scope=scope)
        step.after_run()

    for i in range(plan["warmup"]):
        train_step(i)
    kept, _ = sp.timed_steps(train_step, plan["steps"], start=plan["warmup"])
    times, others = [t for t, _ in kept], [c for _, c in kept]
    return {"times": times, "other_cores": others, "threads": threads, "ceiling": ceiling, "flops_per_token": step.flops_per_token(),
            "tokens_per_step": plan["b"] * args.seq, "arch": _arch_summary(arch), "applied": step.applied,
            "onednn_types": onednn_types_of(step, variant), "machine": sp.machine().to_json()}


def onednn_types_of(step, variant) -> list:
    """The op types the static side runs on oneDNN (what `same_kernels` gives PaddleNLP's program)."""
    if step.kernels is not None:
        return sorted(step.kernels.onednn)
    if "onednn" in variant:
        from ernie_mtl.program.cpu_kernels import EXACT_ONEDNN_OPS

        return sorted(variant["onednn"].split(":") if variant["onednn"] else EXACT_ONEDNN_OPS)
    return []


def run_dygraph(args) -> dict:
    variant = sp.parse_variant(args.variant)
    threads = sp.prepare_env({k: v for k, v in variant.items() if k == "threads1"})  # the same threads only
    import paddle
    import paddle.nn.functional as F
    from paddlenlp.transformers import ErnieConfig, ErnieForPretraining

    plan = PLAN[args.model]
    arch = sp._model_cfg(args.model, False).resolve().arch
    keys = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
            "max_position_embeddings", "type_vocab_size", "hidden_act")
    paddle.seed(1)
    model = ErnieForPretraining(ErnieConfig(**{k: arch[k] for k in keys}))
    opt = paddle.optimizer.AdamW(1e-4, parameters=model.parameters(), weight_decay=0.01,
                                 grad_clip=paddle.nn.ClipGradByGlobalNorm(1.0))
    rng = np.random.RandomState(0)
    feeds = [{k: paddle.to_tensor(v) for k, v in sp.pretrain_batch(rng, plan["b"], args.seq, arch["vocab_size"]).items()}
             for _ in range(4)]

    def train_step(f):
        scores, rel = model(f["input_ids"], token_type_ids=f["segment_ids"], attention_mask=f["input_mask"],
                            masked_positions=f["masked_lm_positions"])
        loss = F.cross_entropy(scores, f["masked_lm_labels"]).mean() + \
            F.cross_entropy(rel, f["next_sentence_labels"]).mean()
        loss.backward()
        opt.step()
        opt.clear_grad()
        return float(loss)

    for i in range(plan["warmup"]):
        train_step(feeds[i % 4])
    kept, _ = sp.timed_steps(lambda i: train_step(feeds[i % 4]), plan["steps"], start=plan["warmup"])
    times, others = [t for t, _ in kept], [c for _, c in kept]
    return {"times": times, "other_cores": others, "threads": threads, "tokens_per_step": plan["b"] * args.seq}


class PaddleNLPStep:
    """PaddleNLP's ERNIE 1.0 `run_pretrain_static.py` step, rebuilt from the script's source (PaddleNLP's
    model_zoo/ernie-1.0/run_pretrain_static.py; the script is not in the paddlenlp wheel, so its program is
    re-made here with the wheel's classes, the way the script makes it): paddlenlp's `ErnieForPretraining` and
    `ErniePretrainingCriterion` in a static program (the script's feeds: int32 flattened masked positions padded
    to a multiple of 8, labels -1 there), loss = MLM + SOP, AdamW over `LinearAnnealingWithWarmupDecay` with
    global-norm clipping and its weight-decay filter (no decay on names with "bias" or "norm"),
    `fleet.distributed_optimizer` with its strategy (execution threads 1, fuse_broadcast_ops, inplace),
    `exe.run(..., use_program_cache=True)` fetching the losses and the LR every run, and the scheduler stepped
    per run. Not rebuilt: its data loader (random batches in its collate layout are fed), evaluation and
    checkpoints. `onednn_types`: op types put on oneDNN (`cpu_kernels.use_onednn_ops`, as our engine applies a
    kernel choice, with the 2-D views of oneDNN matmul gradients); nothing else of the engine is applied."""

    def __init__(self, model: str, b: int, seq: int, onednn_types=()):
        import paddle
        import paddle.distributed.fleet as fleet
        from paddlenlp.transformers import (ErnieConfig, ErnieForPretraining, ErniePretrainingCriterion,
                                            LinearAnnealingWithWarmupDecay)

        arch = sp._model_cfg(model, False).resolve().arch
        keys = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                "max_position_embeddings", "type_vocab_size", "hidden_act", "hidden_dropout_prob",
                "attention_probs_dropout_prob")
        paddle.enable_static()
        fleet.init(is_collective=True)
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup):
            ids = paddle.static.data("input_ids", [-1, -1], "int64")
            seg = paddle.static.data("segment_ids", [-1, -1], "int64")
            mask = paddle.static.data("input_mask", [-1, 1, 1, -1], "float32")
            pos = paddle.static.data("masked_lm_positions", [-1], "int32")
            labels = paddle.static.data("masked_lm_labels", [-1, 1], "int64")
            nsp = paddle.static.data("next_sentence_labels", [-1, 1], "int64")
            model_ = ErnieForPretraining(ErnieConfig(**{k: arch[k] for k in keys}))
            scores, rel = model_(input_ids=ids, token_type_ids=seg, position_ids=None, attention_mask=mask,
                                 masked_positions=pos)
            lm_loss, sop_loss = ErniePretrainingCriterion(with_nsp_loss=True)(scores, rel, labels, nsp)
            loss = lm_loss + sop_loss
            scheduler = LinearAnnealingWithWarmupDecay(1e-4, 1e-5, warmup_step=0, decay_step=sp.LR_HORIZON)
            decay = [p.name for n, p in model_.named_parameters() if not any(t in n for t in ("bias", "norm"))]
            opt = paddle.optimizer.AdamW(learning_rate=scheduler, beta1=0.9, beta2=0.999, epsilon=1e-8,
                                         grad_clip=paddle.nn.ClipGradByGlobalNorm(1.0), weight_decay=0.01,
                                         apply_decay_param_fun=lambda name: name in decay)
            opt.apply_optimize = opt._apply_optimize
            strategy = fleet.DistributedStrategy()
            exec_strategy = paddle.static.ExecutionStrategy()
            exec_strategy.num_threads = 1
            exec_strategy.num_iteration_per_drop_scope = 10000
            build = paddle.static.BuildStrategy()
            build.fuse_broadcast_ops = True
            build.enable_inplace = True
            strategy.execution_strategy, strategy.build_strategy = exec_strategy, build
            fleet.distributed_optimizer(opt, strategy=strategy).minimize(loss)
        self.applied = "as built (Paddle's default kernels)"
        if onednn_types:
            from ernie_mtl.program.cpu_kernels import use_onednn_ops

            changed = use_onednn_ops(main, list(onednn_types))
            self.applied = f"oneDNN kernels on {sum(changed.values())} ops ({', '.join(sorted(changed))})"
        self.main, self.startup, self.loss, self.scheduler = main, startup, loss, scheduler
        lr = next(v for n, v in main.global_block().vars.items() if n.startswith("learning_rate_"))  # _0 when alone
        self.fetch = [loss, lm_loss, sop_loss, lr]
        rng = np.random.RandomState(0)
        self.feeds = []
        for _ in range(4):
            batch = sp.pretrain_batch(rng, b, seq, arch["vocab_size"])
            n = len(batch["masked_lm_positions"])
            size = n + (-n) % 8
            positions = np.zeros(size, "int32")
            positions[:n] = batch["masked_lm_positions"]
            mlm = np.full([size, 1], -1, "int64")
            mlm[:n] = batch["masked_lm_labels"]
            self.feeds.append({"input_ids": batch["input_ids"], "segment_ids": batch["segment_ids"],
                               "input_mask": batch["input_mask"], "masked_lm_positions": positions,
                               "masked_lm_labels": mlm, "next_sentence_labels": batch["next_sentence_labels"]})

    def initialize(self, exe, scope) -> None:
        exe.run(self.startup, scope=scope)

    def run(self, exe, scope, i: int) -> float:
        """One training step as the script runs it (the losses and the LR fetched); returns the loss."""
        out = exe.run(self.main, feed=self.feeds[i % 4], fetch_list=self.fetch, use_program_cache=True, scope=scope)
        self.scheduler.step()
        return float(np.asarray(out[0]).reshape(-1)[0])


def run_paddlenlp_static(args) -> dict:
    """PaddleNLP's step (`PaddleNLPStep`) in its own process. Its best CPU settings: the threads of this
    machine (the script leaves Paddle's 1), and with `serial` in the variant the serial executor. With
    `onednn=T1:T2` (the driver's `same_kernels`: the op types the static side runs on oneDNN here) its program
    gets the same kernel choice, and nothing else of the engine (no bias gradients by matmul, no other rewrite)."""
    variant = sp.parse_variant(args.variant)
    unknown = sorted(set(variant) - {"threads1", "serial", "onednn"})
    if unknown:
        raise SystemExit(f"--paddlenlp: {unknown} are static-side variants; PaddleNLP's step takes threads1, serial "
                         "and same_kernels (or onednn=<types>)")
    threads = sp.prepare_env({k: v for k, v in variant.items() if k in ("threads1", "serial")})
    import paddle

    plan = PLAN[args.model]
    step = PaddleNLPStep(args.model, plan["b"], args.seq, (variant.get("onednn") or "").split(":") if variant.get("onednn") else ())
    scope, exe = paddle.static.Scope(), paddle.static.Executor(paddle.CPUPlace())
    step.initialize(exe, scope)
    for i in range(plan["warmup"]):
        step.run(exe, scope, i)
    kept, _ = sp.timed_steps(lambda i: step.run(exe, scope, i), plan["steps"], start=plan["warmup"])
    return {"times": [t for t, _ in kept], "other_cores": [c for _, c in kept], "threads": threads,
            "tokens_per_step": plan["b"] * args.seq, "applied": step.applied}


def run_paired(args) -> dict:
    """Program-level variants side by side in ONE process: each variant's program gets its own scope
    and executor, then rounds run one step of every variant, in a rotated order, so load from other
    processes falls on all of them alike. Process-level settings (threads, serial, inplace: Paddle's
    executors share one work queue, so serial and threaded executors cannot be mixed) must be the same
    in every variant: compare those with separate runs. Also reports whether each variant's losses
    equal the first variant's bitwise (same initial weights, feeds and dropout seeds).

    A variant `paddlenlp` is PaddleNLP's rebuilt step (`PaddleNLPStep`) on its own kernels under the same
    process settings; `paddlenlp+same_kernels` puts it on the oneDNN op types of the first of our variants
    (pretraining only)."""
    texts = args.variant.split(",")
    variants = [sp.parse_variant(v) for v in texts if not v.startswith("paddlenlp")]
    process_level = {frozenset(k for k in v if k in ("threads1", "serial", "inplace")) for v in variants}
    if len(process_level) != 1 or not variants:
        raise SystemExit("--paired: threads1/serial/inplace are per process; give every variant the same ones "
                         "(and one of ours first)")
    if any(t.startswith("paddlenlp") for t in texts) and args.task != "pretrain":
        raise SystemExit("--paired: PaddleNLP's step is a pretraining step (--task pretrain)")
    threads = sp.prepare_env(variants[0])
    import paddle

    plan = PLAN[args.model]
    sides, ours = [], []
    for text in texts:
        scope, exe = paddle.static.Scope(), paddle.static.Executor(paddle.CPUPlace())
        if text.startswith("paddlenlp"):
            extra = set(text.split("+")[1:])
            if extra - {"same_kernels"}:
                raise SystemExit(f"--paired: {text!r}: PaddleNLP's step takes only +same_kernels here")
            types = onednn_types_of(ours[0][0], ours[0][1]) if "same_kernels" in extra else ()
            step = PaddleNLPStep(args.model, plan["b"], args.seq, types)
            step.initialize(exe, scope)
            run = functools.partial(lambda st, e, sc, i: st.run(e, sc, i), step, exe, scope)
        else:
            variant = sp.parse_variant(text)
            step = sp.build_step(args.task, args.model, plan["b"], args.seq, variant)
            ours.append((step, variant))
            if "seed" not in variant and any(op.type == "dropout" and op.attr("dropout_prob") > 0
                                             for op in step.main.global_block().ops):
                step.seed_vars = sp.add_dropout_seed_inputs(step.main)  # identical masks on every side
            step.initialize(exe, scope)

            def run(i, step=step, exe=exe, scope=scope):
                (loss,) = exe.run(step.main, feed=step.feed(i), fetch_list=[step.loss], scope=scope)
                step.after_run()
                return float(np.asarray(loss).reshape(-1)[0])
        losses = [run(i) for i in range(plan["warmup"])]
        sides.append({"run": run, "losses": losses, "times": [], "others": [], "applied": step.applied,
                      "ours": not text.startswith("paddlenlp")})
    rounds = args.rounds or plan["steps"] * 2
    for r in range(rounds):
        i = plan["warmup"] + r
        for k in range(len(sides)):
            side = sides[(k + r) % len(sides)]
            with sp.OtherLoad() as other:
                start = time.perf_counter()
                loss = side["run"](i)
                side["times"].append(time.perf_counter() - start)
            side["others"].append(other.cores)
            side["losses"].append(loss)
    return {"threads": threads, "variants": texts, "tokens_per_step": plan["b"] * args.seq,
            "flops_per_token": ours[0][0].flops_per_token(), "machine": sp.machine().to_json(),
            "sides": [{k: s[k] for k in ("times", "others", "losses", "applied", "ours")} for s in sides]}


def run_short_docs(args) -> dict:
    """Real tokens/s on short documents: every micro-batch padded to --seq vs to its longest sample
    (rounded up to a multiple of 8), the same samples either way."""
    variant = sp.parse_variant(args.variant)
    threads = sp.prepare_env(variant)
    import paddle

    plan = PLAN[args.model]
    b, seq = plan["b"], args.seq
    step = sp.build_step("pretrain", args.model, b, seq, variant)
    scope, exe = paddle.static.Scope(), paddle.static.Executor(paddle.CPUPlace())
    step.initialize(exe, scope)
    rng = np.random.RandomState(0)
    lengths = [rng.randint(args.short_min, seq + 1, b) for _ in range(plan["warmup"] + plan["steps"])]
    out = {"threads": threads, "fill": float(np.mean(lengths) / seq)}
    for policy in ("max_seq_len", "longest"):
        times, real = [], 0
        feed_rng = np.random.RandomState(1)
        for i, lens in enumerate(lengths):
            width = seq if policy == "max_seq_len" else min(seq, -(-int(max(lens)) // 8) * 8)
            feed = step.engine_feed(sp.pretrain_batch(feed_rng, b, width, step.arch["vocab_size"], real_len=lens), 0, i)
            feed.update({k: v for k, v in step.feed(i).items() if k.startswith(sp.SEED_PREFIX)})
            start = time.perf_counter()
            exe.run(step.main, feed=feed, fetch_list=[step.loss], scope=scope)
            step.after_run()
            if i >= plan["warmup"]:
                times.append(time.perf_counter() - start)
                real += int(sum(lens))
        out[policy] = {"seconds": sum(times), "real_tokens": real}
    return out


# the step timer the real loop loads as a plugin (--plugins/--callbacks): per optimizer step, the time,
# the machine's busy CPU seconds (/proc/stat) and this process's own (os.times), the non-pad tokens fed,
# and the time spent inside Executor.run (the rest of a step is the loop's own host work)
_TIMER_PLUGIN = """
import json, os, time
from ernie_mtl.engine.callbacks import Callback, register_callback

_IN_RUN = [0.0]

def _sample(trainer):
    fields = [int(x) for x in open("/proc/stat").read().split("\\n", 1)[0].split()[1:]]
    own = os.times()
    return [time.perf_counter(), (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK"),
            own.user + own.system, trainer.window.tokens, _IN_RUN[0]]

def _timed(run):
    def timed_run(*args, **kwargs):
        start = time.perf_counter()
        try:
            return run(*args, **kwargs)
        finally:
            _IN_RUN[0] += time.perf_counter() - start
    return timed_run

@register_callback("bench_step_timer")
class BenchStepTimer(Callback):
    def __init__(self):
        self.marks = []

    def on_train_begin(self, trainer):
        trainer.exe.run = _timed(trainer.exe.run)  # this executor object only (isinstance checks still hold)
        self.marks = [_sample(trainer)]

    def on_step_end(self, trainer, step, tasks):
        self.marks.append(_sample(trainer))

    def on_train_end(self, trainer):
        with open(os.environ["ERNIE_BENCH_STEP_TIMES"], "w") as f:
            json.dump(self.marks, f)
"""


def real_loop_settings(variant) -> tuple:
    """(extra CLI flags, environment) giving the real loop the raw program's `variant`."""
    unsupported = sorted(set(variant) - {"threads1", "serial", "onednn", "biasgrad", "seed", "nodrop", "auto"})
    if unsupported or ("onednn" in variant) != ("biasgrad" in variant) or variant.get("onednn") or \
            ("auto" in variant and "onednn" in variant):
        raise SystemExit(f"--real_loop: the training CLI's kernels are --cpu_kernels auto (variant auto), exact "
                         f"(onednn+biasgrad) or plain (neither); without {unsupported or 'onednn=<types>'}, e.g. "
                         "serial+auto")
    env = {"FLAGS_new_executor_serial_run": "1" if "serial" in variant else "0"}
    if "threads1" in variant:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = "1"
    flags = ["--cpu_kernels", "auto" if "auto" in variant else "exact" if "onednn" in variant else "plain"]
    if "nodrop" in variant:
        flags += ["--hidden_dropout_prob", "0", "--attention_probs_dropout_prob", "0"]
    return flags, env


def write_corpus(folder: Path, vocab_size: int, seq: int, docs: int = 400, seed: int = 0) -> tuple:
    """(corpus prefix, vocab file): `docs` documents of random token ids, 8-12 sentences of 40-80 tokens each,
    so that (with short_seq_prob 0) every sample is cut to the full `seq` tokens, as the raw program's batches
    are; a vocab of `vocab_size` entries (the model's)."""
    from data_tools.indexed_dataset import IndexedDatasetBuilder, best_dtype

    specials = ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"]
    vocab = folder / "vocab.txt"
    vocab.write_text("\n".join(specials + [f"t{i}" for i in range(vocab_size - len(specials))]) + "\n", encoding="utf-8")
    rng = np.random.RandomState(seed)
    prefix = folder / "corpus"
    with IndexedDatasetBuilder(prefix, dtype=best_dtype(vocab_size)) as builder:
        for _ in range(docs):
            for _ in range(rng.randint(8, 13)):
                builder.add_sentence(rng.randint(len(specials), vocab_size, rng.randint(40, 81)))
            builder.end_document()
        builder.finalize()
    return prefix, vocab


def time_real_loop(args) -> dict:
    """Seconds per optimizer step of the *real* training loop (run_multitask_static.py, flag mode,
    --device cpu) on the raw program's model, micro-batch (no accumulation), sequence length and
    variant: data pipeline (sample building, masking, collate), feeding, fetches, LR schedule, metric
    window and callbacks included. The corpus is synthetic (`write_corpus`: every sample the full
    --seq tokens); logging, evaluation and checkpoints are beyond the timed steps. A step timer loaded
    as a plugin marks the end of every step: the first `warmup` steps and everything before the first
    step (start-up, program build, index caches) are excluded, and of the 2 x `steps` steps after
    warm-up the first `steps` undisturbed by other processes are kept (as `timed_steps` keeps them;
    the least disturbed of the others when too few are clean)."""
    import tempfile

    variant = sp.parse_variant(args.variant)
    flags, env = real_loop_settings(variant)
    plan = PLAN[args.model]
    b, seq = plan["b"], args.seq
    arch = sp._model_cfg(args.model, False).resolve().arch
    total = plan["warmup"] + 2 * plan["steps"]
    with tempfile.TemporaryDirectory(prefix="ernie_real_loop_") as tmp:
        work = Path(tmp)
        prefix, vocab = write_corpus(work, arch["vocab_size"], seq)
        (work / "step_timer.py").write_text(_TIMER_PLUGIN)
        times_file = work / "times.json"
        big = str(10 * total)
        cmd = [sys.executable, str(sp.ROOT / "run_multitask_static.py"), "--device", "cpu",
               "--model_name_or_path", sp.MODELS.get(args.model, args.model), "--vocab_size", str(arch["vocab_size"]),
               "--input_dir", str(prefix), "--tokenizer_name_or_path", str(vocab), "--split", "98,1,1",
               "--max_seq_len", str(seq), "--short_seq_prob", "0", "--micro_batch_size", str(b),
               "--global_batch_size", str(b), "--max_steps", str(total), "--warmup_rate", "0",
               "--decay_steps", str(sp.LR_HORIZON), "--logging_freq", big, "--eval_freq", big,
               "--eval_iters", "1", "--checkpoint_steps", big, "--save_steps", big, "--seed", "1",
               "--output_dir", str(work / "out"), "--plugins", str(work / "step_timer.py"),
               "--callbacks", "bench_step_timer", *flags]
        run_env = {**os.environ, **env, "ERNIE_BENCH_STEP_TIMES": str(times_file),
                   "PYTHONPATH": os.pathsep.join(filter(None, [str(sp.ROOT), os.environ.get("PYTHONPATH")]))}
        out = subprocess.run(cmd, capture_output=True, text=True, env=run_env, cwd=tmp)
        log = out.stdout + out.stderr
        if out.returncode or not times_file.exists():
            raise SystemExit(f"the real loop failed ({' '.join(cmd)}):\n{log[-3000:]}")
        marks = json.loads(times_file.read_text())
    steps = []  # (seconds, other-process cores, non-pad tokens, seconds outside Executor.run) of steps warmup+1 ..
    for prev, cur in list(zip(marks, marks[1:]))[plan["warmup"]:]:
        wall = cur[0] - prev[0]
        steps.append((wall, max(0.0, ((cur[1] - prev[1]) - (cur[2] - prev[2])) / max(wall, 1e-9)), cur[3] - prev[3],
                      wall - (cur[4] - prev[4])))
    # as timed_steps keeps them: the first `steps` undisturbed steps after warm-up (then the least disturbed)
    clean = [x for x in steps if x[1] < sp.CLEAN][:plan["steps"]]
    kept = clean + sorted((x for x in steps if x[1] >= sp.CLEAN), key=lambda x: x[1])[:plan["steps"] - len(clean)]

    def line(prefix_):
        return next((x[x.index(prefix_):] for x in log.splitlines() if prefix_ in x), "?")

    return {"times": [k[0] for k in kept], "other_cores": [k[1] for k in kept], "tokens_per_step": b * seq,
            "all_times": [x[0] for x in steps], "host_seconds": [k[3] for k in kept],
            "fill": sum(k[2] for k in kept) / (len(kept) * b * seq), "threads": line("threads:"),
            "cpu_kernels": line("CPU kernels:")}


def _arch_summary(arch):
    return {k: arch[k] for k in ("hidden_size", "num_hidden_layers", "intermediate_size")}


# --- the driver -----------------------------------------------------------------------------------

def child_run(mode, model, variant, args, *, with_ceiling=False) -> dict:
    idle = sp.wait_for_quiet(args.wait_quiet)
    cmd = [sys.executable, os.path.abspath(__file__), "--_child", mode, "--model", model, "--variant", variant,
           "--seq", str(args.seq), "--matmul_repeats", str(args.matmul_repeats), "--short_min", str(args.short_min),
           "--rounds", str(args.rounds), "--task", args.task]
    if with_ceiling:
        cmd.append("--with_ceiling")
    env = dict(os.environ) if args.keep_env else \
        {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env.update(sp.isa_env(args.isa))
    before = loadavg()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode:
        sys.exit(f"{mode} {model} {variant} failed:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    other = max(result.get("other_cores") or [float("nan")])
    print(f"# {mode} {model} {variant}: load {before} ({idle:.0%} idle) -> {loadavg()}; other processes used up to "
          f"{other:.2f} cores during timed steps", file=sys.stderr)
    return result


def summarize(runs, tokens_per_step):
    """(median tokens/s over all steps, min and max of the runs' medians)."""
    all_steps = [t for r in runs for t in r["times"]]
    per_run = [tokens_per_step / statistics.median(r["times"]) for r in runs]
    return tokens_per_step / statistics.median(all_steps), min(per_run), max(per_run)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="small,base", help="comma-separated: tiny, small, base")
    p.add_argument("--variants", default=DEFAULT_VARIANT,
                   help=f"static-side variants, comma-separated (default {DEFAULT_VARIANT})")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--runs", type=int, default=3, help="processes per side and variant (default 3)")
    p.add_argument("--no_dygraph", action="store_true", help="static variants only")
    p.add_argument("--paddlenlp", default="",
                   help="also run PaddleNLP's run_pretrain_static.py step (rebuilt from the script's source: "
                        "run_paddlenlp_static) with these settings, comma-separated: plain (its threads set), serial "
                        "(+ the serial executor), and with +same_kernels the static side's kernel choice (oneDNN on the "
                        "op types ours runs on oneDNN here), e.g. serial,serial+same_kernels; the table gets static / "
                        "PaddleNLP on its own kernels (the fastest such setting) and on the same kernels")
    p.add_argument("--isa", default="native", choices=["native"] + sorted(sp.ISA_LIMITS),
                   help="avx2: hold oneDNN, MKL and NumPy's OpenBLAS to their AVX2 code paths (ONEDNN_MAX_CPU_ISA, "
                        "MKL_ENABLE_INSTRUCTIONS, OPENBLAS_CORETYPE) on a CPU with AVX-512: an ISA-limited run on this "
                        "CPU, labelled so in the output (not a real AVX2 machine)")
    p.add_argument("--json", default="", help="also write the table's figures, the machine and the load to this file")
    p.add_argument("--matmul_repeats", type=int, default=5)
    p.add_argument("--short_docs", action="store_true",
                   help="instead: real tokens/s with samples of U[short_min, seq] real tokens, padded to seq vs "
                        "to the longest sample of each micro-batch")
    p.add_argument("--short_min", type=int, default=30, help="shortest sample of --short_docs (default 30: ~62%% fill at 128)")
    p.add_argument("--real_loop", action="store_true", help="instead: the real training loop vs the raw program")
    p.add_argument("--paired", action="store_true",
                   help="instead: the --variants side by side in one process, alternating steps (robust to load "
                        "from other processes; program-level variants and serial only)")
    p.add_argument("--rounds", type=int, default=0, help="rounds of --paired (default: 2 x the timed steps)")
    p.add_argument("--task", default="pretrain", choices=("pretrain", "multitask"),
                   help="program of --paired: flag-mode pretraining or the 3-task step (one task per round, in turn)")
    p.add_argument("--keep_env", action="store_true", help="pass this shell's OMP/MKL_NUM_THREADS to the runs")
    p.add_argument("--wait_quiet", type=float, default=0,
                   help="before each run, wait up to this many seconds for the machine to be 90%% idle")
    p.add_argument("--_child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--model", default=None, help=argparse.SUPPRESS)
    p.add_argument("--variant", default="plain", help=argparse.SUPPRESS)
    p.add_argument("--with_ceiling", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args._child:
        fn = {"static": run_static, "dygraph": run_dygraph, "short_docs": run_short_docs, "paired": run_paired,
              "real_loop": time_real_loop, "paddlenlp": run_paddlenlp_static}[args._child]
        print(json.dumps(fn(args)))
        return

    os.environ.update(sp.isa_env(args.isa))  # this process's library probes and every run see the limits
    machine = sp.machine(numpy_blas=False)  # NumPy's BLAS is already loaded here: the timed processes report theirs
    sp.print_machine(machine)
    if machine.isa_limited:
        print(f"ISA-LIMITED RUN: the math libraries are held to {machine.isa_in_effect} on this {machine.isa} CPU "
              f"({', '.join(v[0] for v in machine.isa_limits.values())}); not a real {machine.isa_in_effect} machine")
    print(f"load average before: {loadavg()}")
    models, variants = args.models.split(","), args.variants.split(",")
    if args.short_docs:
        print("| model | batch | fill | variant | real tokens/s, pad to max_seq_len | pad to longest | gain |")
        print("|---|---|---|---|---|---|---|")
        for name in models:
            for variant in variants:
                r = child_run("short_docs", name, variant, args)
                full, longest = (r[k]["real_tokens"] / r[k]["seconds"] for k in ("max_seq_len", "longest"))
                print(f"| {name} | {PLAN[name]['b']} | {r['fill']:.0%} | {variant} | {full:,.0f} | {longest:,.0f} | "
                      f"{longest / full:.2f}x |")
        print(f"load average after: {loadavg()}")
        return
    if args.paired:
        paired_json = []
        for name in models:
            r = child_run("paired", name, args.variants, args)
            print(f"\n{args.task}: {name}, batch {PLAN[name]['b']} x seq {args.seq}, {r['threads']}; {len(r['sides'][0]['times'])} "
                  "rounds, one step of every variant per round, in one process:\n")
            print("| variant | ms/step median (min-max) | tokens/s | ratio to the first (median of rounds, IQR) | "
                  "losses bitwise equal to the first's | other processes, cores (median, max) |")
            print("|---|---|---|---|---|---|")
            first = r["sides"][0]
            for v, side in zip(r["variants"], r["sides"]):
                t = side["times"]
                ratios = sorted(a / b for a, b in zip(first["times"], t))  # > 1: this variant is faster
                q = lambda f: ratios[min(len(ratios) - 1, int(f * len(ratios)))]  # noqa: E731
                same = side["losses"] == first["losses"]
                diff = max(abs(a - b) for a, b in zip(side["losses"], first["losses"]))
                print(f"| {v} | {1e3 * statistics.median(t):,.0f} ({1e3 * min(t):,.0f}-{1e3 * max(t):,.0f}) | "
                      f"{r['tokens_per_step'] / statistics.median(t):,.0f} | {statistics.median(ratios):.3f}x "
                      f"({q(0.25):.3f}-{q(0.75):.3f}) | "
                      f"{('yes' if same else f'no (max diff {diff:.2g})') if side['ours'] else 'n/a (another program)'} | "
                      f"{statistics.median(side['others']):.2f}, {max(side['others']):.2f} |")
            for v, side in zip(r["variants"], r["sides"]):
                print(f"#   {v}: {side['applied']}", file=sys.stderr)
                if not side["ours"]:  # the first variant over PaddleNLP's step, paired by round
                    over = sorted(b / a for a, b in zip(first["times"], side["times"]))
                    print(f"{r['variants'][0]} over {v}: {statistics.median(over):.2f}x (median of {len(over)} rounds, "
                          f"IQR {over[len(over) // 4]:.2f}-{over[(3 * len(over)) // 4]:.2f})")
            paired_json.append({"model": name, "task": args.task, **r})
        print(f"\nload average after: {loadavg()}")
        if args.json:
            sp.write_json(args.json, {"isa": args.isa, "paired": paired_json}, machine)
        return
    if args.real_loop:
        for name in models:
            for variant in variants:
                raw, loop = [], []
                for _ in range(args.runs):  # alternating, so drifting load from other jobs hits both sides
                    raw.append(child_run("static", name, variant, args))
                    loop.append(child_run("real_loop", name, variant, args))
                tps = raw[0]["tokens_per_step"]
                r, l_ = summarize(raw, tps)[0], summarize(loop, tps)[0]
                print("# per run, tokens/s: raw " + ", ".join(f"{tps / statistics.median(x['times']):,.0f}" for x in raw)
                      + "; real loop " + ", ".join(f"{tps / statistics.median(x['times']):,.0f}" for x in loop)
                      + "; real loop, every step after warm-up (s): "
                      + " | ".join(", ".join(f"{t:.2f}" for t in x["all_times"]) for x in loop), file=sys.stderr)
                host = statistics.median(h for x in loop for h in x["host_seconds"])
                step_s = statistics.median(t for x in loop for t in x["times"])
                print(f"# real loop: {1e3 * host:.1f} ms per step outside Executor.run (data, feed, fetch conversion, "
                      f"metrics, callbacks) of {1e3 * step_s:.0f} ms: the loop's own share {host / step_s:.1%}",
                      file=sys.stderr)
                print(f"{name} (batch {PLAN[name]['b']} x seq {args.seq}) {variant}: raw program {r:,.0f} tokens/s, "
                      f"real loop {l_:,.0f} tokens/s, loop / raw {l_ / r:.3f}; real loop: {loop[0]['threads']}; "
                      f"{loop[0]['cpu_kernels']}; non-pad fill {min(x['fill'] for x in loop):.1%}")
        print(f"load average after: {loadavg()}")
        return

    rows, ceilings = [], {}
    pnlp_variants = [v for v in args.paddlenlp.split(",") if v]
    for name in models:
        dygraph_runs, pnlp_runs = {}, {v: [] for v in pnlp_variants}
        for variant in variants:
            static_runs = []
            for k in range(args.runs):
                static_runs.append(child_run("static", name, variant, args, with_ceiling=(k == 0)))
                threads_key = "threads1" if "threads1" in sp.parse_variant(variant) else "auto"
                if not args.no_dygraph and len(dygraph_runs.setdefault(threads_key, [])) < args.runs:
                    dygraph_runs[threads_key].append(child_run("dygraph", name, variant, args))
                for v in pnlp_variants:  # alternating with the static runs, so drifting load hits both
                    if len(pnlp_runs[v]) < args.runs:
                        pnlp_runs[v].append(child_run("paddlenlp", name, paddlenlp_variant(v, static_runs[0]), args))
            first = static_runs[0]
            ceilings.setdefault(name, first["ceiling"])
            tps = first["tokens_per_step"]
            static = summarize(static_runs, tps)
            dyg = summarize(dygraph_runs[threads_key], tps) if not args.no_dygraph else None
            pnlp = {v: summarize(r, tps) for v, r in pnlp_runs.items() if r}
            load = {"static": sp.other_cores_summary(c for r in static_runs for c in r["other_cores"]),
                    "dygraph": sp.other_cores_summary(c for r in dygraph_runs.get(threads_key, []) for c in r["other_cores"]),
                    **{f"paddlenlp[{v}]": sp.other_cores_summary(c for r in rs for c in r["other_cores"])
                       for v, rs in pnlp_runs.items()}}
            rows.append((name, variant, first, static, dyg, pnlp, load, static_runs, pnlp_runs))
            print(f"# {name} / {variant}: {first['threads']}; {first.get('applied', '')}; load {loadavg()}",
                  file=sys.stderr)
            for v, rs in pnlp_runs.items():
                print(f"# PaddleNLP [{v}]: {rs[0].get('applied', '')}", file=sys.stderr)

    peak = rows[0][2]["machine"].get("peak_gflops") if rows else None
    if rows:  # the machine as the timed processes saw it (NumPy's BLAS included: it is in the ceiling)
        child_machine = rows[0][2]["machine"]
        print(f"\nin the timed processes: ISA in effect {child_machine['isa_in_effect']}; "
              + "; ".join(f"{k} {v}" for k, v in child_machine["libraries"].items() if k.endswith(("isa", "code_path", "blas"))))
    warnings = []
    for name, c in ceilings.items():
        print(f"\nfloat32 matmul on {name}'s shapes (batch {PLAN[name]['b']} x seq {args.seq}), GFLOP/s median "
              f"(min-max) of {args.matmul_repeats}: Paddle MKL | Paddle oneDNN | NumPy BLAS")
        for f in c["forms"]:
            cells = " | ".join(f"{f[k][0]:6.1f} ({f[k][1]:.0f}-{f[k][2]:.0f})" for k in ("mkl", "onednn", "numpy"))
            print(f"  {f['form']:<34} x{f['uses']}: {cells}")
            warnings += [w for w in (check_rate(f[k][0], peak, f"{k} on {f['form']}") for k in ("mkl", "onednn", "numpy")) if w]
        mix = c["mix"]
        print(f"  FLOP-weighted: Paddle MKL {mix['mkl'] / 1e9:.1f}, Paddle oneDNN {mix['onednn'] / 1e9:.1f}, "
              f"NumPy {mix['numpy'] / 1e9:.1f} GFLOP/s; honest ceiling (fastest per form) {c['ceiling'] / 1e9:.1f} GFLOP/s"
              + (f"; estimated FP32 peak {peak:.1f} GFLOP/s: the ceiling is {c['ceiling'] / 1e9 / peak:.0%} of it" if peak else ""))
        warnings += [w for w in [check_rate(c["ceiling"] / 1e9, peak, f"the honest ceiling of {name}")] if w]
    for w in warnings:
        print(f"WARNING: {w}")
    print("\n| model | batch x seq | static variant | static tokens/s (runs) | dygraph tokens/s (runs) | static / dygraph "
          "| PaddleNLP step, its own kernels: tokens/s (runs) [setting] | static / PaddleNLP, its own kernels "
          "| PaddleNLP step, our kernels: tokens/s (runs) | static / PaddleNLP, same kernels "
          "| static GFLOP/s | honest ceiling | of ceiling | of FP32 peak |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    table = []
    for name, variant, first, static, dyg, pnlp, load, static_runs, pnlp_runs in rows:
        a = first["arch"]
        gflops = static[0] * first["flops_per_token"] / 1e9
        own = {v: r for v, r in pnlp.items() if "same_kernels" not in v}
        same = {v: r for v, r in pnlp.items() if "same_kernels" in v}
        best_own = max(own.items(), key=lambda kv: kv[1][0]) if own else None
        best_same = max(same.items(), key=lambda kv: kv[1][0]) if same else None
        c = ceilings[name]
        cell = lambda x: f"{x[0]:,.0f} ({x[1]:,.0f}-{x[2]:,.0f})"  # noqa: E731
        print(f"| {name} (h{a['hidden_size']}, L{a['num_hidden_layers']}) | {PLAN[name]['b']} x {args.seq} | {variant} | "
              f"{cell(static)} | {cell(dyg) if dyg else '-'} | {f'{static[0] / dyg[0]:.2f}x' if dyg else '-'} | "
              f"{f'{cell(best_own[1])} [{best_own[0]}]' if best_own else '-'} | "
              f"{f'{static[0] / best_own[1][0]:.2f}x' if best_own else '-'} | "
              f"{f'{cell(best_same[1])} [{best_same[0]}]' if best_same else '-'} | "
              f"{f'{static[0] / best_same[1][0]:.2f}x' if best_same else '-'} | "
              f"{gflops:.1f} | {c['ceiling'] / 1e9:.1f} | {gflops * 1e9 / c['ceiling']:.0%} | "
              f"{f'{gflops / peak:.0%} of {peak:.0f}' if peak else '-'} |")
        for v, r in pnlp.items():
            print(f"#   PaddleNLP static [{v}]: {r[0]:,.0f} tokens/s ({r[1]:,.0f}-{r[2]:,.0f})", file=sys.stderr)
        table.append({"model": name, "batch": PLAN[name]["b"], "seq": args.seq, "variant": variant,
                      "static_tokens_per_s": static, "dygraph_tokens_per_s": dyg, "paddlenlp_tokens_per_s": pnlp,
                      "paddlenlp_applied": {v: rs[0].get("applied") for v, rs in pnlp_runs.items() if rs},
                      "static_over_paddlenlp_own_kernels": static[0] / best_own[1][0] if best_own else None,
                      "static_over_paddlenlp_same_kernels": static[0] / best_same[1][0] if best_same else None,
                      "static_gflops": gflops, "ceiling_gflops": c["ceiling"] / 1e9, "peak_gflops": peak,
                      "onednn_types": first.get("onednn_types"), "applied": first.get("applied"),
                      "threads": first["threads"], "other_cores": load,
                      "static_run_medians": [tps_ / statistics.median(r["times"]) for r in static_runs
                                             for tps_ in [first["tokens_per_step"]]]})
    print("\nCPU used by other processes during the timed steps (cores, median / max): " + "; ".join(
        f"{t['model']} {side} {v['median']:.2f} / {v['max']:.2f}" for t in table for side, v in t["other_cores"].items() if v))
    print(f"\nload average after: {loadavg()}")
    if args.json:
        sp.write_json(args.json, {"isa": args.isa, "ceilings": ceilings, "rows": table, "warnings": warnings,
                                  "timed_machine": rows[0][2]["machine"] if rows else None}, machine)


def check_rate(gflops: float, peak: Optional[float], what: str) -> Optional[str]:
    """A measurement-error warning when `gflops` exceeds the machine's estimated FP32 peak."""
    if not peak or gflops <= peak:
        return None
    return (f"MEASUREMENT ERROR? {what}: {gflops:.1f} GFLOP/s is above the estimated FP32 peak {peak:.1f} GFLOP/s of this "
            "machine (cores x clock read x FLOP/cycle; see the header): the timing is wrong or the cores run faster "
            "than the clock read")


def paddlenlp_variant(v: str, static_first: dict) -> str:
    """A --paddlenlp setting for the child: `same_kernels` becomes `onednn=<the static side's oneDNN op types>`."""
    parts = [p for p in v.split("+") if p]
    if "same_kernels" not in parts:
        return v
    types = static_first.get("onednn_types") or []
    parts = [p for p in parts if p != "same_kernels"] + ([f"onednn={':'.join(types)}"] if types else [])
    return "+".join(parts) or "plain"

if __name__ == "__main__":
    main()
