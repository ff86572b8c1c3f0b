"""Command line and YAML configuration of run_multitask_static.py -> one validated, frozen `RunConfig`.

Flag names and meanings are PaddleNLP ERNIE 1.0's (`run_pretrain_static.py`), so its users can switch;
every flag is a field of a config slice and its `--help` text is that field's metadata. Precedence:
field default < `--config FILE.yaml` (keys = flag names) < command line. Booleans accept a bare flag
(`--use_amp` enables) or a value (`--use_amp false`).

All values are converted and validated here, before any process group or program exists; every
problem is collected into one `ConfigError` (flag, value, fix). Code below the entry point receives
the `RunConfig` slices only, never the argparse namespace.
"""
from __future__ import annotations

import argparse
import difflib
import os
import sys
import typing
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from data_tools.cli_utils import str2bool
from ernie_mtl.config import AmpConfig, ConfigError, ModelConfig, OptimConfig, ParallelConfig, field_help
from ernie_mtl.data.pretrain import PretrainSampleConfig


def _f(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class DataConfig:
    """Where the pretraining samples come from and how they are cut and masked."""

    input_dir: Optional[str] = _f(None, "Corpus prefix: the path of the tokenized corpus without .bin/.idx "
                                        "(as written by data_tools.create_pretraining_data). Required.")
    tokenizer_name_or_path: Optional[str] = _f(None, "A vocab.txt or a directory containing one; default: "
                                                     "--model_name_or_path when it is a directory.")
    split: str = _f("949,50,1", "Train,valid,test ratio over documents.")
    max_seq_len: int = _f(512, "Longest sample in tokens ([CLS] A [SEP] B [SEP]); batches are padded to their "
                               "longest sample.")
    masked_lm_prob: float = _f(0.15, "Fraction of tokens masked (whole words, n-grams).")
    max_predictions_per_seq: int = _f(20, "At most this many masked tokens per sample.")
    short_seq_prob: float = _f(0.1, "Probability of a shorter random target length for a sample.")
    max_ngrams: int = _f(3, "Longest masked n-gram of whole words.")
    num_workers: int = _f(2, "DataLoader worker processes per rank (0 = load in the training process).")

    @property
    def vocab_file(self) -> Optional[Path]:
        """The vocab.txt the tokenizer path designates (None when unset)."""
        if self.tokenizer_name_or_path is None:
            return None
        path = Path(self.tokenizer_name_or_path)
        return path / "vocab.txt" if path.is_dir() else path


DEVICES = ("auto", "cpu", "gpu")
RESUME_WORDS = ("auto", "none")


@dataclass(frozen=True)
class TrainConfig:
    """The loop: where outputs go, how often to log, evaluate and checkpoint, and how to resume."""

    output_dir: str = _f("output", "Checkpoints (model_last, model_<step>), VisualDL logs (visualdl/), "
                                   "program dumps (program_desc/) and train_metrics.jsonl.")
    save_steps: int = _f(10000, "Every this many steps keep a checkpoint output_dir/model_<step>.")
    checkpoint_steps: int = _f(1000, "Every this many steps overwrite the rolling checkpoint output_dir/model_last.")
    keep_last: int = _f(3, "How many model_<step> checkpoints to keep (older ones are removed).")
    logging_freq: int = _f(20, "Log (console, VisualDL) every this many steps.")
    eval_freq: int = _f(1000, "Evaluate on the valid split every this many steps (and after the last step).")
    eval_iters: int = _f(10, "Global batches per evaluation; the final test split uses 10x as many.")
    seed: int = _f(1234, "Seed of initialisation, dropout, sample order and masking (same on every rank).")
    device: str = _f("auto", 'Device: "gpu", "cpu", or "auto" (gpu when paddle is built with CUDA).')
    resume: str = _f("auto", '"auto": continue from the newest complete checkpoint in --output_dir if any; '
                             '"none": start fresh; or the path of a model_last / model_<step> folder.')
    dry_run: bool = _f(False, "Print the plan (topology, batches, task schedule, strategy, parameters, memory per "
                              "rank) and exit without training.")
    do_predict: bool = _f(False, "Predict with an exported task model instead of training: needs --task and "
                                 "--pred_file; reads output_dir/<task>/infer_model.")
    task: Optional[str] = _f(None, "The task to predict with (--do_predict).")
    pred_file: Optional[str] = _f(None, "The file to predict (--do_predict), in the task's reader format.")
    predict_output: Optional[str] = _f(None, "Where --do_predict writes its JSON; default: "
                                            "output_dir/<task>/predictions.json.")


@dataclass(frozen=True)
class RunConfig:
    """The whole run, one slice per component."""

    model: ModelConfig
    parallel: ParallelConfig
    amp: AmpConfig
    optim: OptimConfig
    data: DataConfig
    train: TrainConfig
    multitask: Any = field(default=None, compare=False)  # mtl_config.MultiTaskSetup in multi-task mode

    @property
    def is_multitask(self) -> bool:
        return self.multitask is not None

    def to_dict(self) -> Dict[str, Dict[str, Any]]:
        """JSON-friendly `{slice: {field: value}}` (stored in checkpoints)."""
        return {name: asdict(getattr(self, name)) for name in SLICES}

    def sample_config(self) -> PretrainSampleConfig:
        """How the pretraining dataset cuts and masks samples (its slice of this config)."""
        return PretrainSampleConfig(
            max_seq_len=self.data.max_seq_len, short_seq_prob=self.data.short_seq_prob,
            binary_head=self.model.binary_head, masked_lm_prob=self.data.masked_lm_prob,
            max_predictions_per_seq=self.data.max_predictions_per_seq, max_ngrams=self.data.max_ngrams,
            seed=self.train.seed)


SLICES: Dict[str, type] = {"model": ModelConfig, "parallel": ParallelConfig, "amp": AmpConfig,
                           "optim": OptimConfig, "data": DataConfig, "train": TrainConfig}
# flag name -> (slice name, field type)
_FLAGS: Dict[str, Tuple[str, Any]] = {
    f.name: (slice_name, typing.get_type_hints(cls)[f.name]) for slice_name, cls in SLICES.items() for f in fields(cls)}
_NONE_WORDS = {"none", "null", ""}


def build_parser() -> argparse.ArgumentParser:
    """The parser: one flag per config field (values kept as given; `_convert` types them)."""
    p = argparse.ArgumentParser(
        prog="run_multitask_static.py", description="ERNIE pretraining as fleet static programs.",
        argument_default=argparse.SUPPRESS,  # absent flags stay absent, so YAML values are not overridden
        allow_abbrev=False)  # a prefix such as --max must not silently mean --max_lr
    p.add_argument("--config", help="YAML file of flag values (keys = flag names without --); the command line "
                                    "wins over it.")
    for slice_name, cls in SLICES.items():
        group = p.add_argument_group(cls.__name__, (cls.__doc__ or "").strip().splitlines()[0])
        helps = field_help(cls)
        for f in fields(cls):
            kind = _base_type(_FLAGS[f.name][1])
            default = f.default if f.default is not MISSING else None
            text = f"{helps[f.name]} (default: {_show(default)})"
            if kind is bool:
                group.add_argument(f"--{f.name}", nargs="?", const="true", metavar="BOOL", help=text)
            elif kind is tuple:
                group.add_argument(f"--{f.name}", metavar="A,B,...", help=text)
            else:
                group.add_argument(f"--{f.name}", metavar=kind.__name__.upper(), help=text)
    return p


def _show(value: Any) -> str:
    return ",".join(value) if isinstance(value, tuple) else str(value)


def _base_type(annotation: Any) -> type:
    """int/float/str/bool/tuple behind Optional[...] and Tuple[str, ...]."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    origin = typing.get_origin(annotation)
    if origin is tuple:
        return tuple
    if origin is typing.Union and len(args) == 1:
        return _base_type(args[0])
    return annotation


def _convert(name: str, raw: Any, source: str) -> Any:
    """Typed value of flag `name` from a command-line string or a YAML value; raises ValueError with
    a message naming the flag, the value and what is expected."""
    annotation = _FLAGS[name][1]
    kind = _base_type(annotation)
    optional = type(None) in typing.get_args(annotation)
    if raw is None or (optional and isinstance(raw, str) and raw.strip().lower() in _NONE_WORDS):
        if optional:
            return None
        raise ValueError(f"--{name} ({source}) needs a value")
    try:
        if kind is bool:
            return str2bool(raw)
        if kind is tuple:
            items = raw if isinstance(raw, (list, tuple)) else str(raw).split(",")
            return tuple(str(i).strip() for i in items if str(i).strip())
        if kind is int:
            if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
                raise ValueError
            return int(raw) if not isinstance(raw, str) else int(raw.strip())
        if kind is float:
            if isinstance(raw, bool):
                raise ValueError
            return float(raw)
        return str(raw)
    except (ValueError, TypeError, argparse.ArgumentTypeError):
        expected = {bool: "true or false", int: "an integer", float: "a number", tuple: "a comma-separated list"}
        raise ValueError(f"--{name} {raw!r} ({source}) is not {expected.get(kind, kind.__name__)}"
                         + ("; or none to unset it" if optional else "")) from None


def _read_yaml(path: str, problems: List[str]) -> Dict[str, Any]:
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f) or {}
    except OSError as e:
        problems.append(f"--config {path}: cannot read it ({e.strerror}); give an existing YAML file")
        return {}
    except yaml.YAMLError as e:
        problems.append(f"--config {path}: not valid YAML: {e}")
        return {}
    if not isinstance(data, dict):
        problems.append(f"--config {path}: expected a mapping of flag names to values, got {type(data).__name__}")
        return {}
    values = {}
    for key, value in data.items():
        key = str(key).lstrip("-")
        if key not in _FLAGS:
            problems.append(f"{path}: unknown key {key!r}{_suggest(key)}; keys are the flag names (see --help)")
        else:
            values[key] = value
    return values


def _unknown_problems(unknown: Sequence[str]) -> List[str]:
    """One problem per unknown flag (its value, if any, is not reported separately)."""
    problems = []
    for k, token in enumerate(unknown):
        if token.startswith("--"):
            problems.append(f"unknown argument {token!r}{_suggest(token[2:].split('=')[0])}; see --help")
        elif k == 0 or not unknown[k - 1].startswith("--"):
            problems.append(f"unexpected value {token!r}: every value follows its --flag")
    return problems


def _suggest(name: str) -> str:
    close = difflib.get_close_matches(name, list(_FLAGS), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def parse_config(argv: Optional[Sequence[str]] = None, *, world_size: Optional[int] = None) -> RunConfig:
    """Parse and validate the command line (+ YAML) into a RunConfig; ConfigError lists every problem.

    `world_size`: the number of processes the topology must fit (default: from the launcher's
    environment, 1 without a launcher).
    """
    from ernie_mtl import mtl_config

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        argv, task_cli = mtl_config.split_task_overrides(argv)
    except ConfigError as e:
        raise ConfigError(e.problems) from None
    parser = build_parser()
    namespace, unknown = parser.parse_known_args(argv)
    given = vars(namespace)
    config_file = given.pop("config", None)
    multitask = bool(config_file) and os.path.isfile(config_file) and mtl_config.is_multitask_yaml(config_file)
    mtl_cli: Dict[str, Any] = {}
    if multitask:  # PALM let every scalar global key be set on the command line: so do we
        unknown = _take_mtl_keys(unknown, mtl_cli)
    problems = _unknown_problems(unknown)
    if task_cli and not multitask:
        problems.append("--tasks.<task>.<key> overrides need a multi-task --config (a YAML with task_instance)")
    values: Dict[str, Any] = {}
    sources: Dict[str, str] = {}
    setup = None
    if multitask:
        try:  # every command-line value: flags that are also task keys (max_seq_len, masked_lm_prob, ...) reach the tasks
            setup = mtl_config.load_multitask_config(
                config_file, cli={**mtl_cli, **given}, task_cli=task_cli, flag_names=set(_FLAGS),
                splits=("pred",) if _truthy(given.get("do_predict")) else ("train", "dev"))
            for key, raw in setup.run_flags.items():
                values[key], sources[key] = raw, f"from {config_file}"
            if _truthy(given.get("do_predict")) and "pred_file" not in given and given.get("task"):
                spec = next((t for t in setup.tasks if t.name == given["task"]), None)
                if spec is not None and spec.pred_file:  # the task file's pred_file (PALM)
                    given["pred_file"] = spec.pred_file
        except ConfigError as e:
            problems += e.problems
    elif config_file:
        for key, raw in _read_yaml(config_file, problems).items():
            values[key], sources[key] = raw, f"from {config_file}"
    for key, raw in given.items():
        values[key], sources[key] = raw, "command line"
    typed: Dict[str, Dict[str, Any]] = {name: {} for name in SLICES}
    for key, raw in values.items():
        try:
            typed[_FLAGS[key][0]][key] = _convert(key, raw, sources[key])
        except ValueError as e:
            problems.append(str(e))
    # a value that could not be typed keeps its default, so the semantic checks still report the rest
    cfg = RunConfig(**{name: cls(**typed[name]) for name, cls in SLICES.items()}, multitask=setup)
    if setup is None and multitask:  # the multi-task file itself is broken: its problems say why
        raise ConfigError(problems)
    try:
        validate(_absolute_paths(cfg), world_size=world_size)
    except ConfigError as e:
        problems += e.problems
    if problems:
        raise ConfigError(problems)
    return _absolute_paths(cfg)


def _truthy(raw: Any) -> bool:
    try:
        return raw is not None and str2bool(raw)
    except (ValueError, argparse.ArgumentTypeError):
        return False


def _take_mtl_keys(unknown: Sequence[str], out: Dict[str, Any]) -> List[str]:
    """Move `--<multi-task key> value` pairs (mix_ratio, sampling, num_epochs, batch_size, ...) from the
    unknown arguments into `out`; returns the arguments still unknown."""
    from ernie_mtl import mtl_config

    keys = set(mtl_config.MTL_KEYS) | set(mtl_config.BROADCAST_KEYS) | set(mtl_config.PALM_ALIASES)
    rest: List[str] = []
    k = 0
    while k < len(unknown):
        token = unknown[k]
        name, has_value, value = token[2:].partition("=") if token.startswith("--") else ("", "", "")
        bare_bool = name in keys and mtl_config.MTL_KEYS.get(name, ("",))[0] == "bool"
        if name in keys and (has_value or (k + 1 < len(unknown) and not unknown[k + 1].startswith("--"))):
            if not has_value:
                value = unknown[k + 1]
                k += 1
            out[name] = value
        elif bare_bool and not has_value:  # --use_ema alone means true, as for the flags
            out[name] = "true"
        else:
            rest.append(token)
        k += 1
    return rest


def _absolute_paths(cfg: RunConfig) -> RunConfig:
    """Paths made absolute: the trainer changes directory while building programs (fleet dumps)."""
    def absolute(path: Optional[str]) -> Optional[str]:
        return None if path is None else os.path.abspath(os.path.expanduser(path))

    data = replace(cfg.data, input_dir=absolute(cfg.data.input_dir),
                   tokenizer_name_or_path=absolute(cfg.data.tokenizer_name_or_path
                                                   or _model_dir(cfg.model.model_name_or_path)))
    resume = cfg.train.resume if cfg.train.resume in RESUME_WORDS else absolute(cfg.train.resume)
    train = replace(cfg.train, output_dir=absolute(cfg.train.output_dir), resume=resume)
    model = cfg.model
    if os.path.isdir(model.model_name_or_path):
        model = replace(model, model_name_or_path=absolute(model.model_name_or_path))
    return replace(cfg, model=model, data=data, train=train)


def _model_dir(name_or_path: str) -> Optional[str]:
    return name_or_path if os.path.isdir(name_or_path) else None


def validate(cfg: RunConfig, *, world_size: Optional[int] = None) -> RunConfig:
    """Check every slice and their combinations; raise one ConfigError with all problems."""
    from ernie_mtl.parallel import Topology

    problems: List[str] = []

    def collect(check, *args, **kwargs):
        try:
            return check(*args, **kwargs)
        except ConfigError as e:
            problems.extend(e.problems)
            return None

    if cfg.train.do_predict:  # prediction reads an exported model: nothing else of the run matters
        problems += _predict_problems(cfg.train)
        if problems:
            raise ConfigError(problems)
        return cfg
    collect(cfg.amp.validate)
    collect(cfg.optim.validate)
    before = len(problems)
    collect(cfg.parallel.validate)
    if len(problems) == before:  # the topology arithmetic needs a consistent parallel slice
        if world_size is None:
            world_size = int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))
        collect(Topology.from_config, cfg.parallel, world_size)
    resolved = collect(cfg.model.resolve)  # validates the model slice too
    problems += _data_problems(cfg.data, resolved.arch if resolved else None, multitask=cfg.is_multitask)
    if cfg.is_multitask:
        problems += _multitask_problems(cfg, resolved.arch if resolved else None)
    else:
        problems += cfg.sample_config().problems()  # the dataset's own checks, so they are written once
    problems += _train_problems(cfg.train, cfg.optim)
    from ernie_mtl.trainer import resolve_device

    if cfg.amp.use_amp and cfg.amp.amp_level == "O2" and cfg.parallel.use_sharding:
        problems.append("--amp_level O2 with --sharding_degree > 1 cannot be built by fleet 2.6.2 (its sharding "
                        "pass rejects O2's parameter casts); use --amp_level O1 with sharding, or O2 without")
    if cfg.amp.use_amp and cfg.amp.amp_dtype == "bfloat16" and resolve_device(cfg.train.device) == "cpu":
        problems.append("--use_amp with --amp_dtype bfloat16 cannot run on CPU (Paddle 2.6.2 lacks the bf16 CPU "
                        "kernels); use --device gpu, --amp_dtype float16, or drop --use_amp")
    if problems:
        raise ConfigError(problems)
    return cfg


def _predict_problems(train: TrainConfig) -> List[str]:
    from ernie_mtl.export import MANIFEST, export_dir

    problems = []
    if not train.task:
        problems.append("--do_predict needs --task: the name of a task exported under --output_dir")
    elif not (export_dir(train.output_dir, train.task) / MANIFEST).is_file():
        found = sorted(p.parent.name for p in Path(train.output_dir).glob(f"*/infer_model/{MANIFEST}"))
        problems.append(f"--task {train.task}: no exported model {export_dir(train.output_dir, train.task)}; "
                        f"tasks exported under --output_dir {train.output_dir}: {found or 'none'}")
    if not train.pred_file:
        problems.append("--do_predict needs --pred_file: the file to predict, in the task's reader format")
    elif not os.path.isfile(train.pred_file):
        problems.append(f"--pred_file {train.pred_file}: not found")
    return problems


def _multitask_problems(cfg: RunConfig, arch: Optional[Mapping[str, Any]]) -> List[str]:
    problems = []
    for spec in cfg.multitask.tasks:
        if arch is not None and spec.max_seq_len > arch["max_position_embeddings"]:
            problems.append(f"task {spec.name}: max_seq_len {spec.max_seq_len} exceeds the model's "
                            f"max_position_embeddings {arch['max_position_embeddings']}")
    if cfg.multitask.mtl.use_task_id and cfg.model.model_type != "ernie":
        problems.append("use_task_id needs the ERNIE backbone (BERT has no task embedding); set backbone: ernie "
                        "or use_task_id: false")
    return problems


def _data_problems(data: DataConfig, arch: Optional[Mapping[str, Any]], *, multitask: bool = False) -> List[str]:
    from ernie_mtl.data.pretrain import parse_split

    problems = []
    if multitask:  # no corpus flag: the tasks' files were checked by mtl_config
        pass
    elif data.input_dir is None:
        problems.append("--input_dir is required: the corpus prefix (path without .bin/.idx) written by "
                        "`python -m data_tools.create_pretraining_data`")
    else:
        missing = [ext for ext in (".bin", ".idx") if not os.path.isfile(data.input_dir + ext)]
        if missing:
            problems.append(f"--input_dir {data.input_dir}: {' and '.join(data.input_dir + e for e in missing)} "
                            "not found; give the corpus prefix (the path without .bin/.idx)")
    vocab_size = None
    if data.vocab_file is None:
        problems.append("--tokenizer_name_or_path is required when --model_name_or_path is an architecture name: "
                        "give the vocab.txt the corpus was tokenized with (or its directory)")
    elif not data.vocab_file.is_file():
        problems.append(f"--tokenizer_name_or_path {data.tokenizer_name_or_path}: {data.vocab_file} not found; "
                        "give a vocab.txt or a directory containing one")
    else:
        with open(data.vocab_file, encoding="utf-8") as f:
            vocab_size = sum(1 for _ in f)
    try:
        parse_split(data.split)
    except ValueError as e:
        problems.append(str(e))
    if arch is not None:
        if not multitask and data.max_seq_len > arch["max_position_embeddings"]:
            problems.append(f"--max_seq_len {data.max_seq_len} exceeds the model's max_position_embeddings "
                            f"{arch['max_position_embeddings']}; use --max_seq_len <= "
                            f"{arch['max_position_embeddings']}")
        if vocab_size is not None and vocab_size > arch["vocab_size"]:
            problems.append(f"--tokenizer_name_or_path {data.vocab_file} has {vocab_size} tokens but the model's "
                            f"vocab_size is {arch['vocab_size']}; pass --vocab_size {vocab_size}")
    if data.num_workers < 0:
        problems.append(f"--num_workers {data.num_workers} must be >= 0 (0 = load in the training process)")
    return problems


def _train_problems(train: TrainConfig, optim: OptimConfig) -> List[str]:
    problems = []
    for name in ("save_steps", "checkpoint_steps", "logging_freq", "eval_freq", "eval_iters", "keep_last"):
        value = getattr(train, name)
        if value < 1:
            problems.append(f"--{name} {value} must be >= 1")
    if train.device not in DEVICES:
        problems.append(f"--device {train.device!r} is not supported; use one of {list(DEVICES)}")
    elif train.device == "gpu":
        from paddle.base import core

        if not core.is_compiled_with_cuda():
            problems.append("--device gpu but this paddle is a CPU build; install paddlepaddle-gpu or pass "
                            "--device cpu")
    if train.resume not in RESUME_WORDS and not os.path.isfile(os.path.join(train.resume, "train_state.json")):
        problems.append(f"--resume {train.resume}: not a complete checkpoint (no train_state.json); use auto, "
                        "none, or a model_last / model_<step> folder")
    return problems
