"""`--fuse_optimizer` (ernie_mtl/program/fused_optimizer.py): a few `fused_adam` ops instead of one `adamw`
op per parameter, bitwise the same training on CPU. The GPU program's groups, flags and master weights
are checked in tests/unit/test_program_matrix.py."""
import zlib  # noqa: F401  (before paddle)

import numpy as np
import pytest

from ernie_mtl.config import ModelConfig, OptimConfig
from helpers import make_batch, scope_and_exe

pytestmark = pytest.mark.usefixtures("static_mode")


def trained(build_programs, fuse: bool, steps: int = 4):
    """Tiny ERNIE (dropout on, weight decay on, clipping and the anomaly guard on) trained `steps` steps on
    different batches: its losses, its persistable state and its optimizer op types."""
    optim = OptimConfig(max_lr=1e-2, min_lr=1e-4, max_steps=100, warmup_rate=0.1, weight_decay=0.1,
                        fuse_optimizer=fuse)
    p = build_programs(model=ModelConfig(model_name_or_path="ernie-tiny-test"), optim=optim, anomaly_guard=True)
    ops = [op.type for op in p.main.global_block().ops]
    scope, exe = scope_and_exe(p)
    losses = []
    for step in range(steps):
        (loss,) = exe.run(p.main, feed=p.feed(make_batch(seed=step), step=step), fetch_list=[p.loss], scope=scope)
        losses.append(float(loss))
        p.lr_scheduler.step()
    state = {}
    for var in p.main.list_vars():
        found = scope.find_var(var.name) if var.persistable else None
        if found is not None and found.get_tensor()._is_initialized():
            state[var.name] = np.array(found.get_tensor())
    fused = [op for op in p.main.global_block().ops if op.type == "fused_adam"]
    return losses, state, ops, fused


def test_fused_updates_are_bitwise_the_per_parameter_updates_on_cpu(build_programs):
    plain_losses, plain_state, plain_ops, _ = trained(build_programs, fuse=False)
    losses, state, ops, fused = trained(build_programs, fuse=True)
    n_params = plain_ops.count("adamw")
    assert n_params > 20 and "fused_adam" not in plain_ops
    # two groups: weights with decay, biases and norms without; nothing left per parameter
    assert ops.count("adamw") == 0 and len(fused) == 2
    assert sorted(op.attr("use_adamw") for op in fused) == [False, True]
    assert sum(len(op.input("Params")) for op in fused) == n_params
    assert len(ops) == len(plain_ops) - n_params + 2
    assert losses == plain_losses and len(set(losses)) == len(losses)  # the batches differ: the losses too
    assert sorted(state) == sorted(plain_state)  # the same optimizer state variables: the same checkpoints
    moments = [n for n in state if "moment1" in n]
    assert moments and all(np.abs(state[n]).max() > 0 for n in moments)  # the moments moved
    for name in state:
        assert np.array_equal(state[name], plain_state[name]), name
