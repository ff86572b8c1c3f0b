"""The Python API: the engine from scripts and notebooks, with results returned and typed exceptions.

    import ernie_mtl

    result = ernie_mtl.train("global.yaml", max_steps=200)        # a YAML path, a dict or a RunConfig
    result.test["sentiment"]["best"]["metrics"]["acc"]            # what test_results.json holds
    ernie_mtl.predict(result.output_dir, "sentiment", "pred.tsv")  # -> the prediction records
    ernie_mtl.evaluate(result.output_dir, "sentiment", "dev.tsv")  # -> the metrics report
    print(ernie_mtl.plan({"task_instance": "a, b", "tasks": {...}, ...}, world_size=16))

A configuration is what the command line takes: a YAML path (flag keys, or a PALM-style global
configuration with `task_instance`), a mapping with the same keys (tasks can be given inline under
`tasks: {name: {reader: ..., train_file: ...}}`), a list of command-line arguments, or a RunConfig
from `ernie_mtl.load_config(...)`. Keyword arguments are flags (or multi-task keys) that win over the
configuration, as on the command line; `tasks={"ner": {"batch_size": 16}}` overrides task keys.
Relative paths in a mapping are resolved against `base_dir` (default: the current directory).

What the API does not do behind the caller's back: it does not set thread counts or executor flags
(the command line does that before Paddle is imported: call `configure_process()` first for the
same behaviour), install signal or exit hooks, or leave Paddle in static mode or with changed
flags after a call (both are restored). Each call builds its programs in a fresh scope, so a
notebook cell can run twice. In a script launched by `python -m paddle.distributed.launch`, every
rank runs the same calls and `train` trains on all of them (pass `watch_peers=True` for the command
line's watch of lost ranks, which exits this process when a peer is lost).

Errors in the configuration, the data or a checkpoint raise `ConfigError` / `CheckpointError`
(both `UserError`, whose message names the culprit and the fix), never `SystemExit`.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Union

from data_tools.cli_utils import UserError
from ernie_mtl.checkpoint.store import CheckpointError
from ernie_mtl.config import ConfigError, RunConfig
from ernie_mtl.engine import run as engine
from ernie_mtl.engine.callbacks import Callback, register_callback
from ernie_mtl.engine.run import PrebuildResult, RunResult
from ernie_mtl.engine.run import flags_restored as _flags_restored
from ernie_mtl.engine.run import static_mode_restored as _static_mode_restored
from ernie_mtl.engine.config_checks import HOOKS
from ernie_mtl.tasks.base import TaskType, register_task_type

ConfigSource = Union[None, str, os.PathLike, Mapping[str, Any], Sequence[str], RunConfig]

__all__ = ["CheckpointError", "Callback", "ConfigError", "PrebuildResult", "RunConfig", "RunResult", "TaskType",
           "UserError", "configure_process", "load_config", "evaluate", "export", "plan", "prebuild", "predict",
           "register_callback", "register_task_type", "train"]


def load_config(source: ConfigSource = None, *, base_dir: Optional[os.PathLike] = None,
                world_size: Optional[int] = None,
                tasks: Optional[Mapping[str, Mapping[str, Any]]] = None, **flags: Any) -> RunConfig:
    """A validated RunConfig from `source` and `flags` (see the module docstring); ConfigError lists
    every problem, as the command line does."""
    from ernie_mtl.config.cli import parse_config
    from ernie_mtl.dist.compat import require_supported_paddle

    try:
        require_supported_paddle()
    except UserError as e:
        raise ConfigError([str(e)]) from None
    if "config" in flags:  # train(config={...}) / train(config="run.yaml"): the configuration, by keyword
        if source is not None:
            raise ConfigError(["the configuration is given twice: as the first argument and as config=; give one"])
        source = flags.pop("config")
    _check_source(source)
    if isinstance(source, RunConfig):
        if flags or tasks:
            raise ConfigError(["a RunConfig is already resolved: pass flags to load_config() when building it"])
        return source
    argv: List[str] = []
    mapping = None
    if isinstance(source, (str, os.PathLike)):
        argv += ["--config", os.fspath(source)]
    elif isinstance(source, Mapping):
        mapping = source
    elif source is not None:
        argv += [str(a) for a in source]
    for key, value in flags.items():
        argv += [f"--{key}", _flag_value(value)]
    for task, keys in (tasks or {}).items():
        argv += [f"--tasks.{task}.{key}={_flag_value(value)}" for key, value in keys.items()]
    with _static_mode_restored():
        return parse_config(argv, hooks=HOOKS, world_size=world_size, config=mapping,
                            config_dir=os.fspath(base_dir) if base_dir is not None else None)


def _check_source(source: Any) -> None:
    """A configuration of a kind `load_config` takes, or a ConfigError naming what was given."""
    if source is None or isinstance(source, (str, os.PathLike, Mapping, RunConfig)):
        return
    if isinstance(source, (list, tuple)):
        bad = [a for a in source if not isinstance(a, (str, os.PathLike, int, float))]
        if not bad:
            return
        raise ConfigError([f"the configuration {source!r} is a list, so it must hold command-line arguments (strings), "
                           f"not {type(bad[0]).__name__} {bad[0]!r}"])
    raise ConfigError([f"the configuration {source!r} ({type(source).__name__}) is none of what train/plan/prebuild "
                       "take: a YAML path, a mapping of flags and multi-task keys (tasks inline under tasks:), a list "
                       "of command-line arguments, or a RunConfig from ernie_mtl.load_config()"])


def train(source: ConfigSource = None, *, callbacks: Sequence[Callback] = (), watch_peers: bool = False,
          **flags: Any) -> RunResult:
    """Train (resume, train, test, export) and return the `RunResult`: steps, the latest dev metrics
    per task, the test results with the last and best weights, best checkpoints, exported models.
    `callbacks`: Callback objects of this process (no plugin file needed)."""
    cfg = load_config(source, **flags)
    on_distributed = None
    if watch_peers:
        from ernie_mtl.dist import watchdog

        def on_distributed(info):
            watchdog.start_peer_watch(info, **engine.resume_point(cfg.train.output_dir))
    with _static_mode_restored(), _flags_restored():
        result = engine.train(cfg, callbacks=callbacks, on_distributed=on_distributed)
    if watch_peers:
        from ernie_mtl.dist import watchdog

        watchdog.finish()
    return result


def prebuild(source: ConfigSource = None, **flags: Any) -> PrebuildResult:
    """Build every index cache the run of `source` reads (what `--prebuild_index` does)."""
    cfg = load_config(source, **flags)
    with _static_mode_restored():
        return engine.prebuild(cfg)


def plan(source: ConfigSource = None, *, world_size: Optional[int] = None, **flags: Any) -> str:
    """The dry-run plan of `source` as text (topology, schedule, memory per rank, warnings); with
    `device="gpu"` the GPU program rank 0 would run, built here."""
    cfg = load_config(source, world_size=world_size, **{**flags, "dry_run": True})
    with _static_mode_restored(), _flags_restored(), _world_size(world_size):
        return engine.plan(cfg)


def evaluate(output_dir: os.PathLike, task: str, eval_file: os.PathLike, *, checkpoint: Optional[os.PathLike] = None,
             eval_output: Optional[os.PathLike] = None, device: str = "cpu",
             cpu_kernels: str = "auto", stage: str = "final") -> Dict[str, Any]:
    """Metrics of `task` on the labelled `eval_file`: its exported model in `output_dir`, or the
    weights of `checkpoint` (a model_last / model_<step> / best_<task> folder). Returns the report
    (task, source, step, examples, metrics) also written to `eval_output` (default
    `<output_dir>/<task>/eval_results.json`). `cpu_kernels` as `--cpu_kernels` (auto: a checkpoint's
    recorded kernels, the measured predictor kernels for an exported model; plain: no oneDNN). `stage`:
    `multitask` evaluates a refined target's multi-task export (as `--stage`)."""
    argv = ["--do_eval", "--task", task, "--eval_file", os.fspath(eval_file), "--output_dir", os.fspath(output_dir),
            "--device", device, "--cpu_kernels", cpu_kernels, "--stage", stage]
    argv += ["--checkpoint", os.fspath(checkpoint)] if checkpoint is not None else []
    argv += ["--eval_output", os.fspath(eval_output)] if eval_output is not None else []
    cfg = load_config(argv)
    with _static_mode_restored():
        return engine.evaluate(cfg)


def predict(output_dir: os.PathLike, task: str, pred_file: os.PathLike, *, output: Optional[os.PathLike] = None,
            device: str = "cpu", cpu_kernels: str = "auto", stage: str = "final") -> List[Any]:
    """Predictions of `task`'s exported model (in `output_dir`) for `pred_file`, as the records the
    task writes (also written to `output`, default `<output_dir>/<task>/predictions.json`). On CPU the
    predictor gets this process's thread budget and the kernels of `cpu_kernels` (as `--cpu_kernels`).
    `stage`: `multitask` predicts with a refined target's multi-task export (as `--stage`)."""
    import json

    argv = ["--do_predict", "--task", task, "--pred_file", os.fspath(pred_file), "--output_dir", os.fspath(output_dir),
            "--device", device, "--cpu_kernels", cpu_kernels, "--stage", stage]
    argv += ["--predict_output", os.fspath(output)] if output is not None else []
    with _static_mode_restored():
        path = engine.predict(load_config(argv))
    return json.loads(Path(path).read_text(encoding="utf-8"))


def export(checkpoint: os.PathLike, task: str, output: Optional[os.PathLike] = None) -> Path:
    """Export `task`'s inference model from the weights of `checkpoint` (its EMA averages when the run
    kept them) to `output` (default `<checkpoint's output dir>/<task>/infer_model`); returns it."""
    from ernie_mtl.engine.saved_models import export_from_checkpoint

    with _static_mode_restored():
        return export_from_checkpoint(Path(checkpoint), task, None if output is None else Path(output))


def configure_process(device: str = "cpu") -> str:
    """What the command line does before Paddle is imported, for scripts that want the same: the
    thread budget of this rank, Paddle's serial executor on CPU, and a quiet console. Call it first
    thing (RuntimeError once paddle is imported). Returns the thread decision."""
    from ernie_mtl.dist import console, process, threads

    note = threads.configure_threads(device=device)
    process.configure_executor(device=device)
    console.quiet_framework(debug=False)
    console.quiet_fleet_loggers()
    return note


# -- helpers -------------------------------------------------------------------------------------------
def _flag_value(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ", ".join(_flag_value(v) for v in value)
    return os.fspath(value) if isinstance(value, os.PathLike) else str(value)


@contextlib.contextmanager
def _world_size(world_size: Optional[int]) -> Iterator[None]:
    """PADDLE_TRAINERS_NUM as the dry run reads it, for the duration of the call."""
    if world_size is None:
        yield
        return
    old = os.environ.get("PADDLE_TRAINERS_NUM")
    os.environ["PADDLE_TRAINERS_NUM"] = str(world_size)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("PADDLE_TRAINERS_NUM", None)
        else:
            os.environ["PADDLE_TRAINERS_NUM"] = old
