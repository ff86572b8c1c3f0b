"""Evaluation during and after training: dev sets every `--eval_freq` steps, and the final test with
the last and with the best weights.

Evaluation scales with the cluster: with D data-parallel ranks, batch j of a split runs on rank
j mod D and the prediction outputs are gathered through the job's store, so every rank computes the
metrics of the whole split, bit for bit what one process computes. Every rank runs the same number
of batches (a rank without one re-runs batch 0 and drops it): under sharding all ranks must run the
evaluation program together. Rank 0's metrics are then handed to every rank
(`StoreBarrier.share`), so the decisions they drive (best checkpoints, early stopping) agree
everywhere.
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from ernie_mtl.engine.prediction_loop import by_name, executor_runner, num_batches, predict_batches
from ernie_mtl.program.forward import make_feed

from ernie_mtl.checkpoint.io import write_json_atomic
from ernie_mtl.checkpoint.layout import TEST_RESULTS, best_dir

if TYPE_CHECKING:  # annotations only: no import at run time (no cycle)
    from ernie_mtl.engine.session import Session


class Evaluator:
    """Metrics of a task on a split through the session's evaluation program (EMA weights swapped in
    when the run keeps an EMA)."""

    def __init__(self, session: Session):
        self.session = session
        self.programs = session.programs

    def averaged_weights(self):
        """Evaluate (and export) with the EMA's averages when the run keeps one (swapped on the device)."""
        ema = self.programs.ema
        return ema.swapped_in(self.session.exe) if ema is not None else contextlib.nullcontext()

    def predict(self, task, data, limit: Optional[int] = None) -> Dict[str, List[np.ndarray]]:
        """Prediction variables of `task` over `data` in order, per batch (`limit` batches at most),
        the batches split across the data-parallel ranks and gathered on every rank."""
        names = list(self.programs.fwd.predictions[task.spec.name])
        n = num_batches(len(data), task.spec.batch_size, limit)
        world, rank = self.session.topo.data_world_size, self.session.data_rank
        mine = [j for j in range(rank, -(-n // world) * world, world)]  # round r: batch r*world + rank
        tasks, use_task_id = self.session.plan.tasks, self.session.cfg.setup.mtl.use_task_id
        run = executor_runner(self.session.exe, self.programs.test,
                              [self.programs.fwd.predictions[task.spec.name][m].name for m in names],
                              lambda batch: make_feed(tasks, task.spec.index, batch, use_task_id=use_task_id))
        outputs = predict_batches(task, data, run, names, indices=[j if j < n else 0 for j in mine])
        gathered: Dict[int, Dict[str, np.ndarray]] = {}
        for part in self.session.barrier.gather("predictions", {j: o for j, o in zip(mine, outputs) if j < n}):
            gathered.update(part)
        return by_name([gathered[j] for j in range(n)], names)

    def metrics(self, task, data) -> Dict[str, float]:
        """`task`'s metrics on `data` (all of it, or the first `eval_batches` batches of a corpus)."""
        limit = None if task.full_dev_eval else self.session.plan.eval_batches
        outputs = self.predict(task, data, limit=limit)
        used = data if limit is None else _Prefix(data, min(len(data), limit * task.spec.batch_size))
        return {k: float(v) for k, v in task.evaluate(used, outputs).items()}

    def evaluate(self, tasks: Sequence, splits: Dict[str, Any], what: str) -> Dict[str, Dict[str, float]]:
        """Metrics of each task on its split, rank 0's handed to every rank (`what` names the exchange)."""
        with self.averaged_weights():
            local = {task.spec.name: self.metrics(task, splits[task.spec.name]) for task in tasks}
        return self.session.barrier.share(what, local)


def final_test(session: Session, evaluator: Evaluator, checkpointer, *, step: int,
               report: Callable[[str, str, int, Dict[str, float], str], None]) -> Dict[str, Any]:
    """The final test evaluation at `step`: every target with a test split, with the final weights and
    with its best checkpoint's weights (when it has one, loaded through `checkpointer`: verified, from
    the rank files its writer recorded); each result goes to `report(prefix, task, step, metrics, what)`
    (the log and VisualDL: `test/...`, `test_best/...`), all to `<output_dir>/test_results.json`. The run
    is over: its last state is in model_last."""
    s = session
    tasks = [task for task in s.plan.tasks if task.spec.name in s.plan.test]
    if not tasks:
        return {}
    data = s.plan.test  # read and checked before training (ernie_mtl/planning/plan.py)
    final = evaluator.evaluate(tasks, data, "test")
    results: Dict[str, Any] = {task.spec.name: {"last": {"step": step, "metrics": final[task.spec.name]}}
                               for task in tasks}
    for task in tasks:
        name = task.spec.name
        folder = best_dir(s.cfg.train.output_dir, name)
        if not s.barrier.share("best exists", checkpointer.is_complete(folder)):
            continue
        best_step = s.barrier.share("best step", checkpointer.step_of(folder) if s.is_rank0 else None)
        if best_step == step:  # saved from the weights just evaluated: the same figures, not a second pass
            results[name]["best"] = {"step": best_step, "metrics": final[name]}
            if s.is_rank0:
                s.log.info(f"test: the best {name} checkpoint is the final step's ({best_step}): "
                           "its figures are the final weights'")
            continue
        ref = checkpointer.restore_weights(folder)
        results[name]["best"] = {"step": ref.step, "metrics": evaluator.evaluate([task], data, "best test")[name]}
    for task in tasks:
        name = task.spec.name
        for which, prefix in (("last", "test"), ("best", "test_best")):
            if which in results[name]:
                entry = results[name][which]
                report(prefix, name, entry["step"], entry["metrics"], f" ({which} weights, {len(data[name])} examples)")
    if s.is_rank0:
        write_json_atomic(Path(s.cfg.train.output_dir) / TEST_RESULTS, results)
    return results


class _Prefix:
    """The first `n` examples of a TaskData (what an evaluation limited to some batches read)."""

    def __init__(self, data, n: int):
        self._data, self._n = data, n
        self.split, self.examples, self.has_labels = data.split, data.examples, data.has_labels
        self.features = _Head(data.features, n)

    def __len__(self) -> int:
        return self._n

    def get(self, index: int, epoch: int = 0):
        return self._data.get(index, epoch)


class _Head:
    def __init__(self, seq, n):
        self._seq, self._n = seq, n

    def __len__(self):
        return self._n

    def __getitem__(self, i):
        if not 0 <= i < self._n:
            raise IndexError(i)
        return self._seq[i]
