"""The one prediction loop: a task's examples, batch by batch, through whatever computes the task's
prediction variables, collected per batch. Three callers share it:

- evaluation during training (ernie_mtl/engine/evaluation.py): the evaluation program on the run's
  executor, each data-parallel rank running its own batches;
- `--do_predict` / `--do_eval` with an exported model (ernie_mtl/engine/saved_models.py): Paddle
  Inference's predictor;
- `--do_eval --checkpoint`: a checkpoint's forward program rebuilt on an executor.

Batch j holds examples [j*B, min((j+1)*B, N)) of `data` in order (B the task's batch size), collated
by the task's own `collate`, so the three compute on identical batches.
"""
from __future__ import annotations

from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence

import numpy as np

Runner = Callable[[Dict[str, np.ndarray]], Sequence[np.ndarray]]  # a collated batch -> outputs in `names` order


def num_batches(n_examples: int, batch_size: int, limit: Optional[int] = None) -> int:
    """Batches of `batch_size` covering `n_examples` (the last one smaller), at most `limit`."""
    n = -(-n_examples // batch_size)
    return n if limit is None else min(n, limit)


def collate_batch(task, data, j: int, batch_size: int) -> Dict[str, np.ndarray]:
    """Batch j of `data`, collated by `task`."""
    return task.collate([data.get(i) for i in range(j * batch_size, min(j * batch_size + batch_size, len(data)))])


def predict_batches(task, data, run: Runner, names: Sequence[str], *, batch_size: Optional[int] = None,
                    indices: Optional[Iterable[int]] = None, desc: Optional[str] = None) -> List[Dict[str, np.ndarray]]:
    """`{name: array}` of each batch of `indices` (default: every batch in order), computed by `run`.
    `desc`: show a progress bar with that label (on a terminal only)."""
    bs = batch_size or task.spec.batch_size
    order = list(range(num_batches(len(data), bs))) if indices is None else list(indices)
    if desc:
        from tqdm import tqdm

        order_iter = tqdm(order, desc=desc, unit="batch", dynamic_ncols=True, mininterval=1.0, disable=None)
    else:
        order_iter = order
    return [dict(zip(names, (np.asarray(v) for v in run(collate_batch(task, data, j, bs))))) for j in order_iter]


def by_name(outputs: Sequence[Mapping[str, np.ndarray]], names: Sequence[str]) -> Dict[str, List[np.ndarray]]:
    """Per-batch outputs regrouped as `{name: [array of batch 0, batch 1, ...]}` (what `TaskType.evaluate`
    and `TaskType.predictions` take)."""
    return {n: [o[n] for o in outputs] for n in names}


def executor_runner(exe, program, fetch: Sequence[str], feed_of: Callable[[Dict[str, np.ndarray]], Dict]) -> Runner:
    """A runner over a static program: `feed_of(batch)` -> the feed, `fetch` the variable names."""
    def run(batch):
        return exe.run(program, feed=feed_of(batch), fetch_list=list(fetch))

    return run
