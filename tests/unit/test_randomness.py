"""Training randomness and on-device multi-task state, checked on built programs (the defects these
tests guard against: dropout was frozen, every same-shape parameter started equal, idle heads and the
EMA went through the host).

Each test here fails on the code before the fix: masks were equal across steps and layers
(`fix_seed`), q/k/v and every layer started with equal weights, idle heads were restored from host
copies (no SkipUpdate in the program), the pooler was never frozen, a task named `debias` lost
weight decay, and the CRF's Viterbi decode ran inside the training program."""
import zlib  # noqa: F401  (before paddle)

import functools

import numpy as np
import pytest

from ernie_mtl.config import AmpConfig, ModelConfig, OptimConfig, ParallelConfig
from ernie_mtl.program.randomness import DROPOUT_SEEDS, draw_dropout_seeds, dropout_ops, parameter_seed
from helpers import make_batch, params, scope_and_exe

pytestmark = pytest.mark.usefixtures("static_mode")

DROP = dict(hidden_dropout_prob=0.5, attention_probs_dropout_prob=0.5)


def tiny_model(**kw):
    return ModelConfig(model_name_or_path="ernie-tiny-test", **kw)


# ------------------------------------------------------------------------------------------ dropout
def test_dropout_masks_differ_across_steps_slots_and_layers(build_programs):
    p = build_programs(model=tiny_model(**DROP))
    drops = dropout_ops(p.main)
    assert p.dropout_seeds == len(drops) >= 6
    masks = [op.output("Mask")[0] for op in drops]
    scope, exe = scope_and_exe(p)
    feed = make_batch()

    def run(**where):
        return [np.array(v) for v in exe.run(p.main, feed=p.feed(feed, **where), fetch_list=masks, scope=scope)]

    first, again = run(step=0), run(step=0)
    for m0, m1 in zip(first, again):  # a pure function of (seed, step, slot, op)
        np.testing.assert_array_equal(m0, m1)
    for other in (run(step=1), run(step=0, slot=1), run(step=0, seed=2)):
        for k, (m0, m1) in enumerate(zip(first, other)):
            assert not np.array_equal(m0, m1), k
    by_shape = {}
    for k, m in enumerate(first):
        by_shape.setdefault(m.shape, []).append(k)
    same_shape = [ks for ks in by_shape.values() if len(ks) > 1]
    assert same_shape  # e.g. the hidden dropouts of layer 0 and layer 1
    for ks in same_shape:
        for a, b in zip(ks, ks[1:]):
            assert not np.array_equal(first[a], first[b]), (a, b)
    kept = np.mean([m.mean() for m in first])
    assert 0.4 < kept < 0.6  # dropout 0.5


def test_seeds_are_distinct_per_op_and_reproducible():
    a = draw_dropout_seeds(1234, 7, 1, 40)
    assert a.dtype == np.int32 and len(set(a.tolist())) == 40 and (a > 0).all()
    np.testing.assert_array_equal(a, draw_dropout_seeds(1234, 7, 1, 40))
    assert not np.array_equal(a, draw_dropout_seeds(1234, 8, 1, 40))
    assert not np.array_equal(a, draw_dropout_seeds(1234, 7, 2, 40))


def test_a_slot_is_the_same_micro_batch_on_any_layout():
    """Slot = micro-batch x data world + data rank: 2 ranks x 1 micro-batch, 1 rank x 2 micro-batches
    and 2 ranks x 2 micro-batches number the global batch's micro-batches 0.. in all-reduce order, so
    the seeds of a slot (and the examples it reads) do not depend on the layout."""
    from ernie_mtl.program.randomness import slot_of

    assert [slot_of(0, r, 2) for r in (0, 1)] == [0, 1]
    assert [slot_of(m, 0, 1) for m in (0, 1)] == [0, 1]
    assert sorted(slot_of(m, r, 2) for m in (0, 1) for r in (0, 1)) == [0, 1, 2, 3]
    assert slot_of(1, 0, 2) == 2  # rank 0's second micro-batch runs after both ranks' first
    with pytest.raises(ValueError):
        slot_of(0, 2, 2)


@pytest.mark.slow
def test_dropout_changes_the_loss_and_recompute_replays_the_same_masks(build_programs):
    losses = {}
    for name, model, parallel in (("off", tiny_model(), ParallelConfig(micro_batch_size=4)),
                                  ("on", tiny_model(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1),
                                   ParallelConfig(micro_batch_size=4)),
                                  ("on+recompute",
                                   tiny_model(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1),
                                   ParallelConfig(micro_batch_size=4, use_recompute=True))):
        if name == "off":
            model = tiny_model(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        p = build_programs(model=model, parallel=parallel)
        scope, exe = scope_and_exe(p)
        run = []
        for step in range(3):
            (loss,) = exe.run(p.main, feed=p.feed(make_batch(step), step=step), fetch_list=[p.loss], scope=scope)
            run.append(float(np.asarray(loss).reshape(-1)[0]))
            p.lr_scheduler.step()
        losses[name] = (run, params(p, scope))
    assert losses["off"][0] != losses["on"][0]
    # recompute re-runs each layer's forward in the backward pass with the same Seed inputs: same masks
    assert losses["on+recompute"][0] == losses["on"][0]
    for name, value in losses["on"][1].items():
        np.testing.assert_array_equal(losses["on+recompute"][1][name], value, err_msg=name)


def test_gpu_program_feeds_every_dropout_a_cpu_seed_and_recompute_adds_none(build_programs):
    """Rank 1 of 2, sharding 2, fp16 AMP, accumulation 2, recompute: the seeds still come from the
    fed vector, split on the CPU (no `seed` op of recompute's own, no fixed seed)."""
    parallel = ParallelConfig(use_sharding=True, sharding_degree=2, micro_batch_size=2, global_batch_size=8,
                              use_recompute=True)
    p = build_programs(world=2, rank=1, parallel=parallel, amp=AmpConfig(use_amp=True), model=tiny_model(**DROP))
    block = p.main.global_block()
    split = [op for op in block.ops if op.type == "split" and DROPOUT_SEEDS in op.input_arg_names]
    assert len(split) == 1 and split[0].attr("op_device") == "cpu"
    seeds = set(split[0].output("Out"))
    drops = [op for op in block.ops if op.type == "dropout"]
    assert p.dropout_seeds == len(seeds) and len(drops) == 2 * len(seeds)  # forward + recompute's replay
    used = [op.input("Seed")[0] for op in drops]
    assert all(used.count(s) == 2 for s in seeds)  # each replay reads its forward's seed: the same mask
    assert not any(op.attr("fix_seed") for op in drops)
    assert not [op for b in p.main.blocks for op in b.ops if op.type == "seed"]
    assert any(op.type == "dropout_grad" for op in block.ops)
    assert not any(DROPOUT_SEEDS in op.input_arg_names for op in p.test.global_block().ops)


# -------------------------------------------------------------------------------- initial weights
@pytest.mark.slow
def test_every_parameter_starts_from_its_own_seed(build_programs):
    p = build_programs(model=tiny_model())
    scope, _ = scope_and_exe(p)
    m = p.name_map
    value = {k: np.array(scope.find_var(m[k]).get_tensor()) for k in m}
    q0, k0, v0 = (value[f"ernie.encoder.layers.0.self_attn.{x}_proj.weight"] for x in "qkv")
    q1 = value["ernie.encoder.layers.1.self_attn.q_proj.weight"]
    assert not np.array_equal(q0, k0) and not np.array_equal(k0, v0) and not np.array_equal(q0, q1)
    assert 0.015 < q0.std() < 0.025  # still the architecture's initializer (truncated normal, std 0.02)
    again = build_programs(model=tiny_model())
    scope2, _ = scope_and_exe(again)
    q_name = "ernie.encoder.layers.0.self_attn.q_proj.weight"
    np.testing.assert_array_equal(np.array(scope2.find_var(again.name_map[q_name]).get_tensor()), q0)
    other = build_programs(model=tiny_model(), seed=2)
    scope3, _ = scope_and_exe(other)
    assert not np.array_equal(np.array(scope3.find_var(other.name_map[q_name]).get_tensor()), q0)
    assert parameter_seed(1, "a") != parameter_seed(1, "b") and parameter_seed(1, "a") == parameter_seed(1, "a")


# ------------------------------------------------------------------------- multi-task: idle heads
SPECIAL = ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"]
CHARS = list("好坏天气很不错今日我你他是的了")


@pytest.fixture
def task_files(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(SPECIAL + CHARS) + "\n", encoding="utf-8")
    rng = np.random.default_rng(0)
    rows = ["label\ttext_a"] + [f"{i % 2}\t{''.join(rng.choice(CHARS, 6))}" for i in range(16)]
    (tmp_path / "cls.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    rows = ["text_a\tlabel"]
    for _ in range(16):
        chars = rng.choice(CHARS, 5)
        rows.append("\x02".join(chars) + "\t" + "\x02".join(rng.choice(list("BMES"), 5)))
    (tmp_path / "seg.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    (tmp_path / "labels.json").write_text('{"B": 0, "M": 1, "E": 2, "S": 3}', encoding="utf-8")
    return tmp_path


def make_tasks(root, *, cls_name="sentiment", use_crf=False):
    from ernie_mtl.tasks.base import TaskContext, TaskSpec, get_task_type

    ctx = TaskContext(vocab_file=str(root / "vocab.txt"), seed=3, log=lambda s: None)
    cls, seg = get_task_type("cls"), get_task_type("seq_label")
    a = cls(TaskSpec(name=cls_name, reader="cls", index=0, max_seq_len=16, batch_size=4,
                     train_file=str(root / "cls.tsv"), options={**{k: o.default for k, o in cls.options.items()},
                                                                "n_classes": 2}), ctx)
    b = seg(TaskSpec(name="wordseg", reader="seq_label", index=1, max_seq_len=16, batch_size=4,
                     train_file=str(root / "seg.tsv"),
                     options={**{k: o.default for k, o in seg.options.items()}, "label_map": str(root / "labels.json"),
                              "use_crf": use_crf}), ctx)
    return [a, b]


def build_mtl(tasks, *, world=1, rank=0, gpu=False, parallel=None, amp=None, dropout=0.1, ema_decay=None):
    from ernie_mtl.dist.compat import emulate_gpu_program
    from ernie_mtl.program.builder import build_programs as build_multitask_programs
    from ernie_mtl.dist.topology import Topology, build_strategy, init_fleet

    parallel = parallel or ParallelConfig(micro_batch_size=4)
    amp = amp or AmpConfig()
    model = tiny_model(vocab_size=len(SPECIAL) + len(CHARS), hidden_dropout_prob=dropout,
                       attention_probs_dropout_prob=dropout)
    optim = OptimConfig(max_lr=1e-2, min_lr=1e-3, max_steps=50, warmup_rate=0.0, weight_decay=0.1)
    topo = Topology.from_config(parallel, world)
    strategy = functools.partial(build_strategy, topo, parallel, amp)
    build = functools.partial(build_multitask_programs, model, optim, strategy, topo, tasks, seed=1, amp_cfg=amp,
                              ema_decay=ema_decay)
    if gpu or world > 1:
        with emulate_gpu_program(rank, world):
            return build()
    init_fleet(topo)
    return build()


def _persistables(p, scope, group):
    """Every persistable variable of a group: parameters, moments, beta powers, master weights, merge buffers."""
    names = {v.name for v in p.main.list_vars() if v.persistable}
    held = [n for n in names if any(n == q or n.startswith(q + "_") or n.startswith(q + "@") for q in group.params)]
    return {n: np.array(scope.find_var(n).get_tensor()) for n in sorted(held)
            if scope.find_var(n) is not None and scope.find_var(n).get_tensor()._is_initialized()}


def test_idle_groups_are_heads_and_the_pooler_and_stay_bitwise_frozen(task_files):
    import paddle

    from ernie_mtl.program.forward import make_feed
    from ernie_mtl.program.randomness import draw_dropout_seeds

    tasks = make_tasks(task_files)
    p = build_mtl(tasks, parallel=ParallelConfig(micro_batch_size=4, global_batch_size=8))  # accumulation 2
    groups = {g.name: g for g in p.freeze.groups}
    assert set(groups) == {"sentiment", "wordseg"}  # named after their users
    m = p.name_map
    # the pooler is frozen with the pooled-output head: only `sentiment` (cls) reads it, not wordseg
    assert {m["ernie.pooler.dense.weight"], m["heads.sentiment.weight"]} <= set(groups["sentiment"].params)
    assert m["heads.wordseg.emission.weight"] in groups["wordseg"].params
    assert not {m["ernie.encoder.layers.0.linear1.weight"], m["ernie.embeddings.word_embeddings.weight"]} & {
        q for g in groups.values() for q in g.params}  # what every task reads is never frozen
    data = [t.load("train") for t in tasks]
    scope = paddle.static.Scope()
    exe = paddle.static.Executor(paddle.CPUPlace())
    p.initialize(exe, scope)

    def step(n, drawn):
        for micro, i in enumerate(drawn):
            batch = tasks[i].collate([data[i].get(j) for j in range(4 * micro, 4 * micro + 4)])
            feed = make_feed(tasks, i, batch)
            feed.update(p.freeze.feed([tasks[k].spec.name for k in drawn]))
            feed[DROPOUT_SEEDS] = draw_dropout_seeds(1, n, micro, p.dropout_seeds)
            exe.run(p.main, feed=feed, fetch_list=[p.fwd.loss], scope=scope)
            p.lr_scheduler.step() if micro == len(drawn) - 1 else None

    seen = {"frozen": 0, "moved": 0}
    for n, drawn in enumerate([(1, 1), (0, 1), (1, 1), (0, 0), (1, 1)]):  # accumulation mixes tasks in a step
        before = {g: _persistables(p, scope, groups[g]) for g in groups}
        step(n, drawn)
        names = {tasks[i].spec.name for i in drawn}
        for g, group in groups.items():
            after = _persistables(p, scope, group)
            assert after.keys() == before[g].keys() and len(after) >= 10  # weight+bias with 4 states each
            changed = [k for k in after if not np.array_equal(after[k], before[g][k])]
            if set(group.users) & names:
                assert changed, (n, g)
                seen["moved"] += 1
            else:
                assert changed == [], (n, g, changed)
                seen["frozen"] += 1
    assert seen == {"frozen": 4, "moved": 6}


def test_gpu_amp_o2_program_skips_idle_updates_together_with_found_inf(task_files):
    """The program a GPU rank runs with fp16 O2 (master weights) and accumulation: every frozen
    parameter's adamw op takes SkipUpdate = found_inf (copied to the CPU) OR its group's CPU flag."""
    tasks = make_tasks(task_files)
    p = build_mtl(tasks, world=2, gpu=True, amp=AmpConfig(use_amp=True, amp_level="O2"),
                  parallel=ParallelConfig(micro_batch_size=4, global_batch_size=16))
    ops = [op for b in p.main.blocks for op in b.ops]
    ors = {op.output("Out")[0]: op for op in ops if op.type == "logical_or"}
    assert ors and all(op.attr("op_device") == "cpu" for op in ors.values())
    flags = set(p.freeze.flag_vars.values())
    adamw = {op.input("Param")[0]: op for op in ops if op.type == "adamw"}
    import paddle

    frozen = {q for g in p.freeze.groups for q in g.params}
    mastered = 0
    for param, op in adamw.items():
        skip = op.input("SkipUpdate")
        if param in frozen:
            assert skip[0] in ors and set(ors[skip[0]].input_arg_names) & flags
            if p.main.global_block().var(param).dtype == paddle.float16:  # O2: the master weight is skipped too
                assert op.input("MasterParam") and op.output("MasterParamOut")
                mastered += 1
        else:
            assert skip and skip[0] not in ors  # found_inf alone (the encoder is never frozen)
    assert mastered >= 2
    assert any(op.type == "conditional_block" for op in ops) and any(op.type == "cast" for op in ops)


def test_coverage_check_fails_a_program_whose_update_ignores_the_flags(task_files):
    import paddle
    from paddle.utils import unique_name

    from ernie_mtl.program.idle_heads import FreezeCoverageError, check_coverage, plan_freeze
    from ernie_mtl.program.forward import build_forward as build_multitask_forward

    tasks = make_tasks(task_files)
    main, startup = paddle.static.Program(), paddle.static.Program()
    arch = {k: v for k, v in tiny_model(vocab_size=len(SPECIAL) + len(CHARS)).resolve().arch.items()
            if k != "model_type"}
    with paddle.static.program_guard(main, startup), unique_name.guard():
        fwd = build_multitask_forward("ernie", arch, tasks)
        plan = plan_freeze(main, fwd.task_losses, fwd.name_map)
        paddle.optimizer.AdamW(learning_rate=1e-3).minimize(fwd.loss)  # no SkipUpdate wiring
    with pytest.raises(FreezeCoverageError, match="SkipUpdate"):
        check_coverage(main, plan)


# ------------------------------------------------------------------------- smaller defects (#9 item 5)
def test_weight_decay_follows_the_parameter_role_not_its_name(task_files):
    tasks = make_tasks(task_files, cls_name="debias")
    p = build_mtl(tasks)
    adamw = {op.input("Param")[0]: op for b in p.main.blocks for op in b.ops if op.type == "adamw"}
    m = p.name_map
    assert adamw[m["heads.debias.weight"]].attr("with_decay")  # the substring rule dropped it
    assert not adamw[m["heads.debias.bias"]].attr("with_decay")
    assert not adamw[m["ernie.encoder.layers.0.norm1.weight"]].attr("with_decay")
    assert adamw[m["ernie.encoder.layers.0.linear1.weight"]].attr("with_decay")


def test_crf_decode_is_in_the_evaluation_program_only(task_files):
    p = build_mtl(make_tasks(task_files, use_crf=True))
    train_ops = {op.type for op in p.main.global_block().ops}
    test_ops = {op.type for op in p.test.global_block().ops}
    assert "linear_chain_crf" in train_ops and "crf_decoding" not in train_ops
    assert "crf_decoding" in test_ops
    assert "argmax" not in train_ops and "arg_max" not in train_ops  # the cls prediction is gone too


# --------------------------------------------------------------------------------------------- EMA
@pytest.mark.slow
def test_device_ema_matches_the_formula_swaps_in_and_restores(task_files):
    import paddle

    from ernie_mtl.program.ema import ema_name, warmup_decay
    from ernie_mtl.program.forward import make_feed

    tasks = make_tasks(task_files)
    p = build_mtl(tasks, dropout=0.0, ema_decay=0.9)
    data = [t.load("train") for t in tasks]
    scope = paddle.static.Scope()
    exe = paddle.static.Executor(paddle.CPUPlace())
    p.initialize(exe, scope)
    tracked = p.ema.params
    assert set(tracked) == set(p.name_map.values())
    expected = {}
    for n in range(5):
        batch = tasks[n % 2].collate([data[n % 2].get(j) for j in range(4)])
        feed = {**make_feed(tasks, n % 2, batch), **p.freeze.feed([tasks[n % 2].spec.name]),
                DROPOUT_SEEDS: draw_dropout_seeds(1, n, 0, p.dropout_seeds)}
        exe.run(p.main, feed=feed, fetch_list=[p.fwd.loss], scope=scope)
        p.lr_scheduler.step()
        p.ema.update(exe, n, scope=scope)
        d = np.float32(warmup_decay(0.9, n))
        for q in tracked:
            w = np.array(scope.find_var(q).get_tensor())
            expected[q] = w.copy() if n == 0 else expected[q] * d + w * np.float32(1.0 - d)
    trained = {q: np.array(scope.find_var(q).get_tensor()) for q in tracked}
    for q in tracked:
        np.testing.assert_allclose(np.array(scope.find_var(ema_name(q)).get_tensor()), expected[q], rtol=1e-6,
                                   atol=1e-7, err_msg=q)
    word = p.name_map["ernie.embeddings.word_embeddings.weight"]
    assert not np.allclose(expected[word], trained[word])
    with p.ema.swapped_in(exe, scope=scope):
        for q in tracked:
            np.testing.assert_array_equal(np.array(scope.find_var(q).get_tensor()),
                                          np.array(scope.find_var(ema_name(q)).get_tensor()))
    for q in tracked:
        np.testing.assert_array_equal(np.array(scope.find_var(q).get_tensor()), trained[q])


def test_device_ema_builds_with_gradient_accumulation(task_files):
    """Gradient merge's conditional block adds STEP_SCOPES variables (no shape) to the block: the EMA
    asked every variable of the block for its shape and failed to build with accumulation > 1."""
    p = build_mtl(make_tasks(task_files), dropout=0.0, ema_decay=0.9,
                  parallel=ParallelConfig(micro_batch_size=4, global_batch_size=8))
    assert set(p.ema.params) == set(p.name_map.values())
    persistable = {v.name for v in p.main.list_vars() if v.persistable}
    assert any(n.endswith("@GRAD@GradientMerge") for n in persistable)
    assert all(f"{q}@EMA" in persistable for q in p.ema.params)
