"""Callbacks of the multi-task trainer (HF-style hooks), and the built-in ones that use them.

A callback subclasses `Callback` and overrides any of `on_train_begin`, `on_step_end`, `on_log`, `on_evaluate`,
`on_save`, `on_train_end`. The trainer calls them on every rank in the same order. Decisions that
change training (early stopping, best checkpoints: both save or export on every rank together)
must be rank-independent: `on_evaluate` receives rank 0's metrics on every rank (the trainer
shares them through the job's store), so callbacks deciding from them agree everywhere. A user's
callback is registered by name in a plugin file:

    from ernie_mtl.engine.callbacks import Callback, register_callback

    @register_callback("print_best")
    class PrintBest(Callback):
        def on_evaluate(self, trainer: Trainer, task, metrics):
            print(task, metrics)

and enabled with `callbacks: [print_best]` in the global YAML.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Type

from ernie_mtl.checkpoint.layout import best_name
from ernie_mtl.config import ConfigError

if TYPE_CHECKING:  # annotations only: no import at run time (no cycle)
    from ernie_mtl.engine.loop import Trainer


class Callback:
    """Hooks; `trainer` is the running ernie_mtl.engine.loop.Trainer (read its `step`, `schedule`, `tasks`,
    `cfg`, `info`, `freeze`, ...)."""

    def on_train_begin(self, trainer: Trainer) -> None:
        """After set-up and resume, before the first step of this process."""

    def on_step_end(self, trainer: Trainer, step: int, tasks: List[str]) -> None:
        """After optimizer step `step`, whose slots (the micro-batches of all ranks, in slot order) came
        from `tasks`."""

    def on_log(self, trainer: Trainer, step: int, logs: Mapping[str, float]) -> None:
        """Every logging step: `logs` are scalars (train/<task>/loss, train/<task>/sampled, lr, perf/...)."""

    def on_evaluate(self, trainer: Trainer, task: str, metrics: Mapping[str, float]) -> None:
        """After evaluating `task` on its dev file."""

    def on_save(self, trainer: Trainer, path: str) -> None:
        """After a checkpoint or an exported model was written to `path`."""

    def on_train_end(self, trainer: Trainer) -> None:
        """After the last step (before the final exports)."""

    def state_dict(self) -> Dict[str, Any]:
        """State to keep in checkpoints (exact resume)."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        pass


_CALLBACKS: Dict[str, Type[Callback]] = {}


def register_callback(name: str) -> Callable[[Type[Callback]], Type[Callback]]:
    def wrap(cls: Type[Callback]) -> Type[Callback]:
        if not (isinstance(cls, type) and issubclass(cls, Callback)):
            raise TypeError(f"@register_callback({name!r}) decorates {cls!r}, which is not a Callback subclass")
        _CALLBACKS[name] = cls
        return cls

    return wrap


def registered_callbacks() -> Dict[str, Type[Callback]]:
    return dict(_CALLBACKS)


def make_callbacks(names) -> List[Callback]:
    out = []
    for name in names:
        if name not in _CALLBACKS:
            raise ConfigError([f"callbacks: unknown callback {name!r}; registered: {sorted(_CALLBACKS)} "
                               "(register one with @register_callback in a file listed under plugins:)"])
        out.append(_CALLBACKS[name]())
    return out


class VisualDLLogger(Callback):
    """Writes the scalars of every log and evaluation to VisualDL and train_metrics.jsonl (rank 0)."""

    def __init__(self, writer):
        self.writer = writer

    def on_log(self, trainer: Trainer, step, logs):
        self.writer.scalars(step, logs)

    def on_evaluate(self, trainer: Trainer, task, metrics):
        self.writer.scalars(trainer.step, trainer.reporter.metrics("eval", task, trainer.step, metrics)[1])


class EarlyStopping(Callback):
    """Per target task: after `patience` evaluations without improvement of its main metric, the task
    is finished (it leaves the sampler and is exported, as if it had reached its quota)."""

    def __init__(self, patience: int, min_delta: float = 0.0):
        self.patience = patience
        self.min_delta = min_delta
        self.best: Dict[str, float] = {}
        self.bad: Dict[str, int] = {}

    def on_evaluate(self, trainer: Trainer, task, metrics):
        evaluated = trainer.task(task)
        if not evaluated.spec.is_target or trainer.schedule.is_finished(evaluated.spec.index):
            return
        value = metrics[evaluated.main_metric]
        sign = 1.0 if evaluated.higher_is_better else -1.0
        if task not in self.best or sign * (value - self.best[task]) > self.min_delta:
            self.best[task], self.bad[task] = value, 0
            return
        self.bad[task] = self.bad.get(task, 0) + 1
        if self.bad[task] >= self.patience:
            trainer.finish_task(task,
                                reason=f"early stopping: {evaluated.main_metric} has not improved on "
                                       f"{self.best[task]:.4f} for {self.patience} evaluations")

    def state_dict(self):
        return {"best": self.best, "bad": self.bad}

    def load_state_dict(self, state):
        self.best = dict(state.get("best", {}))
        self.bad = dict(state.get("bad", {}))


class BestCheckpoint(Callback):
    """Keeps `best_<task>` (a full checkpoint) for every target task by its main metric."""

    def __init__(self):
        self.best: Dict[str, float] = {}
        self.steps: Dict[str, int] = {}

    def on_evaluate(self, trainer: Trainer, task, metrics):
        evaluated = trainer.task(task)
        if not evaluated.spec.is_target:
            return
        value = metrics[evaluated.main_metric]
        sign = 1.0 if evaluated.higher_is_better else -1.0
        if task in self.best and sign * (value - self.best[task]) <= 0:
            return
        self.best[task] = value
        self.steps[task] = trainer.step
        trainer.save_checkpoint(best_name(task), note=f"best {evaluated.main_metric} {value:.4f} of {task}")

    def state_dict(self):
        return {"best": self.best, "steps": self.steps}

    def load_state_dict(self, state):
        self.best = dict(state.get("best", {}))
        self.steps = dict(state.get("steps", {}))


class CallbackList(list):
    """The run's callbacks, called in order (`emit`); their states are one `Stateful`, keyed by class name
    (enabling a callback later still resumes)."""

    def emit(self, hook: str, trainer, *args) -> None:
        for cb in self:
            getattr(cb, hook)(trainer, *args)

    def state_dict(self) -> Dict[str, Any]:
        return {type(cb).__name__: cb.state_dict() for cb in self}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for cb in self:
            if type(cb).__name__ in state:
                cb.load_state_dict(state[type(cb).__name__])

    def find(self, kind: Type[Callback]) -> Optional[Callback]:
        return next((cb for cb in self if isinstance(cb, kind)), None)


def built_in_callbacks(mtl, writer) -> CallbackList:
    """The callbacks every run has (VisualDL and metrics file, best checkpoints, early stopping when
    asked), then those the configuration names (`callbacks:` / `--callbacks`)."""
    out = CallbackList([VisualDLLogger(writer), BestCheckpoint()])
    if mtl.early_stopping_patience:
        out.append(EarlyStopping(mtl.early_stopping_patience))
    return CallbackList(out + make_callbacks(mtl.callbacks))
