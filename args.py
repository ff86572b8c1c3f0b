"""Command line of run_multitask_static.py: a thin front over `ernie_mtl.config.cli`.

    from args import parse_config
    cfg = parse_config(["--config", "global.yaml", "--max_steps", "100"])   # a validated RunConfig

Kept at the repository root for scripts written against it; the implementation (flags, YAML,
validation, flag-mode pretraining as a one-task run) lives in ernie_mtl/config/cli.py.
"""
from ernie_mtl.config.cli import build_parser, flag_mode_setup, parse_config, validate  # noqa: F401
from ernie_mtl.config import DataConfig, RunConfig, TrainConfig  # noqa: F401
