"""oneDNN vs Paddle's plain CPU kernels, op by op, on ERNIE's shapes: the evidence behind
ernie_mtl.program.cpu_kernels.EXACT_ONEDNN_OPS.

    python benchmarks/bench_onednn_ops.py                  # ERNIE-base shapes, batch 8 x seq 128
    python benchmarks/bench_onednn_ops.py --hidden 256 --layers-ffn 1024 --heads 4 --batch 16

Each case is a small static program: the op applied `--copies` times to parameters of the model's
shapes, alone (forward) and with its gradient op (`paddle.static.gradients` with a given output
gradient, so nothing else runs), each plain and with oneDNN on the case's op types; each program
runs `--repeats` times and the minimum is reported (the figure least disturbed by other processes
on a shared machine; the median in parentheses). The oneDNN programs' outputs (and input gradients)
are compared with the plain ones: "exact" means bitwise equal.
Threads: ernie_mtl.dist.threads, as the training entry points (OMP_NUM_THREADS wins if set); serial executor.
"""
import zlib  # noqa: F401  (before paddle)

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(os.path.abspath(__file__)).parent))
import step_programs as sp  # noqa: E402


def cases(b, s, h, ffn, heads):
    """(name, op type, grad op type, builder(params) -> output, parameter shapes); a shape given as
    ("const", shape) is an input without gradient (the attention mask is a feed)."""
    import paddle
    import paddle.nn.functional as F

    d = h // heads
    return [
        ("bias add [b,s,ffn]+[ffn]", "elementwise_add", "elementwise_add_grad",
         lambda x, y: paddle.add(x, y), [(b, s, ffn), (ffn,)]),
        ("residual add [b,s,h]+[b,s,h]", "elementwise_add", "elementwise_add_grad",
         lambda x, y: paddle.add(x, y), [(b, s, h), (b, s, h)]),
        ("mask add [b,n,s,s]+[b,1,1,s]", "elementwise_add", "elementwise_add_grad",
         lambda x, y: paddle.add(x, y), [(b, heads, s, s), ("const", (b, 1, 1, s))]),
        ("relu [b,s,ffn]", "relu", "relu_grad", lambda x: F.relu(x), [(b, s, ffn)]),
        ("gelu [b,s,ffn]", "gelu", "gelu_grad", lambda x: F.gelu(x), [(b, s, ffn)]),
        ("softmax [b,n,s,s]", "softmax", "softmax_grad", lambda x: F.softmax(x), [(b, heads, s, s)]),
        ("layer_norm [b,s,h]", "layer_norm", "layer_norm_grad",
         lambda x, g, bb: F.layer_norm(x, [h], weight=g, bias=bb), [(b, s, h), (h,), (h,)]),
        ("reshape2 [b,s,h]->[b,s,n,d]", "reshape2", "reshape2_grad",
         lambda x: paddle.reshape(x, [b, s, heads, d]), [(b, s, h)]),
        ("transpose2 [b,s,n,d]->[b,n,s,d]", "transpose2", "transpose2_grad",
         lambda x: paddle.transpose(x, [0, 2, 1, 3]), [(b, s, heads, d)]),
        ("scale [b,n,s,d]", "scale", None, lambda x: paddle.scale(x, 0.125), [(b, heads, s, d)]),
        ("multiply [b,s,h]*[b,s,h]", "elementwise_mul", "elementwise_mul_grad",
         lambda x, y: paddle.multiply(x, y), [(b, s, h), (b, s, h)]),
        ("sum of 3 [b,s,h]", "sum", None, lambda x, y, z: paddle.add_n([x, y, z]), [(b, s, h)] * 3),
        ("matmul_v2 [b*s,h]x[h,ffn]", "matmul_v2", "matmul_v2_grad",
         lambda x, w: paddle.matmul(x, w), [(b * s, h), (h, ffn)]),
    ]


def build(fn, shapes, copies, with_grad):
    import paddle
    from paddle.utils import unique_name

    main, startup = paddle.static.Program(), paddle.static.Program()
    main.random_seed = startup.random_seed = 1
    with paddle.static.program_guard(main, startup), unique_name.guard():
        outs, grads_in, params = [], [], []
        for _ in range(copies):
            ps = []
            for shape in shapes:
                const = shape[0] == "const"
                v = paddle.static.create_parameter(list(shape[1] if const else shape), "float32",
                                                   default_initializer=paddle.nn.initializer.Uniform(-1, 1))
                v.stop_gradient = const
                ps.append(v)
                if not const:
                    params.append(v)
            out = fn(*ps)
            g = paddle.static.create_parameter(list(out.shape), "float32",
                                               default_initializer=paddle.nn.initializer.Uniform(-1, 1))
            g.stop_gradient = True
            outs.append(out)
            grads_in.append(g)
        grads = paddle.static.gradients(outs, params, target_gradients=grads_in) if with_grad else []
    return main, startup, outs + [g for g in grads if g is not None]


def measure(fn, shapes, onednn_types, copies, repeats, with_grad):
    """(run times, fetched outputs) of the case's program with oneDNN on `onednn_types`."""
    import paddle

    main, startup, fetch = build(fn, shapes, copies, with_grad)
    for op in main.global_block().ops:
        if op.type in onednn_types:
            op._set_attr("use_mkldnn", True)
    scope, exe = paddle.static.Scope(), paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup, scope=scope)
    values = exe.run(main, fetch_list=fetch, scope=scope)  # warm-up; these outputs are compared
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        exe.run(main, fetch_list=[], scope=scope)
        times.append(time.perf_counter() - start)
    return times, values


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--ffn", type=int, default=3072)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--copies", type=int, default=4, help="independent applications per program")
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--only", default="", help="comma-separated op types to run (default: all cases)")
    args = p.parse_args()
    threads = sp.prepare_env({"serial": None})
    # after the threads are set: the header asks MKL and oneDNN which code path they take
    from ernie_mtl.dist.machine import describe_machine  # the machine every figure below came from

    machine = describe_machine()
    print("\n".join(machine.header()), flush=True)
    import paddle

    paddle.enable_static()
    print(f"{threads}; serial executor; {args.copies} copies per program; ms per op: minimum over "
          f"{args.repeats} runs (median in parentheses); the gradient op's time is the forward+backward "
          "program's minus the forward program's\n")
    print("| case | forward op: plain | oneDNN | speed-up | exact | gradient op: plain | oneDNN | speed-up | exact |")
    print("|---|---|---|---|---|---|---|---|---|")
    only = set(filter(None, args.only.split(",")))
    for name, fwd_type, grad_type, fn, shapes in cases(args.batch, args.seq, args.hidden, args.ffn, args.heads):
        if only and fwd_type not in only:
            continue

        def run(types, with_grad):
            times, values = measure(fn, shapes, types, args.copies, args.repeats, with_grad)
            return (1e3 * min(times) / args.copies, 1e3 * statistics.median(times) / args.copies), values

        def same(a, b):
            if all(np.array_equal(x, y) for x, y in zip(a, b)):
                return "yes"
            return f"no ({max(float(np.max(np.abs(x - y))) for x, y in zip(a, b)):.1g})"

        fwd_plain, ref = run(set(), False)
        fwd_dnn, out = run({fwd_type}, False)
        row = [f"{fwd_plain[0]:.2f} ({fwd_plain[1]:.2f})", f"{fwd_dnn[0]:.2f} ({fwd_dnn[1]:.2f})",
               f"{fwd_plain[0] / fwd_dnn[0]:.2f}x", same(out, ref)]
        if grad_type:
            both_plain, ref = run(set(), True)
            both_dnn, out = run({fwd_type, grad_type}, True)  # as a program would run them
            g_plain, g_dnn = both_plain[0] - fwd_plain[0], both_dnn[0] - fwd_dnn[0]
            row += [f"{g_plain:.2f}", f"{g_dnn:.2f}", f"{g_plain / g_dnn:.2f}x" if g_dnn > 0 else "-", same(out, ref)]
        else:
            row += ["-"] * 4
        print(f"| {name} | " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main()
