"""Configuration in one package: typed slices, the PALM multi-task loader, the command line.

    errors.py     ConfigError (every problem names the flag/file/key, the value and the fix)
    values.py     the one YAML reader, value coercer and "did you mean" helper
    model.py      known architectures and ModelConfig (name or local PaddleNLP directory)
    slices.py     ParallelConfig, AmpConfig, OptimConfig, DataConfig, TrainConfig
    task.py       TaskSpec: one task as resolved from the configuration
    multitask.py  MultiTaskConfig (global multi-task keys) and MultiTaskSetup (the tasks of a run)
    run.py        RunConfig: all slices plus the setup
    palm.py       the PALM-compatible loader (global YAML + one YAML per task)
    cli.py        the command line (+ `--config` YAML) -> a validated RunConfig; flag mode -> one task

Layering: nothing here imports the trainer or the program builder; palm.py and cli.py look up
task types (ernie_mtl.tasks) when they need their options.
"""
from ernie_mtl.config.errors import ConfigError
from ernie_mtl.config.model import (ARCH_FIELDS, ARCHITECTURES, MODEL_FAMILIES, MODEL_TYPES, ModelConfig,  # noqa: F401
                                    ModelFamily, ResolvedModel, model_family)
from ernie_mtl.config.multitask import MultiTaskConfig, MultiTaskSetup
from ernie_mtl.config.run import SLICES, RunConfig
from ernie_mtl.config.slices import (AMP_DTYPES, AMP_LEVELS, CPU_KERNEL_MODES, DEVICES, RESUME_WORDS, AmpConfig,
                                     DataConfig, OptimConfig, ParallelConfig, TrainConfig, canonical_cpu_kernels,
                                     field_help, parse_cpu_kernels)
from ernie_mtl.config.task import SPLITS, TaskSpec

__all__ = ["ARCH_FIELDS", "ARCHITECTURES", "AMP_DTYPES", "AMP_LEVELS", "CPU_KERNEL_MODES", "ConfigError", "DEVICES",
           "MODEL_FAMILIES", "canonical_cpu_kernels", "parse_cpu_kernels",
           "MODEL_TYPES", "ModelFamily", "model_family",
           "AmpConfig", "DataConfig", "ModelConfig", "MultiTaskConfig", "MultiTaskSetup", "OptimConfig",
           "ParallelConfig", "RESUME_WORDS", "ResolvedModel", "RunConfig", "SLICES", "SPLITS", "TaskSpec",
           "TrainConfig", "field_help"]
