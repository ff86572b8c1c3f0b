"""Command line of run_multitask_static.py: a thin front over `ernie_mtl.engine.config_checks.parse`.

    from args import parse_config
    cfg = parse_config(["--config", "global.yaml", "--max_steps", "100"])   # a validated RunConfig

Kept at the repository root for scripts written against it; the implementation (flags, YAML,
validation, flag-mode pretraining as a one-task run) lives in ernie_mtl/config/cli.py, and the
checks that need the layers above config in ernie_mtl/engine/config_checks.py.
"""
import functools

from ernie_mtl.config.cli import build_parser, flag_mode_setup  # noqa: F401
from ernie_mtl.config.cli import validate as _validate
from ernie_mtl.engine.config_checks import HOOKS, parse as parse_config  # noqa: F401

from ernie_mtl.config import DataConfig, RunConfig, TrainConfig  # noqa: F401

validate = functools.partial(_validate, hooks=HOOKS)
