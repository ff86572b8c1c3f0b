"""Run planner: the closed-form parameter count against paddlenlp's models, and the per-rank memory
and batch arithmetic, worked by hand, for several topologies."""
import zlib  # noqa: F401  (before paddle)

import numpy as np
import pytest

from ernie_mtl.config import ARCHITECTURES, AmpConfig, ParallelConfig
from ernie_mtl.dist.topology import Topology
from ernie_mtl.planning.dryrun import (MiB, activation_estimate, count_parameters, memory_estimate, parameter_sizes,
                                       plan,
                               shard_sizes)

TINY = ARCHITECTURES["ernie-tiny-test"]  # h 32, 2 layers, 2 heads, ffn 64, vocab 1000, 128 positions


def paddlenlp_model(arch, kind):
    import paddlenlp.transformers as T

    family = {"ernie": ("ErnieConfig", "Ernie"), "bert": ("BertConfig", "Bert")}[arch["model_type"]]
    config = getattr(T, family[0])(**arch)
    return getattr(T, family[1] + kind)(config)


def dygraph_count(model):
    params = model.parameters()  # tied weights appear once
    return sum(int(np.prod(p.shape)) for p in params), len(params)  # also in static mode (another test's)


@pytest.mark.parametrize("arch", [
    TINY,
    ARCHITECTURES["bert-tiny-test"],
    dict(TINY, use_task_id=True, task_type_vocab_size=5, type_vocab_size=0),  # task table, no type table
    dict(TINY, type_vocab_size=4, hidden_size=48, num_attention_heads=3, intermediate_size=96),
], ids=["ernie", "bert", "ernie-task-id", "ernie-wider"])
def test_count_equals_paddlenlp_dygraph(arch):
    for kind, heads in (("Model", False), ("ForPretraining", True)):
        total, tensors = dygraph_count(paddlenlp_model(arch, kind))
        counts = count_parameters(arch, pretraining_heads=heads)
        assert (counts["total"], counts["tensors"]) == (total, tensors), kind


def test_tiny_count_by_hand():
    h, i, v, p, t, n = 32, 64, 1000, 128, 2, 2
    counts = count_parameters(TINY)
    assert counts["embeddings"] == (v + p + t) * h + 2 * h == 36_224
    assert counts["encoder"] == n * (4 * (h * h + h) + h * i + i + i * h + h + 4 * h) == 17_088
    assert counts["pooler"] == 1_056
    assert counts["pretraining_heads"] == h * h + h + 2 * h + v + 2 * h + 2 == 2_186
    assert counts["total"] == 36_224 + 17_088 + 1_056 + 2_186 == 56_554


@pytest.mark.parametrize("name", ["ernie-1.0-base-zh", "bert-base-chinese"])
def test_base_count_equals_paddlenlp(name):
    """Base sizes are built as static programs: parameters are declared but never initialised (the
    dygraph constructor spends about 10 s filling 100M random values on these CPUs)."""
    import paddle

    arch = ARCHITECTURES[name]
    was_dynamic = paddle.in_dynamic_mode()
    paddle.enable_static()
    try:
        with paddle.static.program_guard(paddle.static.Program(), paddle.static.Program()):
            params = paddlenlp_model(arch, "ForPretraining").parameters()
    finally:
        if was_dynamic:
            paddle.disable_static()
    counts = count_parameters(arch)
    assert counts["total"] == sum(int(np.prod(p.shape)) for p in params)
    assert counts["tensors"] == len(params)
    assert counts["total"] == {"ernie-1.0-base-zh": 100_477_778, "bert-base-chinese": 102_882_442}[name]


def test_task_heads_added_like_paddlenlp_classifier():
    total, _ = dygraph_count(paddlenlp_model(dict(TINY, num_labels=3), "ForSequenceClassification"))
    counts = count_parameters(TINY, pretraining_heads=False, task_heads={"news": 32 * 3 + 3})
    assert counts["task_head/news"] == 99
    assert counts["total"] == total == counts["backbone"] + 99


def test_shard_sizes_replays_fleets_greedy_split():
    # the owner advances only once the running total has passed its share: 3 of 4 equal tensors on rank 0
    assert shard_sizes([4, 4, 4, 4], 2) == [12, 4]
    assert shard_sizes([4, 4, 4, 4], 1) == [16]
    assert shard_sizes([1, 1, 1, 1, 1, 1, 1, 1], 4) == [3, 2, 2, 1]
    # tiny ERNIE: the word embedding (1000 x 32) alone passes half of 56,554
    assert shard_sizes(parameter_sizes(TINY), 2) == [32_000, 24_554]


@pytest.mark.parametrize("world,rank", [(2, 0), (2, 1), (4, 3)])
def test_shard_sizes_equal_parameters_kept_by_fleet(world, rank, tmp_path):
    """What rank r of a sharded GPU job keeps (persistable parameters of its startup program, built on
    CPU as the GPU program) is what shard_sizes predicts."""
    import paddle

    from ernie_mtl.config import OptimConfig
    from helpers import pretraining_programs

    parallel = ParallelConfig(use_sharding=True, sharding_degree=world, micro_batch_size=2)
    was_dynamic = paddle.in_dynamic_mode()
    paddle.enable_static()
    try:
        programs = pretraining_programs(tmp_path, world=world, rank=rank, gpu=True, parallel=parallel,
                                        optim=OptimConfig(max_steps=10), amp=FP32_AMP)
    finally:
        if was_dynamic:
            paddle.disable_static()
    names = {p.name for p in programs.main.global_block().all_parameters()}
    kept = [v for v in programs.startup.global_block().vars.values() if v.persistable and v.name in names]
    assert sum(int(np.prod(v.shape)) for v in kept) == shard_sizes(parameter_sizes(TINY), world)[rank]


# memory: 1000 parameters in 10 tensors; fp32 = 4 bytes, Adam = 2 fp32 moments + 2 fp32 beta powers per tensor
P, T = 1000, 10
FP32_AMP = AmpConfig()
O1 = AmpConfig(use_amp=True, amp_level="O1")
O2 = AmpConfig(use_amp=True, amp_level="O2")
SEGMENT = 32 * MiB


def mem(topo, amp=FP32_AMP):
    out = memory_estimate(P, topology=topo, amp=amp, num_tensors=T)
    return {k: v for k, v in out.items() if v}


def test_memory_one_rank_fp32():
    topo = Topology.create(1, micro_batch_size=4)
    assert mem(topo) == {"parameters": 4000, "gradients": 4000, "optimizer_state": 8000 + 80,
                         "persistent": 4000 + 8080, "total": 4000 + 4000 + 8080}


def test_memory_data_parallel_is_replicated():
    assert mem(Topology.create(4, micro_batch_size=4)) == mem(Topology.create(1, micro_batch_size=4))


def test_memory_sharding_2_by_dp_2():
    topo = Topology.create(4, micro_batch_size=4, sharding_degree=2)
    assert (topo.dp_degree, topo.sharding_degree) == (2, 2)
    assert mem(topo) == {"parameters": 2000, "gradients": 2000, "optimizer_state": 4040, "sharding_broadcast": SEGMENT,
                         "persistent": 6040, "total": 2000 + 2000 + 4040 + SEGMENT}


def test_memory_uses_the_most_loaded_rank():
    topo = Topology.create(2, micro_batch_size=4, sharding_degree=2)
    out = memory_estimate(P, topology=topo, amp=FP32_AMP, num_tensors=T, owned_params=750)
    assert (out["parameters"], out["gradients"], out["optimizer_state"]) == (3000, 3000, 6000 + 40)


def test_memory_accumulate_4():
    topo = Topology.create(1, micro_batch_size=4, global_batch_size=16)
    assert topo.accumulate_steps == 4
    assert mem(topo)["gradient_merge"] == 4000
    sharded = Topology.create(2, micro_batch_size=4, global_batch_size=32, sharding_degree=2)
    assert sharded.accumulate_steps == 4
    assert mem(sharded)["gradient_merge"] == 2000  # only the owned gradients get a merge buffer


def test_memory_amp_o1_vs_o2():
    topo = Topology.create(1, micro_batch_size=4)
    assert mem(topo, O1) == {"parameters": 4000, "gradients": 4000, "optimizer_state": 8080, "amp_weight_copies": 2000,
                             "persistent": 12080, "total": 18080}
    assert mem(topo, O2) == {"parameters": 2000, "gradients": 2000, "optimizer_state": 8080, "master_weights": 4000,
                             "persistent": 2000 + 8080 + 4000, "total": 16080}
    sharded = Topology.create(2, micro_batch_size=4, sharding_degree=2)
    # master weights are not partitioned by fleet's static sharding (see the planner's docstring)
    assert mem(sharded, O2) == {"parameters": 1000, "gradients": 1000, "optimizer_state": 4040, "master_weights": 4000,
                                "sharding_broadcast": SEGMENT, "persistent": 9040, "total": 10040 + SEGMENT}


def test_activation_estimate_by_hand():
    # s 8, b 2, h 32, a 2, L 2, V 1000, 3 masked tokens per sequence (m = 6)
    kwargs = dict(micro_batch_size=2, seq_len=8, masked_tokens_per_seq=3)
    # fp32 (e=4): layer 512*66 + 2*64*2*9 = 36096; embeddings 512*9; head 6*32*12 + 6*1000*8
    assert activation_estimate(TINY, amp=FP32_AMP, recompute=False, **kwargs) == 4608 + 2 * 36096 + 2304 + 48000
    # recompute keeps (L+1) layer inputs plus one layer being recomputed
    assert activation_estimate(TINY, amp=FP32_AMP, recompute=True, **kwargs) == 4608 + 3 * 512 * 4 + 36096 + 50304
    # AMP (e=2): layer 512*34 + 2*64*2*5 = 18688; embeddings 512*5; head 6*32*6 + 48000
    assert activation_estimate(TINY, amp=O1, recompute=False, **kwargs) == 2560 + 2 * 18688 + 1152 + 48000


def test_plan_report_sharding_accumulate_amp_recompute():
    base = ARCHITECTURES["ernie-1.0-base-zh"]
    parallel = ParallelConfig(use_sharding=True, sharding_degree=2, micro_batch_size=8, global_batch_size=64,
                              use_recompute=True)
    text = plan(base, parallel, O1, world_size=4, seq_len=128, masked_tokens_per_seq=20,
                schedule_summary="tasks: mlm 100%")
    lines = text.splitlines()
    for expected in ("world size 4 = dp 2 x sharding 2",
                     "global batch 64 = micro batch 8 x data-parallel world 4 x accumulate steps 2",
                     "per rank: 8 samples per executor run, 16 per optimizer step",
                     "amp: float16 O1, init_loss_scaling 32768, dynamic loss scaling True",
                     "recompute: on, 13 checkpoints",
                     "sharding: degree 2, hybrid dp True (dp 2), gradient_merge_acc_step 2, segment_broadcast_MB 32",
                     "gradient_merge: off (accumulation via sharding)",
                     "tasks: mlm 100%"):
        assert expected in lines, expected
    assert any(line.startswith("total ") and "100,477,778 (206 tensors)" in line for line in lines)
    # rank 0 owns 50,250,240 of the 100,477,778 parameters (fleet's greedy split): x 4 bytes
    assert max(shard_sizes(parameter_sizes(base), 2)) == 50_250_240
    rows = {line[:30].strip(): line[30:].split() for line in lines if "MiB" in line}
    assert rows["parameters"][:2] == [f"{50_250_240 * 4 / MiB:.1f}", "MiB"] == ["191.7", "MiB"]
    assert rows["gradient-merge buffers"][0] == "191.7"
    assert rows["16-bit weight copies (O1)"][0] == f"{50_250_240 * 2 / MiB:.1f}"
    assert rows["sharding broadcast buffer"][0] == "32.0"
    assert "fp32 master weights (O2)" not in rows


def test_plan_report_gradient_merge_and_o2_without_sharding():
    text = plan(TINY, ParallelConfig(micro_batch_size=4, global_batch_size=32), O2, world_size=2, seq_len=64,
                masked_tokens_per_seq=10)
    lines = text.splitlines()
    assert "global batch 32 = micro batch 4 x data-parallel world 2 x accumulate steps 4" in lines
    assert "amp: float16 O2 (use_pure_fp16), init_loss_scaling 32768, dynamic loss scaling True" in lines
    assert "gradient_merge: k_steps 4, avg True" in lines
    assert "sharding: off" in lines and "recompute: off" in lines
    assert any(line.startswith("fp32 master weights (O2)") for line in lines)
    assert "== task schedule ==" not in lines


# -- the dry run's GPU program (built on CPU as rank 0 of a GPU job) and the plan's warnings -------------
ENDPOINTS = [f"127.0.0.1:{6170 + i}" for i in range(4)]


def gpu_program(tmp_path, world, parallel, amp):
    """Rank 0's GPU program of tiny-ERNIE pretraining, built on this CPU build, in static mode."""
    import paddle

    from helpers import pretraining_programs

    was_dynamic = paddle.in_dynamic_mode()
    paddle.enable_static()
    try:
        return pretraining_programs(tmp_path, world=world, rank=0, gpu=True, parallel=parallel, amp=amp)
    finally:
        if was_dynamic:
            paddle.disable_static()


@pytest.mark.slow
def test_gpu_program_facts_of_rank_0_under_sharding_amp_and_accumulation(tmp_path):
    """4 GPUs = sharding 2 x dp 2, AMP O1, 4 micro-batches per step: float16 casts, the sharding ring
    (broadcasts and reduces among ranks 0-1), the dp ring (all-reduce among ranks 0 and 2), gradient
    merge's conditional block, and persistable bytes equal to the memory table's persistent row."""
    from ernie_mtl.planning.dryrun import estimate, format_gpu_program, program_facts

    parallel = ParallelConfig(use_sharding=True, sharding_degree=2, micro_batch_size=2, global_batch_size=32)
    p = gpu_program(tmp_path, 4, parallel, O1)
    facts = program_facts(p.main, p.startup, endpoints=ENDPOINTS)
    assert facts.casts["to_16bit"] > 0 and facts.casts["from_16bit"] > 0
    assert facts.amp_ops["check_finite_and_unscale"] > 0 and facts.amp_ops["update_loss_scaling"] > 0
    assert facts.rings == {1: [0, 1], 2: [0, 2]}
    assert facts.collectives[1]["c_broadcast"] > 0 and facts.collectives[1]["c_reduce_sum"] > 0
    assert facts.collectives[2]["c_allreduce_sum"] > 0 and "c_broadcast" not in facts.collectives[2]
    assert facts.conditional_blocks == 1
    parts = estimate(TINY, parallel, O1, world_size=4, seq_len=64, masked_tokens_per_seq=10)
    assert facts.persistable_bytes == pytest.approx(parts["memory"]["persistent"], rel=0.01)
    lines = format_gpu_program(facts, topology=parts["topology"], amp=O1, memory=parts["memory"])
    assert lines[0].startswith("== GPU program (rank 0 of 4")
    assert any(line.startswith(f"amp float16 O1: {sum(facts.casts.values())} cast ops "
                               f"({facts.casts['to_16bit']} to float16") for line in lines)
    assert any(line.startswith("  ring 1 (ranks 0,1: rank 0's sharding group): ") and "c_reduce_sum" in line
               for line in lines)
    assert any(line.startswith("  ring 2 (ranks 0,2: rank 0's data-parallel group): c_allreduce_sum ")
               for line in lines)
    assert "gradient merge: 1 conditional_block (the update runs once every 4 micro-batches)" in lines


@pytest.mark.slow
def test_gpu_program_facts_of_one_float32_rank(tmp_path):
    from ernie_mtl.planning.dryrun import estimate, format_gpu_program, program_facts

    parallel = ParallelConfig(micro_batch_size=2)
    p = gpu_program(tmp_path, 1, parallel, FP32_AMP)
    facts = program_facts(p.main, p.startup, endpoints=ENDPOINTS[:1])
    assert facts.casts["to_16bit"] == 0 and facts.rings == {} and facts.collectives == {}
    assert facts.conditional_blocks == 0
    parts = estimate(TINY, parallel, FP32_AMP, world_size=1, seq_len=64, masked_tokens_per_seq=10)
    assert facts.persistable_bytes == pytest.approx(parts["memory"]["persistent"], rel=0.01)
    lines = format_gpu_program(facts, topology=parts["topology"], amp=FP32_AMP, memory=parts["memory"])
    assert "collectives: none in the training program (one rank)" in lines
    assert "gradient merge: no conditional_block (accumulate steps 1)" in lines


def test_corpus_warnings_give_the_numbers_and_the_fix():
    from ernie_mtl.planning.plan import REPEAT_WARN_EPOCHS, corpus_warnings

    kwargs = dict(what="--input_dir", flag_mode=True)
    # a plan a user reported: 32 GPUs x micro batch 4 x ... = 6,400 per step, 32,000 steps of a 5,785-sample corpus
    warnings = corpus_warnings([("news", 204_800_000, 5_785)], global_batch=6_400, max_steps=32_000, **kwargs)
    assert len(warnings) == 2
    assert warnings[0].startswith("warning: --input_dir: the plan reads corpus 'news' 35,401.90 times "
                                  "(204,800,000 train samples planned, 5,785 per epoch), more than 10 epochs")
    assert warnings[0].endswith("Use more data, fewer --max_steps, or a smaller --global_batch_size; --max_steps 9 "
                                "reads it 10 times")  # 32,000 x 10 / 35,401.9
    assert warnings[1] == ("warning: --input_dir: its train split gives 5,785 samples per epoch, fewer than one "
                           "global batch (6,400): every optimizer step reads some samples more than once. Use more "
                           "data or a smaller --global_batch_size")
    # a mixture: only the corpus that repeats is named; a plan within the threshold says nothing
    mixed = corpus_warnings([("web", 80_000, 40_000), ("wiki", 50_000, 1_000)], global_batch=512, **kwargs)
    assert len(mixed) == 1 and "corpus 'wiki' 50.00 times" in mixed[0] and "web" not in mixed[0]
    assert REPEAT_WARN_EPOCHS == 10
    assert corpus_warnings([("web", 10 * 40_000, 40_000)], global_batch=512, **kwargs) == []


def test_plan_warnings_of_a_multitask_plan():
    """An auxiliary task repeated past the threshold and a task smaller than one global batch of the
    task are flagged with their numbers; a target's epochs are its quota (num_epochs asked for them)."""
    from types import SimpleNamespace

    from ernie_mtl.planning.plan import plan_warnings

    def task(name, batch, target):
        spec = SimpleNamespace(name=name, batch_size=batch, is_target=target)
        return SimpleNamespace(spec=spec, train_sources=lambda: None, num_train_examples=len)

    topo = Topology.create(2, micro_batch_size=8, global_batch_size=32)  # 2 data-parallel ranks x 2 micro-batches
    run_plan = SimpleNamespace(
        tasks=[task("big", 8, True), task("long", 8, True), task("tiny", 8, False), task("aux", 4, False)],
        train={"big": [0] * 1000, "long": [0] * 100, "tiny": [0] * 10, "aux": [0] * 400},
        planned=SimpleNamespace(epochs=(3.0, 40.0, 30.0, 2.0), micro_batches=(189, 280, 30, 100)))
    warnings = plan_warnings(run_plan, topo, flag_mode=False)
    assert warnings == [
        "warning: task tiny (auxiliary): the plan reads its 10 training examples 30.00 times (30 micro-batches of 8), "
        "more than 10 epochs. Give it more data, a lower sampling weight (mix_ratio), a "
        "shorter run (the targets' num_epochs, max_steps) or a smaller batch_size",
        "warning: task tiny: its train data has 10 examples, fewer than one global batch of the task (8 per rank x 2 "
        "data-parallel ranks x 2 micro-batches per step = 32): a step that draws only this task reads examples more "
        "than once. Give it more data or a smaller batch_size"]
