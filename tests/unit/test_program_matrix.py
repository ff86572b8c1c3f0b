"""Every task type x sharding 1/2 x accumulation 1/2 x AMP builds, for every rank, the program a GPU
rank would run (built on CPU, never run), with the idle-head freeze covering each parameter's whole
optimizer state.

Why a cross product: a sharded multi-task run with gradient accumulation failed before its first
step ("2 optimizer ops update it, expected 1", rank 1 only) while each of sharding, accumulation and
multi-task had its own passing test. Cause: fleet's sharding gradient merge (Paddle 2.6.2,
`ShardingOptimizer._sharding_gradient_merge`) copies the optimizer ops into a scratch block that
nothing runs, then builds the real conditional block from the copies; the coverage check counted
the scratch copies. Checks over "every op of the program" now read the blocks that can run
(`program_utils.live_blocks`).

A second fault of the same combination, found by running it: that conditional block declares no
inputs (`Input: []`), so the executor freed the idle-head flags (computed in the global block, read
only by the block's AdamW ops) before the block ran: "Tensor holds no memory ... adamw" on the
first step. The builder now declares them (`program_utils.declare_sub_block_inputs`); the matrix
checks that every such read is declared, and tests/e2e/test_multitask.py runs the combination
with two processes.

Each kind of task is paired with a second task (so that both have idle groups): `seq_label` with a
CRF, or `cls` when the kind itself is the CRF tagger. AMP: off, float16 O1, float16 O2 (O2 with
sharding is refused by the configuration: fleet 2.6.2 cannot build it)."""
import zlib  # noqa: F401  (before paddle)

import functools
import os
import json

import pytest

from ernie_mtl.config import AmpConfig, ModelConfig, OptimConfig, ParallelConfig

pytestmark = pytest.mark.usefixtures("static_mode")

SPECIAL = ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"]
CHARS = list("好坏天气很不错今日我你他是的了")
KINDS = ("pretrain_pair", "pretrain", "mlm", "cls", "match", "seq_label", "seq_label_crf", "mrc")
# (sharding degree, accumulation, amp level or None); world size 2
TOPOLOGIES = [(s, a, amp) for s in (1, 2) for a in (1, 2) for amp in (None, "O1", "O2") if not (s == 2 and amp == "O2")]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("matrix")
    (root / "vocab.txt").write_text("\n".join(SPECIAL + CHARS) + "\n", encoding="utf-8")
    (root / "labels.json").write_text(json.dumps({"B": 0, "M": 1, "E": 2, "S": 3}), encoding="utf-8")
    return root


def make_task(kind, root, name, index):
    """A task of `kind` whose program can be built (its data files are never read here)."""
    from ernie_mtl.config import TaskSpec
    from ernie_mtl.tasks.base import TaskContext, get_task_type

    reader = {"pretrain_pair": "pretrain", "seq_label_crf": "seq_label"}.get(kind, kind)
    cls = get_task_type(reader)
    options = {k: o.default for k, o in cls.options.items()}
    options.update({"pretrain_pair": {"binary_head": True}, "pretrain": {"binary_head": False},
                    "cls": {"n_classes": 3}, "seq_label": {"label_map": str(root / "labels.json")},
                    "seq_label_crf": {"label_map": str(root / "labels.json"), "use_crf": True}}.get(kind, {}))
    spec = TaskSpec(name=name, reader=reader, index=index, train_file=str(root / "unused"), max_seq_len=32,
                    batch_size=4, options=options)
    return cls(spec, TaskContext(vocab_file=str(root / "vocab.txt"), seed=3, log=lambda s: None))


def build(tasks, *, rank, sharding, acc, amp, dump_dir=None, fuse=False):
    from ernie_mtl.program.builder import build_programs
    from ernie_mtl.dist.compat import emulate_gpu_program
    from ernie_mtl.dist.topology import Topology, build_strategy

    parallel = ParallelConfig(use_sharding=sharding > 1, sharding_degree=sharding, micro_batch_size=4,
                              global_batch_size=4 * 2 * acc)
    amp_cfg = AmpConfig(use_amp=True, amp_level=amp) if amp else AmpConfig()
    model = ModelConfig(model_name_or_path="ernie-tiny-test", vocab_size=len(SPECIAL) + len(CHARS),
                        hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    optim = OptimConfig(max_lr=1e-3, min_lr=1e-4, max_steps=20, warmup_rate=0.1, weight_decay=0.01,
                        fuse_optimizer=fuse)
    topo = Topology.from_config(parallel, 2)
    strategy = functools.partial(build_strategy, topo, parallel, amp_cfg)
    with emulate_gpu_program(rank, 2):
        return build_programs(model, optim, strategy, topo, tasks, seed=1, amp_cfg=amp_cfg, anomaly_guard=True,
                              dump_dir=dump_dir)


def parameter_users(*args):
    from ernie_mtl.program.idle_heads import parameter_users as users

    return users(*args)


def assert_defined_before_use(program, where):
    """Every input of every live op is persistable, fed, or written earlier (in its block or, for a
    sub-block, before the control-flow op that runs it): an update reading a flag computed after it
    reads an empty tensor at run time."""
    from ernie_mtl.program.edits import live_blocks

    persistable = {v.name for v in program.list_vars() if v.persistable}
    fed = {v.name for v in program.list_vars() if getattr(v.desc, "need_check_feed", lambda: False)()}
    fed |= {n for op in program.global_block().ops if op.type == "feed" for n in op.output_arg_names}
    written_before_sub = {}
    for block in live_blocks(program):
        written = set(written_before_sub.get(block.idx, set()))
        for op in block.ops:
            for name in op.input_arg_names:
                var = block._find_var_recursive(name)
                if name in persistable or name in fed or name in written or var is None:
                    continue
                if var.desc.need_check_feed() or (block.idx == 0
                                                  and not any(name in o.output_arg_names for o in block.ops)):
                    continue  # a data variable
                assert False, (where, f"block {block.idx}: {op.type} reads {name} before it is written")
            if op.has_attr("sub_block"):
                written_before_sub[op._block_attr_id("sub_block")] = set(written)
            written.update(op.output_arg_names)


def outer_reads(program, sub):
    """Non-persistable variables of the global block that ops of `sub` read."""
    block = program.global_block()
    made = {n for op in sub.ops for n in op.output_arg_names}
    return {n for op in sub.ops for n in op.input_arg_names
            if n not in made and block.has_var(n) and not block.var(n).persistable}


def live_ops(program):
    from ernie_mtl.program.edits import live_blocks

    return [op for block in live_blocks(program) for op in block.ops]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.slow
def test_every_topology_builds_for_every_rank_with_the_freeze_covering_the_optimizer_state(kind, root):
    partner = ("cls", "intent") if kind == "seq_label_crf" else ("seq_label_crf", "ner")
    trained = None  # parameters some task's loss reaches (e.g. no pooler without a pooled-output task)
    for sharding, acc, amp in TOPOLOGIES:  # sharding 1 first
        by_rank = []
        for rank in (range(2) if sharding > 1 else (1,)):  # data parallel ranks build the same program
            where = f"{kind} + {partner[0]}, sharding {sharding}, accumulation {acc}, amp {amp}, rank {rank}"
            tasks = [make_task(kind, root, "main", 0), make_task(partner[0], root, partner[1], 1)]
            p = build(tasks, rank=rank, sharding=sharding, acc=acc, amp=amp)  # check_coverage runs inside
            ops = live_ops(p.main)
            types = [op.type for op in ops]
            updates = [op for op in ops if op.type == "adamw"]
            updated = [op.input("Param")[0] for op in updates]
            assert len(updated) == len(set(updated)), where  # one live update per parameter
            if trained is None:
                users = parameter_users(p.main, p.fwd.task_losses, set(p.name_map.values()))
                trained = {q for q, u in users.items() if u}
            by_rank.append(set(updated))
            # every frozen parameter this rank updates takes its group's flag as SkipUpdate
            frozen = {q: g for g in p.freeze.groups for q in g.params}
            assert {g.name for g in p.freeze.groups} >= {"main", partner[1]}, where
            ors = {op.output("Out")[0]: set(op.input_arg_names) for op in ops if op.type == "logical_or"}

            def gated_by(var):  # the flags a SkipUpdate variable ORs together
                return {var} | set().union(*(gated_by(v) for v in ors.get(var, ())))

            for op in updates:  # every update skips a non-finite step; a frozen one also its idle group
                gates = gated_by(op.input("SkipUpdate")[0])
                assert p.anomaly is not None and p.anomaly.flag in gates, (where, op.input("Param"))
                group = frozen.get(op.input("Param")[0])
                if group is not None:
                    assert p.freeze.flag_vars[group.name] in gates, (where, op.input("Param"))
            assert_defined_before_use(p.main, where)
            # the topology really is in the program
            if acc > 1:
                cond = [op for op in p.main.global_block().ops if op.type == "conditional_block"]
                assert len(cond) == 1, where
                sub = p.main.block(cond[0]._block_attr_id("sub_block"))
                assert {op.input("Param")[0] for op in sub.ops if op.type == "adamw"} == set(updated), where
                assert outer_reads(p.main, sub) <= set(cond[0].input("Input")), where
            else:
                assert "conditional_block" not in types, where
            assert ("c_broadcast" in types) == (sharding > 1), where
            assert "c_allreduce_sum" in types or "c_reduce_sum" in types, where
            if amp:
                assert "check_finite_and_unscale" in types and "update_loss_scaling" in types, where
                assert types.count("cast") > 0, where
            else:
                assert "check_finite_and_unscale" not in types, where
        # every trained parameter is updated by exactly one rank (sharding splits them)
        assert set().union(*by_rank) == trained and sum(map(len, by_rank)) == len(trained), where
        assert sharding == 1 or all(by_rank), where


def test_the_scratch_block_of_sharded_gradient_merge_is_not_live(root, monkeypatch):
    """The fault itself: the sharded, accumulating program holds a block of optimizer ops nothing
    runs; `live_blocks` leaves it out, and without that the coverage check would fail (as it did)."""
    import ernie_mtl.program.idle_heads as idle_heads
    from ernie_mtl.program.edits import live_blocks

    tasks = [make_task("pretrain", root, "poems", 0), make_task("seq_label_crf", root, "ner", 1)]
    p = build(tasks, rank=1, sharding=2, acc=2, amp=None)
    live = {b.idx for b in live_blocks(p.main)}
    dead = [b for b in p.main.blocks if b.idx not in live]
    assert len(dead) == 1 and any(op.type == "adamw" for op in dead[0].ops)
    idle_heads.check_coverage(p.main, p.freeze)  # passes on the live blocks
    monkeypatch.setattr(idle_heads, "live_blocks", lambda program: list(program.blocks))  # the old rule
    with pytest.raises(idle_heads.FreezeCoverageError, match="2 optimizer ops update it, expected 1"):
        idle_heads.check_coverage(p.main, p.freeze)


def test_the_flags_read_inside_the_merged_update_are_declared_inputs_of_its_block(root, monkeypatch):
    """Without the declaration the program is the one that failed at run time (flags freed early)."""
    import ernie_mtl.program.builder as build_module

    tasks = [make_task("pretrain", root, "poems", 0), make_task("seq_label_crf", root, "ner", 1)]
    p = build(tasks, rank=1, sharding=2, acc=2, amp=None)
    (cond,) = [op for op in p.main.global_block().ops if op.type == "conditional_block"]
    reads = outer_reads(p.main, p.main.block(cond._block_attr_id("sub_block")))
    assert set(p.freeze.flag_vars.values()) <= reads <= set(cond.input("Input"))
    monkeypatch.setattr(build_module, "declare_sub_block_inputs", lambda program: {})
    p = build([make_task("pretrain", root, "poems", 0), make_task("seq_label_crf", root, "ner", 1)],
              rank=1, sharding=2, acc=2, amp=None)
    (cond,) = [op for op in p.main.global_block().ops if op.type == "conditional_block"]
    assert cond.input("Input") == []  # fleet's own declaration


def test_a_sharded_build_in_a_unit_test_leaves_no_dump_in_the_working_directory(root, tmp_path, monkeypatch):
    """tests/unit/conftest.py: fleet's program dumps stay out of the working directory (the repository root
    under make test)."""
    monkeypatch.chdir(tmp_path)
    build([make_task("mlm", root, "main", 0), make_task("cls", root, "c", 1)], rank=1, sharding=2, acc=1, amp=None)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.fleet_dumps
def test_the_builder_keeps_fleet_dumps_out_of_the_working_directory(root, tmp_path, monkeypatch):
    """Fleet's sharding optimizer writes `main_sharding_<rank>`/`start_sharding_<rank>` into the working
    directory. A build called from Python (no run, no `dump_dir`) leaves nothing where it was called; with
    `dump_dir` (a run passes `<output_dir>/program_desc`) the dumps are there, and the cwd is restored."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    tasks = [make_task("mlm", root, "main", 0), make_task("cls", root, "c", 1)]
    build(tasks, rank=1, sharding=2, acc=1, amp=None)
    assert sorted(p.name for p in cwd.iterdir()) == []
    tasks = [make_task("mlm", root, "main", 0), make_task("cls", root, "c", 1)]
    build(tasks, rank=1, sharding=2, acc=1, amp=None, dump_dir=str(tmp_path / "out" / "program_desc"))
    assert sorted(p.name for p in (tmp_path / "out" / "program_desc").iterdir()) == ["main_sharding_1",
                                                                                     "start_sharding_1"]
    assert sorted(p.name for p in cwd.iterdir()) == [] and str(cwd) == os.getcwd()


@pytest.mark.parametrize("sharding,acc,amp", [(1, 1, "O2"), (2, 2, "O1")])
def test_the_fused_optimizer_updates_what_adamw_updates_with_the_same_flags(root, sharding, acc, amp):
    """`--fuse_optimizer` (ernie_mtl/program/fused_optimizer.py) on the GPU program of a multi-task run with
    idle-head flags, AMP and the anomaly guard: the fused ops update the same parameters, each once, as the
    per-parameter build of the same rank; each fused op's SkipUpdate carries the anomaly flag and, when its
    parameters belong to an idle group, that group's flag (one group per op); O2 keeps master weights."""
    def built(fuse, rank):
        tasks = [make_task("mlm", root, "main", 0), make_task("seq_label_crf", root, "ner", 1)]
        return build(tasks, rank=rank, sharding=sharding, acc=acc, amp=amp, fuse=fuse)

    for rank in (range(2) if sharding > 1 else (1,)):
        plain, fused = built(False, rank), built(True, rank)
        per_param = [op.input("Param")[0] for op in live_ops(plain.main) if op.type == "adamw"]
        master = {op.input("Param")[0]: op.input("MasterParam")[0] for op in live_ops(plain.main)
                  if op.type == "adamw" and op.input("MasterParam")}  # O2: the float16 parameters' float32 copies
        assert bool(master) == (amp == "O2")
        ops = live_ops(fused.main)
        fused_ops = [op for op in ops if op.type == "fused_adam"]
        updated = [n for op in fused_ops for n in op.input("Params")]
        updated += [op.input("Param")[0] for op in ops if op.type == "adamw"]
        assert fused_ops and len(updated) == len(set(updated)) and set(updated) == set(per_param), rank
        assert sum(op.type == "adamw" for op in ops) < len(fused_ops), rank  # at most a few singletons
        frozen = {q: g.name for g in fused.freeze.groups for q in g.params}
        ors = {op.output("Out")[0]: set(op.input_arg_names) for op in ops if op.type == "logical_or"}

        def gated_by(var):
            return {var} | set().union(*(gated_by(v) for v in ors.get(var, ())))

        idle_fused = 0
        for op in fused_ops:
            gates = gated_by(op.input("SkipUpdate")[0])
            assert fused.anomaly.flag in gates, rank
            groups = {frozen.get(q) for q in op.input("Params")}
            assert len(groups) == 1, (rank, groups)  # one skip flag per op: the members' step counts stay equal
            group = groups.pop()
            if group is not None:
                assert fused.freeze.flag_vars[group] in gates, rank
                idle_fused += 1
            masters = [master[q] for q in op.input("Params") if q in master]
            assert op.input("MasterParams") == masters and len(masters) in (0, len(op.input("Params"))), rank
        assert idle_fused or sharding > 1, rank  # a head's parameters fused under its idle flag (unsharded)
        if acc > 1:
            cond = [op for op in fused.main.global_block().ops if op.type == "conditional_block"][0]
            sub = fused.main.block(cond._block_attr_id("sub_block"))
            assert any(op.type == "fused_adam" for op in sub.ops) and not any(
                op.type == "fused_adam" for op in fused.main.global_block().ops), rank
