"""A non-finite step never reaches the weights (ernie_mtl/program/anomaly.py): the update is skipped
on the device -- every persistable variable but the counter bitwise unchanged -- and counted; a
finite step then trains as usual. Also the GPU programs (sharding, accumulation) carry the gate on
every update and the counter in the update's block."""
import zlib  # noqa: F401  (before paddle)

import numpy as np
import pytest

from ernie_mtl.config import ModelConfig, OptimConfig, ParallelConfig
from helpers import make_batch

pytestmark = pytest.mark.usefixtures("static_mode")


def persistables(p, scope):
    """The model state (what checkpoints hold): without the loss sums of the log window, which record
    a non-finite loss as the log reports it (program/loss_sums.py)."""
    return {v.name: np.array(scope.find_var(v.name).get_tensor()) for v in p.state_program.list_vars()
            if v.persistable and v.name not in ("feed", "fetch") and scope.find_var(v.name) is not None
            and scope.find_var(v.name).get_tensor()._is_initialized()}


@pytest.mark.parametrize("accumulate", [1, 2])
@pytest.mark.slow
def test_a_nan_step_is_skipped_bitwise_and_counted(build_programs, accumulate):
    import paddle

    from ernie_mtl.program.anomaly import COUNTER, skipped_steps

    p = build_programs(model=ModelConfig(model_name_or_path="ernie-tiny-test", hidden_dropout_prob=0.0,
                                         attention_probs_dropout_prob=0.0),
                       optim=OptimConfig(max_lr=1e-3, min_lr=1e-4, max_steps=100, warmup_rate=0.0, grad_clip=1.0),
                       parallel=ParallelConfig(micro_batch_size=4, global_batch_size=4 * accumulate),
                       anomaly_guard=True)
    assert p.anomaly is not None and p.anomaly.counter == COUNTER
    scope, exe = paddle.static.Scope(), paddle.static.Executor(paddle.CPUPlace())
    p.initialize(exe, scope)

    def step():
        for micro in range(accumulate):
            exe.run(p.main, feed=p.feed(make_batch(seed=micro), slot=micro), fetch_list=[p.loss], scope=scope)

    # a fault in one value (a flipped bit, a bad kernel): the word embedding holds an infinity for one step
    table = scope.find_var(p.name_map["ernie.embeddings.word_embeddings.weight"]).get_tensor()
    clean = np.array(table)
    poisoned = clean.copy()
    poisoned[:, 0] = np.inf
    table.set(poisoned, paddle.CPUPlace())
    before = persistables(p, scope)
    step()
    after = persistables(p, scope)
    changed = sorted(k for k in after if not np.array_equal(after[k], before[k], equal_nan=True))
    assert changed == [COUNTER] and skipped_steps(scope) == 1.0
    assert not np.isfinite(p.loss_sums.take(exe, scope).sums["pretrain"][0])  # logged as it was: not finite
    table.set(clean, paddle.CPUPlace())
    after = persistables(p, scope)
    step()
    trained = persistables(p, scope)
    moved = [k for k in trained if not np.array_equal(trained[k], after[k])]
    assert len(moved) > 20 and skipped_steps(scope) == 1.0  # a finite step updates and is not counted
    assert all(np.isfinite(v).all() for k, v in trained.items() if v.dtype.kind == "f")


@pytest.mark.slow
def test_without_clipping_the_guard_still_reads_the_norm_and_changes_no_gradient(build_programs):
    """--grad_clip 0 used to turn the guard off without a word (no clipping, no norm to read). Now the
    program computes the norm with a bound that never clips: the guard skips a non-finite step, and
    finite steps train to the same bits as the program without any clipping."""
    import paddle

    from ernie_mtl.program.anomaly import COUNTER, skipped_steps

    def build(guard):
        return build_programs(model=ModelConfig(model_name_or_path="ernie-tiny-test", hidden_dropout_prob=0.0,
                                                attention_probs_dropout_prob=0.0),
                              optim=OptimConfig(max_lr=1e-3, min_lr=1e-4, max_steps=100, warmup_rate=0.0,
                                                grad_clip=0.0),
                              anomaly_guard=guard)

    runs = {}
    for guard in (True, False):
        p = build(guard)
        assert (p.anomaly is not None) == guard
        scope, exe = paddle.static.Scope(), paddle.static.Executor(paddle.CPUPlace())
        p.initialize(exe, scope)
        for step in range(2):
            exe.run(p.main, feed=p.feed(make_batch(seed=step), slot=0), fetch_list=[p.loss], scope=scope)
        runs[guard] = (p, scope, exe, persistables(p, scope))
    guarded, plain = runs[True][3], runs[False][3]
    shared = sorted(set(plain) & set(guarded))
    assert len(shared) > 20 and set(guarded) - set(plain) == {COUNTER}
    assert all(np.array_equal(guarded[k], plain[k]) for k in shared)  # the bound never clipped
    p, scope, exe, _ = runs[True]
    table = scope.find_var(p.name_map["ernie.embeddings.word_embeddings.weight"]).get_tensor()
    poisoned = np.array(table)
    poisoned[:, 0] = np.inf
    table.set(poisoned, paddle.CPUPlace())
    before = persistables(p, scope)
    exe.run(p.main, feed=p.feed(make_batch(seed=5), slot=0), fetch_list=[p.loss], scope=scope)
    after = persistables(p, scope)
    assert sorted(k for k in after if not np.array_equal(after[k], before[k], equal_nan=True)) == [COUNTER]
    assert skipped_steps(scope) == 1.0


def test_the_gpu_program_gates_every_update_with_sharding_and_accumulation(build_programs):
    from ernie_mtl.program.edits import live_blocks

    p = build_programs(world=2, rank=1, model=ModelConfig(model_name_or_path="ernie-tiny-test"),
                       optim=OptimConfig(max_steps=100, grad_clip=1.0), anomaly_guard=True,
                       parallel=ParallelConfig(use_sharding=True, sharding_degree=2, micro_batch_size=2,
                                               global_batch_size=8))
    blocks = live_blocks(p.main)
    update_block = next(b for b in blocks if any(op.type == "adamw" for op in b.ops))
    assert update_block.idx != 0  # the gradient-merge block: counted once per optimizer step
    ops = update_block.ops
    bad = p.anomaly.flag
    ors = {op.output("Out")[0] for op in ops if op.type == "logical_or" and bad in op.input_arg_names}
    adamw = [op for op in ops if op.type == "adamw"]
    assert adamw and all(op.input("SkipUpdate")[0] in ors | {bad} for op in adamw)
    assert any(op.type == "isfinite_v2" for op in ops)


def test_a_dump_names_this_ranks_slots_and_samples(tmp_path):
    """Under data parallelism a step has every rank's slots: the dump of rank 1 of 2 names the
    micro-batches it trained -- their slots and the samples the feeder gave them (slots 1 and 3 read a
    task's 2nd and 4th micro-batch of the step) -- not positions counted as if it computed them all."""
    import json
    from types import SimpleNamespace

    from ernie_mtl.engine.anomaly import AnomalyPolicy
    from ernie_mtl.engine.step_feeds import MicroBatch

    def step(step, drawn, read):  # what Feeder.step yields on rank 1 of 2, accumulation 2, batches of 2
        for slot in (1, 3):
            yield MicroBatch("pretrain", {"input_ids": np.full((2, 4), slot)}, tokens=8, slot=slot,
                             examples=[(read[0] * 2 + slot * 2 + j, 0) for j in range(2)])

    from ernie_mtl.engine.stops import StopRequests

    policy = AnomalyPolicy(SimpleNamespace(on_anomaly="replay", loss_spike_factor=0.0), guard=object(), scope=None,
                           stops=StopRequests(), say=print, warn=print, output_dir=str(tmp_path), rank=1, grad_clip=1.0)
    path = policy.dump(5, list(step(5, drawn=[0, 0, 0, 0], read=[20])))  # the micro-batches the step trained
    dumped = json.loads(path.read_text())
    assert dumped["rank"] == 1 and dumped["micro_batches"] == [
        {"task": "pretrain", "slot": 1, "samples": [[42, 0], [43, 0]]},
        {"task": "pretrain", "slot": 3, "samples": [[46, 0], [47, 0]]}]
    assert np.load(tmp_path / "anomalies/step_5_rank1.npz")["micro1.input_ids"][0, 0] == 3
