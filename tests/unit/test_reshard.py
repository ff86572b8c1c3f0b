"""Topology-free training state (ernie_mtl/checkpoint/reshard.py): static names <-> structured names,
gradient-merge state verified and dropped, a checkpoint's state written into the programs of other
topologies (real fleet programs, GPU ones built on CPU), and the decision to continue, reshard or
refuse with what would be needed."""
import zlib  # noqa: F401  (before paddle)

import numpy as np
import pytest

from ernie_mtl.checkpoint.reshard import (ReshardError, assignments, decide, is_transient, name_map_differences,
                                          split_name, structured_state)
from ernie_mtl.config import AmpConfig, ParallelConfig

NAME_MAP = {"ernie.embeddings.word_embeddings.weight": "embedding_0.w_0",
            "ernie.encoder.layers.0.linear1.weight": "linear_1.w_0",
            "ernie.encoder.layers.0.linear1.bias": "linear_1.b_0",
            "ernie.encoder.layers.1.linear1.weight": "linear_10.w_0",
            "heads.pretrain.decoder_weight": "embedding_0.w_0"}  # tied to the word embedding


# -- names ------------------------------------------------------------------------------------------------
def test_a_variable_is_split_into_its_parameter_and_a_known_suffix():
    params = set(NAME_MAP.values())
    assert split_name("linear_1.w_0", params) == ("linear_1.w_0", "")
    assert split_name("linear_1.w_0_moment1_0", params) == ("linear_1.w_0", "_moment1_0")
    assert split_name("linear_10.w_0_beta2_pow_acc_0", params) == ("linear_10.w_0", "_beta2_pow_acc_0")  # not linear_1
    assert split_name("linear_1.w_0_fp32_master_0", params) == ("linear_1.w_0", "_fp32_master_0")
    assert split_name("linear_1.w_0_fp32_master_0_moment2_0", params) == ("linear_1.w_0", "_fp32_master_0_moment2_0")
    assert split_name("linear_1.w_0@EMA", params) == ("linear_1.w_0", "@EMA")
    assert split_name("linear_1.w_0@GRAD@GradientMerge", params) == ("linear_1.w_0", "@GRAD@GradientMerge")
    assert split_name("linear_1.w_0@GRAD@GradiantMerge", params) == ("linear_1.w_0", "@GRAD@GradiantMerge")
    assert split_name("loss_scaling_0", params) is None and split_name("linear_1.w_0_unknown", params) is None
    assert is_transient("linear_1.w_0@GRAD@GradientMerge", params) and is_transient("gradient_merge_k", params)
    assert is_transient("learning_rate_0", params) and not is_transient("loss_scaling_0", params)
    assert not is_transient("linear_1.w_0_moment1_0", params)


def test_structured_state_names_by_the_first_alias_and_drops_zero_merge_state():
    merged = {"embedding_0.w_0": np.ones((4, 2), "float32"), "embedding_0.w_0_moment1_0": np.full((4, 2), 2, "float32"),
              "linear_1.w_0@EMA": np.zeros((2, 2), "float32"), "loss_scaling_0": np.array([32768.0], "float32"),
              "linear_1.w_0@GRAD@GradientMerge": np.zeros((2, 2), "float32"),
              "gradient_merge_step": np.array([0], "int32"), "gradient_merge_k": np.array([2], "int32"),
              "learning_rate_0": np.array(1e-3, "float32"), "StructuredToParameterName@@": {"a": "b"}}
    state = structured_state(merged, NAME_MAP)
    assert sorted(state) == ["ernie.embeddings.word_embeddings.weight",
                             "ernie.embeddings.word_embeddings.weight_moment1_0",
                             "ernie.encoder.layers.0.linear1.weight@EMA", "loss_scaling_0"]


def test_a_state_saved_inside_an_optimizer_step_is_refused():
    busy = {"linear_1.w_0@GRAD@GradientMerge": np.ones((2, 2), "float32"),
            "gradient_merge_step": np.array([1], "int32")}
    with pytest.raises(ReshardError, match=r"saved inside an optimizer step .*gradient_merge_step = \[1\].*"
                                           r"ernie.encoder.layers.0.linear1.weight\) is not zero"):
        structured_state(busy, NAME_MAP)


def test_assignments_by_any_alias_and_the_first_differences_listed():
    state = {"heads.pretrain.decoder_weight": np.ones((4, 2), "float32"),  # a writer whose first alias was the head's
             "heads.pretrain.decoder_weight_moment1_0": np.zeros((4, 2), "float32"),
             "ernie.encoder.layers.0.linear1.weight": np.ones((2, 2), "float32"),
             "loss_scaling_0": np.ones(1, "float32")}
    variables = {"embedding_0.w_0": ((4, 2), "float32"), "embedding_0.w_0_moment1_0": ((4, 2), "float32"),
                 "embedding_0.w_0@GRAD@GradientMerge": ((4, 2), "float32"), "learning_rate_0": ((), "float32")}
    got = assignments(state, NAME_MAP, variables)
    assert sorted(got) == ["embedding_0.w_0", "embedding_0.w_0_moment1_0"]  # transient ones keep the program's own
    assert sorted(assignments(state, NAME_MAP, {**variables, "loss_scaling_0": ((1,), "float32")},
                              only="parameters")) == ["embedding_0.w_0"]
    with pytest.raises(ReshardError) as e:
        assignments(state, NAME_MAP, {**variables, "linear_1.w_0": ((3, 2), "float32"),
                                      "linear_1.b_0_moment2_0": ((2,), "float32"), "num_bad_steps_0": ((1,), "int32")})
    assert str(e.value) == (
        "2 of this program's variables are not in the checkpoint: ernie.encoder.layers.0.linear1.bias_moment2_0, "
        "num_bad_steps_0; 1 differ in shape or type: ernie.encoder.layers.0.linear1.weight: shape [2, 2] in the "
        "checkpoint, [3, 2] here")
    assert name_map_differences(NAME_MAP, {**NAME_MAP, "heads.cls.weight": "linear_9.w_0"}) == [
        "1 parameter(s) of this model are not in the checkpoint: heads.cls.weight"]


# -- real programs of several topologies ---------------------------------------------------------------------
def _variables(programs):
    from ernie_mtl.engine.elastic import program_variables

    return program_variables(programs.main)


@pytest.fixture(scope="module")
def layouts(build_programs):
    """Persistable variables of the tiny pretraining program on several topologies (EMA on): one
    process with accumulation 2, two data-parallel ranks, sharding 2 (+ accumulation 2, GPU programs
    built on CPU), and AMP O2 on one GPU."""
    cases = {
        "one_acc2": [dict(world=1, parallel=ParallelConfig(micro_batch_size=2, global_batch_size=4))],
        "dp2": [dict(world=2, rank=r, parallel=ParallelConfig(micro_batch_size=2)) for r in (0, 1)],
        "sharding2_acc2": [dict(world=2, rank=r, parallel=ParallelConfig(micro_batch_size=2, global_batch_size=8,
                                                                          use_sharding=True, sharding_degree=2))
                           for r in (0, 1)],
        "o2_gpu": [dict(world=1, gpu=True, parallel=ParallelConfig(micro_batch_size=2),
                        amp=AmpConfig(use_amp=True, amp_level="O2"))],
    }
    out = {}
    for name, ranks in cases.items():
        built = [build_programs(ema_decay=0.9, **kw) for kw in ranks]
        out[name] = ([_variables(p) for p in built], built[0].name_map)
    return out


def _fake_checkpoint(variables_per_rank, rng):
    """What the ranks' files hold, merged: random values, zero gradient-merge state (a step boundary)."""
    merged = {}
    for variables in variables_per_rank:
        for name, (shape, dtype) in variables.items():
            zero = "GradientMerge" in name or "GradiantMerge" in name or name.startswith("gradient_merge")
            merged.setdefault(name, np.zeros(shape, dtype) if zero else rng.standard_normal(shape).astype(dtype))
    return merged


@pytest.mark.parametrize("source,target", [("one_acc2", "sharding2_acc2"), ("sharding2_acc2", "dp2"),
                                           ("dp2", "one_acc2"), ("sharding2_acc2", "one_acc2")])
@pytest.mark.slow
def test_a_state_written_by_one_topology_fills_every_rank_of_another(layouts, source, target):
    """Every persistable variable of every target rank (its own shard under sharding) gets the value
    the source held for the same structured name; only transient state (gradient merge, the fed
    learning rate) is left to the target program; the union of the target ranks uses every source
    tensor that is not transient."""
    rng = np.random.default_rng(0)
    src_vars, src_map = layouts[source]
    merged = _fake_checkpoint(src_vars, rng)
    state = structured_state(merged, src_map)
    tgt_vars, tgt_map = layouts[target]
    assert tgt_map == src_map  # static names do not depend on the topology
    used = set()
    for variables in tgt_vars:
        got = assignments(state, tgt_map, variables)
        params = set(tgt_map.values())
        assert set(got) == {n for n in variables if not is_transient(n, params)}
        for name, value in got.items():
            assert np.array_equal(value, merged[name]), name
        used |= set(got)
    assert used == {n for n in merged if not is_transient(n, set(src_map.values()))}


@pytest.mark.slow  # the `layouts` fixture builds the programs of several topologies
def test_amp_o2_state_maps_master_weights_and_loss_scaling(layouts):
    (variables,), name_map = layouts["o2_gpu"]
    state = structured_state(_fake_checkpoint([variables], np.random.default_rng(1)), name_map)
    word = "ernie.encoder.layers.0.linear1.weight"  # float16 under O2 (the word embedding stays float32)
    assert {f"{word}_fp32_master_0", f"{word}_fp32_master_0_moment1_0", f"{word}@EMA", "loss_scaling_0",
            "num_good_steps_0"} <= set(state)
    weights = assignments(state, name_map, variables, only="parameters")  # a warm start: weights + master weights
    assert name_map[word] + "_fp32_master_0" in weights and name_map[word] + "_moment1_0" not in weights
    assert "loss_scaling_0" not in weights
    assert "loss_scaling_0" in assignments(state, name_map, variables, only="parameters+optimizer")
    # AMP O2 state cannot be written into a float32 program as is: the master weights are missing there
    (plain,), _ = layouts["one_acc2"]
    with pytest.raises(ReshardError, match="differ in shape or type"):
        assignments(structured_state(_fake_checkpoint([plain], np.random.default_rng(2)), name_map), name_map,
                    variables)


# -- deciding -----------------------------------------------------------------------------------------------
def topo(world, dp, sharding, micro, glob):
    return {"world_size": world, "dp_degree": dp, "sharding_degree": sharding, "micro_batch_size": micro,
            "global_batch_size": glob, "accumulate_steps": glob // (micro * dp * sharding)}


def raw(t, step=3, consumed=12):
    return {"topology": t, "step": step, "consumed_samples": consumed}


def test_same_topology_is_exact_and_another_layout_with_the_global_batch_reshards():
    assert decide(raw(topo(2, 2, 1, 2, 4)), topo(2, 2, 1, 2, 4), flag_mode=True).kind == "exact"
    c = decide(raw(topo(2, 2, 1, 2, 4)), topo(1, 1, 1, 2, 4), flag_mode=True)
    assert c.kind == "resharded" and c.same_masks and "with the same dropout masks" in c.summary()[-1]
    assert c.summary()[1] == ("  checkpoint: 2 processes (dp 2 x sharding 1), micro batch 2 x accumulation 1, "
                              "global batch 4")
    c = decide(raw(topo(2, 1, 2, 2, 8)), topo(2, 2, 1, 4, 8), flag_mode=True)
    assert c.kind == "resharded" and not c.same_masks and "micro batch 2 -> 4" in c.notes[0]
    # multi-task: the global batch is micro-batches per step (each task's micro-batch is its batch_size)
    assert decide(raw(topo(1, 1, 1, 8, 32)), topo(2, 2, 1, 8, 32), flag_mode=False).kind == "resharded"
    with pytest.raises(ReshardError, match="4 micro-batches per step .* vs 2 now"):
        decide(raw(topo(1, 1, 1, 8, 32)), topo(2, 2, 1, 16, 32), flag_mode=False)


def test_another_global_batch_is_refused_with_what_would_be_needed_unless_allowed():
    with pytest.raises(ReshardError) as e:
        decide(raw(topo(16, 16, 1, 16, 512), step=100, consumed=51200), topo(8, 8, 1, 16, 256), flag_mode=True,
               where="out/model_last")
    assert str(e.value) == (
        "cannot continue out/model_last with another global batch: global batch 512 samples per step vs 256 now. A "
        "different global batch changes the optimization, so it is not continued by default. To continue the same run "
        "here, keep --global_batch_size 512 (micro batch x 8 data-parallel ranks x accumulation: e.g. "
        "--micro_batch_size 16 gives accumulation 4). To continue with the new batch from the checkpoint's 51,200 "
        "consumed samples (data position kept by samples, the learning-rate schedule re-planned by samples), add "
        "--allow_batch_change")
    c = decide(raw(topo(16, 16, 1, 16, 512)), topo(8, 8, 1, 16, 256), flag_mode=True, allow_batch_change=True)
    assert c.kind == "batch_change" and "512 -> 256 samples per step" in c.notes[0]


# -- another global batch: the learning rate and the run's length by samples ---------------------------------
def test_the_lr_schedule_is_replanned_by_samples_after_a_batch_change():
    """Global batch 4 -> 8 at step 3 of a 12-step run (warm-up 4, decay to step 12): step n >= 3 is at
    3 + 2 (n - 3) steps of the first batch, and gets the original schedule's rate there; a later
    resume restores the clock from the state; a second change composes."""
    from ernie_mtl.config import OptimConfig
    from ernie_mtl.program.optim import WarmupLinearDecay, lr_at

    cfg = OptimConfig(max_lr=1e-3, min_lr=1e-5, warmup_rate=1 / 3, max_steps=12)
    original = [lr_at(n, max_lr=1e-3, min_lr=1e-5, warmup_steps=4, decay_steps=12) for n in range(12)]
    a = WarmupLinearDecay(cfg)
    for _ in range(3):
        a.step()
    saved = a.state_dict()
    b = WarmupLinearDecay(OptimConfig(max_lr=1e-3, min_lr=1e-5, warmup_rate=1 / 3, max_steps=7))  # the new plan
    b.set_state_dict(saved)
    b.rebase(3, 2.0)
    assert b.warmup_steps == 4 and b.decay_steps == 12  # the checkpoint's, in steps of the first batch
    rates = [b.last_lr]
    for _ in range(3):
        b.step()
        rates.append(b.last_lr)
    assert rates == pytest.approx([original[3], original[5], original[7], original[9]])
    c = WarmupLinearDecay(cfg)
    c.set_state_dict(b.state_dict())  # a later resume on the new batch
    assert c.clock == [3, 3.0, 2.0] and c.get_lr() == pytest.approx(original[9])
    c.rebase(6, 0.5)  # 8 -> 4 again: one step of the first batch per step
    c.step()
    assert c.last_lr == pytest.approx(original[10])


def test_flag_mode_runs_for_its_samples_after_a_batch_change():
    """A flag-mode run of 6 x 4 = 24 samples, changed to global batch 8 at step 3 (12 consumed): 2
    more steps (ceil(12 / 8)); unchanged, exactly --max_steps."""
    from ernie_mtl.dist.topology import Topology
    from ernie_mtl.planning.plan import ResumePoint, flag_mode_quota, flag_mode_steps

    four = Topology.create(1, micro_batch_size=2, global_batch_size=4)
    eight = Topology.create(1, micro_batch_size=2, global_batch_size=8)
    assert flag_mode_steps(24, four, None) == 6 and flag_mode_quota(6, four, None) == 12
    changed = ResumePoint(sampler={"base": [6, 3]})  # 6 micro-batches of 2 = 12 samples at step 3
    assert flag_mode_steps(24, eight, changed) == 5 and flag_mode_quota(5, eight, changed) == 6 + 2 * 4
    assert flag_mode_steps(26, eight, changed) == 5 and flag_mode_steps(29, eight, changed) == 6
