"""PALM-compatible multi-task configuration: a global YAML plus one YAML per task -> TaskSpecs.

The global YAML names the tasks (`task_instance: "a, b, c"`), their sampling weights, which are
targets, which share a head, the MTL settings of `MultiTaskConfig`, run flags of args.py (also
under their PALM names: `learning_rate`, `save_path`, ...) and task keys broadcast to every task
(`max_seq_len`, `batch_size`, ...). Each task is described by `<task_dir>/<task>.yaml` (files,
`reader`, `paradigm`, task keys, the task type's own options). docs/multitask_config.md lists every key.

Precedence for a task's value, lowest first (PALM's documented order, plus per-task overrides):
    defaults < task file < global file < command line (--key) < command line (--tasks.<task>.<key>)
An override of a differing value from a task file (or of a global value by --tasks.<task>.<key>) is
recorded in `MultiTaskSetup.reports`; PALM raised an exception instead.

Everything is checked up front and every problem goes into one `ConfigError` naming the file and
the key. Relative data paths in a task file resolve against that file's folder; when nothing is
there but the path exists relative to the current directory (how PALM resolved them), that one is
used and reported.
"""
from __future__ import annotations

import os
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from ernie_mtl.config.errors import ConfigError
from ernie_mtl.config.hooks import ParseHooks
from ernie_mtl.config.model import palm_arch
from ernie_mtl.config.multitask import MTL_DEFAULTS, MTL_KEYS, MultiTaskConfig, MultiTaskSetup
from ernie_mtl.config.task import TaskSpec
from ernie_mtl.config.values import coerce as _coerce
from ernie_mtl.config.values import kind_of_default as _option_kind
from ernie_mtl.config.values import read_yaml, suggest, yaml_value as _yaml_value

SAMPLING_STRATEGIES = ("palm", "proportional", "temperature")  # ernie_mtl/planning/schedule.py implements them
LOSS_BALANCE = ("none", "uncertainty", "normalize")  # ernie_mtl/program/forward.py implements them
# readers whose training file `tapt: true` reads as text, and the columns holding the text
TAPT_READERS = {"cls": "text_a, text_b", "match": "text_a, text_b, text_b_neg", "seq_label": "text_a",
                "mlm": "text_a"}

# PALM v0.3 name -> our run flag (args.py). `optimizer` is checked, not mapped (we have AdamW only).
PALM_ALIASES: Dict[str, str] = {
    "learning_rate": "max_lr", "warmup_proportion": "warmup_rate", "random_seed": "seed",
    "print_every_n_steps": "logging_freq", "save_every_n_steps": "save_steps",
    "save_ckpt_every_n_steps": "save_steps", "save_path": "output_dir", "backbone": "model_type",
    "pretrain_model_path": "model_name_or_path", "vocab_path": "tokenizer_name_or_path",
}
# PALM keys with no equivalent here, and what to do instead.
PALM_UNSUPPORTED: Dict[str, str] = {
    "use_gpu": "use device: gpu or device: cpu",
    "save_infermodel_every_n_steps": "inference models are exported when a target reaches its quota and at "
                                     "the end; remove it",
}
SPLIT_KEYS = ("train_file", "dev_file", "test_file", "pred_file")
# Task keys -> kind. BROADCAST_KEYS may also be set globally (and on the command line) for every task.
TASK_KEYS: Dict[str, str] = {
    **{k: "path" for k in SPLIT_KEYS}, "reader": "str", "paradigm": "str", "max_seq_len": "posint",
    "batch_size": "posint", "loss_weight": "nonneg", "num_epochs": "posfloat", "do_lower_case": "bool",
    "for_cn": "bool", "export_from": "exportfrom",
    # PALM 1.x's reader and prediction keys: shuffle (False: the file's order every epoch), pred_batch_size
    # (prediction's batch size), pred_output_path (where Controller.pred writes), print_first_n (noted, unused)
    "shuffle": "bool", "pred_batch_size": "posint", "pred_output_path": "outpath", "print_first_n": "nonnegint",
    # recipes of multi-task learning that pays (docs/multitask.md): task-adaptive masked LM, the refine stage
    "tapt": "bool", "tapt_file": "path", "tapt_mix_ratio": "nonneg", "refine": "bool", "refine_steps": "optposint",
    "refine_epochs": "optposfloat", "refine_learning_rate": "optposfloat",
}
BROADCAST_KEYS = ("max_seq_len", "batch_size", "loss_weight", "do_lower_case", "for_cn", "shuffle", "pred_batch_size",
                  "print_first_n")
# A reader's name in PALM task files -> ours; and the PALM paradigm names accepted with each reader.
PALM_READERS = {"ner": "seq_label"}
PALM_PARADIGMS = {"seq_label": ("seq_label", "ner")}
# Option values with these name endings are paths (resolved like data files, must exist when set).
PATH_OPTION_SUFFIXES = ("_file", "_path", "_config", "_dir", "label_map")
_TASK_NAME = re.compile(r"^[A-Za-z0-9_-]+$")


def _backbone_family(value: Any) -> Optional[str]:
    """PALM's backbone name -> model_type: "ernie", "bert" (also "ernie-en-uncased-large" style names)."""
    family = str(value).strip().lower().split("-")[0]
    return family if family in ("ernie", "bert") else None


def _coerce_option(kind: str, value: Any) -> Any:
    return _coerce(kind, value)


def _suggest(key: str, known) -> str:
    return suggest(key, known)


def _read_yaml(path: str, what: str, problems: List[str]) -> Optional[Dict[str, Any]]:
    return read_yaml(path, problems, what=what)


def _exists(path: str) -> bool:
    """A file, a directory, or a .bin/.idx corpus prefix (pretraining data)."""
    return os.path.exists(path) or (os.path.isfile(path + ".bin") and os.path.isfile(path + ".idx"))


def _resolve(value: str, base_dir: str) -> Tuple[str, Optional[str]]:
    """(absolute path, fallback note). Relative: `base_dir` first, then the current directory."""
    value = os.path.expanduser(value)
    if os.path.isabs(value):
        return os.path.normpath(value), None
    first = os.path.normpath(os.path.join(base_dir, value))
    if _exists(first):
        return first, None
    cwd = os.path.abspath(value)
    if cwd != first and _exists(cwd):
        return cwd, f"{value} is not in {base_dir}; using {cwd} (relative to the current directory, as PALM did)"
    return first, None


# -- entry points -----------------------------------------------------------------------------------------
def is_multitask_yaml(path: str) -> bool:
    """Whether `path` is a readable YAML mapping with `task_instance` (a multi-task global config)."""
    problems: List[str] = []
    data = _read_yaml(path, "config", problems) if os.path.isfile(path) else None
    return bool(data) and "task_instance" in data


def split_task_overrides(argv: Sequence[str]) -> Tuple[List[str], Dict[str, Dict[str, str]]]:
    """Take `--tasks.<task>.<key>=value` / `--tasks.<task>.<key> value` out of `argv`.

    Returns (the other arguments, {task: {key: value string}}) for `load_multitask_config(task_cli=...)`.
    """
    rest: List[str] = []
    out: Dict[str, Dict[str, str]] = {}
    tokens = list(argv)
    k = 0
    while k < len(tokens):
        token = tokens[k]
        if not token.startswith("--tasks."):
            rest.append(token)
            k += 1
            continue
        name, has_value, value = token[len("--tasks."):].partition("=")
        task, _, key = name.partition(".")
        if not task or not key:
            raise ConfigError([f"{token}: per-task overrides are written --tasks.<task>.<key>=<value>"])
        if not has_value:
            if k + 1 >= len(tokens) or tokens[k + 1].startswith("--"):
                raise ConfigError([f"{token} needs a value (--tasks.{task}.{key}=<value>)"])
            value = tokens[k + 1]
            k += 1
        out.setdefault(task, {})[key] = value
        k += 1
    return rest, out


def load_multitask_config(global_yaml: str, *, hooks: ParseHooks, data: Optional[Mapping[str, Any]] = None,
                          base_dir: Optional[str] = None, cli: Optional[Mapping[str, Any]] = None,
                          task_cli: Optional[Mapping[str, Mapping[str, Any]]] = None, flag_names: Set[str],
                          splits: Sequence[str] = ("train", "dev")) -> MultiTaskSetup:
    """Read the global YAML and its task YAMLs into TaskSpecs, the MTL settings and run flags.

    `cli`: command-line values {key: value} (global keys, task keys for every task, run flags and
    PALM aliases; strings are typed like YAML values except run flags, which args.py types);
    `task_cli`: {task: {key: value}} from `--tasks.<task>.<key>`; `flag_names`: the flags of
    args.py (a global key among them is a run flag); `splits`: the data the run reads — `train`
    requires every task's train_file, and each listed split's file must exist when set; `hooks`:
    task types, plugins and corpus specifications (config/hooks.py); `data`: the global configuration
    as a mapping instead of the file `global_yaml` (then only a label in messages), its relative paths
    against `base_dir`. Tasks come from `<task_dir>/<task>.yaml`, or inline from the global key
    `tasks` ({task: {key: value}}), where relative paths are against the global file's folder.
    Raises one ConfigError listing every problem.
    """
    return _Loader(global_yaml, hooks, data, base_dir, dict(cli or {}),
                   {task: dict(v) for task, v in (task_cli or {}).items()},
                   set(flag_names), tuple(splits)).load()


class _Loader:
    def __init__(self, global_yaml: str, hooks: ParseHooks, data: Optional[Mapping[str, Any]],
                 base_dir: Optional[str], cli: Dict[str, Any], task_cli: Dict[str, Dict[str, Any]],
                 flag_names: Set[str], splits: Tuple[str, ...]):
        self.data = None if data is None else {str(k).lstrip("-"): v for k, v in data.items()}
        self.path = global_yaml if data is not None else os.path.abspath(global_yaml)
        self.hooks = hooks
        self.base = os.path.abspath(base_dir or os.getcwd()) if data is not None else os.path.dirname(self.path)
        self.inline: Optional[Dict[str, Any]] = None  # tasks given inline (`tasks:`), by name
        self.cli = {str(k).lstrip("-"): v for k, v in cli.items()}
        self.task_cli = task_cli
        self.flags = flag_names
        self.splits = splits
        self.problems: List[str] = []
        self.reports: List[str] = []
        self.run_flags: Dict[str, Any] = {}
        self.flag_source: Dict[str, str] = {}

    def load(self) -> MultiTaskSetup:
        data = dict(self.data) if self.data is not None else _read_yaml(self.path, "global config", self.problems)
        if data is None:
            raise ConfigError(self.problems)
        if "tasks" in data:
            self.inline = data.pop("tasks")
            if not isinstance(self.inline, Mapping) or not all(isinstance(v, Mapping) for v in self.inline.values()):
                self.problems.append(f"{self.path}: key 'tasks' must map each task name to its keys "
                                     "({name: {reader: ..., train_file: ...}}), got "
                                     f"{type(self.inline).__name__}")
                raise ConfigError(self.problems)
        for layer, where in ((data, self.path), (self.cli, "the command line")):
            if "epoch" in layer:  # PALM 1.x's name of num_epochs
                if "num_epochs" in layer:
                    self.problems.append(f"{where}: both 'epoch' (PALM 1.x's name) and 'num_epochs' are set; keep one")
                else:
                    layer["num_epochs"] = layer.pop("epoch")
                    self.reports.append(f"{where}: PALM's epoch sets num_epochs {layer['num_epochs']}")
        layers = [(f"global {self.path}", data), ("command line", self.cli)]
        mtl_raw = {k: (v, src) for src, layer in layers for k, v in layer.items() if k in MTL_KEYS}
        mtl = self._mtl(mtl_raw)
        if mtl is None:
            raise ConfigError(self.problems)
        self._import_plugins(mtl.plugins)
        task_files = [self._read_task(mtl, name) for name in mtl.task_instance]
        types = [self._task_type(mtl, i, tf) for i, tf in enumerate(task_files)]
        option_owners: Dict[str, List[int]] = {}
        for i, cls in enumerate(types):
            for key in (cls.options if cls else {}):
                option_owners.setdefault(key, []).append(i)
        broadcast: Dict[str, List[Tuple[str, Any]]] = {}  # key -> [(source label, value)], lowest first
        for src, layer in layers:
            for key, value in layer.items():
                if key in MTL_KEYS:
                    continue
                on_cli = src == "command line"
                where = f"command line --{key}" if on_cli else f"{self.path}: key {key!r}"
                if key in BROADCAST_KEYS or key in option_owners:
                    broadcast.setdefault(key, []).append(
                        (f"command line --{key}", _yaml_value(value)) if on_cli else (f"global {self.path}", value))
                elif not self._global_setting(key, value, where, src):
                    self._unknown_global(key, where, option_owners)
        for task, overrides in self.task_cli.items():
            if task not in mtl.task_instance:
                self.problems.append(f"--tasks.{task}.*: no task {task!r} in task_instance {list(mtl.task_instance)}")
        specs = []
        for i, name in enumerate(mtl.task_instance):
            if task_files[i] is not None and types[i] is not None:
                spec = self._spec(mtl, i, task_files[i], types[i], broadcast)
                if spec is not None:
                    specs.append(spec)
        if not self.problems:
            self._check_groups(mtl, specs)
        if not self.problems:
            self._check_refine(mtl, specs)
        if not self.problems:
            mtl, specs = self._add_tapt_tasks(mtl, specs)
        if self.problems:
            raise ConfigError(self.problems)
        if mtl.early_stopping_patience:
            for spec in specs:
                if spec.is_target and spec.dev_file is None:
                    self.reports.append(f"task {spec.name}: no dev_file, so early_stopping_patience does not apply "
                                        "to it (it trains to its quota)")
        return MultiTaskSetup(tasks=tuple(specs), mtl=mtl, run_flags=self.run_flags, reports=self.reports)

    # -- global MTL keys ----------------------------------------------------------------------------------
    def _mtl(self, raw: Dict[str, Tuple[Any, str]]) -> Optional[MultiTaskConfig]:
        values: Dict[str, Any] = {}
        for key, (value, src) in raw.items():
            kind = MTL_KEYS[key]
            if src == "command line" and kind not in ("strlist", "floatlist", "intlist", "str"):
                value = _yaml_value(value)
            try:
                values[key] = _coerce(kind, value)
            except ValueError as e:
                where = f"{self.path}: key {key!r}" if src != "command line" else f"command line --{key}"
                self.problems.append(f"{where}: {e}")
        if "task_instance" not in raw:
            self.problems.append(f"{self.path}: key 'task_instance' is required: the task names, e.g. "
                                 "task_instance: \"sentiment, ner\" (one <task_dir>/<name>.yaml each)")
            return None
        names = values.get("task_instance")
        if names is None:
            return None
        where = f"{self.path}: key 'task_instance'"
        if not names:
            self.problems.append(f"{where} lists no task")
            return None
        bad = [n for n in names if not _TASK_NAME.match(n)]
        if bad:
            self.problems.append(f"{where}: task names {bad} may only use ASCII letters (a-z, A-Z), digits, '_' and "
                                 "'-' (a name becomes file and folder names, feed names and VisualDL tags); rename "
                                 "the task and its task file in ASCII (e.g. task_1 and task_1.yaml)")
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            self.problems.append(f"{where}: {dupes} listed more than once")
        n = len(names)
        for key in ("mix_ratio", "target_tag", "task_reuse_tag"):
            if key in values and len(values[key]) != n:
                self.problems.append(f"{self.path}: key {key!r} has {len(values[key])} values but task_instance has "
                                     f"{n} tasks; give one value per task, in task_instance order")
                values.pop(key)
        if "target_tag" in values and any(tag not in (0, 1) for tag in values["target_tag"]):
            self.problems.append(f"{self.path}: key 'target_tag' {list(values['target_tag'])}: each value must be "
                                 "1 (target) or 0 (auxiliary)")
        sampling = values.get("sampling", "palm")
        if sampling not in SAMPLING_STRATEGIES:
            self.problems.append(f"{self.path}: key 'sampling' {sampling!r} is not one of "
                                 f"{list(SAMPLING_STRATEGIES)}")
        if sampling != "palm" and "mix_ratio" in values and any(m != 1.0 for m in values["mix_ratio"]):
            self.problems.append(f"{self.path}: key 'mix_ratio' is only used with sampling: palm (sampling "
                                 f"{sampling!r} derives the mix from the data sizes); drop one of them")
        if sampling != "temperature" and values.get("temperature", 1.0) != 1.0:
            self.problems.append(f"{self.path}: key 'temperature' needs sampling: temperature")
        if sampling == "palm" and values.get("examples_cap") is not None:
            self.problems.append(f"{self.path}: key 'examples_cap' needs sampling: proportional or temperature")
        if sampling == "palm" and values.get("temperature_end") is not None:
            self.problems.append(f"{self.path}: key 'temperature_end' anneals the temperature of sampling: "
                                 "temperature (or proportional, which starts at T = 1); PALM's mix_ratio is fixed")
        if values.get("loss_balance", "none") not in LOSS_BALANCE:
            self.problems.append(f"{self.path}: key 'loss_balance' {values['loss_balance']!r} is not one of "
                                 f"{list(LOSS_BALANCE)}")
            values.pop("loss_balance")
        refine_keys = sorted(k for k in values if k.startswith("refine_") and values[k] != MTL_DEFAULTS.get(k))
        if refine_keys and not values.get("refine"):
            self.problems.append(f"{self.path}: keys {refine_keys} set the refine stage, which needs refine: true")
        if values.get("refine_steps") is not None and values.get("refine_epochs") is not None:
            self.problems.append(f"{self.path}: refine_steps and refine_epochs both size the refine stage; keep one")
        task_dir = values.get("task_dir")
        if task_dir is None:
            task_dir = self.base
        else:
            task_dir, note = _resolve(task_dir, self.base)
            if note:
                self.reports.append(f"task_dir: {note}")
            if not os.path.isdir(task_dir):
                self.problems.append(f"{self.path}: key 'task_dir' {values['task_dir']!r}: no such directory "
                                     f"({task_dir}); it is relative to the global YAML's folder")
        plugins = []
        for plugin in values.get("plugins", ()):
            path, note = _resolve(plugin, self.base)
            if note:
                self.reports.append(f"plugins: {note}")
            if not path.endswith(".py") or not os.path.isfile(path):
                self.problems.append(f"{self.path}: key 'plugins': {plugin!r} ({path}) is not an existing .py file")
            else:
                plugins.append(path)
        if not os.path.isdir(task_dir) and self.inline is None:
            return None  # the task files cannot be read
        if sampling not in SAMPLING_STRATEGIES:
            values.pop("sampling", None)
        # a bad global value was reported and falls back to its default: the task files are still read,
        # so that every problem of the configuration is reported at once
        return MultiTaskConfig(**{**MTL_DEFAULTS, **values, "task_instance": names,
                                  "mix_ratio": values.get("mix_ratio", (1.0,) * n),
                                  "target_tag": tuple(bool(tag) for tag in values.get("target_tag", (1,) * n)),
                                  "task_reuse_tag": values.get("task_reuse_tag"), "task_dir": task_dir,
                                  "plugins": tuple(plugins)})

    def _import_plugins(self, plugins: Sequence[str]) -> None:
        self.problems += self.hooks.import_plugins(plugins, where=f"{self.path}: key 'plugins'")

    # -- keys that are run flags (global file, command line or, PALM-style, a task file) ----------------
    def _global_setting(self, key: str, value: Any, where: str, src: str) -> bool:
        """Handle `key` if it is a run flag, a PALM alias or `optimizer`; False if it is neither."""
        if key == "backbone_config_path":
            self._backbone_config(value, where, src)
            return True
        if key == "optimizer":
            if str(value).strip().lower() != "adam":
                self.problems.append(f"{where}: optimizer {value!r} is not available; only adam (AdamW with "
                                     "decoupled weight_decay) is; set optimizer: adam or remove it")
            return True
        if key not in PALM_ALIASES:
            if key not in self.flags:
                return False
            self._set_flag(key, value, where, src)
            return True
        flag = PALM_ALIASES[key]
        if flag == "model_type":
            family = _backbone_family(value)
            if family is None:
                self.problems.append(f"{where}: backbone {value!r} is not supported; use ernie or bert")
                return True
            value = family
        if flag not in self.flags:
            self.problems.append(f"{where}: PALM's {key} maps to --{flag}, which this program does not have")
            return True
        if self._set_flag(flag, value, where, src):
            self.reports.append(f"{where}: PALM's {key} sets --{flag} {value}")
        return True

    def _backbone_config(self, value: Any, where: str, src: str) -> None:
        """PALM's `backbone_config_path` (an ernie_config.json): its architecture and dropout rates become
        the flags --hidden_size, --num_hidden_layers, ... (config/model.palm_arch translates its keys)."""
        import json

        path, note = _resolve(str(value), self.base)
        try:
            with open(path, encoding="utf-8") as f:
                raw = json.load(f)
        except (OSError, ValueError) as e:
            self.problems.append(f"{where}: backbone_config_path {value}: cannot read {path} ({e}); give the "
                                 "model's ernie_config.json")
            return
        if not isinstance(raw, dict):
            self.problems.append(f"{where}: backbone_config_path {path} is not a JSON object")
            return
        if note:
            self.reports.append(f"{where}: {note}")
        try:
            values = palm_arch(raw, path)
        except ConfigError as e:
            self.problems.extend(f"{where}: {p}" for p in e.problems)
            return
        values = {k: v for k, v in values.items() if k in self.flags}
        values.update({k: raw[k] for k in ("hidden_dropout_prob", "attention_probs_dropout_prob")
                       if raw.get(k) is not None and k in self.flags})
        for flag, v in values.items():
            self._set_flag(flag, v, where, src)
        self.reports.append(f"{where}: PALM's backbone_config_path sets "
                            + ", ".join(f"--{k} {v}" for k, v in values.items()))

    def _set_flag(self, flag: str, value: Any, where: str, src: str) -> bool:
        """Record run flag `flag`; a second, different value from the same layer is an error."""
        previous = self.flag_source.get(flag)
        if previous is not None and previous[1] == src and str(self.run_flags[flag]) != str(value):
            self.problems.append(f"{where}: sets --{flag} {value!r} but {previous[0]} already sets it to "
                                 f"{self.run_flags[flag]!r}; keep one")
            return False
        self.run_flags[flag] = value
        self.flag_source[flag] = (where, src)
        return True

    def _unknown_global(self, key: str, where: str, option_owners: Mapping[str, List[int]]) -> None:
        if key in PALM_UNSUPPORTED:
            self.problems.append(f"{where}: PALM's {key} is not supported: {PALM_UNSUPPORTED[key]}")
        elif key in TASK_KEYS:
            self.problems.append(f"{where}: {key} is a task key; put it in the task YAMLs (<task_dir>/<task>.yaml)")
        else:
            known = set(MTL_KEYS) | set(BROADCAST_KEYS) | set(option_owners) | set(PALM_ALIASES) | self.flags
            self.problems.append(f"{where}: unknown key{_suggest(key, known)}; see docs/multitask_config.md")

    # -- task files ---------------------------------------------------------------------------------------
    def _read_task(self, mtl: MultiTaskConfig, name: str) -> Optional[Tuple[str, Dict[str, Any]]]:
        if self.inline is not None:  # `tasks:` in the global configuration; paths relative to its folder
            if name not in self.inline:
                self.problems.append(f"{self.path}: task_instance names {name!r} but key 'tasks' does not define it "
                                     f"(it defines {sorted(self.inline)}); add tasks.{name}")
                return None
            return os.path.join(self.base, f"<tasks.{name}>"), {str(k): v for k, v in self.inline[name].items()}
        path = os.path.join(mtl.task_dir, name + ".yaml")
        if not os.path.isfile(path):
            self.problems.append(f"{self.path}: task_instance names {name!r} but its task file {path} does not "
                                 f"exist; create it or set task_dir (now {mtl.task_dir})")
            return None
        data = read_yaml(path, self.problems, what="task config",
                         empty="write the task's keys in it (reader, train_file, ...: docs/multitask_config.md)")
        return None if data is None else (path, data)

    def _task_type(self, mtl: MultiTaskConfig, i: int, task_file):
        if task_file is None:
            return None
        path, data = task_file
        name = mtl.task_instance[i]
        override = self.task_cli.get(name, {}).get("reader")
        reader = override if override is not None else data.get("reader")
        where = f"--tasks.{name}.reader" if override is not None else f"{path}: key 'reader'"
        if reader is None:
            self.problems.append(f"{path}: key 'reader' is required: the task type (cls, match, seq_label, mrc, "
                                 "mlm, pretrain or a plugin's type)")
            return None
        reader = str(reader)
        if reader in PALM_READERS:
            self.reports.append(f"task {name}: reader {reader} (PALM) is {PALM_READERS[reader]}")
            reader = PALM_READERS[reader]
        try:
            return self.hooks.task_type(reader)
        except ConfigError as e:
            self.problems.extend(f"{where}: {p}" for p in e.problems)
            return None

    def _spec(self, mtl: MultiTaskConfig, i: int, task_file, cls, broadcast) -> Optional[TaskSpec]:
        path, data = task_file
        name = mtl.task_instance[i]
        folder = os.path.dirname(path)
        before = len(self.problems)
        kinds = dict(TASK_KEYS)
        kinds.update({k: ("path" if k.endswith(PATH_OPTION_SUFFIXES) else _option_kind(o.default))
                      for k, o in cls.options.items()})
        if getattr(cls, "sized_by_run", False):  # corpus splits: a prefix, weight/prefix pairs or a folder
            kinds.update({k: "corpus" for k in SPLIT_KEYS})
        layers: Dict[str, List[Tuple[str, Any, str]]] = {}  # key -> [(source label, typed value, base dir)]

        def add(key: str, value: Any, label: str, where: str, base: str) -> None:
            try:
                typed = _coerce_option(kinds[key], value)
            except ValueError as e:
                self.problems.append(f"{where}: {e}")
                return
            layers.setdefault(key, []).append((label, typed, base))

        for key, value in data.items():
            if key in kinds:
                add(key, value, path, f"{path}: key {key!r}", folder)
            elif key in MTL_KEYS:
                self.problems.append(f"{path}: key {key!r} is a global setting; move it to {self.path}")
            elif not self._task_file_setting(name, path, key, value):
                self.problems.append(f"{path}: unknown key {key!r}{_suggest(key, kinds)} for reader {cls.name!r}; "
                                     f"task keys: {sorted(kinds)}")
        for key, entries in broadcast.items():
            if key in kinds:
                for label, value in entries:
                    add(key, value, label, f"{label}: key {key!r}", self.base)
        for key, value in self.task_cli.get(name, {}).items():
            where = f"command line --tasks.{name}.{key}"
            if key not in kinds:
                self.problems.append(f"{where}: {key!r} is not a key of task {name} (reader {cls.name})"
                                     f"{_suggest(key, kinds)}")
            else:
                add(key, _yaml_value(value), where, where, os.getcwd())
        values: Dict[str, Any] = {}
        if "print_first_n" in layers:
            self.reports.append(f"task {name}: PALM's print_first_n is accepted and not used (the start-up log "
                                "describes the data instead of printing examples)")
            layers.pop("print_first_n")
        for key, entries in layers.items():
            label, value, base = entries[-1]
            for lower_label, lower_value, _ in entries[:-1]:
                task_specific = lower_label == path or label.startswith("command line --tasks.")
                if lower_value != value and task_specific:
                    self.reports.append(f"task {name}: key {key}={lower_value} from {lower_label} overridden by "
                                        f"{label} ({value})")
            if kinds[key] == "path":
                value = self._path(name, key, value, label, base)
            elif kinds[key] == "corpus":
                value = self._corpus(key, value, label, base)
            values[key] = value
        reader = cls.name
        paradigm = values.pop("paradigm", None)
        allowed = PALM_PARADIGMS.get(reader, (reader,))
        if paradigm is not None and paradigm not in allowed:
            self.problems.append(f"{path}: key 'paradigm' {paradigm!r} does not go with reader {reader!r}; use "
                                 f"{' or '.join(repr(a) for a in allowed)} (or drop paradigm)")
        if "train" in self.splits and values.get("train_file") is None:
            self.problems.append(f"{path}: key 'train_file' is required: the task's training data")
        for key, option in cls.options.items():
            if key not in values:
                if option.required:
                    self.problems.append(f"{path}: key {key!r} is required by reader {reader!r}: {option.help}")
                else:
                    values[key] = option.default
        if len(self.problems) > before:
            return None
        options = {k: values.pop(k) for k in cls.options}
        values.pop("reader", None)
        return TaskSpec(name=name, reader=reader, index=i, is_target=mtl.target_tag[i], mix_ratio=mtl.mix_ratio[i],
                        reuse_tag=None if mtl.task_reuse_tag is None else mtl.task_reuse_tag[i], options=options,
                        **values)

    def _check_refine(self, mtl: MultiTaskConfig, specs: List[TaskSpec]) -> None:
        """Task-level refine keys: on targets only, one size (steps or epochs), and only where refined."""
        for spec in specs:
            keys = [k for k in ("refine_steps", "refine_epochs", "refine_learning_rate")
                    if getattr(spec, k) is not None]
            refined = mtl.refine if spec.refine is None else spec.refine
            if (keys or spec.refine) and not spec.is_target:
                self.problems.append(f"task {spec.name}: {keys or ['refine']} refine a target alone after the "
                                     "multi-task stage, and this task is auxiliary (target_tag 0); drop them or make "
                                     "it a target")
            elif keys and not refined:
                self.problems.append(f"task {spec.name}: keys {keys} size its refine stage, which is off; add "
                                     f"refine: true (to the task or to {self.path})")
            if spec.refine_steps is not None and spec.refine_epochs is not None:
                self.problems.append(f"task {spec.name}: refine_steps and refine_epochs both size its refine stage; "
                                     "keep one")
        if mtl.refine and mtl.sampling == "palm" and not any(s.is_target for s in specs):
            self.problems.append(f"{self.path}: refine: true needs a target (target_tag 1)")

    def _add_tapt_tasks(self, mtl: MultiTaskConfig, specs: List[TaskSpec]) -> Tuple[MultiTaskConfig, List[TaskSpec]]:
        """Task-adaptive masked LM (Gururangan et al. 2020): a task with `tapt: true` gets an auxiliary `mlm`
        task `<task>_tapt` over its own training text (or `tapt_file`), appended to task_instance with
        `tapt_mix_ratio`, the task's max_seq_len and batch size, no dev or test file; the other columns of
        the file (label, text_b) are ignored and a sequence-labelling file's tokens are joined again."""
        from dataclasses import replace

        added = []
        for spec in specs:
            if not spec.tapt:
                continue
            name = f"{spec.name}_tapt"
            if name in mtl.task_instance:
                self.problems.append(f"task {spec.name}: tapt adds a task named {name!r}, which task_instance already "
                                     "has; rename that task")
                continue
            source = spec.tapt_file or spec.train_file
            if spec.tapt_file is None and spec.reader not in TAPT_READERS:
                self.problems.append(f"task {spec.name}: tapt reads the training file as text, which a {spec.reader!r} "
                                     "file is not; add tapt_file: <a TSV with a text_a column> (the task's own "
                                     "text, e.g. its passages)")
                continue
            columns = "text_a" if spec.tapt_file is not None else TAPT_READERS[spec.reader]
            options = {"masked_lm_prob": 0.15, "max_predictions_per_seq": 20, "max_ngrams": 3,
                       "text_columns": columns, "other_columns": "ignore",
                       "token_separator": "\x02" if spec.reader == "seq_label" and spec.tapt_file is None else None}
            added.append(TaskSpec(name=name, reader="mlm", index=len(specs) + len(added), train_file=source,
                                  max_seq_len=spec.max_seq_len, batch_size=spec.batch_size, is_target=False,
                                  mix_ratio=spec.tapt_mix_ratio, do_lower_case=spec.do_lower_case,
                                  for_cn=spec.for_cn, options=options))
            self.reports.append(f"task {spec.name}: tapt adds the auxiliary task {name} (masked LM over {source}, "
                                f"mix_ratio {spec.tapt_mix_ratio:g})")
        if not added:
            return mtl, specs
        reuse = None if mtl.task_reuse_tag is None else (
            tuple(mtl.task_reuse_tag) + tuple(max(mtl.task_reuse_tag, default=-1) + 1 + k for k in range(len(added))))
        mtl = replace(mtl, task_instance=tuple(mtl.task_instance) + tuple(added_spec.name for added_spec in added),
                      mix_ratio=tuple(mtl.mix_ratio) + tuple(added_spec.mix_ratio for added_spec in added),
                      target_tag=tuple(mtl.target_tag) + (False,) * len(added), task_reuse_tag=reuse)
        return mtl, specs + added

    def _corpus(self, key: str, value: Any, label: str, base: str) -> Any:
        """A corpus split of a generated-data task (`reader: pretrain`): one prefix, weight/prefix pairs
        or a folder (ernie_mtl/data/mixture.py), resolved against the task file's folder; the
        canonical form (absolute prefixes) is kept."""
        split = key[:-len("_file")]
        try:
            return self.hooks.corpus_spec(value, what=f"{label}: key {key!r}", base_dir=base)
        except ConfigError as e:
            if split in self.splits:
                self.problems.extend(e.problems)
            return value

    def _path(self, task: str, key: str, value: str, label: str, base: str) -> str:
        resolved, note = _resolve(value, base)
        if note:
            self.reports.append(f"task {task}: {key}: {note}")
        split = key[:-len("_file")] if key in SPLIT_KEYS else None
        if (split is None or split in self.splits) and not _exists(resolved):
            self.problems.append(f"{label}: key {key!r} {value!r}: file not found ({resolved}; relative paths are "
                                 f"relative to the file's folder, then the current directory)")
        return resolved

    def _task_file_setting(self, task: str, path: str, key: str, value: Any) -> bool:
        """A run flag in a task file (PALM's demos put vocab_path there): adopted unless the global file or
        command line sets it (then reported); task files that disagree are an error."""
        flag = PALM_ALIASES.get(key) or (key if key in self.flags or key == "optimizer" else None)
        if flag is None:
            return False
        where = f"{path}: key {key!r}"
        source = self.flag_source.get(flag)
        if source is None or source[1] == "task files":
            return self._global_setting(key, value, where, "task files")
        kept = self.run_flags[flag]
        mine = _backbone_family(value) if flag == "model_type" else value
        if str(kept) != str(mine):
            self.reports.append(f"task {task}: key {key}={value} from {path} overridden by {source[0]} ({kept}): "
                                f"--{flag} is one setting for the whole run")
        return True

    def _check_groups(self, mtl: MultiTaskConfig, specs: Sequence[TaskSpec]) -> None:
        hosts: Dict[int, TaskSpec] = {}
        for spec in specs:
            if spec.reuse_tag is None:
                continue
            host = hosts.setdefault(spec.reuse_tag, spec)
            if host.reader != spec.reader:
                self.problems.append(f"{self.path}: key 'task_reuse_tag': tasks {host.name} (reader {host.reader}) "
                                     f"and {spec.name} (reader {spec.reader}) share tag {spec.reuse_tag}, but only "
                                     "tasks of the same reader can share a head; give them different tags")
