"""Training tokens/s: our static fleet program vs the same ERNIE in a plain paddlenlp dygraph loop.

Same architecture, batch, sequence length, optimizer (AdamW + global-norm clip) and loss (MLM
over real masked tokens + NSP); random batches in the collate layout. Each side runs in its own
process (static and dygraph must not share one). Achieved FLOP/s is reported as a fraction of
the measured NumPy float32 matmul peak of this machine. FLOPs per token are estimated as
6 x non-embedding parameters + 12 x layers x hidden x seq (attention scores and values).

    python benchmarks/bench_train.py --models small,base
"""
import zlib  # noqa: F401  (before paddle)
import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MODELS = {"small": "ernie-small", "base": "ernie-1.0-base-zh"}


def batch(rng, b, seq, vocab, masked=0.15):
    ids = rng.randint(5, vocab, (b, seq)).astype("int64")
    k = max(1, int(seq * masked))
    pos = np.concatenate([i * seq + np.sort(rng.choice(np.arange(1, seq), k, replace=False)) for i in range(b)])
    return {"input_ids": ids, "segment_ids": (np.arange(seq) >= seq // 2).astype("int64")[None].repeat(b, 0),
            "input_mask": np.zeros((b, 1, 1, seq), "float32"), "masked_lm_positions": pos.astype("int64"),
            "masked_lm_labels": ids.reshape(-1)[pos].reshape(-1, 1),
            "next_sentence_labels": rng.randint(0, 2, (b, 1)).astype("int64")}


def run_static(name, b, seq, steps, warmup):
    import functools
    import paddle
    paddle.enable_static()
    from ernie_mtl.config import AmpConfig, ModelConfig, OptimConfig, ParallelConfig
    from ernie_mtl.model import build_pretrain_programs
    from ernie_mtl.parallel import Topology, build_strategy, init_fleet
    parallel = ParallelConfig(micro_batch_size=b, global_batch_size=b)
    topo = Topology.from_config(parallel, 1)
    init_fleet(topo)
    model = ModelConfig(model_name_or_path=MODELS[name])
    progs = build_pretrain_programs(model, OptimConfig(max_steps=1000), functools.partial(
        build_strategy, topo, parallel, AmpConfig()), topo, seed=1, amp_cfg=AmpConfig())
    scope, exe = paddle.static.Scope(), paddle.static.Executor(paddle.CPUPlace())
    progs.initialize(exe, scope)
    arch = model.resolve().arch
    rng = np.random.RandomState(0)
    feeds = [batch(rng, b, seq, arch["vocab_size"]) for _ in range(4)]
    for i in range(warmup + steps):
        if i == warmup:
            start = time.perf_counter()
        exe.run(progs.main, feed=feeds[i % 4], fetch_list=[progs.fetches["loss"]], scope=scope)
    return (time.perf_counter() - start) / steps, arch


def run_dygraph(name, b, seq, steps, warmup):
    import paddle
    import paddle.nn.functional as F
    from paddlenlp.transformers import ErnieConfig, ErnieForPretraining
    from ernie_mtl.config import ModelConfig
    arch = ModelConfig(model_name_or_path=MODELS[name]).resolve().arch
    keys = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
            "max_position_embeddings", "type_vocab_size", "hidden_act")
    model = ErnieForPretraining(ErnieConfig(**{k: arch[k] for k in keys}))
    opt = paddle.optimizer.AdamW(1e-4, parameters=model.parameters(), weight_decay=0.01,
                                 grad_clip=paddle.nn.ClipGradByGlobalNorm(1.0))
    rng = np.random.RandomState(0)
    feeds = [{k: paddle.to_tensor(v) for k, v in batch(rng, b, seq, arch["vocab_size"]).items()} for _ in range(4)]
    for i in range(warmup + steps):
        if i == warmup:
            start = time.perf_counter()
        f = feeds[i % 4]
        scores, rel = model(f["input_ids"], token_type_ids=f["segment_ids"], attention_mask=f["input_mask"],
                            masked_positions=f["masked_lm_positions"])
        loss = F.cross_entropy(scores, f["masked_lm_labels"]).mean() + \
            F.cross_entropy(rel, f["next_sentence_labels"]).mean()
        loss.backward()
        opt.step()
        opt.clear_grad()
    float(loss)
    return (time.perf_counter() - start) / steps, arch


def matmul_peak(n=2048, repeats=3):
    a = np.random.rand(n, n).astype("float32")
    best = min(_time(lambda: a @ a) for _ in range(repeats))
    return 2 * n ** 3 / best


def _time(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="small,base")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--mode", default=None, help=argparse.SUPPRESS)
    p.add_argument("--model", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    plan = {"small": dict(b=16, steps=20, warmup=3), "base": dict(b=8, steps=6, warmup=1)}
    if args.mode:
        fn = run_static if args.mode == "static" else run_dygraph
        sec, arch = fn(args.model, plan[args.model]["b"], args.seq, plan[args.model]["steps"], plan[args.model]["warmup"])
        print(json.dumps({"seconds_per_step": sec, "arch": {k: arch[k] for k in (
            "hidden_size", "num_hidden_layers", "intermediate_size")}}))
        return
    peak = matmul_peak()
    print(f"numpy float32 matmul peak: {peak / 1e9:.1f} GFLOP/s")
    print("| model | batch x seq | static tokens/s | dygraph tokens/s | static / dygraph | static FLOP/s (of peak) |")
    print("|---|---|---|---|---|---|")
    for name in args.models.split(","):
        res = {}
        for mode in ("static", "dygraph"):
            out = subprocess.run([sys.executable, __file__, "--mode", mode, "--model", name, "--seq", str(args.seq)],
                                 capture_output=True, text=True, cwd=str(ROOT))
            if out.returncode:
                sys.exit(f"{mode} {name} failed:\n{out.stderr[-3000:]}")
            res[mode] = json.loads(out.stdout.strip().splitlines()[-1])
        b, seq = plan[name]["b"], args.seq
        a = res["static"]["arch"]
        h, n_layers, ffn = a["hidden_size"], a["num_hidden_layers"], a["intermediate_size"]
        flops_per_token = 6 * n_layers * (4 * h * h + 2 * h * ffn) + 12 * n_layers * h * seq
        tok = {m: b * seq / res[m]["seconds_per_step"] for m in res}
        print(f"| {name} (h{h}, L{n_layers}) | {b} x {seq} | {tok['static']:,.0f} | {tok['dygraph']:,.0f} | "
              f"{tok['static'] / tok['dygraph']:.2f}x | {tok['static'] * flops_per_token / 1e9:.1f} GFLOP/s "
              f"({tok['static'] * flops_per_token / peak:.0%}) |")


if __name__ == "__main__":
    main()
