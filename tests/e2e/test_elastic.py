"""Changing the cluster between runs, with real processes over gloo, a SIGKILL before every change and
dropout on, in flag mode (pretraining) and multi-task mode (docs/checkpoints.md, "Changing the cluster").

A chain trains in segments on different topologies (each segment is SIGKILLed right after a
checkpoint, the next launch resumes it on another topology) and is compared with one uninterrupted
run of the same global batch, slot by slot (the task, examples and loss of every micro-batch of
every rank: the `record_slots` test hook) and variable by variable (every parameter and optimizer
variable of the final checkpoint, all ranks' files merged):

- bitwise chains (global batch = 2 micro-batches): 1 process with accumulation 2 -> 2 processes (dp
  2, accumulation 1) -> 1 process. A step's two micro-batch gradients are added in the same order by
  gradient merge and by the all-reduce: every loss and every variable equal, bitwise.
- float32 chains (global batch = 4 micro-batches): through dp 2 x accumulation 2, 1 process x 4 and
  sharding 2 x 2, against 1 process x 4. The same task and examples in every slot (exact); the floats
  within float32 rounding, because 4 gradients are summed in another order ((g0+g2)+(g1+g3) vs
  ((g0+g1)+g2)+g3) and sharding sums the clip norm's squares per shard. The measured differences are
  printed (pytest -s) and bounded by LOSS_RTOL / STATE_ATOL.

Flag mode also: another micro batch (2 -> 4, the same global batch: the same samples per step,
other dropout masks; the continued loss curve stays within the spread of 3 seeds), another global
batch (refused with what would be needed; --allow_batch_change: 4 -> 8 from the consumed samples,
the LR re-planned by samples, the run ending with its samples), and warm starts (--init_from a
checkpoint written by 2 processes: weights only or with the optimizer state, a new step 0; the
same command again resumes the warm-started run instead of starting it over).
"""
import zlib  # noqa: F401  (before paddle)

import json
import re
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import ROOT, global_yaml, jsonl, launch_logs, metrics, run_cli, state, tiny_args

# the tests whose runs launch several processes run alone (tests/conftest.py); the ones that continue only
# the 1-process reference runs (flag_straight, mtl_straight) share the cores

SLOTS = {"ERNIE_MTL_TEST_SLOTS": "1"}  # the record_slots test hook
ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **SLOTS}
FLAG = dict(max_steps=6, max_lr=5e-3, min_lr=1e-4, warmup_rate=0.34, logging_freq=1, eval_freq=1000, eval_iters=1,
            checkpoint_steps=2, save_steps=2, keep_last=5, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
MTL = dict(num_epochs=1, max_steps=6, eval_freq=1000, checkpoint_steps=2, save_steps=2, keep_last=5,
           print_every_n_steps=1, batch_size=4, micro_batch_size=8, learning_rate="5e-3",
           hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
USER_FLAG = dict(FLAG, num_workers=2)  # the flag-mode chain under a user's defaults: 2 data-loading workers
SHARDED = ["--use_sharding", "true", "--sharding_degree", "2"]
PORTABLE = ["--checkpoint_format", "portable"]  # tensors by structured name (ernie_mtl/checkpoint/portable.py)
# Bounds of the float32 chains. Measured (tiny ERNIE, lr 5e-3, 6-8 steps, this machine): losses equal to
# the last bit, parameters and optimizer state within 1.2e-6 (Adam moments of near-zero gradients).
LOSS_RTOL = 1e-5
STATE_ATOL = 2e-5


# -- running and comparing -------------------------------------------------------------------------------------
def launch(argv, tmp, *, procs, env=None, user_env=False):
    """(process, every rank's log) of one launch. `user_env`: the defaults' threads (a user's shell: this
    machine's cores for 1 process, 1 thread per launched rank) instead of ENV's one thread everywhere."""
    proc = run_cli(argv, cwd=tmp, launch_procs=procs, log_dir=tmp / "logs", user_env=user_env,
                   env={**(SLOTS if user_env else ENV), **(env or {})})
    logs = launch_logs(tmp / "logs", tail=100_000) if procs else proc.stdout + proc.stderr
    shutil.rmtree(tmp / "logs", ignore_errors=True)
    return proc, logs


def segment(argv, tmp, *, procs, kill_at=None, env=None, user_env=False):
    """One launch of a chain: SIGKILLed right after its checkpoint of step `kill_at`, or to the end."""
    kill = {"ERNIE_MTL_TEST_KILL_AT_STEP": str(kill_at)} if kill_at else {}
    proc, logs = launch(argv, tmp, procs=procs, env={**(env or {}), **kill}, user_env=user_env)
    assert (proc.returncode != 0) if kill_at else (proc.returncode == 0), logs[-6000:]
    return logs


def slots(out):
    """{(step, slot): {task, examples, loss}} over every rank and launch of a run."""
    table = {}
    for f in sorted(Path(out).glob("slots_rank*.jsonl")):
        for r in jsonl(f):
            key = (r.pop("step"), r.pop("slot"))
            assert table.get(key, r) == r, key
            table[key] = r
    return table


def final_state(out, name="model_last"):
    from ernie_mtl.checkpoint import merged_state

    return {k: np.asarray(v) for k, v in merged_state(Path(out) / name).items()
            if not k.startswith("StructuredToParameterName")}


def carried(names):
    transient = ("GradientMerge", "GradiantMerge", "gradient_merge", "learning_rate")
    return {k for k in names if not any(t in k for t in transient)}


def compare(reference, chained, *, bitwise, label):
    """Every slot: the same task and examples; losses and the final state bitwise, or within bounds."""
    a, b = slots(reference), slots(chained)
    assert sorted(a) == sorted(b) and len(a) >= 12, (label, sorted(a), sorted(b))
    for key in a:
        assert (a[key]["task"], a[key]["examples"]) == (b[key]["task"], b[key]["examples"]), (label, key)
    loss = max(abs(a[k]["loss"] - b[k]["loss"]) / abs(a[k]["loss"]) for k in a)
    sa, sb = final_state(reference), final_state(chained)
    assert carried(sa) == carried(sb) and len(carried(sa)) > 100, label
    shared = sorted(carried(sa))
    state = max(float(np.max(np.abs(sa[k].astype(np.float64) - sb[k].astype(np.float64)))) if sa[k].size else 0.0
                for k in shared)
    print(f"\n{label}: max relative loss difference {loss:.3g} over {len(a)} micro-batches; max absolute "
          f"difference {state:.3g} over {len(shared)} parameters and optimizer variables")
    if bitwise:
        assert all(a[k]["loss"] == b[k]["loss"] for k in a), label
        assert all(np.array_equal(sa[k], sb[k]) for k in shared), label
    else:
        assert loss <= LOSS_RTOL and state <= STATE_ATOL, (label, loss, state)


def saved(out, name="model_last"):
    return json.loads((Path(out) / name / "train_state.json").read_text())


def step_losses(out):
    """{step (1-based): mean loss of its micro-batches over all ranks}."""
    steps = {}
    for (step, _), r in slots(out).items():
        steps.setdefault(step + 1, []).append(r["loss"])
    return {s: float(np.mean(v)) for s, v in steps.items()}


# -- flag mode ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def flag_straight(demo, tmp_path_factory):
    """The uninterrupted flag-mode run of the chain below (1 process, global batch 4 = 2 micro-batches of 2,
    6 steps, a checkpoint kept every 2 steps), under the defaults a user gets: threads not pinned (1 process
    computes on this machine's cores), `--cpu_kernels auto`, 2 data-loading workers."""
    tmp = tmp_path_factory.mktemp("flag")
    straight = segment(tiny_args(demo, tmp / "straight", micro_batch_size=2, global_batch_size=4,
                                 **USER_FLAG), tmp, procs=0, user_env=True)
    return tmp, straight


@pytest.fixture(scope="module")
def flag_chain(flag_straight, demo):
    """The flag-mode bitwise chain beside its reference (chain: model_2 by 1 process, model_4 by 2 launched
    ranks on 1 thread each, model_6 by 1 process), under the same defaults."""
    tmp, straight = flag_straight
    argv = tiny_args(demo, tmp / "chain", micro_batch_size=2, global_batch_size=4, **USER_FLAG)
    logs = [segment(argv, tmp, procs=0, kill_at=2, user_env=True),  # 1 process, accumulation 2
            # 2 processes, accumulation 1, portable format
            segment(argv + PORTABLE, tmp, procs=2, kill_at=4, user_env=True),
            segment(argv, tmp, procs=0, user_env=True)]  # 1 process again
    return tmp, [straight] + logs

def kernels_of(out, name="model_last"):
    record = saved(out, name)["extra"]["cpu_kernels"]
    return record["onednn"], record["bias_grads"]


@pytest.mark.slow
def test_flag_mode_continues_bitwise_on_2_processes_and_back_on_1(flag_chain):
    """Bitwise under the defaults: MKL's results would depend on the thread count (1 process on 2 threads,
    the ranks on 1 each) without MKL_CBWR=AUTO,STRICT, set by the CLI; `auto` chooses the same kernels on
    1 process and on 2 (the choice is keyed by the CPU kind, not by threads or processes)."""
    tmp, (straight, *logs) = flag_chain
    threads = next(line for line in straight.splitlines() if "threads: OMP_NUM_THREADS=" in line)
    assert "MKL_CBWR=AUTO,STRICT" in threads and "MKL_CBWR=AUTO,STRICT" in logs[1], threads
    assert kernels_of(tmp / "straight") == kernels_of(tmp / "chain", "model_4") == kernels_of(tmp / "chain")
    assert "another topology with the same global batch" in logs[1] and "with the same dropout masks" in logs[1]
    assert "checkpoint: 2 processes (dp 2 x sharding 1), micro batch 2 x accumulation 1, global batch 4" in logs[2]
    compare(tmp / "straight", tmp / "chain", bitwise=True, label="flag: 1 process x 2 -> dp 2 -> 1 process x 2")
    final = saved(tmp / "chain")
    assert final["step"] == 6 and final["topology"]["world_size"] == 1 and final["consumed_samples"] == 24
    four = saved(tmp / "chain", "model_4")
    assert four["topology"]["world_size"] == 2 and four["state_format"] == "portable"


@pytest.mark.slow
def test_flag_mode_continues_on_four_topologies_within_float32(demo, tmp_path):
    """dp 2 x accumulation 2 -> 1 process x 4 -> sharding 2 x 2 -> dp 2 x 2 (global batch 8 = 4
    micro-batches of 2, 8 steps), against 1 process with accumulation 4."""
    flags = dict(FLAG, max_steps=8)
    segment(tiny_args(demo, tmp_path / "straight", micro_batch_size=2, global_batch_size=8, **flags), tmp_path, procs=0)
    argv = tiny_args(demo, tmp_path / "chain", micro_batch_size=2, global_batch_size=8, **flags)
    segment(argv, tmp_path, procs=2, kill_at=2)
    segment(argv, tmp_path, procs=0, kill_at=4)  # 2 -> 1
    logs = segment(argv + SHARDED + PORTABLE, tmp_path, procs=2, kill_at=6)  # 1 -> sharding 2, each rank its shard
    assert "float results equal the uninterrupted run's bitwise when" in logs
    six = saved(tmp_path / "chain", "model_6")
    assert six["per_rank_state"] is True and six["state_format"] == "portable"
    records = [json.loads((tmp_path / f"chain/model_6/state/rank_{r}.sha1").read_text()) for r in (0, 1)]
    assert records[0] and records[1] and not set(records[0]) & set(records[1])  # both ranks wrote tensor files
    segment(argv, tmp_path, procs=2)  # sharding 2 -> dp 2
    compare(tmp_path / "straight", tmp_path / "chain", bitwise=False,
            label="flag: dp 2 x 2 -> 1 process x 4 -> sharding 2 x 2 -> dp 2 x 2")


@pytest.mark.slow
def test_flag_mode_another_micro_batch_keeps_the_samples_and_stays_within_the_seeds(flag_straight, demo):
    """Micro batch 2 -> 4 at step 2 (global batch 4: accumulation 2 -> 1): every step reads the
    samples of the uninterrupted run; a dropout op then draws one mask for a tensor of another
    shape, so the losses differ, but by less than the spread of 3 seeds of the uninterrupted run."""
    tmp, _ = flag_straight
    argv = tiny_args(demo, tmp / "micro", micro_batch_size=2, global_batch_size=4, **FLAG)
    segment(argv, tmp, procs=0, kill_at=2)
    logs = segment(tiny_args(demo, tmp / "micro", micro_batch_size=4, global_batch_size=4, **FLAG), tmp, procs=0)
    assert "micro batch 2 -> 4: the same samples in the same optimizer steps, but a dropout op" in logs

    def samples_per_step(out):
        steps = {}
        for (step, slot), r in sorted(slots(out).items()):
            steps.setdefault(step, []).extend(map(tuple, r["examples"]))
        return steps

    assert samples_per_step(tmp / "micro") == samples_per_step(tmp / "straight")
    seeds = [step_losses(tmp / "straight")]
    for seed in (11, 12):
        out = tmp / f"seed{seed}"
        segment(tiny_args(demo, out, micro_batch_size=2, global_batch_size=4, seed=seed, **FLAG), tmp, procs=0)
        seeds.append(step_losses(out))
    continued = step_losses(tmp / "micro")
    for step in (3, 4, 5, 6):
        spread = max(s[step] for s in seeds) - min(s[step] for s in seeds)
        print(f"\nstep {step}: continued {continued[step]:.4f}, uninterrupted {seeds[0][step]:.4f}, "
              f"seed spread {spread:.4f}")
        assert abs(continued[step] - seeds[0][step]) <= spread, step


@pytest.mark.slow
def test_flag_mode_a_resume_may_switch_the_fused_optimizer_on_and_stays_bitwise(flag_straight, demo):
    """`--fuse_optimizer true` on the resume of a checkpoint the per-parameter updates wrote: the same
    optimizer state variables, updated bitwise alike on CPU, so the continued run is the uninterrupted one
    (docs/training.md)."""
    tmp, _ = flag_straight
    out = tmp / "fused"
    argv = tiny_args(demo, out, micro_batch_size=2, global_batch_size=4, **USER_FLAG) + [
        "--resume", str(tmp / "straight" / "model_2"), "--fuse_optimizer", "true"]
    logs = segment(argv, tmp, procs=0, user_env=True)
    assert "resumed from" in logs and str(tmp / "straight" / "model_2") in logs
    assert re.search(r"--fuse_optimizer: \d+ parameter updates in 2 fused_adam ops", logs), logs[-3000:]
    straight, fused = slots(tmp / "straight"), slots(out)
    assert sorted(fused) and min(step for step, _ in fused) == 2 and max(fused) == max(straight)
    assert all(fused[key] == straight[key] for key in fused)  # tasks, examples and losses of steps 3-6
    sa, sb = final_state(tmp / "straight"), final_state(out)
    assert carried(sa) == carried(sb)
    assert all(np.array_equal(sa[k], sb[k]) for k in carried(sa))


@pytest.mark.slow
def test_flag_mode_another_global_batch_is_refused_or_continued_by_samples(flag_straight, demo):
    tmp, _ = flag_straight
    out = tmp / "bigger"
    argv = tiny_args(demo, out, micro_batch_size=2, global_batch_size=8, **FLAG) + [
        "--resume", str(tmp / "straight" / "model_2")]
    refused, logs = launch(argv, tmp, procs=0)
    assert refused.returncode == 2 and "Traceback" not in logs
    assert ("cannot continue " + str(tmp / "straight" / "model_2") + " with another global batch: global batch 4 "
            "samples per step vs 8 now") in refused.stderr
    assert "keep --global_batch_size 4" in refused.stderr and "add --allow_batch_change" in refused.stderr
    assert not out.exists()
    planned, _ = launch(argv + ["--allow_batch_change", "--dry_run"], tmp, procs=0)
    assert "another global batch (--allow_batch_change)" in planned.stdout
    assert "the run continues to step 4" in planned.stdout  # 16 samples left: 2 steps of 8
    logs = segment(argv + ["--allow_batch_change"], tmp, procs=0)
    assert "global batch 4 -> 8 samples per step" in logs
    final = saved(out)
    assert final["step"] == 4 and final["consumed_samples"] == 24 and final["topology"]["global_batch_size"] == 8
    # the data goes on at the next unread sample: steps 3 and 4 read what steps 3-6 read before
    before = [x for (step, _), r in sorted(slots(tmp / "straight").items()) if step >= 2 for x in r["examples"]]
    after = [x for (step, _), r in sorted(slots(out).items()) for x in r["examples"]]
    assert after == before
    # the LR at a step is the original schedule's at the same number of samples: 8 + 8k
    lr, lr_before = metrics(out, "train/lr"), metrics(tmp / "straight", "train/lr")
    assert (lr[3], lr[4]) == (lr_before[3], lr_before[5])


@pytest.mark.slow
def test_warm_start_from_a_checkpoint_of_another_topology_is_a_new_run(flag_chain, demo):
    """--init_from the 2-process model_4 into 1 process: its weights, a new step 0 and LR schedule;
    with --init_optimizer its Adam state too; the same command again resumes the warm-started run."""
    tmp, _ = flag_chain
    source = tmp / "chain" / "model_4"
    weights = final_state(tmp / "chain", "model_4")
    names = set(saved(tmp / "chain", "model_4")["name_map"].values())
    for with_optimizer in (False, True):
        out = tmp / f"warm{int(with_optimizer)}"
        argv = tiny_args(demo, out, micro_batch_size=2, global_batch_size=4, **dict(FLAG, max_steps=4)) + [
            "--init_from", str(source)] + (["--init_optimizer"] if with_optimizer else [])
        logs = segment(argv, tmp, procs=0, env={"ERNIE_MTL_TEST_DUMP_DIR": str(out / "begin"),
                                                "ERNIE_MTL_TEST_DUMP_WHEN": "begin"})
        assert f"warm start from {source}: its {'weights and optimizer state' if with_optimizer else 'weights'}" in logs
        begin = state(out / "begin" / "rank_0")
        for name in names:
            assert np.array_equal(begin[name], weights[name]), name
        moments = [k for k in begin if k.endswith("_moment1_0")]
        assert moments and all(np.array_equal(begin[k], weights[k]) == with_optimizer for k in moments
                               if np.any(weights[k]))
        # a new run: its own 4 steps and warm-up (1 step: max_lr at step 1), not the source's decayed rate
        assert saved(out)["step"] == 4 and metrics(out, "train/lr")[1] == pytest.approx(5e-3)
        assert saved(tmp / "chain", "model_4")["lr_scheduler"]["last_lr"] < 4e-3
    again = segment(argv, tmp, procs=0)
    assert f"--init_from {source} is not used: this run resumes its own checkpoint" in again


# -- multi-task mode ----------------------------------------------------------------------------------------------
def mtl_config(data, name, out, **keys):
    """Three tasks (classification and tagging targets, a corpus) with per-task batch 4, dropout on."""
    return ["--config", str(global_yaml(data, f"elastic_{name}.yaml", save_path=str(out), **{**MTL, **keys}))]


@pytest.fixture(scope="module")
def mtl_straight(data, tmp_path_factory):
    """The uninterrupted multi-task run of the chain below: 2 micro-batches (slots) per step, 6 steps."""
    tmp = tmp_path_factory.mktemp("mtl")
    segment(mtl_config(data, "straight", tmp / "straight", global_batch_size=16), tmp, procs=0)
    return tmp


@pytest.fixture(scope="module")
def mtl_chain(mtl_straight, data):
    """The multi-task bitwise chain beside its reference: 1 process -> 2 -> 1."""
    tmp = mtl_straight
    argv = mtl_config(data, "chain", tmp / "chain", global_batch_size=16)
    logs = [segment(argv, tmp, procs=0, kill_at=2), segment(argv + PORTABLE, tmp, procs=2, kill_at=4),
            segment(argv, tmp, procs=0)]
    return tmp, logs


@pytest.mark.slow
def test_multitask_continues_bitwise_on_2_processes_and_back_on_1(mtl_chain):
    tmp, logs = mtl_chain
    assert "another topology with the same global batch" in logs[1]
    compare(tmp / "straight", tmp / "chain", bitwise=True, label="multi-task: 1 process x 2 -> dp 2 -> 1 process x 2")
    assert len({r["task"] for r in slots(tmp / "chain").values()}) == 3
    a, b = saved(tmp / "straight"), saved(tmp / "chain")
    assert a["sampler"] == b["sampler"] and a["consumed_samples"] == b["consumed_samples"]


@pytest.mark.slow
def test_multitask_continues_through_sharding_within_float32(data, tmp_path):
    """sharding 2 x accumulation 2 -> dp 2 x 2 -> 1 process x 4 (4 slots per step), against 1 process x 4."""
    segment(mtl_config(data, "straight4", tmp_path / "straight", global_batch_size=32), tmp_path, procs=0)
    argv = mtl_config(data, "chain4", tmp_path / "chain", global_batch_size=32)
    segment(argv + SHARDED, tmp_path, procs=2, kill_at=2)
    segment(argv, tmp_path, procs=2, kill_at=4)  # sharding 2 -> dp 2
    segment(argv, tmp_path, procs=0)  # 2 -> 1
    compare(tmp_path / "straight", tmp_path / "chain", bitwise=False,
            label="multi-task: sharding 2 x 2 -> dp 2 x 2 -> 1 process x 4")


@pytest.mark.slow
def test_multitask_another_global_batch_continues_the_slot_sequence(mtl_straight, data):
    """2 -> 4 micro-batches per step from step 2 with --allow_batch_change: the tasks and examples of the
    uninterrupted run's slot sequence, grouped 4 per step from there; the LR by micro-batches drawn."""
    tmp = mtl_straight
    out = tmp / "bigger"
    argv = mtl_config(data, "bigger", out, global_batch_size=32) + ["--resume", str(tmp / "straight" / "model_2")]
    refused, _ = launch(argv, tmp, procs=0)
    assert refused.returncode == 2 and ("global batch 2 micro-batches per step (--global_batch_size 16 / "
                                        "--micro_batch_size 8) vs 4 now") in refused.stderr
    logs = segment(argv + ["--allow_batch_change"], tmp, procs=0)
    assert "global batch 2 -> 4 micro-batches per step" in logs
    before = {step * 2 + slot: r for (step, slot), r in slots(tmp / "straight").items()}
    after = {4 + (step - 2) * 4 + slot: r for (step, slot), r in slots(out).items()}
    common = sorted(set(before) & set(after))
    assert common == list(range(4, 12))
    for k in common:
        assert (before[k]["task"], before[k]["examples"]) == (after[k]["task"], after[k]["examples"]), k
    lr, lr_before = metrics(out, "train/lr"), metrics(tmp / "straight", "train/lr")
    assert (lr[3], lr[4]) == (lr_before[3], lr_before[5])
    final = saved(out)
    assert final["sampler"]["base"] == [4, 2] and final["sampler"]["slots_per_step"] == 4


@pytest.mark.slow
def test_offline_conversion_to_the_portable_format_keeps_every_tensor(flag_straight, tmp_path):
    """ernie-mtl-reshard: a Paddle-format checkpoint as the portable format (every tensor by structured
    name, bitwise), listed by --inspect; the converter to PaddleNLP reads both alike; averaging two."""
    from ernie_mtl.checkpoint import portable
    from ernie_mtl.convert import read_source

    def reshard(*args):  # the ernie-mtl-reshard command
        return subprocess.run([sys.executable, "-m", "ernie_mtl.convert.reshard_cli", *map(str, args)], cwd=tmp_path,
                              capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})

    tmp, _ = flag_straight
    source = tmp / "straight" / "model_4"
    proc = reshard(source, "--output", tmp_path / "model_4")
    assert proc.returncode == 0, proc.stderr
    paddle_state, converted = final_state(tmp / "straight", "model_4"), final_state(tmp_path, "model_4")
    assert carried(paddle_state) == set(converted)
    assert all(np.array_equal(paddle_state[k], converted[k]) for k in converted)
    a, b = read_source(source), read_source(tmp_path / "model_4")
    assert sorted(a.weights) == sorted(b.weights) and all(np.array_equal(a.weights[k], b.weights[k]) for k in a.weights)
    listing = reshard(tmp_path / "model_4", "--inspect").stdout
    assert "portable format" in listing and "ernie.embeddings.word_embeddings.weight_moment1_0  F32" in listing
    avg = reshard(source, tmp / "straight" / "model_6", "--average", "--output", tmp_path / "avg")
    assert avg.returncode == 0, avg.stderr
    mean = portable.read_tensors(tmp_path / "avg")
    word = "ernie.embeddings.word_embeddings.weight"
    six = final_state(tmp / "straight", "model_6")
    name = saved(tmp / "straight", "model_6")["name_map"][word]
    expected = ((paddle_state[name].astype(np.float64) + six[name].astype(np.float64)) / 2).astype(np.float32)
    assert np.array_equal(mean[word], expected) and not any(k.endswith("_moment1_0") for k in mean)
