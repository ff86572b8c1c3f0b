"""The pretraining programs: they train, their loss, names, optimizer, schedule, test program and
weight loading; model resolution and config validation."""
import zlib  # noqa: F401  (before paddle)

import json
import re
from dataclasses import replace

import numpy as np
import pytest

from ernie_mtl.config import (ARCHITECTURES, AmpConfig, ConfigError, ModelConfig, OptimConfig, ParallelConfig,
                              field_help)
from ernie_mtl.program.optim import WarmupLinearDecay, lr_at
from helpers import make_batch, params, scope_and_exe

pytestmark = pytest.mark.usefixtures("static_mode")

TINY_ARCH = ARCHITECTURES["ernie-tiny-test"]
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)



@pytest.fixture(scope="module")
def tiny(build_programs):
    """Tiny ERNIE without dropout, default optimizer; shared by tests that never step its scheduler."""
    return build_programs(model=ModelConfig(model_name_or_path="ernie-tiny-test", **NO_DROPOUT),
                          optim=OptimConfig(max_steps=100))


# --------------------------------------------------------------------------------------- training

def test_tiny_ernie_trains_on_cpu_losses_fall_lr_follows_schedule(build_programs):
    optim = OptimConfig(max_lr=1e-3, min_lr=1e-4, max_steps=100, warmup_rate=0.05)
    p = build_programs(model=ModelConfig(model_name_or_path="ernie-tiny-test", **NO_DROPOUT), optim=optim)
    assert p.feed_names == ["input_ids", "segment_ids", "input_mask", "pretrain.masked_lm_positions",
                            "pretrain.masked_lm_labels", "pretrain.next_sentence_labels"]
    assert list(p.fetches) == ["loss", "mlm_loss", "nsp_loss", "lr"]
    scope, exe = scope_and_exe(p)
    feed = make_batch()
    history = []
    for step in range(8):
        loss, mlm, nsp, lr = exe.run(p.main, feed=p.feed(feed, step=step), fetch_list=list(p.fetches.values()),
                                     scope=scope)
        history.append(float(loss))
        assert float(loss) == pytest.approx(float(mlm) + float(nsp), rel=1e-6)
        assert float(lr) == pytest.approx(lr_at(step, max_lr=1e-3, min_lr=1e-4, warmup_steps=5, decay_steps=100),
                                          rel=1e-6)
        p.lr_scheduler.step()
    assert np.isfinite(history).all()
    assert all(b < a for a, b in zip(history, history[1:])), history
    assert history[-1] < history[0] - 0.2


def test_mlm_loss_counts_only_real_masked_tokens(tiny):
    import paddle

    p = tiny
    scope, exe = scope_and_exe(p)
    fetch = [p.mlm_loss, p.nsp_loss]
    few, many = (exe.run(p.test, feed=p.feed(make_batch(pad_slots=k)), fetch_list=fetch, scope=scope) for k in (1, 29))
    assert float(few[0]) == pytest.approx(float(many[0]), rel=1e-6)  # padding slots do not dilute the mean
    assert float(few[0]) > 6.0  # about ln(vocab 1000) for a fresh model, not 12/13 or 12/41 of it
    empty = make_batch(masked_per_seq=0, pad_slots=8)
    mlm, nsp = exe.run(p.test, feed=p.feed(empty), fetch_list=fetch, scope=scope)
    assert float(mlm) == 0.0 and np.isfinite(nsp)
    # the same numbers as the paddlenlp forward + our criterion in dygraph
    state = {s: np.array(scope.find_var(s).get_tensor()) for s in set(p.name_map.values())}
    feed = make_batch(pad_slots=5)
    static_mlm, static_nsp = exe.run(p.test, feed=p.feed(feed), fetch_list=fetch, scope=scope)
    with paddle.base.dygraph.guard():
        from paddlenlp.transformers import ErnieConfig, ErnieForPretraining

        from ernie_mtl.tasks.mlm import pretraining_losses

        arch = {k: v for k, v in p.arch.items() if k != "model_type"}
        model = ErnieForPretraining(ErnieConfig(**arch))
        model.set_state_dict({k: state[v] for k, v in p.paddlenlp_name_map.items()})
        model.eval()
        t = {k: paddle.to_tensor(v) for k, v in feed.items()}
        scores, seq_rel = model(t["input_ids"], token_type_ids=t["segment_ids"], attention_mask=t["input_mask"],
                                masked_positions=t["masked_lm_positions"])
        mlm, nsp = pretraining_losses(scores, seq_rel, t["masked_lm_labels"], t["next_sentence_labels"])
        ce = paddle.nn.functional.cross_entropy(scores[:12], t["masked_lm_labels"][:12])  # the 12 real ones
        dygraph_mlm, dygraph_nsp, plain_mean = float(mlm), float(nsp), float(ce)
    assert dygraph_mlm == pytest.approx(plain_mean, rel=1e-6)
    assert float(static_mlm) == pytest.approx(dygraph_mlm, rel=1e-5)
    assert float(static_nsp) == pytest.approx(dygraph_nsp, rel=1e-5)


@pytest.mark.slow
def test_without_binary_head_there_is_no_sentence_pair_feed_or_loss(build_programs):
    p = build_programs(model=ModelConfig(model_name_or_path="ernie-tiny-test", binary_head=False))
    assert "next_sentence_labels" not in p.feed_names and p.nsp_loss is None
    assert list(p.fetches) == ["loss", "mlm_loss", "lr"]
    scope, exe = scope_and_exe(p)
    feed = make_batch()
    del feed["next_sentence_labels"]
    loss, mlm = exe.run(p.main, feed=p.feed(feed), fetch_list=[p.loss, p.mlm_loss], scope=scope)
    assert float(loss) == float(mlm) and np.isfinite(loss)


@pytest.mark.slow
def test_bert_builds_and_runs(build_programs):
    p = build_programs(model=ModelConfig(model_type="bert", model_name_or_path="bert-tiny-test"))
    assert "bert.encoder.layers.1.linear2.weight" in p.name_map
    scope, exe = scope_and_exe(p)
    (loss,) = exe.run(p.main, feed=p.feed(make_batch()), fetch_list=[p.loss], scope=scope)
    assert np.isfinite(loss)


@pytest.mark.slow
def test_recompute_gives_the_same_training_as_without(build_programs):
    model = ModelConfig(model_name_or_path="ernie-tiny-test", **NO_DROPOUT)
    runs = []
    for use_recompute in (False, True):
        p = build_programs(model=model, parallel=ParallelConfig(micro_batch_size=4, use_recompute=use_recompute))
        scope, exe = scope_and_exe(p)
        for step in range(3):
            exe.run(p.main, feed=p.feed(make_batch(step), step=step), fetch_list=[p.loss], scope=scope)
            p.lr_scheduler.step()
        runs.append(params(p, scope))
    for name, value in runs[0].items():
        np.testing.assert_allclose(runs[1][name], value, rtol=1e-5, atol=1e-6, err_msg=name)


# ---------------------------------------------------------------------------------- test program

@pytest.mark.slow
def test_test_program_evaluates_without_side_effects_under_accumulation(build_programs):
    p = build_programs(model=ModelConfig(model_name_or_path="ernie-tiny-test", **NO_DROPOUT),
                       parallel=ParallelConfig(micro_batch_size=4, global_batch_size=8))
    ops = {op.type for op in p.test.global_block().ops}
    assert not ops & {"adamw", "conditional_block", "increment", "dropout_grad"}
    assert all(op.attr("is_test") for op in p.test.global_block().ops if op.type == "dropout")
    scope, exe = scope_and_exe(p)
    before = params(p, scope)
    feed = p.feed(make_batch())
    (evaluated,) = exe.run(p.test, feed=feed, fetch_list=[p.loss], scope=scope)
    for _ in range(2):  # evaluating must not advance gradient merge's step counter
        exe.run(p.test, feed=feed, fetch_list=[p.loss], scope=scope)
    (trained,) = exe.run(p.main, feed=feed, fetch_list=[p.loss], scope=scope)
    assert float(trained) == pytest.approx(float(evaluated), rel=1e-6)
    after_first = params(p, scope)
    assert all(np.array_equal(after_first[k], v) for k, v in before.items())  # 1 of 2 micro-batches: no update
    exe.run(p.main, feed=feed, fetch_list=[p.loss], scope=scope)
    assert not np.array_equal(params(p, scope)["linear_0.w_0"], before["linear_0.w_0"])


# ------------------------------------------------------------------------------- names, optimizer

def test_name_map_matches_paddlenlp_state_dict_and_covers_every_parameter(build_programs, tiny):
    import paddle

    p = tiny
    with paddle.base.dygraph.guard():
        from paddlenlp.transformers import ErnieConfig, ErnieForPretraining

        expected = ErnieForPretraining(ErnieConfig(**{k: v for k, v in TINY_ARCH.items() if k != "model_type"}))
        # the head's keys are ErnieForPretraining's cls.* keys under heads.pretrain.
        assert list(p.paddlenlp_name_map) == list(expected.state_dict())
    assert all(k.startswith(("ernie.", "heads.pretrain.")) for k in p.name_map)
    program_params = {v.name for v in p.main.global_block().all_parameters()}
    assert set(p.name_map.values()) == program_params  # no orphan (untied) decoder weight left
    assert len(program_params) == 46
    # tied weights share one static variable
    m = p.paddlenlp_name_map
    assert m["cls.predictions.decoder.weight"] == m["ernie.embeddings.word_embeddings.weight"]
    assert m["cls.predictions.decoder.bias"] == m["cls.predictions.decoder_bias"]
    # a second build gives the same names (fresh unique-name counters)
    assert build_programs().name_map == p.name_map


def test_adamw_decays_everything_but_biases_and_norms(tiny):
    p = tiny
    adamw = {op.input("Param")[0]: op for op in p.main.global_block().ops if op.type == "adamw"}
    decayed = {n for n, op in adamw.items() if op.attr("with_decay")}
    m = p.paddlenlp_name_map
    assert m["ernie.embeddings.word_embeddings.weight"] in decayed
    assert m["ernie.encoder.layers.0.linear1.weight"] in decayed
    assert m["cls.seq_relationship.weight"] in decayed
    for name in ("ernie.encoder.layers.0.linear1.bias", "ernie.encoder.layers.1.norm2.weight",
                 "ernie.embeddings.layer_norm.weight", "cls.predictions.decoder_bias",
                 "cls.predictions.layer_norm.bias"):
        assert m[name] not in decayed, name
    assert len(decayed) == 18  # 3 embeddings + 6 matrices per layer x 2 + pooler + LM transform + pair head
    assert set(adamw) == set(m.values())
    assert all(op.attr("coeff") == pytest.approx(OptimConfig().weight_decay) for op in adamw.values())


def test_global_norm_clipping_only_when_grad_clip_is_positive(build_programs, tiny):
    def norm_ops(p):
        return sum(op.type == "squared_l2_norm" for op in p.main.global_block().ops)
    assert OptimConfig().grad_clip == 1.0 and norm_ops(tiny) == 46
    assert norm_ops(build_programs(optim=OptimConfig(grad_clip=0.0, max_steps=10))) == 0


def test_learning_rate_schedule_values_and_exact_resume():
    cfg = OptimConfig(max_lr=1e-3, min_lr=1e-4, warmup_rate=0.1, max_steps=100, decay_steps=60)
    assert cfg.resolved_warmup_steps == 10
    assert replace(cfg, warmup_steps=3).resolved_warmup_steps == 3  # --warmup_steps wins over the rate
    expected = {0: 1e-4, 4: 5e-4, 9: 1e-3, 10: 1e-4 + 9e-4 * 49 / 50, 34: 1e-4 + 9e-4 * 25 / 50,
                58: 1e-4 + 9e-4 / 50, 59: 1e-4, 99: 1e-4, 500: 1e-4}
    for step, lr in expected.items():
        assert lr_at(step, max_lr=1e-3, min_lr=1e-4, warmup_steps=10, decay_steps=60) == pytest.approx(lr), step
    sched = WarmupLinearDecay(cfg)
    assert (sched.last_epoch, sched()) == (0, pytest.approx(1e-4))  # a fresh run's first update learns
    for _ in range(12):
        sched.step()
    state = json.loads(json.dumps(sched.state_dict()))  # as a checkpoint stores it
    resumed = WarmupLinearDecay(cfg)
    resumed.set_state_dict(state)
    for _ in range(5):
        assert resumed() == sched() and resumed.last_epoch == sched.last_epoch
        sched.step()
        resumed.step()
    assert WarmupLinearDecay(OptimConfig(warmup_rate=0.0, max_steps=10))() == pytest.approx(1e-5 + 9e-5 * 9 / 10)


def test_replanned_decay_reaches_min_lr_at_the_new_end_and_resumes():
    """A multi-task run that gets shorter (a target stopped early) re-aims the decay: from the rate of
    the current update, linearly to min_lr at the new horizon (hand-computed values)."""
    cfg = OptimConfig(max_lr=1.0, min_lr=0.1, warmup_rate=0.1, max_steps=100)  # warm-up 10, decay to step 100
    sched = WarmupLinearDecay(cfg)
    for _ in range(20):
        sched.step()
    at_20 = lr_at(20, max_lr=1.0, min_lr=0.1, warmup_steps=10, decay_steps=100)
    assert sched() == pytest.approx(at_20)
    sched.replan(40)  # the run now ends after 40 optimizer steps
    assert sched() == pytest.approx(at_20)  # the coming update keeps its rate
    rates = {}
    for step in range(21, 45):
        sched.step()
        rates[step] = sched()
    # update n = step + 1 gets min_lr at n = 40; 19 steps from 20 to 39
    assert rates[21] == pytest.approx(at_20 + (0.1 - at_20) * 1 / 19)
    assert rates[30] == pytest.approx(at_20 + (0.1 - at_20) * 10 / 19)
    assert rates[39] == pytest.approx(0.1) and rates[44] == pytest.approx(0.1)
    state = json.loads(json.dumps(sched.state_dict()))
    assert state["decay_steps"] == 40 and state["replan_step"] == 20
    resumed = WarmupLinearDecay(cfg)
    resumed.set_state_dict(state)
    assert resumed() == sched() and resumed.decay_steps == 40


# ------------------------------------------------------------------------------- pretrained weights

def _save_dygraph_model(path, seed=7, **arch_overrides):
    import paddle

    with paddle.base.dygraph.guard():
        from paddlenlp.transformers import ErnieConfig, ErnieForPretraining

        paddle.seed(seed)
        arch = {k: v for k, v in TINY_ARCH.items() if k != "model_type"}
        model = ErnieForPretraining(ErnieConfig(**{**arch, **arch_overrides}))
        model.save_pretrained(str(path))
        return {k: v.numpy() for k, v in model.state_dict().items()}


def test_pretrained_directory_round_trip_gives_identical_outputs(build_programs, tmp_path):
    import paddle

    from ernie_mtl.tasks.mlm import pretraining_losses

    state = _save_dygraph_model(tmp_path)
    p = build_programs(model=ModelConfig(model_name_or_path=str(tmp_path), **NO_DROPOUT))
    assert p.weights == tmp_path / "model_state.pdparams"
    scope, exe = scope_and_exe(p)  # initialize() loads the weights
    for structured, static in p.paddlenlp_name_map.items():
        np.testing.assert_array_equal(np.array(scope.find_var(static).get_tensor()), state[structured])
    feed = make_batch()
    static_out = exe.run(p.test, feed=p.feed(feed), fetch_list=[p.mlm_loss, p.nsp_loss], scope=scope)
    with paddle.base.dygraph.guard():
        from paddlenlp.transformers import ErnieConfig, ErnieForPretraining

        # not from_pretrained(): it asks fleet for a hybrid-parallel group once fleet is initialised
        model = ErnieForPretraining(ErnieConfig.from_pretrained(str(tmp_path)))
        model.set_state_dict(paddle.load(str(tmp_path / "model_state.pdparams")))
        model.eval()
        t = {k: paddle.to_tensor(v) for k, v in feed.items()}
        scores, seq_rel = model(t["input_ids"], token_type_ids=t["segment_ids"], attention_mask=t["input_mask"],
                                masked_positions=t["masked_lm_positions"])
        dygraph_out = [float(x) for x in pretraining_losses(scores, seq_rel, t["masked_lm_labels"],
                                                            t["next_sentence_labels"])]
    # the static forward calls the backbone and the head's parts separately (the one-engine forward), which
    # rounds a few ulps differently from paddlenlp's single call
    np.testing.assert_allclose([float(x) for x in static_out], dygraph_out, rtol=5e-6)


def test_loading_reports_missing_and_misshapen_weights_and_writes_nothing(tiny, tmp_path):
    import paddle

    from ernie_mtl.program.builder import load_pretrained_into_scope

    p = tiny
    scope, exe = scope_and_exe(p)
    before = params(p, scope)
    state = _save_dygraph_model(tmp_path)
    for key in ("cls.seq_relationship.weight", "cls.seq_relationship.bias"):
        del state[key]
    state["ernie.pooler.dense.weight"] = np.zeros((3, 3), "float32")
    paddle.save(state, str(tmp_path / "model_state.pdparams"))
    with pytest.raises(ConfigError) as e:
        load_pretrained_into_scope(tmp_path, p.paddlenlp_name_map, scope)
    assert e.value.problems == [
        f"{tmp_path / 'model_state.pdparams'} lacks 2 of the model's parameters: cls.seq_relationship.weight, "
        "cls.seq_relationship.bias",
        f"ernie.pooler.dense.weight: shape [3, 3] in {tmp_path / 'model_state.pdparams'} but [32, 32] in the "
        "model; the architecture flags differ from the weights' config"]
    assert all(np.array_equal(v, params(p, scope)[k]) for k, v in before.items())
    with pytest.raises(ConfigError, match="not found"):
        load_pretrained_into_scope(tmp_path / "nowhere", p.paddlenlp_name_map, scope)


def test_backbone_only_weights_load_by_prefix(tiny, tmp_path):
    import paddle

    from ernie_mtl.program.builder import load_pretrained_into_scope

    p = tiny
    scope, _ = scope_and_exe(p)
    state = _save_dygraph_model(tmp_path)
    renamed = {k[len("ernie."):] if k.startswith("ernie.") else k: v for k, v in state.items()}
    paddle.save(renamed, str(tmp_path / "model_state.pdparams"))
    written = load_pretrained_into_scope(tmp_path, p.paddlenlp_name_map, scope)
    assert sorted(written) == sorted(set(p.name_map.values()))
    word = p.name_map["ernie.embeddings.word_embeddings.weight"]
    np.testing.assert_array_equal(np.array(scope.find_var(word).get_tensor()),
                                  state["ernie.embeddings.word_embeddings.weight"])


# -------------------------------------------------------------------------- resolution and config

def test_known_names_resolve_without_weights_and_accept_overrides():
    r = ModelConfig(model_name_or_path="ernie-1.0-base-zh").resolve()
    assert r.weights is None
    assert {k: r.arch[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size",
                                   "type_vocab_size", "max_position_embeddings")} == {
        "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "vocab_size": 18000,
        "type_vocab_size": 2, "max_position_embeddings": 513}
    r = ModelConfig(model_name_or_path="ernie-tiny-test", vocab_size=1234, hidden_dropout_prob=0.0).resolve()
    assert (r.arch["vocab_size"], r.arch["hidden_dropout_prob"], r.arch["hidden_size"]) == (1234, 0.0, 32)


def test_model_resolution_errors_never_download(tmp_path):
    with pytest.raises(ConfigError) as e:
        ModelConfig(model_name_or_path="ernie-3.0-base-zh").resolve()
    assert str(e.value).startswith("--model_name_or_path 'ernie-3.0-base-zh' is neither a local directory nor a "
                                   "known architecture [")
    assert ("Pretrained weights are never downloaded at run time: on a machine with network access run "
            "`ErnieForPretraining.from_pretrained('ernie-3.0-base-zh').save_pretrained('DIR')`") in str(e.value)
    with pytest.raises(ConfigError, match=r"^--model_name_or_path './missing': no such directory"):
        ModelConfig(model_name_or_path="./missing").resolve()
    (tmp_path / "config.json").write_text(json.dumps({**TINY_ARCH}))
    with pytest.raises(ConfigError, match=re.escape(f"--model_name_or_path {tmp_path}: model_state.pdparams is "
                                                    "missing, so there are no weights to load")):
        ModelConfig(model_name_or_path=str(tmp_path)).resolve()
    (tmp_path / "model_state.pdparams").write_bytes(b"")
    with pytest.raises(ConfigError, match="--model_type 'bert' does not match"):
        ModelConfig(model_type="bert", model_name_or_path=str(tmp_path)).resolve()
    with pytest.raises(ConfigError) as e:
        ModelConfig(model_name_or_path=str(tmp_path), vocab_size=999).resolve()
    assert str(e.value) == (f"--vocab_size 999 differs from 1000 in {tmp_path} whose weights are loaded; drop "
                            "--vocab_size (or start from a name to train from scratch)")


def test_config_slices_report_every_problem_with_flag_and_fix():
    with pytest.raises(ConfigError) as e:
        OptimConfig(max_lr=1e-5, min_lr=5e-5, warmup_rate=0.5, max_steps=100, decay_steps=40, grad_clip=-1).validate()
    assert e.value.problems == [
        "--min_lr 5e-05 must be within [0, --max_lr 1e-05], e.g. 1e-5",
        "--decay_steps 40 must be greater than the warm-up steps 50 (--warmup_rate 0.5 x --max_steps 100)",
        "--grad_clip -1 must be >= 0 (0 disables clipping)"]
    with pytest.raises(ConfigError) as e:
        AmpConfig(amp_dtype="fp8", amp_level="O3", custom_white_list=("softmax",),
                  custom_black_list=("softmax",)).validate()
    assert len(e.value.problems) == 3 and e.value.problems[0].startswith("--amp_dtype 'fp8' is not supported")
    with pytest.raises(ConfigError) as e:
        ModelConfig(model_type="gpt", hidden_size=30, num_attention_heads=4, hidden_dropout_prob=1.0).validate()
    assert e.value.problems == [
        "--model_type 'gpt' is not supported; use one of ['ernie', 'bert']",
        "--hidden_size 30 must be divisible by --num_attention_heads 4",
        "--hidden_dropout_prob 1.0 must be within [0, 1), e.g. 0.1"]
    defaults = OptimConfig()
    assert defaults.max_lr > defaults.min_lr
    for cls in (ModelConfig, ParallelConfig, AmpConfig, OptimConfig):
        assert all(help_text.endswith(".") for help_text in field_help(cls).values()), cls


def test_build_checks_fleet_world_against_topology(static_mode, tmp_path):
    from ernie_mtl.program.builder import build_programs
    from ernie_mtl.dist.topology import Topology, build_strategy, init_fleet
    from helpers import pretrain_task, tiny_vocab_file

    init_fleet(Topology.create(1, micro_batch_size=1))
    topo = Topology.create(2, micro_batch_size=1)
    with pytest.raises(ValueError, match="fleet runs 1 workers but the topology has 2"):
        build_programs(ModelConfig(model_name_or_path="ernie-tiny-test"), OptimConfig(),
                       build_strategy(topo, ParallelConfig(), AmpConfig()), topo,
                       [pretrain_task(tiny_vocab_file(tmp_path))], seed=1)
