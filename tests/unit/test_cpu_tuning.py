"""The CPU tuning is wired into the training engine: `engine.session.make_executor` (the trainer's path from
the built programs to the first run) rewrites a CPU run's programs with `cpu_kernels.tune_for_cpu`
unless `--cpu_kernels false`, and logs what it applied; the entry point's `configure_executor`
chooses Paddle's serial executor for CPU runs only, before paddle is imported."""
import zlib  # noqa: F401  (before paddle)

from types import SimpleNamespace

import pytest

from ernie_mtl.config import AmpConfig, ModelConfig, OptimConfig, TrainConfig
from ernie_mtl.dist.process import SERIAL_RUN, ProcessInfo, configure_executor
from ernie_mtl.engine.session import make_executor

pytestmark = pytest.mark.usefixtures("static_mode")


class Log:
    def __init__(self):
        self.lines = []

    def info(self, message):
        self.lines.append(message)

    warning = info


def onednn_ops(program):
    return [op.type for b in program.blocks for op in b.ops if op.desc.has_attr("use_mkldnn") and op.attr("use_mkldnn")]


def bias_grad_matmuls(program):
    """matmul_v2 ops writing a bias gradient (`cpu_kernels.bias_grads_by_matmul`'s ones x dOut)."""
    return [op for op in program.global_block().ops
            if op.type == "matmul_v2" and any(n.endswith("@bias_ones") for n in op.input("X"))]


def executor_for(build_programs, **train):
    p = build_programs(model=ModelConfig(model_name_or_path="ernie-tiny-test"), optim=OptimConfig(max_steps=100))
    cfg = SimpleNamespace(train=TrainConfig(**train), amp=AmpConfig())
    log = Log()
    make_executor(cfg, ProcessInfo(rank=0, world_size=1, local_rank=0), p.programs, log)
    return p, log.lines


def test_a_cpu_run_trains_and_evaluates_with_the_tuned_programs(build_programs):
    p, lines = executor_for(build_programs, device="cpu")
    on = onednn_ops(p.main)
    assert len(on) > 20 and set(on) <= {"elementwise_add", "transpose2", "transpose2_grad", "sum", "scale"}, on
    assert len(bias_grad_matmuls(p.main)) == 2 * 6 + 4  # q, k, v, out, ffn in/out per layer; 4 head biases
    assert {"elementwise_add", "transpose2", "scale"} <= set(onednn_ops(p.test))  # evaluation: the forward part
    assert not onednn_ops(p.forward)  # the export program stays device-neutral
    line = next(x for x in lines if x.startswith("CPU kernels:"))
    assert f"oneDNN kernels on {len(on)} ops" in line and "16 bias gradients by matmul" in line, line
    assert "executor" in line


def test_cpu_kernels_false_leaves_the_programs_as_built(build_programs):
    p, lines = executor_for(build_programs, device="cpu", cpu_kernels=False)
    assert not onednn_ops(p.main) and not onednn_ops(p.test) and not bias_grad_matmuls(p.main)
    assert any(x.startswith("CPU kernels: as built (--cpu_kernels false)") for x in lines), lines


def test_the_serial_executor_is_chosen_for_cpu_runs_only():
    env = {}
    assert configure_executor(env, device="cpu", modules={}) == f"serial executor ({SERIAL_RUN}=1)"
    assert env == {SERIAL_RUN: "1"}
    env = {SERIAL_RUN: "0"}  # the user's choice is kept
    assert "from the environment, kept" in configure_executor(env, device="cpu", modules={})
    assert env == {SERIAL_RUN: "0"}
    env = {}
    configure_executor(env, device="gpu", modules={})
    assert env == {}  # GPU: the threaded executor overlaps host work with the device
    with pytest.raises(RuntimeError, match="before paddle is imported"):
        configure_executor({}, device="cpu", modules={"paddle": object()})
