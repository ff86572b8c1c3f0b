"""The layout of an output folder: every name a run writes under `--output_dir`, in one place.

    output_dir/
      model_last/                    rolling checkpoint (every --checkpoint_steps)
      model_<step>/                  kept checkpoints (every --save_steps; the newest --keep_last)
      best_<task>/                   the best checkpoint of each target
        state/rank_<r>.pdparams .pdopt .sha1
        train_state.json             written last: a checkpoint is complete when it exists
      <task>/infer_model/            an exported task model: model.pdmodel, model.pdiparams, manifest.json
      <task>/infer_model_multitask/  with refine stages: the multi-task stage's export (infer_model: the refined)
      program_desc/  visualdl/  train_metrics.jsonl  test_results.json
      refine/<task>/                 a refine stage's own output folder (this layout again)
      stages.json                    with refine stages: which stages are complete, their results

Everything else asks here (the store, the loop, evaluation, export, the converter, the command-line
checks, the watchdog's resume hint), so a new layout is one change.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Optional, Union

PathArg = Union[str, os.PathLike]  # a folder given as text or a Path

TRAIN_STATE = "train_state.json"
STATE_DIR = "state"
SUMS = ".sha1"
LAST = "model_last"
BEST_PREFIX = "best_"
KEPT = re.compile(r"^model_(\d+)$")
LAST_BACKUP = ".model_last.old"  # model_last while its replacement is swapped in
MANIFEST = "manifest.json"
MODEL_PREFIX = "model"
PROGRAM_DESC = "program_desc"
METRICS_FILE = "train_metrics.jsonl"
TEST_RESULTS = "test_results.json"
STAGES_FILE = "stages.json"
REFINE_DIR = "refine"
EXPORT_NAME = "infer_model"
MULTITASK_EXPORT = "infer_model_multitask"


def kept_name(step: int) -> str:
    return f"model_{step}"


def best_name(task: str) -> str:
    return f"{BEST_PREFIX}{task}"


def best_dir(output_dir: PathArg, task: str) -> Path:
    return Path(output_dir) / best_name(task)


def last_dir(output_dir: PathArg) -> Path:
    return Path(output_dir) / LAST


def state_prefix(checkpoint: PathArg, rank: int) -> Path:
    """`<checkpoint>/state/rank_<r>`: + .pdparams / .pdopt / .sha1."""
    return Path(checkpoint) / STATE_DIR / f"rank_{rank}"


def is_complete(checkpoint: PathArg) -> bool:
    """A checkpoint folder whose train_state.json exists (written last). Complete is not verified:
    the store checks every file before loading."""
    return (Path(checkpoint) / TRAIN_STATE).is_file()


def kept_step(name: str) -> Optional[int]:
    """The step of a kept checkpoint's folder name (`model_<step>`), else None."""
    m = KEPT.match(name)
    return int(m.group(1)) if m else None


def export_dir(output_dir: PathArg, task: str) -> Path:
    """Where task `task`'s inference model is exported: output_dir/<task>/infer_model."""
    return Path(output_dir) / task / EXPORT_NAME


def multitask_export_dir(output_dir: PathArg, task: str) -> Path:
    """A refined target's multi-task export (the stage before refining): output_dir/<task>/infer_model_multitask."""
    return Path(output_dir) / task / MULTITASK_EXPORT


def refine_dir(output_dir: PathArg, task: str) -> Path:
    """The output folder of target `task`'s refine stage: output_dir/refine/<task>."""
    return Path(output_dir) / REFINE_DIR / task
