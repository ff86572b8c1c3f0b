"""engine/evaluation.final_test: the test split with the final weights and with each target's best
checkpoint; a best checkpoint saved at the final step is not evaluated a second time (a single-task
run once evaluated its test split twice when its best was its last step)."""
import json
from pathlib import Path
from types import SimpleNamespace

from ernie_mtl.checkpoint.layout import TEST_RESULTS, best_dir
from ernie_mtl.engine.evaluation import final_test


class _Evaluator:
    def __init__(self, scores):
        self.calls, self.scores = [], scores  # scores: {(task, weights step): metrics}
        self.weights = None

    def evaluate(self, tasks, data, what):
        self.calls.append((what, [t.spec.name for t in tasks]))
        return {t.spec.name: self.scores[(t.spec.name, self.weights)] for t in tasks}


class _Checkpointer:
    def __init__(self, steps, evaluator):
        self.steps, self.evaluator, self.restored = steps, evaluator, []

    def is_complete(self, folder):
        return Path(folder).name in self.steps

    def step_of(self, folder):
        return self.steps[Path(folder).name]

    def restore_weights(self, folder):
        step = self.steps[Path(folder).name]
        self.restored.append(Path(folder).name)
        self.evaluator.weights = step
        return SimpleNamespace(step=step)


def _run(tmp_path, best_steps, final_step=10):
    """(results, evaluator, checkpointer, printed lines, reported results) of a final test at `final_step`."""
    task = lambda name: SimpleNamespace(spec=SimpleNamespace(name=name))  # noqa: E731
    scores = {(n, s): {"acc": 0.5 + s / 100 + (0.01 if n == "b" else 0)} for n in ("a", "b") for s in (5, 10)}
    ev = _Evaluator(scores)
    ev.weights = final_step
    printed, reported = [], []
    session = SimpleNamespace(
        plan=SimpleNamespace(tasks=[task("a"), task("b")], test={"a": [1, 2], "b": [1, 2, 3]}),
        cfg=SimpleNamespace(train=SimpleNamespace(output_dir=str(tmp_path))),
        barrier=SimpleNamespace(share=lambda what, value: value), is_rank0=True,
        log=SimpleNamespace(info=printed.append))
    checkpointer = _Checkpointer({best_dir(str(tmp_path), n).name: s for n, s in best_steps.items()}, ev)
    results = final_test(session, ev, checkpointer, step=final_step,
                         report=lambda prefix, name, step, metrics, what: reported.append((prefix, name, step)))
    return results, ev, checkpointer, printed, reported


def test_a_best_checkpoint_at_the_final_step_is_not_evaluated_again(tmp_path):
    results, evaluator, checkpointer, printed, reported = _run(tmp_path, {"a": 10, "b": 5})
    # one pass with the final weights for both targets, one with b's best; a's best is the final step
    assert evaluator.calls == [("test", ["a", "b"]), ("best test", ["b"])]
    assert checkpointer.restored == [best_dir(str(tmp_path), "b").name]
    assert results["a"]["best"] == {"step": 10, "metrics": results["a"]["last"]["metrics"]}
    assert results["b"]["best"] == {"step": 5, "metrics": {"acc": 0.5 + 5 / 100 + 0.01}}
    assert results["b"]["last"]["metrics"] == {"acc": 0.5 + 10 / 100 + 0.01}
    assert any("best a checkpoint is the final step's (10)" in line for line in printed)
    assert reported == [("test", "a", 10), ("test_best", "a", 10), ("test", "b", 10), ("test_best", "b", 5)]
    assert json.loads((tmp_path / TEST_RESULTS).read_text()) == results


def test_best_checkpoints_at_earlier_steps_are_restored_and_evaluated(tmp_path):
    results, evaluator, _, _, _ = _run(tmp_path, {"a": 5})
    assert evaluator.calls == [("test", ["a", "b"]), ("best test", ["a"])]
    assert results["a"]["best"] == {"step": 5, "metrics": {"acc": 0.55}} and "best" not in results["b"]
