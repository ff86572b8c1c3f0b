"""Shared fixtures for tests that build static programs with fleet."""
import zlib  # noqa: F401  (before paddle: paddle 2.6.2 exports clashing zlib symbols)

import functools

import pytest


@pytest.fixture(scope="module")
def static_mode():
    """Paddle static-graph mode for one test module; the previous mode is restored afterwards."""
    import paddle

    was_dynamic = paddle.in_dynamic_mode()
    paddle.enable_static()
    yield
    if was_dynamic:
        paddle.disable_static()


@pytest.fixture(scope="module")
def build_programs(static_mode):
    """Factory: tiny-ERNIE pretraining programs as rank `rank` of `world`.

    `gpu=True` (implied by world > 1) builds the program a GPU worker would run, on CPU
    (`compat.emulate_gpu_program`); otherwise fleet is initialised for this single process.
    """
    from ernie_mtl.compat import emulate_gpu_program
    from ernie_mtl.config import AmpConfig, ModelConfig, OptimConfig, ParallelConfig
    from ernie_mtl.model import build_pretrain_programs
    from ernie_mtl.parallel import Topology, build_strategy, init_fleet

    def build(*, world=1, rank=0, gpu=False, parallel=None, amp=None, model=None, optim=None, seed=1):
        parallel = parallel or ParallelConfig(micro_batch_size=2)
        amp = amp or AmpConfig()
        model = model or ModelConfig(model_name_or_path="ernie-tiny-test")
        optim = optim or OptimConfig(max_lr=1e-3, min_lr=1e-4, max_steps=100, warmup_rate=0.1)
        topo = Topology.from_config(parallel, world)
        strategy = functools.partial(build_strategy, topo, parallel, amp)
        if gpu or world > 1:
            with emulate_gpu_program(rank, world):
                return build_pretrain_programs(model, optim, strategy, topo, seed=seed, amp_cfg=amp)
        init_fleet(topo)
        return build_pretrain_programs(model, optim, strategy, topo, seed=seed, amp_cfg=amp)

    return build
