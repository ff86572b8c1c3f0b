"""Topology arithmetic, the fleet strategy, and what each strategy option does to the programs.

Program-level facts are asserted on a tiny ERNIE (2 layers, hidden 32, 46 distinct parameters),
including the programs GPU ranks would run, built on CPU with `compat.emulate_gpu_program`.
"""
import zlib  # noqa: F401  (before paddle)

from collections import Counter

import paddle
import pytest

from ernie_mtl.config import AmpConfig, ConfigError, ParallelConfig
from ernie_mtl.dist.topology import Topology, build_strategy, required_flags

pytestmark = pytest.mark.usefixtures("static_mode")


def reachable_ops(program):
    """(op, block index) of every op the executor can reach: the global block and the sub-blocks
    its control-flow ops point to (fleet leaves stale, unreferenced blocks behind)."""
    found = []

    def walk(block):
        for op in block.ops:
            found.append((op, block.idx))
            if op.has_attr("sub_block"):
                walk(program.block(op._block_attr_id("sub_block")))

    walk(program.global_block())
    return found


def counts(program, *, by_ring=False, block=None):
    """Op-type counts (optionally keyed by (type, ring_id), optionally of one block only)."""
    def key(op):
        return (op.type, op.attr("ring_id")) if by_ring and op.has_attr("ring_id") else op.type
    return Counter(key(op) for op, b in reachable_ops(program) if block is None or b == block)


def param_count(programs):
    return len(set(programs.name_map.values()))


@pytest.fixture(scope="module")
def plain(build_programs):
    """The baseline: one process, no accumulation, recompute or AMP."""
    return build_programs()


# ---------------------------------------------------------------- topology arithmetic and errors

def test_topology_derives_accumulation_data_world_and_rank_layout():
    topo = Topology.create(4, micro_batch_size=2, global_batch_size=32, sharding_degree=2)
    assert (topo.dp_degree, topo.data_world_size, topo.accumulate_steps) == (2, 4, 4)
    # sharding groups are runs of consecutive ranks, as fleet's ShardingOptimizer lays them out
    assert [topo.sharding_rank(r) for r in range(4)] == [0, 1, 0, 1]
    assert [topo.dp_rank(r) for r in range(4)] == [0, 0, 1, 1]
    assert [topo.data_rank(r) for r in range(4)] == [0, 1, 2, 3]
    assert topo.to_dict() == {"world_size": 4, "dp_degree": 2, "sharding_degree": 2, "micro_batch_size": 2,
                              "global_batch_size": 32, "accumulate_steps": 4}
    with pytest.raises(ValueError, match="rank 4 is outside 0..3"):
        topo.data_rank(4)


def test_dp_degree_is_inferred_and_global_batch_defaults_to_no_accumulation():
    topo = Topology.create(8, micro_batch_size=3, sharding_degree=2)
    assert (topo.dp_degree, topo.global_batch_size, topo.accumulate_steps) == (4, 24, 1)
    assert Topology.create(1, micro_batch_size=4, global_batch_size=16).accumulate_steps == 4


def test_non_divisible_global_batch_names_the_nearest_valid_sizes():
    with pytest.raises(ConfigError) as e:
        Topology.create(2, micro_batch_size=4, global_batch_size=30)
    assert str(e.value) == ("--global_batch_size 30 is not a multiple of --micro_batch_size 4 x data-parallel "
                            "world 2 (dp 2 x sharding 1) = 8; nearest valid: 24 or 32")
    with pytest.raises(ConfigError, match=r"--global_batch_size 5 .* = 8; nearest valid: 8$"):
        Topology.create(2, micro_batch_size=4, global_batch_size=5)


def test_degree_mismatch_and_every_problem_reported_together():
    with pytest.raises(ConfigError) as e:
        Topology.create(4, micro_batch_size=2, dp_degree=3)
    assert str(e.value) == ("--dp_degree 3 x --sharding_degree 1 = 3 must equal the number of processes 4; "
                            "launch 3 processes or set --dp_degree -1 to infer it")
    with pytest.raises(ConfigError) as e:
        Topology.create(4, micro_batch_size=0, sharding_degree=3)
    assert e.value.problems == [
        "--micro_batch_size 0 must be >= 1",
        "--sharding_degree 3 does not divide the number of processes 4; launch a multiple of 3 processes or "
        "change --sharding_degree"]
    assert str(e.value).startswith("2 configuration problems:\n  - --micro_batch_size 0")


def test_parallel_config_checks_sharding_switches():
    with pytest.raises(ConfigError) as e:
        ParallelConfig(use_sharding=True, sharding_stage=2).validate()
    assert e.value.problems == [
        "--use_sharding with --sharding_degree 1 shards nothing; set --sharding_degree >= 2 or drop --use_sharding",
        "--sharding_stage 2 is not available in static graphs (Paddle 2.6's static ShardingOptimizer has one "
        "mode); use --sharding_stage 1"]
    with pytest.raises(ConfigError, match="--sharding_degree 2 needs --use_sharding"):
        Topology.from_config(ParallelConfig(sharding_degree=2), 2)
    topo = Topology.from_config(ParallelConfig(use_sharding=True, sharding_degree=2, micro_batch_size=1,
                                               global_batch_size=8), 4)
    assert (topo.dp_degree, topo.sharding_degree, topo.accumulate_steps) == (2, 2, 2)


# ------------------------------------------------------------------------ strategy (pure function)

def _strategy(world, parallel, amp=AmpConfig(), checkpoints=()):
    return build_strategy(Topology.from_config(parallel, world), parallel, amp, recompute_checkpoints=checkpoints)


def test_plain_data_parallel_strategy_switches_nothing_on():
    s = _strategy(2, ParallelConfig(micro_batch_size=2))
    assert not any((s.sharding, s.gradient_merge, s.amp, s.recompute))
    assert s.fuse_all_reduce_ops and s.without_graph_optimization  # fleet's RawProgramOptimizer path


def test_accumulation_uses_gradient_merge_without_sharding():
    parallel = ParallelConfig(micro_batch_size=2, global_batch_size=16)
    s = _strategy(2, parallel)
    assert s.gradient_merge and not s.sharding
    assert s.gradient_merge_configs == {"k_steps": 4, "avg": True}
    assert required_flags(Topology.from_config(parallel, 2)) == {}


def test_accumulation_under_sharding_uses_gradient_merge_acc_step_never_both_switches():
    parallel = ParallelConfig(micro_batch_size=2, global_batch_size=32, use_sharding=True, sharding_degree=2)
    s = _strategy(4, parallel)
    assert s.sharding and not s.gradient_merge
    cfg = s.sharding_configs
    keys = ("sharding_degree", "dp_degree", "hybrid_dp", "gradient_merge_acc_step")
    assert [cfg[k] for k in keys] == [2, 2, True, 4]
    assert required_flags(Topology.from_config(parallel, 4)) == {"FLAGS_new_executor_sequential_run": True}
    no_acc = ParallelConfig(micro_batch_size=2, use_sharding=True, sharding_degree=2)
    assert _strategy(2, no_acc).sharding_configs["hybrid_dp"] is False
    assert required_flags(Topology.from_config(no_acc, 2)) == {}


def test_amp_strategy_float16_o1_o2_and_bfloat16_left_to_the_static_api():
    amp = AmpConfig(use_amp=True, custom_white_list=("softmax",), custom_black_list=("reduce_sum",),
                    init_loss_scaling=1024.0)
    s = _strategy(1, ParallelConfig(), amp)
    cfg = s.amp_configs
    assert s.amp and cfg["custom_white_list"] == ["softmax"] and cfg["custom_black_list"] == ["reduce_sum"]
    assert (cfg["init_loss_scaling"], cfg["use_dynamic_loss_scaling"], cfg["use_pure_fp16"]) == (1024.0, True, False)
    o2 = _strategy(1, ParallelConfig(), AmpConfig(use_amp=True, amp_level="O2")).amp_configs
    assert o2["use_pure_fp16"] and o2["use_fp16_guard"]
    assert not _strategy(1, ParallelConfig(), AmpConfig(use_amp=True, amp_dtype="bfloat16")).amp


def test_recompute_strategy_needs_checkpoints():
    parallel = ParallelConfig(use_recompute=True)
    with pytest.raises(ValueError, match="recompute needs checkpoints"):
        _strategy(1, parallel)
    s = _strategy(1, parallel, checkpoints=["a", "b"])
    assert s.recompute and s.recompute_configs["checkpoints"] == ["a", "b"]


# ---------------------------------------------------------- effect on the programs, one CPU process

def test_gradient_merge_puts_the_update_in_a_conditional_block(build_programs, plain):
    import paddle.distributed.fleet as fleet

    base = plain
    p = build_programs(parallel=ParallelConfig(micro_batch_size=2, global_batch_size=8))
    assert fleet.fleet._get_applied_meta_list() == ["RawProgramOptimizer", "GradientMergeOptimizer"]
    assert counts(base.main)["conditional_block"] == 0 and counts(base.main, block=0)["adamw"] == param_count(base)
    assert counts(p.main, block=0)["conditional_block"] == 1
    assert counts(p.main, block=0)["adamw"] == 0
    assert counts(p.main)["adamw"] == param_count(p)  # all updates inside the conditional block
    k = [op for op in p.startup.global_block().ops if op.output_arg_names == ["gradient_merge_k"]]
    assert k and k[0].attr("value") == 4


def test_recompute_checkpoints_every_layer_and_recomputes_each_once(build_programs, plain):
    base = plain
    p = build_programs(parallel=ParallelConfig(micro_batch_size=2, use_recompute=True))
    layers = 2
    assert len(p.recompute_checkpoints) == layers
    assert p.strategy.recompute_configs["checkpoints"] == p.recompute_checkpoints
    # the checkpoints are the outputs of the layers' last op (post-LN: norm2)
    producers = {out: op.type for op in base.main.global_block().ops for out in op.output_arg_names}
    assert [producers[c] for c in p.recompute_checkpoints] == ["layer_norm"] * layers
    assert counts(base.main, block=0)["softmax"] == layers
    # one attention softmax per layer in the forward, and each layer's again in the backward
    assert counts(p.main, block=0)["softmax"] == 2 * layers


def test_amp_on_cpu_adds_loss_scaling_but_no_casts_and_gpu_emulation_adds_casts(build_programs, plain):
    amp = AmpConfig(use_amp=True)
    base = counts(plain.main)
    cpu = build_programs(amp=amp)
    c = counts(cpu.main)
    assert c["check_finite_and_unscale"] == 1 and c["update_loss_scaling"] == 1
    assert c["cast"] == base["cast"]  # the CPU build finds no GPU fp16 kernels: no casts
    assert cpu.loss_scaling is not None and cpu.loss_scaling.name.startswith("loss_scaling")
    gpu = counts(build_programs(amp=amp, gpu=True).main)
    assert gpu["cast"] > base["cast"] + 20


# ----------------------------------------------------- GPU programs for rank r of N, built on CPU

@pytest.mark.slow
def test_gpu_hybrid_sharding_2_x_dp_2_amp_accumulation_4(build_programs):
    import paddle.distributed.fleet as fleet

    parallel = ParallelConfig(micro_batch_size=2, global_batch_size=32, use_sharding=True, sharding_degree=2)
    amp = AmpConfig(use_amp=True)
    updated = 0
    for rank in (0, 3):  # sharding ranks 0 and 1 of different dp replicas
        p = build_programs(world=4, rank=rank, parallel=parallel, amp=amp)
        assert fleet.fleet._get_applied_meta_list() == ["ShardingOptimizer", "AMPOptimizer"]
        assert not p.strategy.gradient_merge
        n = param_count(p)
        top = counts(p.main, by_ring=True, block=0)
        everything = counts(p.main, by_ring=True)
        sub = everything - top  # ops inside the conditional block (run once per 4 micro-batches)
        # sharding ring 1: every parameter broadcast from its owner before use (the word embedding
        # twice: fp32 for the lookup, fp16 for the tied decoder), every gradient reduced to its owner
        assert top[("c_broadcast", 1)] == n + 1 and top[("c_reduce_sum", 1)] == n
        assert top["conditional_block"] == 1 and top["cast"] > 0
        assert sub["check_finite_and_unscale"] == 1 and sub["update_loss_scaling"] == 1
        assert sub[("c_allreduce_max", 1)] == 1  # overflow flag agreed on the sharding ring
        owned = sub["adamw"]
        # dp ring 2: the owned (accumulated) gradients are all-reduced across replicas, once per step
        assert sub[("c_allreduce_sum", 2)] == owned and top[("c_allreduce_sum", 2)] == 0
        updated += owned
        start = Counter((op.type, op.attr("ring_id")) for op in p.startup.global_block().ops if op.has_attr("ring_id"))
        assert start[("c_gen_nccl_id", 1)] == start[("c_comm_init", 1)] == 1
        assert start[("c_gen_nccl_id", 2)] == start[("c_comm_init", 2)] == 1
        assert start[("c_broadcast", 2)] == owned  # replicas start from the same owned values
        test = counts(p.test, by_ring=True, block=0)
        assert test[("c_broadcast", 1)] == n + 1 and test[("c_reduce_sum", 1)] == 0 and test["adamw"] == 0
    assert updated == n  # each parameter is updated by exactly one rank of a sharding group


def test_gpu_data_parallel_2_ranks_all_reduces_every_gradient(build_programs):
    p = build_programs(world=2, rank=1)
    c = counts(p.main, by_ring=True)
    coalesced = [op for op in p.main.global_block().ops if op.type == "coalesce_tensor"]
    assert c[("c_allreduce_sum", 0)] == len(coalesced) >= 1  # fused buckets
    assert sum(len(op.input("Input")) for op in coalesced) == param_count(p)
    start = [op for op in p.startup.global_block().ops if op.type == "c_broadcast"]
    assert sorted(op.input_arg_names[0] for op in start) == sorted(set(p.name_map.values()))
    assert all(op.attr("root") == 0 for op in start)
    init = [op for op in p.startup.global_block().ops if op.type == "c_gen_nccl_id"]
    assert len(init) == 1 and init[0].attr("rank") == 1 and init[0].attr("ring_id") == 0


def test_gpu_data_parallel_with_accumulation_all_reduces_once_per_step(build_programs):
    p = build_programs(world=2, parallel=ParallelConfig(micro_batch_size=2, global_batch_size=8))
    top, everything = counts(p.main, block=0), counts(p.main)
    assert top["c_allreduce_sum"] == 0 and everything["c_allreduce_sum"] == param_count(p)


@pytest.mark.slow
def test_gpu_bfloat16_through_the_static_amp_api(build_programs):
    from paddle.base import core

    p = build_programs(world=2, amp=AmpConfig(use_amp=True, amp_dtype="bfloat16"))
    c = counts(p.main)
    bf16_casts = [op for op in p.main.global_block().ops
                  if op.type == "cast" and op.attr("out_dtype") == core.VarDesc.VarType.BF16]
    assert len(bf16_casts) > 20
    assert c["update_loss_scaling"] == 0 and c["check_finite_and_unscale"] == 0  # no loss scaling for bf16
    assert not p.strategy.amp and p.loss_scaling is None and c[("c_allreduce_sum")] >= 1


@pytest.mark.slow
def test_gpu_amp_o2_keeps_fp32_master_weights(build_programs):
    """O2 casts the parameters to float16; AdamW must update fp32 master copies (multi_precision),
    not accumulate into the float16 values."""
    p = build_programs(world=2, amp=AmpConfig(use_amp=True, amp_level="O2"), gpu=True)
    block = p.main.global_block()
    adamw = [op for op in block.ops if op.type == "adamw"]
    fp16 = [op for op in adamw if block.var(op.input("Param")[0]).dtype == paddle.float16]
    assert len(fp16) > 10 and all(op.attr("multi_precision") for op in fp16)
    assert all(op.input("MasterParam") == [op.input("Param")[0] + "_fp32_master_0"] for op in fp16)


# -------------------------------------------------------------------------------------- CPU shim

def test_emulation_restores_every_patch(build_programs):
    import paddle
    import paddle.static.amp.fp16_lists as fp16_lists
    from paddle.distributed.fleet.meta_optimizers import common

    before = (paddle.get_flags, common.CollectiveHelper._init_communicator, fp16_lists._get_sys_unsupported_list)
    build_programs(world=2, amp=AmpConfig(use_amp=True))
    assert (paddle.get_flags, common.CollectiveHelper._init_communicator,
            fp16_lists._get_sys_unsupported_list) == before


def test_strip_gpu_sync_ops(build_programs):
    from ernie_mtl.dist.compat import GPU_SYNC_OPS, strip_gpu_sync_ops

    p = build_programs(world=2, parallel=ParallelConfig(micro_batch_size=2, use_sharding=True, sharding_degree=2))
    present = sum(counts(prog)[t] for prog in (p.main, p.startup) for t in GPU_SYNC_OPS)
    assert present > 0
    assert strip_gpu_sync_ops(p.main, p.startup) >= present
    assert sum(counts(prog)[t] for prog in (p.main, p.startup) for t in GPU_SYNC_OPS) == 0


def test_cpu_collective_shim_is_idempotent(monkeypatch, static_mode):
    import paddle
    from paddle.distributed.fleet.meta_optimizers import common

    from ernie_mtl.dist.compat import apply_cpu_collective_shim, is_cpu_build

    if not is_cpu_build():
        pytest.skip("the shim applies to CPU-only builds")
    monkeypatch.setattr(paddle, "get_flags", paddle.get_flags)  # undo the shim after the test
    monkeypatch.setattr(common.CollectiveHelper, "_init_communicator", common.CollectiveHelper._init_communicator)
    with pytest.raises(ValueError):
        paddle.get_flags("FLAGS_dynamic_static_unified_comm")  # exists only in CUDA/XPU builds
    assert apply_cpu_collective_shim() and apply_cpu_collective_shim()
    shimmed = paddle.get_flags
    assert apply_cpu_collective_shim() and paddle.get_flags is shimmed  # not wrapped twice
    assert paddle.get_flags("FLAGS_dynamic_static_unified_comm") == {"FLAGS_dynamic_static_unified_comm": True}
    assert paddle.get_flags(["FLAGS_new_executor_sequential_run"]) == {"FLAGS_new_executor_sequential_run": False}
    assert common.CollectiveHelper._init_communicator(None, None, None, None, 0, 0, True) is None


def test_the_rendezvous_server_of_a_cpu_launch_serves_and_stops_within_its_20_ms_poll(monkeypatch):
    """install_quick_kv_server: rank 0's gloo rendezvous helper (Paddle's own checks every 3 s, about
    3 s idle at every multi-process CPU start) serves PUT/GET/DELETE and stops once told and every
    rank's key is deleted, sleeping only KV_SERVER_POLL_S at a time."""
    import socket
    import threading
    import time
    import urllib.request

    import paddle.distributed.parallel as parallel
    from ernie_mtl.dist.compat import KV_SERVER_POLL_S, install_quick_kv_server

    monkeypatch.setattr(parallel, "_start_kv_server", parallel._start_kv_server)  # undone after the test
    install_quick_kv_server()
    slept, real_sleep = [], time.sleep

    def sleep(s):
        slept.append(s)
        real_sleep(min(s, 0.01))

    monkeypatch.setattr(time, "sleep", sleep)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    told = {"running": True}
    server = threading.Thread(target=parallel._start_kv_server, args=(port, told, {"_worker": 1}), daemon=True)
    server.start()

    def call(method, path, data=None):
        for _ in range(200):  # until the server listens
            try:
                req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
                with urllib.request.urlopen(req, timeout=5) as r:
                    return r.read()
            except (ConnectionRefusedError, urllib.error.URLError):
                real_sleep(0.01)
        raise AssertionError(f"the rendezvous server never answered on port {port}")

    call("PUT", "/_worker/0", b"127.0.0.1:6170")
    assert call("GET", "/_worker/0") == b"127.0.0.1:6170"
    call("DELETE", "/_worker/0")
    told["running"] = False
    server.join(timeout=60)
    assert not server.is_alive()
    assert slept and set(slept) == {KV_SERVER_POLL_S}, slept
