"""Prediction throughput on CPU through Paddle Inference, as `--do_predict` runs it: samples/s of an exported
ERNIE classifier at 1, 2 and all threads, with the plain kernels (`disable_mkldnn`) and oneDNN's
(`enable_mkldnn`, Paddle 2.6.2's default), and what `--cpu_kernels auto` chooses here.

    python benchmarks/bench_predict.py                          # ernie-small and ERNIE-base, 64 examples
    python benchmarks/bench_predict.py --models base --examples 128 --rounds 5

Each model is exported as training exports it (ernie_mtl.engine.exporter.export_task_model; random weights:
speed does not depend on them), a classification file of `--examples` random texts of `--seq` tokens is
predicted through the prediction loop (featurize, batch of `--batch`, predictor, outputs) by every
(threads, kernels) configuration in turn, `--rounds` rounds in rotated order so load from other processes
falls on all alike; samples/s is the median over rounds (min-max printed). "Paddle's default before" is
oneDNN on 1 thread: what the predictor ran before it got the thread budget. Benchmarks print figures;
they are not tests. Take them on a quiet machine: the load average and the CPU other processes used are
printed.
"""
import zlib  # noqa: F401  (before paddle)

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(os.path.abspath(__file__)).parent))
import step_programs as sp  # noqa: E402  (also puts the repository on sys.path)


def export_classifier(folder: Path, model: str, examples: int, seq: int, batch: int):
    """(model dir, task, data): an exported `cls` model of `model`'s architecture and a file to predict."""
    import paddle
    from paddle.utils import unique_name

    from ernie_mtl.config import TaskSpec
    from ernie_mtl.engine.exporter import export_task_model
    from ernie_mtl.program.forward import build_forward
    from ernie_mtl.tasks.base import TaskContext
    from ernie_mtl.tasks.classification import ClassificationTask

    cfg = sp._model_cfg(model, True)
    arch = cfg.resolve().arch
    vocab = sp._vocab_file(folder, arch["vocab_size"])
    rng = np.random.RandomState(0)
    rows = ["\t".join(("label", "text_a"))]
    for i in range(examples):  # space-separated words of the vocab: one token each, `seq` - 2 per example
        rows.append(f"{i % 2}\t" + " ".join(f"t{w}" for w in rng.randint(0, arch["vocab_size"] - 5, seq - 2)))
    pred_file = folder / "pred.tsv"
    pred_file.write_text("\n".join(rows) + "\n", encoding="utf-8")
    options = {k: o.default for k, o in ClassificationTask.options.items()}
    options.update(n_classes=2)
    task = ClassificationTask(TaskSpec(name="cls", reader="cls", index=0, max_seq_len=seq, batch_size=batch,
                                       options=options, pred_file=str(pred_file)),
                              TaskContext(vocab_file=vocab, seed=1, log=lambda s: None))
    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup), unique_name.guard():
        fwd = build_forward(cfg.model_type, {k: v for k, v in arch.items() if k != "model_type"}, [task])
    program = main.clone(for_test=True)
    scope, exe = paddle.static.Scope(), paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup, scope=scope)
    model_dir = folder / "out" / "cls" / "infer_model"
    with paddle.static.scope_guard(scope):
        export_task_model(model_dir, program=program, fwd=fwd, task=task, exe=exe, vocab_file=vocab, arch=arch,
                          model_type=cfg.model_type, use_task_id=False)
    return model_dir, task, task.load("pred")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="small,base", help="comma-separated: tiny, small, base")
    p.add_argument("--examples", type=int, default=64)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", default="", help="thread counts to compare (default: 1, 2 and all CPUs)")
    p.add_argument("--json", default="", help="also write the figures, the machine and the load to this file")
    args = p.parse_args()
    threads_line = sp.prepare_env({"serial": None})
    # after the threads are set: the header asks MKL and oneDNN which code path they take
    from ernie_mtl.dist.machine import describe_machine  # the machine every figure below came from

    machine = describe_machine()
    print("\n".join(machine.header()), flush=True)
    from ernie_mtl.dist.threads import cpu_budget
    from ernie_mtl.engine.saved_models import cpu_predictor, predictor_runner, read_manifest
    from ernie_mtl.engine.prediction_loop import predict_batches

    cpus = cpu_budget().cpus
    counts = sorted({int(t) for t in args.threads.split(",") if t} or {1, 2, cpus})
    print(f"load average before: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}; {threads_line}; "
          f"{cpus} CPUs for this process")
    figures = []
    for model in args.models.split(","):
        with tempfile.TemporaryDirectory(prefix="ernie_bench_predict_") as tmp:
            model_dir, task, data = export_classifier(Path(tmp), model, args.examples, args.seq, args.batch)
            manifest = read_manifest(model_dir)
            names = [f["name"] for f in manifest["fetches"]]
            lines = []
            cpu_predictor(model_dir, manifest, task, data, cpu_kernels="auto", threads=cpus, log=lines.append)
            configs = [(t, k) for t in counts for k in (False, True)]
            rates = {c: [] for c in configs}
            others, peak_rss = [], 0
            for r in range(args.rounds):
                order = configs[r % len(configs):] + configs[:r % len(configs)]
                for c in order:
                    # one predictor alive at a time: at ERNIE-base size, the 4 predictors held together grew this
                    # process past 20 GB; each is created, warmed up (primitives, allocations) and dropped
                    run = predictor_runner(model_dir, manifest, threads=c[0], onednn=c[1])[0]
                    predict_batches(task, data, run, names, batch_size=args.batch)
                    with sp.OtherLoad() as other:
                        start = time.perf_counter()
                        predict_batches(task, data, run, names, batch_size=args.batch)
                        rates[c].append(len(data) / (time.perf_counter() - start))
                    others.append(other.cores)
                    del run
                    peak_rss = max(peak_rss, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20)
            print(f"\n{model} ({sp.MODELS[model]}), {len(data)} examples x {args.seq} tokens, batch {args.batch}, "
                  f"{args.rounds} rounds; other processes used {statistics.median(others):.2f} cores (median), "
                  f"{max(others):.2f} at most; peak resident memory of this process {peak_rss:.1f} GB")
            print(f"what --do_predict chooses here: {lines[0]}")
            print("\n| threads | plain kernels (disable_mkldnn), samples/s | oneDNN (enable_mkldnn), samples/s | oneDNN / plain |")
            print("|---|---|---|---|")
            for t in counts:
                a, b = rates[(t, False)], rates[(t, True)]
                print(f"| {t}{' (all)' if t == cpus else ''} | {statistics.median(a):,.1f} ({min(a):,.1f}-{max(a):,.1f}) | "
                      f"{statistics.median(b):,.1f} ({min(b):,.1f}-{max(b):,.1f}) | "
                      f"{statistics.median(b) / statistics.median(a):.2f}x |")
            figures.append({"model": model, "examples": len(data), "seq": args.seq, "batch": args.batch,
                            "auto_choice": lines[0], "other_cores": sp.other_cores_summary(others),
                            "samples_per_s": {f"{t} threads, {'oneDNN' if k else 'plain'}": v for (t, k), v in rates.items()}})
            if 1 in counts and len(counts) > 1:
                for k, label in ((False, "plain"), (True, "oneDNN")):
                    one = statistics.median(rates[(1, k)])
                    print(f"{label}: " + ", ".join(f"{t} threads {statistics.median(rates[(t, k)]) / one:.2f}x"
                                                    for t in counts if t != 1) + " of 1 thread")
                print(f"Paddle's default before (oneDNN, 1 thread): {statistics.median(rates[(1, True)]):,.1f} samples/s; "
                      f"now ({cpus} threads, oneDNN): {statistics.median(rates[(cpus, True)]):,.1f}")
    print(f"\nload average after: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
    if args.json:
        sp.write_json(args.json, {"figures": figures}, machine)


if __name__ == "__main__":
    main()
