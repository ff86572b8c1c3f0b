"""The recipes of multi-task learning that pays (docs/multitask.md): annealed sampling, loss balancing,
task-adaptive masked LM and the refine stage's configuration -- each unit on its own."""
import zlib  # noqa: F401  (before paddle: paddle 2.6.2 exports clashing zlib symbols)

import math
import textwrap

import numpy as np
import pytest

from ernie_mtl.config import ConfigError
from ernie_mtl.planning.schedule import TaskSchedule, end_probabilities, regroup_state


def run(schedule):
    seq = []
    while not schedule.done:
        seq.append(schedule.next_task())
    return seq


# -- annealed sampling --------------------------------------------------------------------------------------
def test_end_probabilities_uniform_at_infinity_and_tempered_otherwise():
    np.testing.assert_allclose(end_probabilities([100, 300, 600], math.inf), [1 / 3] * 3)
    w = np.array([100, 300, 600]) ** 0.25
    np.testing.assert_allclose(end_probabilities([100, 300, 600], 4.0), w / w.sum())
    np.testing.assert_allclose(end_probabilities([100, 300, 600], 1.0, examples_cap=300), [1 / 7, 3 / 7, 3 / 7])


def annealed(seed=3, slots=2, anneal=400, max_steps=None):
    return TaskSchedule([0.9, 0.1], [None, None], [False, False], seed, slots_per_step=slots,
                        max_steps=max_steps or 600, end_probabilities=[0.5, 0.5], anneal_slots=anneal)


def test_annealing_moves_from_the_start_to_the_end_probabilities():
    s = annealed()
    p = s.probabilities_at(np.array([0, 200, 400, 1000]))
    np.testing.assert_allclose(p[0], [0.9, 0.1])
    np.testing.assert_allclose(p[2], [0.5, 0.5])
    np.testing.assert_allclose(p[3], [0.5, 0.5])  # held after the horizon
    mid = np.sqrt([0.9, 0.1] * np.array([0.5, 0.5]))  # geometric interpolation halfway
    np.testing.assert_allclose(p[1], mid / mid.sum())
    seq = np.array(run(s))  # realized: the small task is rare early and even late
    assert (seq[:200] == 1).mean() < 0.2 and 0.4 < (seq[800:] == 1).mean() < 0.6


def test_annealed_schedule_resumes_exactly_plans_and_regroups():
    whole = run(annealed())
    s = annealed()
    head = [s.next_task() for _ in range(333)]
    state = s.state_dict()
    assert state["anneal_slots"] == 400 and state["end_probabilities"] == [0.5, 0.5]
    t = annealed()
    t.load_state_dict(state)
    assert head + run(t) == whole
    assert annealed().plan().micro_batches == tuple(np.bincount(whole, minlength=2))
    other = TaskSchedule([0.9, 0.1], [None, None], [False, False], 3, slots_per_step=2, max_steps=600)
    with pytest.raises(ConfigError, match="anneal_slots"):
        other.load_state_dict(state)
    assert regroup_state(state, slots_per_step=4)["anneal_slots"] == 400  # the horizon is in slots: kept
    assert "0.9000 -> 0.5000" in annealed().summary() and "annealed over the first 400 micro-batches" in \
        annealed().summary()


def test_annealing_arguments_are_checked():
    with pytest.raises(ValueError, match="end_probabilities"):
        TaskSchedule([0.5, 0.5], [None, None], [False, False], 1, max_steps=4, end_probabilities=[1.0, 0.0],
                      anneal_slots=4)
    with pytest.raises(ValueError, match="anneal_slots"):
        TaskSchedule([0.5, 0.5], [None, None], [False, False], 1, max_steps=4, end_probabilities=[0.5, 0.5])


# -- configuration ------------------------------------------------------------------------------------------
def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


@pytest.fixture
def cfgdir(tmp_path):
    write(tmp_path / "vocab.txt", "\n".join(["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]", "好", "坏"]) + "\n")
    write(tmp_path / "cls.tsv", "label\ttext_a\n1\t好\n0\t坏\n")
    write(tmp_path / "seg.tsv", "text_a\tlabel\n好\x02坏\tB\x02E\n")
    write(tmp_path / "mrc.json", "{}")
    write(tmp_path / "labels.json", '{"B": 0, "E": 1}')
    write(tmp_path / "tasks/senti.yaml", "reader: cls\ntrain_file: ../cls.tsv\ndev_file: ../cls.tsv\n"
                                         "n_classes: 2\n")
    write(tmp_path / "tasks/seg.yaml", "reader: seq_label\ntrain_file: ../seg.tsv\nlabel_map: ../labels.json\n")
    write(tmp_path / "tasks/qa.yaml", "reader: mrc\ntrain_file: ../mrc.json\n")
    return tmp_path


def load(root, extra="", tasks="senti, seg", targets="1, 0", **task_edits):
    from ernie_mtl.config.cli import _FLAGS
    from ernie_mtl.config.multitask_yaml import load_multitask_config
    from ernie_mtl.engine.config_checks import HOOKS

    for name, text in task_edits.items():
        path = root / "tasks" / f"{name}.yaml"
        path.write_text(path.read_text(encoding="utf-8") + textwrap.dedent(text), encoding="utf-8")
    n = len(tasks.split(","))
    cfg = write(root / "g.yaml", f"task_instance: \"{tasks}\"\ntarget_tag: {targets}\n"
                                 f"mix_ratio: {', '.join(['1.0'] * n)}\ntask_dir: tasks\n"
                                 f"vocab_path: vocab.txt\n" + textwrap.dedent(extra))
    return load_multitask_config(str(cfg), hooks=HOOKS, flag_names=set(_FLAGS))


def problems(*args, **kwargs):
    with pytest.raises(ConfigError) as e:
        load(*args, **kwargs)
    return "\n".join(e.value.problems)


def test_recipe_keys_parse(cfgdir):
    setup = load(cfgdir, "sampling: proportional\ntemperature_end: inf\nloss_balance: uncertainty\nrefine: true\n"
                         "refine_steps: 50\nrefine_learning_rate: 2e-5\n", senti="tapt: true\n")
    m = setup.mtl
    assert math.isinf(m.temperature_end) and m.loss_balance == "uncertainty" and m.refine and m.refine_steps == 50
    names = [t.name for t in setup.tasks]
    assert names == ["senti", "seg", "senti_tapt"] and list(m.task_instance) == names
    tapt = setup.tasks[2]
    assert tapt.reader == "mlm" and not tapt.is_target and tapt.train_file.endswith("cls.tsv")
    assert tapt.dev_file is None and tapt.options["other_columns"] == "ignore"
    assert tapt.options["text_columns"] == "text_a, text_b"
    assert any("tapt adds the auxiliary task senti_tapt" in r for r in setup.reports)


def test_tapt_of_sequence_labelling_joins_its_tokens(cfgdir):
    setup = load(cfgdir, tasks="senti, seg", targets="1, 1", seg="tapt: true\ntapt_mix_ratio: 0.5\n")
    tapt = setup.tasks[-1]
    assert tapt.name == "seg_tapt" and tapt.options["token_separator"] == "\x02" and tapt.mix_ratio == 0.5
    assert setup.mtl.mix_ratio[-1] == 0.5


@pytest.mark.parametrize("extra, edits, expected", [
    ("temperature_end: inf\n", {}, "key 'temperature_end' anneals the temperature of sampling"),
    ("loss_balance: gradnorm\n", {}, "key 'loss_balance' 'gradnorm' is not one of"),
    ("refine_steps: 10\n", {}, "set the refine stage, which needs refine: true"),
    ("refine: true\nrefine_steps: 10\nrefine_epochs: 2\n", {}, "refine_steps and refine_epochs both size"),
    ("", {"seg": "refine: true\n"}, "task seg: ['refine'] refine a target alone"),
    ("", {"senti": "refine_steps: 5\n"}, "size its refine stage, which is off; add refine: true"),
    ("temperature_end: 0\nsampling: temperature\n", {}, "temperature_end"),
])
def test_recipe_keys_are_checked(cfgdir, extra, edits, expected):
    assert expected in problems(cfgdir, extra, **edits)


def test_tapt_needs_text(cfgdir):
    text = problems(cfgdir, tasks="senti, qa", targets="1, 1", qa="tapt: true\n")
    assert "tapt reads the training file as text, which a 'mrc' file is not; add tapt_file" in text
    write(cfgdir / "tasks/senti_tapt.yaml", "reader: cls\ntrain_file: ../cls.tsv\nn_classes: 2\n")
    text = problems(cfgdir, tasks="senti, senti_tapt", targets="1, 0", senti="tapt: true\n")
    assert "tapt adds a task named 'senti_tapt', which task_instance already has" in text


# -- the mlm reader's text options --------------------------------------------------------------------------
def test_mlm_reads_other_files_as_text(tmp_path):
    from ernie_mtl.tasks.base import TaskContext, TaskSpec, get_task_type

    (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]", "a", "b", "c", "d"])
                                        + "\n", encoding="utf-8")
    (tmp_path / "pair.tsv").write_text("label\ttext_a\ttext_b\n1\ta b\tc\n0\td\t\n", encoding="utf-8")
    (tmp_path / "seg.tsv").write_text("text_a\tlabel\na\x02b\x02c\tS\x02S\x02S\n", encoding="utf-8")
    cls = get_task_type("mlm")

    def task(path, for_cn=False, **options):
        opts = {k: v.default for k, v in cls.options.items()}
        opts.update(options)
        spec = TaskSpec(name="t", reader="mlm", index=0, train_file=str(path), max_seq_len=16, options=opts,
                        for_cn=for_cn)
        return cls(spec, TaskContext(vocab_file=str(tmp_path / "vocab.txt"), seed=1, log=lambda m: None))

    with pytest.raises(ConfigError, match=r"unknown column\(s\) \['label', 'text_b'\]"):
        task(tmp_path / "pair.tsv").load("train")
    data = task(tmp_path / "pair.tsv", other_columns="ignore", text_columns="text_a, text_b").load("train")
    assert list(data.examples) == ["a b", "c", "d"]  # an empty text_b cell is no example
    data = task(tmp_path / "seg.tsv", other_columns="ignore", token_separator="\x02").load("train")
    assert list(data.examples) == ["a b c"]  # not for_cn: tokens joined by a space
    data = task(tmp_path / "seg.tsv", True, other_columns="ignore", token_separator="\x02").load("train")
    assert list(data.examples) == ["abc"]  # for_cn: characters joined again
    with pytest.raises(ConfigError, match="other_columns 'keep' must be refuse or ignore"):
        task(tmp_path / "seg.tsv", other_columns="keep")


# -- loss balancing in the program ---------------------------------------------------------------------------
def _program(loss_balance):
    import paddle
    from paddle.utils import unique_name

    from ernie_mtl.program.forward import _balanced

    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup), unique_name.guard():
        x = paddle.static.data("x", [1], "float32")
        x.stop_gradient = False
        loss = paddle.mean(x * x)  # L = x^2
        name_map, no_decay = {}, set()
        term = _balanced(loss, 2.0, "t", loss_balance, name_map, no_decay)
        grads = paddle.static.gradients([term], [x])
    return main, startup, x, term, grads[0], name_map, no_decay


@pytest.mark.parametrize("how, value, grad", [
    ("none", lambda x: 2 * x * x, lambda x: 4 * x),
    ("normalize", lambda x: 2 * x * x / (x * x + 1e-3), lambda x: 2 * 2 * x / (x * x + 1e-3)),
    ("uncertainty", lambda x: 2 * (x * x + 0.0), lambda x: 4 * x),  # s = 0 at the start: exp(-0) L + 0
])
def test_balanced_terms_and_their_gradients(how, value, grad):
    import paddle

    main, startup, x, term, g, name_map, no_decay = _program(how)
    exe = paddle.static.Executor(paddle.CPUPlace())
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope):
        exe.run(startup)
        out, dx = exe.run(main, feed={"x": np.array([1.5], np.float32)}, fetch_list=[term, g])
    np.testing.assert_allclose(out, value(1.5), rtol=1e-5)
    np.testing.assert_allclose(dx, grad(1.5), rtol=1e-5)
    if how == "uncertainty":
        assert list(name_map) == ["loss_balance.t.log_var"] and set(name_map.values()) == no_decay
        param = main.global_block().var(name_map["loss_balance.t.log_var"])
        assert param.optimize_attr["learning_rate"] == 100.0
    else:
        assert name_map == {}


def test_model_names_leave_out_the_log_variances():
    from ernie_mtl.program.forward import model_names

    assert model_names({"ernie.a": "x", "loss_balance.t.log_var": "y", "heads.t.w": "z"}) == {"ernie.a": "x",
                                                                                            "heads.t.w": "z"}


# -- the refine stage's configuration ------------------------------------------------------------------------
def test_refine_config_draws_only_its_target(cfgdir):
    from types import SimpleNamespace

    from ernie_mtl.config import OptimConfig, TrainConfig
    from ernie_mtl.planning.refine import refine_budget, refine_config, refine_plan_steps, refine_targets

    setup = load(cfgdir, "sampling: temperature\ntemperature: 2\ntemperature_end: inf\nloss_balance: normalize\n"
                         "refine: true\nrefine_learning_rate: 2e-5\n", tasks="senti, seg", targets="1, 1",
                 senti="num_epochs: 3\n", seg="refine: false\n")
    cfg = SimpleNamespace(setup=setup, optim=OptimConfig(max_lr=1e-4, min_lr=1e-5, warmup_steps=7, decay_steps=90),
                          train=TrainConfig(output_dir=str(cfgdir / "out"), resume="none"))
    assert refine_targets(cfg) == ["senti"]  # seg opted out
    budget = refine_budget(cfg, "senti")
    assert (budget.steps, budget.epochs, budget.learning_rate, budget.start) == (None, 3, 2e-5, "last")
    from dataclasses import replace

    run_cfg = _RunLike(setup=setup, optim=cfg.optim, train=cfg.train)
    stage = refine_config(run_cfg, "senti", init_from="/x/model_last")
    senti, seg = stage.setup.tasks
    assert senti.is_target and senti.mix_ratio == 1.0 and senti.num_epochs == 3
    assert not seg.is_target and seg.mix_ratio == 0 and seg.dev_file is None
    m = stage.setup.mtl
    assert (m.sampling, m.temperature_end, m.loss_balance, m.refine) == ("palm", None, "none", False)
    o = stage.optim
    assert (o.max_lr, o.warmup_steps, o.decay_steps) == (2e-5, None, None) and o.min_lr == pytest.approx(2e-6)
    t = stage.train
    assert t.output_dir.endswith("out/refine/senti") and t.init_from == "/x/model_last" and t.resume == "auto"
    assert refine_plan_steps(replace(budget, epochs=2), 10, 4, 2, 1) == 3  # 2 x ceil(10 / 4) slots, 2 per step
    assert refine_plan_steps(replace(budget, steps=5, epochs=None), 10, 4, 2, 1) == 5


class _RunLike:
    """The fields of a RunConfig refine_config reads, as a dataclass (dataclasses.replace works on it)."""

    def __new__(cls, **fields):
        from dataclasses import make_dataclass

        klass = make_dataclass("RunLike", [(k, object) for k in fields])
        return klass(**fields)
