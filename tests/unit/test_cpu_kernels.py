"""ernie_mtl.program.cpu_kernels: oneDNN kernels on the chosen op types (up to every candidate `--cpu_kernels
auto` can choose, matmuls and their gradients on 2-D views included) and bias gradients by matmul train
within float32 rounding of the plain program; the attribute really switches kernels (oneDNN's own
execution log says so, for matmul and its gradient too); optimizer ops are skipped.

No test here asserts *how* a kernel rounds (bitwise equal or bitwise different from another kernel):
MKL and oneDNN take other code paths on AMD and Intel CPUs, so such an assertion tests the CPU, not
the code (one did, and `make test` failed on AMD EPYC machines). Kernels are compared within a
tolerance; exactness (resume, golden losses) is compared between runs on one machine."""
import zlib  # noqa: F401  (before paddle)

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from ernie_mtl.config import ModelConfig, OptimConfig
from ernie_mtl.program.cpu_kernels import EXACT_ONEDNN_OPS, bias_grads_by_matmul, use_onednn_ops
from ernie_mtl.program.kernel_choice import AUTO_CANDIDATES

pytestmark = pytest.mark.usefixtures("static_mode")

NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
STEPS = 4
# float32 rounding after STEPS AdamW steps of tiny ERNIE: relative on losses, absolute on parameters
# (changing the thread count from 2 to 1 moved them by ~1e-7 on ernie-small)
LOSS_RTOL, PARAM_ATOL = 1e-6, 1e-6


def assert_within_rounding(losses, params, plain):
    np.testing.assert_allclose(losses, plain[0], rtol=LOSS_RTOL)
    for n, ref in plain[1].items():
        np.testing.assert_allclose(params[n], ref, rtol=0, atol=PARAM_ATOL, err_msg=n)


def batch(rng, b=4, seq=16, vocab=1000):
    ids = rng.randint(5, vocab, (b, seq)).astype("int64")
    pos = np.array([i * seq + p for i in range(b) for p in sorted(rng.choice(np.arange(1, seq), 3, replace=False))])
    mask = np.zeros((b, 1, 1, seq), "float32")
    mask[-1, ..., seq - 4:] = -1e4
    return {"input_ids": ids, "segment_ids": (np.arange(seq) >= seq // 2).astype("int64")[None].repeat(b, 0),
            "input_mask": mask, "masked_lm_positions": pos.astype("int64"),
            "masked_lm_labels": ids.reshape(-1)[pos].reshape(-1, 1),
            "next_sentence_labels": rng.randint(0, 2, (b, 1)).astype("int64")}


def train(build_programs, op_types=None):
    """(losses, parameters) after STEPS AdamW + global-norm-clip steps of tiny ERNIE pretraining,
    with oneDNN on `op_types` (None: plain kernels everywhere)."""
    import paddle

    p = build_programs(model=ModelConfig(model_name_or_path="ernie-tiny-test", **NO_DROPOUT),
                       optim=OptimConfig(max_lr=1e-3, min_lr=1e-4, max_steps=100, warmup_rate=0.0, grad_clip=1.0))
    changed = use_onednn_ops(p.main, op_types) if op_types is not None else {}
    scope, exe = paddle.static.Scope(), paddle.static.Executor(paddle.CPUPlace())
    p.initialize(exe, scope)
    losses = []
    for _ in range(STEPS):  # one batch, so the loss must fall if the kernels train
        (loss,) = exe.run(p.main, feed=p.feed(batch(np.random.RandomState(0))), fetch_list=[p.loss], scope=scope)
        losses.append(float(np.asarray(loss).reshape(-1)[0]))
        p.lr_scheduler.step()
    params = {n: np.array(scope.find_var(n).get_tensor()) for n in sorted(set(p.name_map.values()))}
    return losses, params, changed


@pytest.fixture(scope="module")
def plain(build_programs):
    return train(build_programs)


@pytest.mark.slow
def test_chosen_ops_train_within_rounding_of_the_plain_program(build_programs, plain):
    losses, params, changed = train(build_programs, EXACT_ONEDNN_OPS)
    assert sum(changed.values()) > 20, changed  # the set really covers the network's ops
    assert_within_rounding(losses, params, plain)
    assert losses[-1] < losses[0]  # and it trains


# oneDNN matmul kernels sum in another order than MKL's: after STEPS steps of tiny ERNIE the largest
# parameter difference measured 1.1e-6 (AMD EPYC), the size the thread count moves them; these bounds
# are 10x that, and 100x below what a wrong gradient does (the bad pair of ONEDNN_CONFLICTS: 8e-3)
CHOSEN_LOSS_RTOL, CHOSEN_PARAM_ATOL = 1e-5, 1e-5
HARNESS_LR = 5e-3  # tests/task_harness.py's Adam learning rate


def test_every_auto_candidate_together_trains_within_rounding_of_the_plain_program(build_programs, plain):
    """The widest choice `--cpu_kernels auto` can make (every candidate type on oneDNN, less the known
    conflicts), matmul gradients of linear layers on 2-D views included, trains within float32 rounding of
    the plain program. Any narrower choice switches a subset of these op types."""
    losses, params, changed = train(build_programs, AUTO_CANDIDATES)
    assert {"matmul_v2", "matmul_v2_grad", "elementwise_add", "transpose2"} <= set(changed), changed
    assert "transpose2_grad" not in changed  # ONEDNN_CONFLICTS
    np.testing.assert_allclose(losses, plain[0], rtol=CHOSEN_LOSS_RTOL)
    for n, ref in plain[1].items():
        np.testing.assert_allclose(params[n], ref, rtol=0, atol=CHOSEN_PARAM_ATOL, err_msg=n)
    assert losses[-1] < losses[0]


ONEDNN_PROBE = textwrap.dedent("""
    import zlib, sys
    import numpy as np
    import paddle
    from ernie_mtl.program.cpu_kernels import use_onednn_ops
    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [4, 8], "float32")
        y = paddle.nn.functional.layer_norm(x + x, [8])
    print("changed", use_onednn_ops(main, sys.argv[1:]), flush=True)
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup)
    exe.run(main, feed={"x": np.ones((4, 8), "float32")}, fetch_list=[y])
""")


def onednn_primitives(op_types):
    """oneDNN primitives executed by a small program with oneDNN on `op_types`, from oneDNN's own
    execution log (ONEDNN_VERBOSE=1: read at library load, hence a fresh process)."""
    env = {**os.environ, "ONEDNN_VERBOSE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", ONEDNN_PROBE, *op_types], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return {line.split(",")[3] for line in proc.stdout.splitlines() if line.startswith("onednn_verbose,exec,")}


def test_the_attribute_switches_kernels():
    """Negative control without any assumption about rounding: oneDNN's execution log lists the
    primitives of exactly the op types that carry the attribute (were it ignored, the test above
    would prove nothing)."""
    assert onednn_primitives(["layer_norm"]) == {"layer_normalization"}
    assert onednn_primitives(["elementwise_add"]) == {"binary"}
    assert onednn_primitives([]) == set()


MATMUL_PROBE = textwrap.dedent("""
    import zlib, sys
    import numpy as np
    import paddle
    from ernie_mtl.program.cpu_kernels import use_onednn_ops
    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [2, 3, 8], "float32")
        x.stop_gradient = False
        w = paddle.static.create_parameter([8, 4], "float32")
        y = paddle.matmul(x, w)
        dx, dw = paddle.static.gradients([y], [x, w])
    print("changed", use_onednn_ops(main, sys.argv[1:]), flush=True)
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup)
    exe.run(main, feed={"x": np.ones((2, 3, 8), "float32")}, fetch_list=[y, dx, dw])
""")


@pytest.mark.slow
def test_oneDNN_matmul_and_its_gradient_really_run_on_oneDNN():
    """A linear layer's forward product and (on its 2-D views) both gradient products run as oneDNN
    matmul primitives when their op types carry the attribute, and none does without it."""
    env = {**os.environ, "ONEDNN_VERBOSE": "1", "OMP_NUM_THREADS": "1"}

    def matmuls(types):
        proc = subprocess.run([sys.executable, "-c", MATMUL_PROBE, *types], capture_output=True, text=True, env=env,
                              timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return [line for line in proc.stdout.splitlines() if line.startswith("onednn_verbose,exec,")
                and line.split(",")[3] == "matmul"]

    assert len(matmuls(["matmul_v2"])) == 1
    assert len(matmuls(["matmul_v2_grad"])) == 2  # dX and dW
    assert matmuls([]) == []


def test_optimizer_ops_and_other_types_are_left_alone(build_programs):
    p = build_programs(model=ModelConfig(model_name_or_path="ernie-tiny-test", **NO_DROPOUT),
                       optim=OptimConfig(max_steps=100, grad_clip=1.0))
    changed = use_onednn_ops(p.main, ["elementwise_mul", "sum", "relu"])
    ops = p.main.global_block().ops
    on = [op for op in ops if op.desc.has_attr("use_mkldnn") and op.attr("use_mkldnn")]
    assert {op.type for op in on} <= {"elementwise_mul", "sum", "relu"}
    assert all(not int(op.attr("op_role")) & 2 for op in on)  # no Optimize-role op (clip's mul and sum)
    clip_muls = [op for op in ops if op.type == "elementwise_mul" and int(op.attr("op_role")) & 2]
    assert clip_muls and not any(op.attr("use_mkldnn") for op in clip_muls if op.desc.has_attr("use_mkldnn"))
    assert changed["relu"] == 3  # two encoder layers and the LM head transform
    assert changed == {t: sum(op.type == t for op in on) for t in changed}


def test_multitask_heads_train_within_rounding_with_the_chosen_ops(tmp_path):
    """The multi-task forward (gated losses, classification and CRF heads) through the task harness."""
    import json

    from ernie_mtl.tasks.base import TaskContext, TaskSpec
    from ernie_mtl.tasks.classification import ClassificationTask
    from ernie_mtl.tasks.seq_label import SeqLabelTask
    from task_harness import TaskHarness

    (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"] +
                                                  [f"t{i}" for i in range(95)]) + "\n")
    (tmp_path / "tags.json").write_text(json.dumps({"B": 0, "I": 1, "O": 2}))
    ctx = TaskContext(vocab_file=str(tmp_path / "vocab.txt"), seed=1, log=lambda s: None)

    def make(cls, name, index, **options):
        opts = {k: o.default for k, o in cls.options.items()}
        opts.update(options, dropout=0.0)
        return cls(TaskSpec(name=name, reader=cls.name, index=index, max_seq_len=16, options=opts), ctx)

    rng = np.random.RandomState(3)
    ids = rng.randint(5, 100, (4, 16)).astype("int64")
    batches = [
        {"input_ids": ids, "segment_ids": np.zeros_like(ids), "input_mask": np.zeros((4, 1, 1, 16), "float32"),
         "label": rng.randint(0, 2, 4).astype("int64")},
        {"input_ids": ids[::-1].copy(), "segment_ids": np.zeros_like(ids),
         "input_mask": np.zeros((4, 1, 1, 16), "float32"), "labels": rng.randint(0, 3, (4, 16)).astype("int64"),
         "label_weights": np.ones((4, 16), "float32")},
    ]

    def run(types):
        tasks = [make(ClassificationTask, "cls", 0, n_classes=2),
                 make(SeqLabelTask, "tag", 1, label_map=str(tmp_path / "tags.json"), use_crf=True)]
        h = TaskHarness(tasks, vocab_size=100)
        changed = use_onednn_ops(h.main, types) if types else {}
        losses = [h.train(i % 2, [batches[i % 2]], steps=1)[0] for i in range(6)]
        return losses, {p.name: h.param(p.name) for p in h.main.global_block().all_parameters()}, changed

    plain_losses, plain_params, _ = run(())
    losses, params, changed = run(EXACT_ONEDNN_OPS)
    assert sum(changed.values()) > 20
    assert_within_rounding(losses, params, (plain_losses, plain_params))
    losses, params, changed = run(AUTO_CANDIDATES)  # the widest auto choice, matmuls included
    assert changed.get("matmul_v2_grad")
    np.testing.assert_allclose(losses, plain_losses, rtol=CHOSEN_LOSS_RTOL)
    # Adam scales every gradient element to a step of about the learning rate, so an element whose gradient is
    # rounding noise moves by a fraction of a step under any change of summation order: the attention key
    # biases (their exact gradient is zero: softmax ignores a shift shared by all keys) differed by 0.06 of a
    # step here. A wrong gradient moves parameters by whole steps (the bad pair: 8 steps' worth)
    atol = 0.1 * HARNESS_LR
    for n, ref in plain_params.items():
        np.testing.assert_allclose(params[n], ref, rtol=0, atol=atol, err_msg=n)


# --------------------------------------------------------------------------- bias gradients by matmul

def test_bias_grads_by_matmul_are_the_row_sums_of_the_output_gradient(build_programs):
    """One step: every rewritten bias gradient equals the float64 row sum of its output gradient
    (an independent oracle) to float32 rounding, and the plain program's within 1e-5 relative. No
    gradient clipping: it scales the gradient variables in place before the fetch."""
    import paddle

    def first_step(rewrite):
        p = build_programs(model=ModelConfig(model_name_or_path="ernie-tiny-test", **NO_DROPOUT),
                           optim=OptimConfig(max_steps=100, grad_clip=0.0))
        block = p.main.global_block()
        pairs = {op.output("Y@GRAD")[0]: op.input("Out@GRAD")[0] for op in block.ops
                 if op.type == "elementwise_add_grad" and op.output("Y@GRAD")
                 and len(block.var(op.input("Y")[0]).shape) == 1}
        rewritten = bias_grads_by_matmul(p.main) if rewrite else []
        scope, exe = paddle.static.Scope(), paddle.static.Executor(paddle.CPUPlace())
        p.initialize(exe, scope)
        names = sorted(pairs)
        values = exe.run(p.main, feed=p.feed(batch(np.random.RandomState(0))),
                         fetch_list=names + [pairs[n] for n in names], scope=scope)
        return rewritten, dict(zip(names, values[:len(names)])), dict(zip(names, values[len(names):]))

    rewritten, grads, douts = first_step(True)
    _, plain_grads, _ = first_step(False)
    # per layer q, k, v, out, ffn in, ffn out; pooler, LM transform, LM decoder, sentence-pair classifier
    assert len(rewritten) == 2 * 6 + 4
    assert sorted(rewritten) == sorted(grads)
    for name in rewritten:
        oracle = douts[name].astype("float64").reshape(-1, grads[name].shape[0]).sum(axis=0)
        np.testing.assert_allclose(grads[name], oracle, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(grads[name], plain_grads[name], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_training_with_bias_grads_by_matmul_stays_within_rounding_of_the_plain_program(build_programs, plain):
    """The documented tolerance: after STEPS steps, losses within 1e-6 relative and parameters within
    1e-6 absolute of the plain program's (changing the thread count from 2 to 1 moved them by ~1e-7
    on ernie-small)."""
    import paddle

    p = build_programs(model=ModelConfig(model_name_or_path="ernie-tiny-test", **NO_DROPOUT),
                       optim=OptimConfig(max_lr=1e-3, min_lr=1e-4, max_steps=100, warmup_rate=0.0, grad_clip=1.0))
    assert bias_grads_by_matmul(p.main)
    use_onednn_ops(p.main)  # as tune_for_cpu applies them
    scope, exe = paddle.static.Scope(), paddle.static.Executor(paddle.CPUPlace())
    p.initialize(exe, scope)
    losses = []
    for _ in range(STEPS):  # the batches of train()
        (loss,) = exe.run(p.main, feed=p.feed(batch(np.random.RandomState(0))), fetch_list=[p.loss], scope=scope)
        losses.append(float(np.asarray(loss).reshape(-1)[0]))
        p.lr_scheduler.step()
    assert_within_rounding(losses, {n: np.array(scope.find_var(n).get_tensor()) for n in plain[1]}, plain)


@pytest.mark.slow
def test_bias_grads_are_ready_before_data_parallel_all_reduce(build_programs):
    """The program rank 0 of 2 would run (data parallel, fused all-reduce): every rewritten bias
    gradient is written before any op reads it."""
    p = build_programs(world=2, rank=0, model=ModelConfig(model_name_or_path="ernie-tiny-test", **NO_DROPOUT),
                       optim=OptimConfig(max_steps=100))
    rewritten = bias_grads_by_matmul(p.main)
    assert rewritten
    ops = p.main.global_block().ops
    assert any(op.type == "c_allreduce_sum" for op in ops)
    for name in rewritten:
        touching = [(i, op.type, name in op.input_arg_names) for i, op in enumerate(ops)
                    if name in op.input_arg_names + op.output_arg_names and op.type != "coalesce_tensor"]
        # first our matmul writes it; everything after (clipping, the optimizer: in place) reads it
        assert touching[0][1:] == ("matmul_v2", False), (name, touching)
        assert all(reads for _, _, reads in touching[1:])


def test_bias_grads_land_in_a_fused_all_reduce_buffer(build_programs):
    """Fleet's fused all-reduce makes the gradients views into one buffer (coalesce_tensor without
    copying) and all-reduces the buffer. Emulated in one process: the rewritten bias gradients must
    be written into that buffer, not into memory of their own."""
    import paddle

    p = build_programs(model=ModelConfig(model_name_or_path="ernie-tiny-test", **NO_DROPOUT),
                       optim=OptimConfig(max_steps=100, grad_clip=0.0))
    grads = sorted(bias_grads_by_matmul(p.main))
    block = p.main.global_block()
    fused = block.create_var(name="FusedOutput_bias_grads", dtype="float32", persistable=False)
    block._insert_op(0, type="coalesce_tensor", inputs={"Input": grads},
                     outputs={"Output": grads, "FusedOutput": fused},
                     attrs={"copy_data": False, "use_align": True, "dtype": fused.dtype, "set_constant": False,
                            "concated_shapes": [d for g in grads for d in block.var(g).shape],
                            "concated_ranks": [len(block.var(g).shape) for g in grads],
                            "op_role": 1})  # as fleet's fused all-reduce sets it up (plus the shapes)
    block._sync_with_cpp()
    scope, exe = paddle.static.Scope(), paddle.static.Executor(paddle.CPUPlace())
    p.initialize(exe, scope)
    values = exe.run(p.main, feed=p.feed(batch(np.random.RandomState(0))), fetch_list=[fused] + grads, scope=scope)
    buffer, start = values[0], 0
    for name, grad in zip(grads, values[1:]):  # each gradient in order, at an aligned offset of the buffer
        flat = grad.reshape(-1)
        assert np.abs(flat).max() > 0, name
        found = next((o for o in range(start, buffer.size - flat.size + 1)
                      if np.array_equal(buffer[o:o + flat.size], flat)), None)
        assert found is not None, f"{name} is not in the fused buffer"
        start = found + flat.size
