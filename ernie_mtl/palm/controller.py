"""PaddlePALM 1.x's `palm.Controller(config, task_dir, for_train)`: a global YAML and one YAML per task,
which is the engine's multi-task configuration (docs/multitask_config.md) unchanged.

    controller = palm.Controller("config.yaml", task_dir="tasks")
    controller.load_pretrain("pretrain_model/ernie/params")
    result = controller.train()                                  # -> RunResult
    controller = palm.Controller("config.yaml", task_dir="tasks", for_train=False)
    records = controller.pred("mrqa")                            # <save_path>/mrqa/infer_model

PALM 1.x's keys load as they are (`learning_rate`, `save_path`, `backbone_config_path`,
`pretrain_model_path`, `epoch`, a task's `pred_output_path`, `pred_batch_size`, `shuffle`,
`print_first_n`, ...); what differs is in docs/multitask_config.md ("PALM keys"). As PALM's did, the
controller takes command-line overrides of the global configuration from the script's own arguments
(`python demo.py --learning_rate 3e-5`; any flag of the command line, `--tasks.<task>.<key>` too): a
bad one is a ConfigError naming it. `Controller(..., argv=[...])` gives them explicitly (`argv=[]`: none).
Outputs keep PALM 1.x's layout: inference models at `<save_path>/<task>/infer_model`, predictions at
`<save_path>/<task>/predictions.json`, or in the task's `pred_output_path` (checkpoints are the engine's
`model_<step>` / `model_last`).
"""
from __future__ import annotations

import os
import sys
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from ernie_mtl.config import ConfigError


class Controller:
    """PALM 1.x's controller over the engine's multi-task YAML path; see the module docstring."""

    def __init__(self, config: Union[str, Mapping[str, Any]], task_dir: str = ".", for_train: bool = True,
                 argv: Optional[Sequence[str]] = None):
        if isinstance(config, Mapping):
            self._mapping: Optional[Dict[str, Any]] = dict(config)
            self._path: Optional[str] = None
        elif isinstance(config, (str, os.PathLike)) and os.path.isfile(config):
            self._mapping, self._path = None, os.fspath(config)
        else:
            raise ConfigError([f"Controller: config {config!r} is neither a YAML file nor a mapping"])
        self._task_dir = os.fspath(task_dir)
        self._for_train = bool(for_train)
        self._flags: Dict[str, Any] = {}
        # PALM's controller fused the script's command line into the global configuration (PDConfig)
        self._argv: List[str] = [str(a) for a in (sys.argv[1:] if argv is None else argv)]

    def load_pretrain(self, pretrain_model_path: Optional[str] = None) -> None:
        """Pretrained backbone weights: an ERNIE 1.0 / PALM params/ directory or a PaddleNLP model directory
        (default: the config's pretrain_model_path)."""
        if pretrain_model_path is not None:
            if not os.path.isdir(pretrain_model_path):
                raise ConfigError([f"load_pretrain: {pretrain_model_path}: no such directory"])
            self._flags["model_name_or_path"] = os.path.abspath(pretrain_model_path)

    def configure(self, **flags) -> None:
        """Engine flags over the YAML's (e.g. `device="cpu"`, `max_steps=100`)."""
        self._flags.update(flags)

    def train(self):
        """Train every task of the configuration; returns the engine's RunResult."""
        from ernie_mtl.engine import run as engine
        from ernie_mtl.engine.run import flags_restored, static_mode_restored

        if not self._for_train:
            raise RuntimeError("this Controller was built with for_train=False: it predicts only")
        cfg = self._load([])
        with static_mode_restored(), flags_restored():
            return engine.train(cfg)

    def pred(self, task_instance: str, inference_model_dir: Optional[str] = None) -> Any:
        """Predict the task's `pred_file` (from its task YAML) with its inference model (default
        `<save_path>/<task>/infer_model`); writes `<save_path>/<task>/predictions.json` and returns
        the records."""
        from ernie_mtl.checkpoint.io import write_json_atomic
        from ernie_mtl.checkpoint.layout import export_dir
        from ernie_mtl.engine.saved_models import predict_exported
        from ernie_mtl.engine.run import static_mode_restored

        cfg = self._load(["--do_predict", "--task", task_instance])
        train_cfg = cfg.train
        if not train_cfg.pred_file:
            raise ConfigError([f"task {task_instance}: no pred_file in its task YAML; add `pred_file: <path>`"])
        spec = next((s for s in cfg.setup.tasks if s.name == task_instance), None)
        model_dir = inference_model_dir or export_dir(train_cfg.output_dir, task_instance)
        with static_mode_restored():
            result = predict_exported(model_dir, train_cfg.pred_file,
                                      batch_size=spec.pred_batch_size if spec is not None else None)
        records = result.records
        folder = (spec.pred_output_path if spec is not None and spec.pred_output_path else
                  os.path.join(train_cfg.output_dir, task_instance))
        write_json_atomic(os.path.join(folder, "predictions.json"), records, indent=1, sort_keys=False)
        return records

    def _load(self, argv: List[str]):
        from ernie_mtl.config.cli import parse_config
        from ernie_mtl.engine.run import static_mode_restored
        from ernie_mtl.engine.config_checks import HOOKS

        argv = list(argv) + ["--task_dir", self._task_dir]
        for key, value in self._flags.items():
            argv += [f"--{key}", str(value).lower() if isinstance(value, bool) else str(value)]
        argv += self._argv  # the script's command line wins, as PALM's PDConfig let it
        with static_mode_restored():
            if self._path is not None:
                return parse_config(["--config", self._path] + argv, hooks=HOOKS)
            return parse_config(argv, hooks=HOOKS, config=self._mapping, config_dir=os.getcwd())


__all__ = ["Controller"]
