"""Command line (+ `--config` YAML) of run_multitask_static.py -> one validated, frozen `RunConfig`.

Flag names and meanings are PaddleNLP ERNIE 1.0's (`run_pretrain_static.py`), so its users can
switch; every flag is a field of a config slice (or a run-wide multi-task key: `--use_ema`,
`--ema_decay`, `--early_stopping_patience`, `--plugins`, `--callbacks`) and its `--help` text is
that field's metadata. Precedence: field default < `--config FILE.yaml` (keys = flag names) <
command line. Booleans accept a bare flag (`--use_amp` enables) or a value (`--use_amp false`).

Two modes, one engine. A `--config` YAML with `task_instance` is a PALM-style multi-task
configuration (ernie_mtl/config/multitask_yaml.py). Anything else is flag-mode pretraining, which becomes a
one-task setup here: the task `pretrain` (reader `pretrain`) on `--input_dir`, with the sampling
and masking flags as its options, a target whose quota is `--max_steps` optimizer steps.

All values are converted and validated here, before any process group or program exists; every
problem is collected into one `ConfigError` (flag, value, fix). Code below the entry point receives
the `RunConfig` slices only, never the argparse namespace.
"""
from __future__ import annotations

import argparse
import os
import sys
import typing
from dataclasses import MISSING, fields, replace
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ernie_mtl.config import multitask_yaml as palm
from ernie_mtl.config.errors import ConfigError
from ernie_mtl.config.model import is_static_params_dir
from ernie_mtl.config.hooks import ParseHooks
from ernie_mtl.config.multitask import MTL_DEFAULTS, MTL_KEYS, RUN_WIDE_KEYS, MultiTaskConfig, MultiTaskSetup
from ernie_mtl.config.run import SLICES, RunConfig
from ernie_mtl.config.slices import (DataConfig, DEVICES, LOG_LEVELS, OptimConfig, RESUME_WORDS, TrainConfig,
                                     canonical_cpu_kernels, field_help, parse_cpu_kernels, parse_preempt_signals)
from ernie_mtl.config.task import TaskSpec
from ernie_mtl.config.values import EXPECTED, NONE_WORDS, coerce, read_yaml, suggest

PROG = "run_multitask_static.py"
FLAG_MODE_TASK = "pretrain"  # the one task of a flag-mode pretraining run
CONFIG_MAPPING = "configuration mapping"  # how messages name a configuration given as a Python mapping
ANOMALY_POLICIES = ("skip", "stop", "replay", "none")
MAX_WORKERS = 64  # --num_workers: more processes per rank only cost memory
RUN_WIDE = "mtl"  # pseudo-slice of the run-wide multi-task flags
# flag name -> (slice name, field type); run-wide multi-task keys -> ("mtl", kind)
_FLAGS: Dict[str, Tuple[str, Any]] = {
    **{f.name: (slice_name, typing.get_type_hints(cls)[f.name]) for slice_name, cls in SLICES.items()
       for f in fields(cls)},
    **{key: (RUN_WIDE, MTL_KEYS[key]) for key in RUN_WIDE_KEYS},
}
# PaddleNLP flags for parallelism ERNIE does not have here: accepted at 1, explained otherwise.
_UNSUPPORTED_PARALLEL = {
    "mp_degree": "tensor (model) parallelism",
    "pp_degree": "pipeline parallelism",
}


def build_parser() -> argparse.ArgumentParser:
    """The parser: one flag per config field (values kept as given; `_convert` types them)."""
    p = argparse.ArgumentParser(
        prog=PROG, description="ERNIE pretraining and multi-task learning as fleet static programs.",
        argument_default=argparse.SUPPRESS,  # absent flags stay absent, so YAML values are not overridden
        allow_abbrev=False)  # a prefix such as --max must not silently mean --max_lr
    p.add_argument("--config", help="YAML file: flag values (keys = flag names without --), or a multi-task "
                                    "configuration (a global YAML with task_instance). The command line wins over it.")
    for slice_name, cls in SLICES.items():
        group = p.add_argument_group(cls.__name__, (cls.__doc__ or "").strip().splitlines()[0])
        helps = field_help(cls)
        for f in fields(cls):
            kind = _base_type(_FLAGS[f.name][1])
            default = f.default if f.default is not MISSING else None
            _add(group, f.name, kind, f"{helps[f.name]} (default: {_show(default)})")
    group = p.add_argument_group("Run-wide training extras", "also keys of a multi-task global YAML")
    for key, text in RUN_WIDE_KEYS.items():
        _add(group, key, _base_type(MTL_KEYS[key]), f"{text} (default: {_show(MTL_DEFAULTS[key])})")
    return p


# flags that were booleans and take a word now: alone on the command line they keep their old meaning
_BARE_VALUE = {"cpu_kernels": "auto"}


def _add(group, name: str, kind: type, text: str) -> None:
    if name in _BARE_VALUE:
        group.add_argument(f"--{name}", nargs="?", const=_BARE_VALUE[name], metavar="VALUE", help=text)
    elif kind is bool:
        group.add_argument(f"--{name}", nargs="?", const="true", metavar="BOOL", help=text)
    elif kind is tuple:
        group.add_argument(f"--{name}", metavar="A,B,...", help=text)
    else:
        group.add_argument(f"--{name}", metavar=getattr(kind, "__name__", "VALUE").upper(), help=text)


def _show(value: Any) -> str:
    return ",".join(value) if isinstance(value, tuple) else str(value)


def _base_type(annotation: Any) -> type:
    """int/float/str/bool/tuple behind Optional[...] and Tuple[str, ...]."""
    if isinstance(annotation, str):  # a run-wide key's kind
        return _TYPE_OF_KIND.get(annotation, str)
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    origin = typing.get_origin(annotation)
    if origin is tuple:
        return tuple
    if origin is typing.Union and len(args) == 1:
        return _base_type(args[0])
    return annotation


_KIND_OF_TYPE = {bool: "bool", int: "int", float: "float", tuple: "tuple", str: "str"}
_TYPE_OF_KIND = {"bool": bool, "strlist": tuple, "nonnegint": int, "posint": int, "optposint": int, "unit": float,
                 "posfloat": float, "nonneg": float}


def _convert(name: str, raw: Any, source: str) -> Any:
    """Typed value of flag `name` from a command-line string or a YAML value; raises ValueError with
    a message naming the flag, the value and what is expected."""
    slice_name, annotation = _FLAGS[name]
    if slice_name == RUN_WIDE:
        kind, optional = annotation, False
    else:
        kind = _KIND_OF_TYPE.get(_base_type(annotation), "str")
        optional = type(None) in typing.get_args(annotation)
    if raw is None or (optional and isinstance(raw, str) and raw.strip().lower() in NONE_WORDS):
        if optional:
            return None
        raise ValueError(f"--{name} ({source}) needs a value")
    try:
        return coerce(kind, raw)
    except ValueError:
        raise ValueError(f"--{name} {raw!r} ({source}) is not {EXPECTED.get(kind, kind)}"
                         + ("; or none to unset it" if optional else "")) from None


def _read_flag_yaml(path: str, problems: List[str]) -> Optional[Dict[str, Any]]:
    """The flag values of a `--config` file, or None when the file itself is unusable (unreadable,
    not YAML, a key given twice, empty): then its problem is the one to report, not the flags it
    would have set."""
    data = read_yaml(path, problems, what="config", label=f"--config {path}",
                     empty="write the training flags in it (keys are flag names without --, e.g. `max_steps: "
                           "1000`), or drop --config")
    if data is None:
        return None
    return _flag_values(data, path, problems)


def _flag_values(data: Mapping[str, Any], path: str, problems: List[str]) -> Dict[str, Any]:
    """The flags of a flag-mode configuration mapping (a `--config` file or a Python dict)."""
    values = {}
    for key, value in data.items():
        if key in _UNSUPPORTED_PARALLEL:
            problems += _unsupported_parallel(key, value, f"{path}: key {key!r}")
        elif key not in _FLAGS:
            problems.append(f"{path}: unknown key {key!r}{_suggest(key)}; keys are the flag names (see --help)")
        else:
            values[key] = value
    return values


def _unsupported_parallel(name: str, value: Any, where: str) -> List[str]:
    """PaddleNLP's --mp_degree/--pp_degree: 1 is accepted silently (their scripts pass it)."""
    try:
        if int(str(value).strip()) == 1:
            return []
    except ValueError:
        pass
    return [f"{where} {value!r}: {_UNSUPPORTED_PARALLEL[name]} is not supported for ERNIE here; ERNIE fits on "
            f"one device, so scale with data parallelism (more processes, --dp_degree) and --use_sharding "
            f"--sharding_degree N to split parameters, gradients and optimizer state; reduce memory with "
            f"--use_recompute and --use_amp. Pass {name} 1 or drop it"]


def _unknown_problems(unknown: Sequence[str]) -> List[str]:
    """One problem per unknown flag (its value, if any, is not reported separately)."""
    problems = []
    skip = False
    for k, token in enumerate(unknown):
        if skip:
            skip = False
            continue
        if token.startswith("--"):
            name, has_value, value = token[2:].partition("=")
            if name in _UNSUPPORTED_PARALLEL:
                if not has_value and k + 1 < len(unknown) and not unknown[k + 1].startswith("--"):
                    value, skip = unknown[k + 1], True
                problems += _unsupported_parallel(name, value, f"--{name}")
                continue
            problems.append(f"unknown argument {token!r}{_suggest(name)}; see --help")
        elif k == 0 or not unknown[k - 1].startswith("--"):
            problems.append(f"unexpected value {token!r}: every value follows its --flag")
    return problems


def _suggest(name: str) -> str:
    """The closest flag; a misspelt PALM name (learning_rate, save_path, ...) points at its flag."""
    close = suggest(name, [*_FLAGS, *palm.PALM_ALIASES])
    alias = close[len(" (did you mean '"):-len("'?)")] if close else ""
    if alias in palm.PALM_ALIASES:
        flag = palm.PALM_ALIASES[alias]
        return f" (did you mean --{flag}? PALM's {alias} is --{flag} here)"
    return close


def parse_config(argv: Optional[Sequence[str]] = None, *, hooks: ParseHooks,
                 world_size: Optional[int] = None, config: Optional[Mapping[str, Any]] = None,
                 config_dir: Optional[str] = None) -> RunConfig:
    """Parse and validate the command line (+ YAML) into a RunConfig; ConfigError lists every problem.

    `hooks`: what parsing needs from the layers above config (task types, plugins, corpus
    specifications, the checks that need data, topology, device or checkpoints: config/hooks.py);
    the engine's are `ernie_mtl.engine.config_checks.HOOKS` (`engine.validate.parse(argv)` passes them).
    `world_size`: the number of processes the topology must fit (default: from the launcher's
    environment, 1 without a launcher). `config`: the content of a `--config` file given as a mapping
    (the Python API), relative paths in it resolved against `config_dir` (default: the current
    directory); it cannot be combined with `--config`.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        argv, task_cli = palm.split_task_overrides(argv)
    except ConfigError as e:
        raise ConfigError(e.problems) from None
    parser = build_parser()
    namespace, unknown = parser.parse_known_args(argv)
    given = vars(namespace)
    config_file = given.pop("config", None)
    if config is not None:
        if config_file:
            raise ConfigError([f"--config {config_file} and a configuration mapping: give one of them"])
        config_dir = os.path.abspath(config_dir or os.getcwd())
        config_file = CONFIG_MAPPING
        multitask = "task_instance" in config
    else:
        multitask = bool(config_file) and os.path.isfile(config_file) and palm.is_multitask_yaml(config_file)
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
        # every command-line value: flags that are also task keys (max_seq_len, masked_lm_prob, ...) reach the tasks
        try:
            setup = palm.load_multitask_config(
                config_file, hooks=hooks, data=config, base_dir=config_dir, cli={**mtl_cli, **given}, task_cli=task_cli,
                flag_names={k for k, (s, _) in _FLAGS.items() if s != RUN_WIDE},
                splits=("pred",) if _truthy(given.get("do_predict")) else () if _truthy(given.get("do_eval"))
                else ("train", "dev", "test"))  # training reads the test files at its end: check them now
            for key, raw in setup.run_flags.items():
                values[key], sources[key] = raw, f"from {config_file}"
            if _truthy(given.get("do_predict")) and "pred_file" not in given and given.get("task"):
                spec = next((candidate for candidate in setup.tasks if candidate.name == given["task"]), None)
                if spec is not None and spec.pred_file:  # the task file's pred_file (PALM)
                    given["pred_file"] = spec.pred_file
        except ConfigError as e:
            problems += e.problems
        given = {k: v for k, v in given.items() if _FLAGS[k][0] != RUN_WIDE}  # the loader typed those
    elif config is not None:
        for key, raw in _flag_values({str(k).lstrip("-"): v for k, v in config.items()}, config_file, problems).items():
            values[key], sources[key] = raw, f"from the {config_file}"
    elif config_file:
        from_file = _read_flag_yaml(config_file, problems)
        if from_file is None:  # what the file would have set is unknown: "--input_dir is required" would mislead
            raise ConfigError(problems)
        for key, raw in from_file.items():
            values[key], sources[key] = raw, f"from {config_file}"
    for key, raw in given.items():
        values[key], sources[key] = raw, "command line"
    typed: Dict[str, Dict[str, Any]] = {name: {} for name in [*SLICES, RUN_WIDE]}
    for key, raw in values.items():
        try:
            typed[_FLAGS[key][0]][key] = _convert(key, raw, sources[key])
        except ValueError as e:
            problems.append(str(e))
    # a value that could not be typed keeps its default, so the semantic checks still report the rest
    slices = {name: cls(**typed[name]) for name, cls in SLICES.items()}
    if setup is None and multitask:  # the multi-task file itself is broken: its problems say why
        raise ConfigError(problems)
    if setup is None:
        setup = flag_mode_setup(slices, typed[RUN_WIDE])
    cfg = _absolute_paths(RunConfig(**slices, setup=setup), hooks, config_dir if config is not None else None)
    try:
        validate(cfg, hooks=hooks, world_size=world_size)
    except ConfigError as e:
        problems += e.problems
    if problems:
        raise ConfigError(problems)
    return cfg


def flag_mode_setup(slices: Mapping[str, Any], run_wide: Mapping[str, Any]) -> MultiTaskSetup:
    """The one-task setup of flag-mode pretraining: task `pretrain` on `--input_dir` (train, valid
    and test splits of the corpus by `--split`), the sampling and masking flags as its options, a
    target whose quota is `--max_steps` optimizer steps (set by the run plan)."""
    data, model, parallel = slices["data"], slices["model"], slices["parallel"]
    options = {"masked_lm_prob": data.masked_lm_prob, "max_predictions_per_seq": data.max_predictions_per_seq,
               "max_ngrams": data.max_ngrams, "split": data.split, "short_seq_prob": data.short_seq_prob,
               "binary_head": model.binary_head, "pair_task": "sop"}
    spec = TaskSpec(name=FLAG_MODE_TASK, reader="pretrain", index=0, train_file=data.input_dir,
                    dev_file=data.input_dir, test_file=data.input_dir, max_seq_len=data.max_seq_len,
                    batch_size=parallel.micro_batch_size, is_target=True, mix_ratio=1.0, options=options)
    mtl = MultiTaskConfig(**{**MTL_DEFAULTS, **run_wide, "task_instance": (FLAG_MODE_TASK,), "mix_ratio": (1.0,),
                             "target_tag": (True,), "task_reuse_tag": None, "task_dir": ""})
    return MultiTaskSetup(tasks=(spec,), mtl=mtl, flag_mode=True)


def _truthy(raw: Any) -> bool:
    try:
        return raw is not None and coerce("bool", raw)
    except ValueError:
        return False


def _take_mtl_keys(unknown: Sequence[str], out: Dict[str, Any]) -> List[str]:
    """Move `--<multi-task key> value` pairs (mix_ratio, sampling, num_epochs, batch_size, ...) from the
    unknown arguments into `out`; returns the arguments still unknown."""
    keys = set(MTL_KEYS) | set(palm.BROADCAST_KEYS) | set(palm.PALM_ALIASES)
    rest: List[str] = []
    k = 0
    while k < len(unknown):
        token = unknown[k]
        name, has_value, value = token[2:].partition("=") if token.startswith("--") else ("", "", "")
        bare_bool = name in keys and MTL_KEYS.get(name) == "bool"
        if name in keys and (has_value or (k + 1 < len(unknown) and not unknown[k + 1].startswith("--"))):
            if not has_value:
                value = unknown[k + 1]
                k += 1
            out[name] = value
        elif bare_bool and not has_value:  # --use_task_id alone means true, as for the flags
            out[name] = "true"
        else:
            rest.append(token)
        k += 1
    return rest


def _absolute_paths(cfg: RunConfig, hooks: ParseHooks, base: Optional[str] = None) -> RunConfig:
    """Paths made absolute: the trainer changes directory while building programs (fleet dumps). A
    corpus mixture keeps its canonical form (absolute prefixes, weights)."""
    def absolute(path: Optional[str]) -> Optional[str]:
        return None if path is None else os.path.abspath(os.path.join(base or os.getcwd(), os.path.expanduser(path)))

    input_dir = cfg.data.input_dir
    if input_dir is not None:
        try:
            input_dir = hooks.corpus_spec(input_dir, what="--input_dir", base_dir=base)
        except ConfigError:
            input_dir = input_dir if " " in input_dir.strip() else absolute(input_dir)  # validate() reports it
    data = replace(cfg.data, input_dir=input_dir, data_cache=absolute(cfg.data.data_cache),
                   tokenizer_name_or_path=absolute(cfg.data.tokenizer_name_or_path
                                                   or _model_dir(cfg.model.model_name_or_path)))
    resume = cfg.train.resume if cfg.train.resume in RESUME_WORDS else absolute(cfg.train.resume)
    try:  # one spelling per choice in the recorded config (a YAML `false` arrives as "False")
        cpu_kernels = canonical_cpu_kernels(cfg.train.cpu_kernels)
    except ValueError:  # validate() reports it
        cpu_kernels = cfg.train.cpu_kernels
    train = replace(cfg.train, output_dir=absolute(cfg.train.output_dir), resume=resume, cpu_kernels=cpu_kernels,
                    init_from=absolute(cfg.train.init_from),
                    checkpoint=absolute(cfg.train.checkpoint), eval_file=absolute(cfg.train.eval_file))
    model = cfg.model
    if os.path.isdir(model.model_name_or_path):
        model = replace(model, model_name_or_path=absolute(model.model_name_or_path))
    setup = cfg.setup
    if setup.flag_mode:
        run_wide = {k: getattr(setup.mtl, k) for k in RUN_WIDE_KEYS}
        run_wide["plugins"] = tuple(absolute(p) for p in run_wide["plugins"])
        setup = flag_mode_setup({"data": data, "model": model, "parallel": cfg.parallel}, run_wide)
    return replace(cfg, model=model, data=data, train=train, setup=setup)


def _model_dir(name_or_path: str) -> Optional[str]:
    """Where the vocabulary of a model directory is: the directory, or for a static parameter
    directory without one (PALM's pretrain/<model>/params) its parent."""
    if not os.path.isdir(name_or_path):
        return None
    parent = os.path.dirname(os.path.abspath(name_or_path))
    if (is_static_params_dir(name_or_path) and not os.path.isfile(os.path.join(name_or_path, "vocab.txt"))
            and os.path.isfile(os.path.join(parent, "vocab.txt"))):
        return parent
    return name_or_path


def validate(cfg: RunConfig, *, hooks: ParseHooks, world_size: Optional[int] = None) -> RunConfig:
    """Check every slice and their combinations (config's own checks, then `hooks.check` for what
    needs the layers above); raise one ConfigError with all problems."""
    problems: List[str] = []

    def collect(check, *args, **kwargs):
        try:
            return check(*args, **kwargs)
        except ConfigError as e:
            problems.extend(e.problems)
            return None

    if cfg.train.do_predict and cfg.train.do_eval:
        raise ConfigError(["--do_predict and --do_eval: pick one (predict an unlabelled file, or evaluate a "
                           "labelled one)"])
    if not (cfg.train.do_eval or cfg.train.do_predict):  # those read a saved model: nothing else of the run matters
        collect(cfg.amp.validate)
        collect(cfg.optim.validate)
        collect(cfg.parallel.validate)
        resolved = collect(cfg.model.resolve)  # validates the model slice too
        arch = resolved.arch if resolved else None
        needs_mask = any(spec.reader in ("mlm", "pretrain") for spec in cfg.setup.tasks)
        problems += _data_problems(cfg.data, arch, flag_mode=cfg.flag_mode, needs_mask=needs_mask)
        if not cfg.flag_mode:
            problems += _multitask_problems(cfg, arch)
        problems += _train_problems(cfg.train, cfg.optim)
        problems += _output_dir_problems(cfg.train, cfg.data)
        if cfg.amp.use_amp and cfg.amp.amp_level == "O2" and cfg.parallel.use_sharding:
            problems.append("--amp_level O2 with --sharding_degree > 1 cannot be built by fleet 2.6.2 (its sharding "
                            "pass rejects O2's parameter casts); use --amp_level O1 with sharding, or O2 without")
    problems += hooks.check(cfg, world_size=world_size)
    if problems:
        raise ConfigError(problems)
    return cfg


def _multitask_problems(cfg: RunConfig, arch: Optional[Mapping[str, Any]]) -> List[str]:
    problems = []
    for spec in cfg.setup.tasks:
        if arch is not None and spec.max_seq_len > arch["max_position_embeddings"]:
            problems.append(f"task {spec.name}: max_seq_len {spec.max_seq_len} exceeds the model's "
                            f"max_position_embeddings {arch['max_position_embeddings']}")
    if cfg.setup.mtl.use_task_id and cfg.model.model_type != "ernie":
        problems.append("use_task_id needs the ERNIE backbone (BERT has no task embedding); set backbone: ernie "
                        "or use_task_id: false")
    return problems


def vocab_problems(vocab_file: Path, *, need_mask: bool) -> Tuple[Optional[int], List[str]]:
    """(size, problems) of a vocab.txt: readable UTF-8, not empty, with the special tokens the model
    needs ([PAD], [CLS], [SEP], [UNK]; [MASK] for masked-LM and pretraining tasks)."""
    from data_tools.safe_io import UnsafeFile, read_bytes_bounded
    from data_tools.tokenization import VOCAB_MAX_BYTES

    try:
        raw = read_bytes_bounded(vocab_file, max_bytes=VOCAB_MAX_BYTES, what="vocab file")
        tokens = [line.rstrip("\r\n") for line in raw.decode("utf-8").splitlines()]
    except UnsafeFile as e:
        return None, [f"--tokenizer_name_or_path {e}; give the vocab.txt the corpus was tokenized with"]
    except UnicodeDecodeError as e:
        return None, [f"--tokenizer_name_or_path {vocab_file}: not UTF-8 text (byte {e.start}); give the vocab.txt "
                      "the corpus was tokenized with"]
    except OSError as e:
        return None, [f"--tokenizer_name_or_path {vocab_file}: cannot read it ({e.strerror})"]
    if not tokens:
        return 0, [f"--tokenizer_name_or_path {vocab_file} is empty; give the vocab.txt written by "
                   "python -m data_tools.build_vocab (or a PaddleNLP model's)"]
    if tokens[0].startswith("\ufeff"):  # else "[PAD]" would be reported missing: the BOM is the cause
        from data_tools.tokenization import bom_problem

        return len(tokens), [f"--tokenizer_name_or_path {bom_problem(vocab_file, tokens[0])}"]
    wanted = ["[PAD]", "[CLS]", "[SEP]", "[UNK]"] + (["[MASK]"] if need_mask else [])
    missing = [token for token in wanted if token not in set(tokens)]
    if missing:
        return len(tokens), [f"--tokenizer_name_or_path {vocab_file} lacks the special token(s) {missing}"
                             + (" ([MASK] is needed by masked-LM and pretraining tasks)" if "[MASK]" in missing else "")
                             + "; build the vocabulary with python -m data_tools.build_vocab, which adds them"]
    return len(tokens), []


def _output_dir_problems(train: TrainConfig, data: Optional[DataConfig] = None) -> List[str]:
    """--output_dir (and --data_cache, where the index caches go) must be folders this process can
    create and write (checked before any work)."""
    problems = _folder_problems("--output_dir", train.output_dir)
    if data is not None and data.data_cache:
        problems += _folder_problems("--data_cache", data.data_cache, use="the index caches are written in it")
    return problems


def _folder_problems(flag: str, folder: str, use: str = "") -> List[str]:
    """A folder this process can create and write: not a file, not under a file, writable."""
    out = Path(folder)
    why = f" ({use})" if use else ""
    if out.exists() and not out.is_dir():
        return [f"{flag} {out} is a file, not a folder{why}; choose a folder path"]
    probe = out
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        return [f"{flag} {out}: {probe} is a file, not a folder{why}; choose another path"]
    if not os.access(probe, os.W_OK | os.X_OK):
        return [f"{flag} {out}: {probe} is not writable by this user{why}; choose a folder you can write to"]
    return []


def _data_problems(data: DataConfig, arch: Optional[Mapping[str, Any]], *, flag_mode: bool,
                   needs_mask: bool = True) -> List[str]:
    problems = []
    vocab_size = None
    if data.vocab_file is None:
        problems.append("--tokenizer_name_or_path is required when --model_name_or_path is an architecture name: "
                        "give the vocab.txt the corpus was tokenized with (or its directory)")
    elif not data.vocab_file.exists():
        problems.append(f"--tokenizer_name_or_path {data.tokenizer_name_or_path}: {data.vocab_file} not found; "
                        "give a vocab.txt or a directory containing one")
    else:
        vocab_size, problems_of_vocab = vocab_problems(data.vocab_file, need_mask=needs_mask)
        problems += problems_of_vocab
    if flag_mode and data.input_dir is None:
        problems.append("--input_dir is required: the corpus prefix (path without .bin/.idx) written by "
                        "`python -m data_tools.create_pretraining_data`, weight/prefix pairs, or a folder of corpora")
    if arch is not None:
        if flag_mode and data.max_seq_len > arch["max_position_embeddings"]:
            problems.append(f"--max_seq_len {data.max_seq_len} exceeds the model's max_position_embeddings "
                            f"{arch['max_position_embeddings']}; use --max_seq_len <= "
                            f"{arch['max_position_embeddings']}")
        if vocab_size is not None and vocab_size > arch["vocab_size"]:
            problems.append(f"--tokenizer_name_or_path {data.vocab_file} has {vocab_size} tokens but the model's "
                            f"vocab_size is {arch['vocab_size']}; pass --vocab_size {vocab_size}")
    if data.num_workers < 0:
        problems.append(f"--num_workers {data.num_workers} must be >= 0 (0 = load in the training process)")
    elif data.num_workers > MAX_WORKERS:
        problems.append(f"--num_workers {data.num_workers}: at most {MAX_WORKERS} data-loading processes per rank "
                        "(each is a process with its own memory; 2-4 keep a GPU fed: docs/performance.md)")
    if not data.worker_timeout >= 0 or data.worker_timeout == float("inf"):
        problems.append(f"--worker_timeout {data.worker_timeout} must be a number of seconds >= 0 (0: wait forever)")
    if data.prefetch_factor < 1:
        problems.append(f"--prefetch_factor {data.prefetch_factor} must be >= 1 (micro-batches each worker builds "
                        "ahead; 2 is PyTorch's and PaddleNLP's default)")
    return problems


def _train_problems(train: TrainConfig, optim: OptimConfig) -> List[str]:
    problems = []
    if train.stage != "final":
        problems.append(f"--stage {train.stage} picks the model --do_predict and --do_eval read; a training run "
                        "has none to pick: drop it")
    for name in ("save_steps", "checkpoint_steps", "logging_freq", "eval_freq", "eval_iters", "keep_last"):
        value = getattr(train, name)
        if value < 1:
            problems.append(f"--{name} {value} must be >= 1")
    try:
        parse_preempt_signals(train.preempt_signals)
    except ValueError as e:
        problems.append(str(e))
    if train.on_anomaly not in ANOMALY_POLICIES:
        problems.append(f"--on_anomaly {train.on_anomaly!r} is not supported; use one of {list(ANOMALY_POLICIES)}")
    if train.loss_spike_factor < 0 or 0 < train.loss_spike_factor <= 1:
        problems.append(f"--loss_spike_factor {train.loss_spike_factor} must be > 1 (or 0 to turn the warning off)")
    if train.slow_rank_factor < 0:
        problems.append(f"--slow_rank_factor {train.slow_rank_factor} must be >= 0 (0 turns the warning off)")
    if train.slow_rank_windows < 1:
        problems.append(f"--slow_rank_windows {train.slow_rank_windows} must be >= 1")
    if train.log_level not in LOG_LEVELS:
        problems.append(f"--log_level {train.log_level!r} is not supported; use one of {list(LOG_LEVELS)}")
    if train.device not in DEVICES:
        problems.append(f"--device {train.device!r} is not supported; use one of {list(DEVICES)}")
    if train.checkpoint_format not in ("paddle", "portable"):
        problems.append(f"--checkpoint_format {train.checkpoint_format!r} is not supported; use paddle or portable")
    if train.init_from is not None and train.resume not in RESUME_WORDS:
        problems.append(f"--init_from {train.init_from} starts a new run from its weights, --resume {train.resume} "
                        "continues a run: pick one (--resume auto, the default, resumes this run's own checkpoint "
                        "when there is one and warm starts from --init_from otherwise)")
    if train.init_optimizer and train.init_from is None:
        problems.append("--init_optimizer loads the optimizer state of --init_from, which is not given; add "
                        "--init_from CHECKPOINT or drop --init_optimizer")
    if train.init_from is not None and not os.path.isdir(train.init_from):
        problems.append(f"--init_from {train.init_from}: no such directory; give a checkpoint folder (model_last, "
                        "model_<step>, best_<task>) or a PaddleNLP model directory (config.json + "
                        "model_state.pdparams)")
    try:
        parse_cpu_kernels(train.cpu_kernels)
    except ValueError as e:
        problems.append(str(e))
    return problems
