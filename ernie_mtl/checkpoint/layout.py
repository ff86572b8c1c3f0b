"""Names of what a run writes under `--output_dir` that several layers need (the config checks,
prediction, evaluation and export): kept here so config code need not import the exporter."""
from __future__ import annotations

from pathlib import Path

MANIFEST = "manifest.json"
MODEL_PREFIX = "model"


def export_dir(output_dir: str, task: str) -> Path:
    """Where task `task`'s inference model is exported: output_dir/<task>/infer_model."""
    return Path(output_dir) / task / "infer_model"
