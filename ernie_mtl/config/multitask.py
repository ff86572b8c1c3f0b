"""The multi-task part of a run: which tasks, how they are sampled, and the run-wide training extras.

`MultiTaskConfig` holds the global keys of a PALM-style YAML (ernie_mtl/config/multitask_yaml.py reads it);
a flag-mode pretraining run gets one too, with the single task `pretrain` (ernie_mtl/config/cli.py).
The fields marked `flag` (EMA, early stopping, plugins, callbacks) are also command-line flags in
both modes. `MTL_KEYS` gives each key's kind for ernie_mtl/config/values.coerce; defaults are the
dataclass's (written once).
"""
from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any, Dict, List, Optional, Tuple

from ernie_mtl.config.task import TaskSpec


def _k(default: Any, kind: str, help: str, *, flag: bool = False) -> Any:
    meta = {"kind": kind, "help": help, "flag": flag}
    return field(metadata=meta) if default is MISSING else field(default=default, metadata=meta)


@dataclass(frozen=True)
class MultiTaskConfig:
    """The multi-task keys of the global YAML (one value per task where a tuple)."""

    task_instance: Tuple[str, ...] = _k(MISSING, "strlist", "the task names, one <task_dir>/<name>.yaml each")
    mix_ratio: Tuple[float, ...] = _k(MISSING, "floatlist", "sampling weight per task (sampling: palm)")
    target_tag: Tuple[bool, ...] = _k(MISSING, "intlist", "1 = target (quota, exported), 0 = auxiliary, per task")
    task_reuse_tag: Optional[Tuple[int, ...]] = _k(MISSING, "intlist", "same tag = one shared head")
    task_dir: str = _k(MISSING, "str", "folder of the task YAMLs (relative to the global YAML)")
    sampling: str = _k("palm", "str", "palm | proportional | temperature")
    temperature: float = _k(1.0, "posfloat", "T of temperature sampling")
    temperature_end: Optional[float] = _k(None, "opttemp", "anneal the sampling temperature from `temperature` to this "
                                                           "over the run (inf: uniform at the end); sampling "
                                                           "proportional or temperature")
    loss_balance: str = _k("none", "str", "none | uncertainty (learned per-task log-variances, Kendall et al. 2018) "
                                          "| normalize (each task's loss divided by its own value: scale-free "
                                          "gradients)")
    refine: bool = _k(False, "bool", "two-stage (MT-DNN): after the multi-task stage, fine-tune each target alone "
                                     "from the multi-task weights, inside the same run")
    refine_steps: Optional[int] = _k(None, "optposint", "optimizer steps of each target's refine stage (or "
                                                        "refine_epochs)")
    refine_epochs: Optional[float] = _k(None, "optposfloat", "epochs of each target's refine stage (default: the "
                                                             "target's num_epochs, else 1)")
    refine_learning_rate: Optional[float] = _k(None, "optposfloat", "peak LR of the refine stages (default: the "
                                                                    "run's)")
    refine_warmup_proportion: float = _k(0.1, "nonneg", "warm-up share of each refine stage")
    refine_early_stopping_patience: Optional[int] = _k(None, "optnonnegint", "early stopping of the refine stages "
                                                                             "(default: early_stopping_patience)")
    refine_from: str = _k("last", "exportfrom", "the multi-task weights a refine stage starts from: last (the "
                                                "stage's final weights, MT-DNN) or best (the target's best_<task>)")
    examples_cap: Optional[int] = _k(None, "optposint", "K: examples counted per task at most (proportional, "
                                                        "temperature)")
    num_epochs: float = _k(1.0, "posfloat", "PALM: epochs of the main (first) target")
    use_task_id: bool = _k(False, "bool", "feed ERNIE's task embedding with each task's index")
    plugins: Tuple[str, ...] = _k((), "strlist", "Python files to import: task types and callbacks registered "
                                                 "there become usable by name.", flag=True)
    early_stopping_patience: int = _k(0, "nonnegint", "Finish a target after this many evaluations without "
                                                      "improvement of its main metric (0 = off).", flag=True)
    use_ema: bool = _k(False, "bool", "Keep an exponential moving average of the weights (on the device) for "
                                      "evaluation and export.", flag=True)
    ema_decay: float = _k(0.9999, "unit", "EMA decay, in (0, 1).", flag=True)
    callbacks: Tuple[str, ...] = _k((), "strlist", "Names of callbacks registered with @register_callback (in a "
                                                   "plugin file) to run.", flag=True)

    def to_dict(self) -> Dict[str, Any]:
        """JSON-friendly copy (tuples become lists)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


# key -> kind, for every key of MultiTaskConfig
MTL_KEYS: Dict[str, str] = {f.name: f.metadata["kind"] for f in fields(MultiTaskConfig)}
# keys with a default (all but the per-task lists and task_dir) -> default
MTL_DEFAULTS: Dict[str, Any] = {f.name: f.default for f in fields(MultiTaskConfig) if f.default is not MISSING}
# run-wide keys that are command-line flags in both modes -> help text
RUN_WIDE_KEYS: Dict[str, str] = {f.name: f.metadata["help"] for f in fields(MultiTaskConfig) if f.metadata["flag"]}


@dataclass
class MultiTaskSetup:
    """The tasks of a run and their settings (ernie_mtl/config/multitask_yaml.py, or a flag-mode run's one task)."""

    tasks: Tuple[TaskSpec, ...]
    mtl: MultiTaskConfig
    run_flags: Dict[str, Any] = field(default_factory=dict)  # run flag -> value as written (cli types it)
    reports: List[str] = field(default_factory=list)  # overrides, aliases, fallbacks: log them
    flag_mode: bool = False  # built from PaddleNLP pretraining flags rather than a multi-task YAML

    @property
    def names(self) -> Tuple[str, ...]:
        return tuple(spec.name for spec in self.tasks)
