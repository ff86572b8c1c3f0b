"""The per-task loss sums kept on the device (ernie_mtl/program/loss_sums.py) are bitwise the sums the
loop made on the host when it fetched every micro-batch: `float(np.asarray(fetched))` added to a
Python float starting at 0.0, per task, in run order. Also: a take zeroes them, the lr and loss scale
taken are the fetched ones, micro-batches of other tasks do not enter a task's sums, and
checkpoints do not see the sums."""
import zlib  # noqa: F401  (before paddle)

import dataclasses

import numpy as np
import pytest

from helpers import make_batch, scope_and_exe


def host_sums(runs):
    """The loop's former arithmetic: per task, [loss, *scalars] summed as Python floats."""
    sums = {}
    for task, values in runs:
        acc = sums.setdefault(task, [0.0] * len(values))
        for k, v in enumerate(values):
            acc[k] = acc[k] + float(np.asarray(v).reshape(-1)[0])
    return sums


def run(p, exe, scope, task_index, feed):
    """One micro-batch, fetching the drawn task's loss and scalars as the loop used to."""
    name = p.tasks_[task_index]
    fetch = [p.fwd.task_losses[name], *p.fwd.task_scalars[name].values(), p.lr]
    fetch += [p.loss_scaling] if p.loss_scaling is not None else []
    values = exe.run(p.main, feed=feed, fetch_list=fetch, scope=scope)
    p.lr_scheduler.step()
    return name, values[:1 + len(p.fwd.task_scalars[name])], values[len(values) - (2 if p.loss_scaling else 1):]


@pytest.mark.slow
def test_one_task_sums_equal_the_host_sums_and_a_take_starts_anew(build_programs):
    from ernie_mtl.config import ParallelConfig

    p = build_programs(parallel=ParallelConfig(micro_batch_size=2, global_batch_size=4))  # accumulation 2
    p.tasks_ = ["pretrain"]
    scope, exe = scope_and_exe(p)
    for window in ((0, 5), (5, 8)):
        runs = []
        for i in range(*window):
            task, values, last = run(p, exe, scope, 0,
                                     p.feed(make_batch(seed=i, batch=2), step=i // 2,
                                            slot=i % 2))  # one process: slot = micro-batch
            runs.append((task, values))
        taken = p.loss_sums.take(exe, scope=scope)
        assert p.loss_sums.columns["pretrain"] == ("loss", "mlm_loss", "nsp_loss")
        assert taken.sums["pretrain"].tolist() == host_sums(runs)["pretrain"]  # bitwise
        assert taken.lr == float(np.asarray(last[0]).reshape(-1)[0]) and taken.loss_scale is None


def test_gated_sums_take_only_the_drawn_tasks_micro_batches(build_programs, tmp_path):
    """Two tasks (two pretraining heads), AMP loss scaling on: each task's sums hold its own micro-batches."""
    import paddle

    from ernie_mtl.config import AmpConfig, ModelConfig, OptimConfig, ParallelConfig
    from ernie_mtl.dist.topology import Topology, build_strategy, init_fleet
    from ernie_mtl.program.builder import build_programs as build
    from ernie_mtl.program.forward import make_feed
    from ernie_mtl.program.randomness import DROPOUT_SEEDS, draw_dropout_seeds
    from helpers import pretrain_task, tiny_vocab_file
    import functools

    first = pretrain_task(tiny_vocab_file(tmp_path))
    second = type(first)(dataclasses.replace(first.spec, name="other", index=1), first.ctx)
    parallel, amp = ParallelConfig(micro_batch_size=2, global_batch_size=4), AmpConfig(use_amp=True)
    topo = Topology.from_config(parallel, 1)
    init_fleet(topo)
    p = build(ModelConfig(model_name_or_path="ernie-tiny-test"), OptimConfig(max_steps=50),
              functools.partial(build_strategy, topo, parallel, amp), topo, [first, second], seed=3, amp_cfg=amp)
    p.tasks_ = ["pretrain", "other"]
    scope = paddle.static.Scope()
    exe = paddle.static.Executor(paddle.CPUPlace())
    p.initialize(exe, scope)
    runs, drawn = [], [0, 1, 1, 0, 1, 1, 1, 0]
    for i, t in enumerate(drawn):
        feed = make_feed([first, second], t, make_batch(seed=i, batch=2))
        if p.dropout_seeds:
            feed[DROPOUT_SEEDS] = draw_dropout_seeds(3, i // 2, i % 2, p.dropout_seeds)  # step, slot (one process)
        feed.update(p.freeze.feed([["pretrain", "other"][k] for k in drawn[i - i % 2:i - i % 2 + 2]]))
        task, values, last = run(p, exe, scope, t, feed)
        runs.append((task, values))
    taken = p.loss_sums.take(exe, scope=scope)
    expected = host_sums(runs)
    assert {k: v.tolist() for k, v in taken.sums.items()} == expected  # bitwise, each task its own
    assert taken.loss_scale == float(np.asarray(last[1]).reshape(-1)[0])
    assert p.loss_sums.take(exe, scope=scope).sums["other"].tolist() == [0.0, 0.0, 0.0]


def test_checkpoints_do_not_see_the_sums(build_programs, tmp_path):
    import paddle

    p = build_programs()
    scope, exe = scope_and_exe(p)
    with paddle.static.scope_guard(scope):
        paddle.static.save(p.state_program, str(tmp_path / "ck"))
        from helpers import state

        saved = state(tmp_path / "ck")
        assert saved and not set(p.loss_sums.variables) & set(saved)
        assert {n for n in p.loss_sums.variables} <= {v.name for v in p.main.list_vars() if v.persistable}
        paddle.static.load(p.state_program, str(tmp_path / "ck"), exe)  # a checkpoint without them loads
