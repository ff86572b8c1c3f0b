"""Test harness for task types: a tiny ERNIE + the task's head through the real multi-task forward
(`ernie_mtl.program.forward`), trained with plain Adam on one process (no fleet).

    harness = TaskHarness([task_a, task_b])           # TaskType instances
    losses = harness.train(task_index, batches, steps=30)
    outputs = harness.predict(task_index, batches)   # {prediction name: [array per batch]}
"""
from __future__ import annotations

import zlib  # noqa: F401  (before paddle: paddle 2.6.2's bundled zlib clash)
from typing import Dict, Iterable, List, Mapping, Sequence

import numpy as np
import paddle
from paddle.utils import unique_name

from ernie_mtl.config import ARCHITECTURES
from ernie_mtl.program.forward import build_forward, make_feed

TINY = {k: v for k, v in ARCHITECTURES["ernie-tiny-test"].items() if k != "model_type"}


class TaskHarness:
    def __init__(self, tasks: Sequence, *, vocab_size: int, model_type: str = "ernie", lr: float = 5e-3,
                 seed: int = 7, use_task_id: bool = False, arch: Mapping = None, dropout: float = 0.0):
        paddle.enable_static()
        self.tasks = list(tasks)
        self.use_task_id = use_task_id
        arch = dict(arch or TINY, vocab_size=vocab_size, hidden_dropout_prob=dropout,
                    attention_probs_dropout_prob=dropout)
        self.main, self.startup = paddle.static.Program(), paddle.static.Program()
        self.main.random_seed = self.startup.random_seed = seed
        with paddle.static.program_guard(self.main, self.startup), unique_name.guard():
            self.fwd = build_forward(model_type, arch, self.tasks, use_task_id=use_task_id)
            self.test = self.main.clone(for_test=True)
            paddle.optimizer.Adam(learning_rate=lr).minimize(self.fwd.loss)
        self.scope = paddle.static.Scope()
        self.exe = paddle.static.Executor(paddle.CPUPlace())
        self.exe.run(self.startup, scope=self.scope)

    def feed(self, task_index: int, batch: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
        return make_feed(self.tasks, task_index, batch, use_task_id=self.use_task_id)

    def train(self, task_index: int, batches: Iterable[Mapping[str, np.ndarray]], steps: int) -> List[float]:
        """`steps` Adam steps cycling over `batches`; returns the task's loss per step."""
        batches = list(batches)
        name = self.tasks[task_index].spec.name
        losses = []
        for step in range(steps):
            (loss,) = self.exe.run(self.main, feed=self.feed(task_index, batches[step % len(batches)]),
                                   fetch_list=[self.fwd.task_losses[name]], scope=self.scope)
            losses.append(float(np.asarray(loss).reshape(-1)[0]))
        return losses

    def predict(self, task_index: int, batches: Iterable[Mapping[str, np.ndarray]]) -> Dict[str, List[np.ndarray]]:
        """Prediction variables of the task for each batch (dropout off)."""
        name = self.tasks[task_index].spec.name
        names = list(self.fwd.predictions[name])
        out: Dict[str, List[np.ndarray]] = {n: [] for n in names}
        for batch in batches:
            values = self.exe.run(self.test, feed=self.feed(task_index, batch),
                                  fetch_list=[self.fwd.predictions[name][n] for n in names], scope=self.scope)
            for n, v in zip(names, values):
                out[n].append(np.asarray(v))
        return out

    def param(self, static_name: str) -> np.ndarray:
        return np.asarray(self.scope.find_var(static_name).get_tensor())


def batches_of(task, data, batch_size: int) -> List[Dict[str, np.ndarray]]:
    """`data.features` in order, collated `batch_size` at a time (last batch smaller)."""
    feats = list(data.features)
    return [task.collate(feats[i:i + batch_size]) for i in range(0, len(feats), batch_size)]
