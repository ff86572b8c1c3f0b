"""Prediction and evaluation use the cores: Paddle Inference's predictor gets the process's thread budget
(the training rule, `dist.threads.process_threads`) and the kernels `--cpu_kernels` gives; the oneDNN and
plain predictors predict the same within tolerance (and as the executor's forward program does); `auto`
keeps oneDNN only where it is faster *and* within tolerance, decided by an injected timing function (never
by this machine's speed) and cached; a checkpoint is evaluated with the forward kernels its run recorded."""
import zlib  # noqa: F401  (before paddle)

import json

import numpy as np
import pytest

from ernie_mtl.engine import saved_models as inference
from ernie_mtl.engine.saved_models import (PREDICTOR_RTOL, checkpoint_forward_types, choose_predictor_kernels,
                                        cpu_predictor, output_difference, predictor_runner, read_manifest)
from ernie_mtl.program.kernel_choice import KernelChoice
from ernie_mtl.tasks.base import TaskContext, TaskSpec
from ernie_mtl.tasks.classification import ClassificationTask
from task_harness import TINY, TaskHarness, batches_of

SPECIAL = ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"]
CHARS = "好坏天气很不错今日我你他是的了"


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A tiny ERNIE classifier, trained a few steps, exported as training exports it; its dev data and the
    executor's own predictions of it."""
    import paddle

    from ernie_mtl.engine.exporter import export_task_model

    root = tmp_path_factory.mktemp("exported")
    vocab = root / "vocab.txt"
    vocab.write_text("\n".join(SPECIAL + list(CHARS)) + "\n", encoding="utf-8")
    rng = np.random.RandomState(0)
    rows = [(int(i % 2), "".join(rng.choice(list(CHARS), rng.randint(3, 12)))) for i in range(24)]
    dev = root / "dev.tsv"
    dev.write_text("label\ttext_a\n" + "".join(f"{a}\t{b}\n" for a, b in rows), encoding="utf-8")
    options = {k: o.default for k, o in ClassificationTask.options.items()}
    options.update(n_classes=2)
    ctx = TaskContext(vocab_file=str(vocab), seed=1, log=lambda s: None)
    task = ClassificationTask(TaskSpec(name="cls", reader="cls", index=0, max_seq_len=16, batch_size=8, options=options,
                                       dev_file=str(dev)), ctx)
    data = task.load("dev")
    harness = TaskHarness([task], vocab_size=len(SPECIAL) + len(CHARS))
    batches = batches_of(task, data, 8)
    harness.train(0, batches, steps=6)
    model_dir = root / "out" / "cls" / "infer_model"
    with paddle.static.scope_guard(harness.scope):
        export_task_model(model_dir, program=harness.test, fwd=harness.fwd, task=task, exe=harness.exe,
                          vocab_file=str(vocab), arch=dict(TINY, vocab_size=len(SPECIAL) + len(CHARS)),
                          model_type="ernie", use_task_id=False)
    return model_dir, task, data, harness.predict(0, batches)


class Recorder:
    """Wraps paddle.inference.create_predictor to keep the configs it was given."""

    def __init__(self, monkeypatch):
        import paddle.inference as pi

        self.configs = []
        original = pi.create_predictor

        def create(config):
            self.configs.append(config)
            return original(config)

        monkeypatch.setattr(pi, "create_predictor", create)


def test_the_predictor_gets_the_thread_budget_and_the_kernels(exported, monkeypatch):
    model_dir, *_ = exported
    manifest = read_manifest(model_dir)
    rec = Recorder(monkeypatch)
    predictor_runner(model_dir, manifest, threads=2, onednn=False)
    predictor_runner(model_dir, manifest, threads=3, onednn=True)
    predictor_runner(model_dir, manifest, threads=1, onednn=("matmul_v2", "elementwise_add"))
    monkeypatch.setattr(inference, "process_threads", lambda: (5, "the test's budget"))
    predictor_runner(model_dir, manifest)  # the default: the process's budget, oneDNN on
    got = [(c.cpu_math_library_num_threads(), c.mkldnn_enabled()) for c in rec.configs]
    assert got == [(2, False), (3, True), (1, True), (5, True)]  # Paddle's own default would be 1 thread


def test_oneDNN_and_plain_predictors_predict_the_same_within_tolerance(exported):
    model_dir, task, data, executor = exported
    manifest = read_manifest(model_dir)
    outputs = {}
    for onednn in (False, True):
        run, names = predictor_runner(model_dir, manifest, threads=2, onednn=onednn)
        outputs[onednn] = [dict(zip(names, run(b))) for b in batches_of(task, data, 8)]
    for plain, dnn, ref in zip(outputs[False], outputs[True], executor["probs"]):
        assert output_difference([plain["probs"]], [dnn["probs"]]) <= PREDICTOR_RTOL
        np.testing.assert_allclose(plain["probs"], ref, rtol=0, atol=1e-5)  # the training executor's forward
        np.testing.assert_array_equal(plain["probs"].argmax(-1), dnn["probs"].argmax(-1))


def test_output_difference_is_relative_and_strict_on_integers():
    a = np.array([[100.0, -50.0]], "float32")
    assert output_difference([a], [a + 1e-3]) == pytest.approx(1e-5, rel=1e-2)  # relative to the largest value
    assert output_difference([np.array([0.5])], [np.array([0.5 + 1e-6])]) == pytest.approx(1e-6, rel=1e-3)
    assert output_difference([np.array([1, 2])], [np.array([1, 3])]) == float("inf")  # tag paths must agree
    assert output_difference([np.zeros((2, 3))], [np.zeros((3, 2))]) == float("inf")


def fake_measure(plain_s, onednn_s, diff):
    calls = []

    def measure(make_runner, sample):
        calls.append(sorted(sample))
        return (plain_s, onednn_s), diff, {}

    return measure, calls


@pytest.mark.parametrize("plain_s, onednn_s, diff, chosen, says", [
    (2.0, 1.0, 1e-7, True, "oneDNN 8.0 vs 4.0 samples/s plain, outputs within 1e-07"),
    (2.0, 1.0, 1e-2, False, "oneDNN outputs differ by 0.01 (> 0.0001), kept plain"),
    (1.0, 0.99, 0.0, False, "plain: oneDNN not faster"),
])
def test_auto_keeps_oneDNN_only_where_faster_and_within_tolerance(exported, tmp_path, plain_s, onednn_s, diff,
                                                                 chosen, says):
    model_dir, task, data, _ = exported
    sample = task.collate([data.get(i) for i in range(8)])
    measure, calls = fake_measure(plain_s, onednn_s, diff)
    use, line, _ = choose_predictor_kernels(model_dir, read_manifest(model_dir), sample, threads=2,
                                            make_runner=None, cache_path=tmp_path / "c.json", measure=measure)
    assert use is chosen and says in line and "measured on 8 examples" in line and len(calls) == 1
    again, calls_again = fake_measure(9.0, 1.0, 0.0)  # would choose otherwise, but the cache answers
    use2, line2, _ = choose_predictor_kernels(model_dir, read_manifest(model_dir), sample, threads=2,
                                              make_runner=None, cache_path=tmp_path / "c.json", measure=again)
    assert use2 is chosen and "from the kernel cache" in line2 and not calls_again
    _, _, _ = choose_predictor_kernels(model_dir, read_manifest(model_dir), sample, threads=1, make_runner=None,
                                       cache_path=tmp_path / "c.json", measure=again)
    assert calls_again  # another thread count is another machine identity: measured
    assert len(json.loads((tmp_path / "c.json").read_text())["machines"]) == 2


def test_timing_the_two_predictors_keeps_one_alive_at_a_time():
    """Two ERNIE-base predictors at once double the peak memory: the plain one is gone before the oneDNN one
    is built; the outputs compared are each predictor's own, and the oneDNN runner is handed back."""
    alive, built = [], []

    class Runner:
        def __init__(self, onednn):
            assert not alive, "a predictor was built while another was alive"
            alive.append(onednn)
            built.append(onednn)
            self.onednn = onednn

        def __call__(self, batch):
            return [np.full((2, 3), 1.0 + (1e-6 if self.onednn else 0.0), dtype="float32")]

        def __del__(self):
            alive.remove(self.onednn)

    (plain_s, onednn_s), diff, runners = inference.time_predictors(Runner, {"input_ids": np.zeros((2, 4))},
                                                                   budget_s=0.01)
    assert built == [False, True] and alive == [True] and set(runners) == {True}
    assert plain_s > 0 and onednn_s > 0 and diff == pytest.approx(1e-6, rel=0.1)


def test_cpu_prediction_logs_its_threads_and_kernels(exported, tmp_path):
    model_dir, task, data, _ = exported
    manifest = read_manifest(model_dir)
    lines = []
    cpu_predictor(model_dir, manifest, task, data, cpu_kernels="plain", threads=2, log=lines.append)
    cpu_predictor(model_dir, manifest, task, data, cpu_kernels="exact", threads=1, log=lines.append)
    measure, _ = fake_measure(2.0, 1.0, 0.0)
    run, names = cpu_predictor(model_dir, manifest, task, data, cpu_kernels="auto", threads=2, log=lines.append,
                               cache_path=tmp_path / "c.json", measure=measure)
    assert lines[0] == "prediction: Paddle Inference on 2 threads (given); plain kernels (--cpu_kernels plain)"
    assert lines[1].startswith("prediction: Paddle Inference on 1 thread (given); oneDNN on elementwise_add, scale, "
                               "sum, transpose2 (--cpu_kernels exact)")
    assert "--cpu_kernels auto (measured on 8 examples): oneDNN" in lines[2]
    assert names == ["probs"] and run(task.collate([data.get(0)]))[0].shape == (1, 2)


def test_a_checkpoint_is_evaluated_with_its_recorded_forward_kernels():
    record = KernelChoice(mode="auto", onednn=("elementwise_add", "matmul_v2", "matmul_v2_grad"), bias_grads=True)
    raw = {"extra": {"cpu_kernels": record.to_json()}, "config": {"train": {"cpu_kernels": "auto"}}}
    assert checkpoint_forward_types(raw) == (("elementwise_add", "matmul_v2"), "the kernels its run recorded")
    assert checkpoint_forward_types(raw, "plain")[0] == ()  # an explicit mode is obeyed
    assert checkpoint_forward_types(raw, "softmax,matmul_v2_grad")[0] == ("softmax",)
    legacy = {"extra": {}, "config": {"train": {"cpu_kernels": True}}}
    assert set(checkpoint_forward_types(legacy)[0]) == {"elementwise_add", "scale", "sum", "transpose2"}
    gpu = {"extra": {"cpu_kernels": None}, "config": {"train": {"cpu_kernels": "auto"}}}
    assert checkpoint_forward_types(gpu)[0] == ()
