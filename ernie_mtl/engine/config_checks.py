"""The checks of a configuration that need the layers above config, and the parser the entry points
use: `parse(argv)` = `config.cli.parse_config` with `HOOKS`, this project's answers to what the
config layer cannot know itself (config/hooks.py): the registered task types and plugins, corpus
specifications, the topology of the launcher's world, the device this Paddle can drive, checkpoint
and exported-model paths. Every problem of a configuration is still reported at once, with exit
status 2 on the command line.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, List, Optional, Sequence

from ernie_mtl.checkpoint.layout import EXPORT_NAME, MANIFEST, export_dir, is_complete
from ernie_mtl.config import ConfigError, RunConfig
from ernie_mtl.config.cli import vocab_problems, parse_config
from ernie_mtl.config.slices import RESUME_WORDS, TrainConfig
from ernie_mtl.config.values import suggest
from ernie_mtl.data.mixture import parse_mixture
from ernie_mtl.data.pretrain import PretrainSampleConfig, parse_split
from ernie_mtl.dist.process import ProcessInfo, resolve_device
from ernie_mtl.dist.topology import Topology
from ernie_mtl.engine.callbacks import registered_callbacks
from ernie_mtl.engine.plugins import import_plugins
from ernie_mtl.tasks.base import get_task_type


class EngineHooks:
    """`config.hooks.ParseHooks` for this project."""

    def task_type(self, reader: str) -> Any:

        return get_task_type(reader)

    def import_plugins(self, paths: Sequence[str], *, where: str) -> List[str]:
        return import_plugins(paths, where=where)

    def corpus_spec(self, value: Any, *, what: str, base_dir: Optional[str] = None) -> Any:
        return parse_mixture(value, what=what, base_dir=base_dir).spec()

    def check(self, cfg: RunConfig, *, world_size: Optional[int] = None) -> List[str]:
        train = cfg.train
        if train.do_eval:  # evaluation reads a saved model: nothing else of the run matters
            return _eval_problems(train)
        if train.do_predict:  # prediction reads an exported model: nothing else of the run matters
            return _predict_problems(train)
        problems: List[str] = []
        try:
            cfg.parallel.validate()  # the topology arithmetic needs a consistent parallel slice
            Topology.from_config(cfg.parallel, world_size or ProcessInfo.from_env().world_size)
        except ConfigError as e:
            if not _reported_by_config(e, cfg):
                problems += e.problems
        if cfg.flag_mode:
            problems += _corpus_problems(cfg)
            problems += _sample_problems(cfg)
        try:
            parse_split(cfg.data.split)
        except ValueError as e:
            problems.append(str(e))
        problems += _extension_problems(cfg)
        problems += _device_problems(cfg)
        problems += cpu_kernel_problems(train.cpu_kernels)
        if train.resume not in RESUME_WORDS and not is_complete(train.resume):
            problems.append(f"--resume {train.resume}: not a complete checkpoint (no train_state.json); use auto, "
                            "none, or a model_last / model_<step> folder")
        return problems


HOOKS = EngineHooks()


def parse(argv: Optional[Sequence[str]] = None, *, world_size: Optional[int] = None) -> RunConfig:
    """The command line (+ YAML) as a validated RunConfig; ConfigError lists every problem."""
    return parse_config(argv, hooks=HOOKS, world_size=world_size)


def _reported_by_config(error: ConfigError, cfg: RunConfig) -> bool:
    """Whether the parallel slice's own check (which config runs) already reported this error."""
    try:
        cfg.parallel.validate()
    except ConfigError:
        return True
    return False


def _corpus_problems(cfg: RunConfig) -> List[str]:
    """--input_dir: a corpus prefix, weight/prefix pairs or a folder, whose vocabularies agree."""
    data = cfg.data
    if data.input_dir is None:
        return []  # config reports the missing flag
    if isinstance(data.input_dir, str) and len(data.input_dir.split()) == 1 and not os.path.isdir(data.input_dir) \
            and not all(os.path.isfile(data.input_dir + ext) for ext in (".bin", ".idx")):
        missing = [data.input_dir + ext for ext in (".bin", ".idx") if not os.path.isfile(data.input_dir + ext)]
        return [f"--input_dir {data.input_dir}: {' and '.join(missing)} not found; give the corpus prefix "
                "(the path without .bin/.idx), weight/prefix pairs, or a folder of corpora"]
    # an unusable vocab (a BOM, no [MASK], ...) is reported by config; comparing the corpora with it would
    # only add a follow-on "tokenized with another vocabulary"
    usable = data.vocab_file is not None and data.vocab_file.is_file() and \
        not vocab_problems(data.vocab_file, need_mask=True)[1]
    vocab = str(data.vocab_file) if usable else None
    try:
        parse_mixture(data.input_dir, what="--input_dir", vocab_file=vocab)
    except ConfigError as e:
        return list(e.problems)
    return []


def _device_problems(cfg: RunConfig) -> List[str]:
    problems = []
    if cfg.train.device == "gpu" and not cfg.train.dry_run:
        from paddle.base import core

        if not core.is_compiled_with_cuda():
            problems.append("--device gpu but this paddle is a CPU build; install paddlepaddle-gpu, pass "
                            "--device cpu, or add --dry_run to plan the GPU job on this machine (it builds "
                            "rank 0's GPU program without running it)")
    if cfg.amp.use_amp and cfg.amp.amp_dtype == "bfloat16" and resolve_device(cfg.train.device) == "cpu":
        problems.append("--use_amp with --amp_dtype bfloat16 cannot run on CPU (Paddle 2.6.2 lacks the bf16 CPU "
                        "kernels); use --device gpu, --amp_dtype float16, or drop --use_amp")
    return problems


def cpu_kernel_problems(value: Any) -> List[str]:
    """Op types listed in --cpu_kernels that this Paddle does not have (a typo such as matmul_v3 used to
    switch nothing, silently): each named, with the nearest op type. A gradient type counts when its
    forward type is an op."""
    from ernie_mtl.config import parse_cpu_kernels

    try:
        mode, types = parse_cpu_kernels(value)
    except ValueError:
        return []  # config reports it
    if mode != "list":
        return []
    from paddle.base.framework import OpProtoHolder

    known = set(OpProtoHolder.instance().op_proto_map)
    problems = []
    for op_type in types:
        if op_type in known or (op_type.endswith("_grad") and op_type[:-len("_grad")] in known):
            continue
        hint = suggest(op_type, sorted(known | {f"{k}_grad" for k in known}))
        problems.append(f"--cpu_kernels {value}: {op_type!r} is not an op type of Paddle "
                        f"{_paddle_version()}{hint}; list op types of the program (e.g. matmul_v2,matmul_v2_grad) "
                        "or use auto, exact or plain")
    return problems


def _paddle_version() -> str:
    import paddle

    return paddle.__version__


def _extension_problems(cfg: RunConfig) -> List[str]:
    """Plugins import (flag mode: the multi-task loader imported a YAML's already) and every callback
    named is registered."""
    problems = import_plugins(cfg.setup.mtl.plugins, where="--plugins") if cfg.flag_mode else []
    known = registered_callbacks()
    for name in cfg.setup.mtl.callbacks:
        if name not in known:
            problems.append(f"--callbacks / callbacks: unknown callback {name!r}{suggest(name, known)}; registered: "
                            f"{sorted(known)} (register one with @register_callback in a file listed under plugins)")
    return problems


def _sample_problems(cfg: RunConfig) -> List[str]:
    """The pretraining dataset's own checks of the sampling/masking flags, written once there."""
    d = cfg.data
    return PretrainSampleConfig(
        max_seq_len=d.max_seq_len, short_seq_prob=d.short_seq_prob, binary_head=cfg.model.binary_head,
        masked_lm_prob=d.masked_lm_prob, max_predictions_per_seq=d.max_predictions_per_seq, max_ngrams=d.max_ngrams,
        seed=cfg.train.seed).problems()


def _predict_problems(train: TrainConfig) -> List[str]:
    problems = []
    if not train.task:
        problems.append("--do_predict needs --task: the name of a task exported under --output_dir")
    elif not (export_dir(train.output_dir, train.task) / MANIFEST).is_file():
        found = sorted(p.parent.parent.name for p in Path(train.output_dir).glob(f"*/{EXPORT_NAME}/{MANIFEST}"))
        problems.append(f"--task {train.task}: no exported model {export_dir(train.output_dir, train.task)}; "
                        f"tasks exported under --output_dir {train.output_dir}: {found or 'none'}")
    if not train.pred_file:
        problems.append("--do_predict needs --pred_file: the file to predict, in the task's reader format")
    elif not os.path.isfile(train.pred_file):
        problems.append(f"--pred_file {train.pred_file}: not found")
    return problems


def _eval_problems(train: TrainConfig) -> List[str]:
    problems = []
    if not train.task:
        problems.append("--do_eval needs --task: the task to evaluate (its exported model, or a task of --checkpoint)")
    elif train.checkpoint:
        if not is_complete(train.checkpoint):
            problems.append(f"--checkpoint {train.checkpoint}: not a complete checkpoint (no train_state.json); give "
                            "a model_last, model_<step> or best_<task> folder")
    elif not (export_dir(train.output_dir, train.task) / MANIFEST).is_file():
        found = sorted(p.parent.parent.name for p in Path(train.output_dir).glob(f"*/{EXPORT_NAME}/{MANIFEST}"))
        problems.append(f"--task {train.task}: no exported model {export_dir(train.output_dir, train.task)} (tasks "
                        f"exported under --output_dir {train.output_dir}: {found or 'none'}); or evaluate a "
                        "checkpoint with --checkpoint PATH")
    if not train.eval_file:
        problems.append("--do_eval needs --eval_file: a labelled file in the task's reader format")
    elif not os.path.exists(train.eval_file) and not os.path.isfile(train.eval_file + ".idx"):
        problems.append(f"--eval_file {train.eval_file}: not found")
    return problems
