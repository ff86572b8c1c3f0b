"""Static checkpoints and exported task models -> PaddleNLP dygraph directories, with a numerical check.

PaddleNLP's own converter looks parameters up by their auto-generated static names
(`linear_3.w_0`) in a model rebuilt in the same order; it breaks silently when the order or the
configuration differs and it never compares outputs. Here the only link between a static
variable and a PaddleNLP weight is the name map stored with the source (`train_state.json` or
the exported model's `manifest.json`: structured name -> static name), every shape is checked
against the PaddleNLP model of the stored architecture, and `verify` runs one batch through a
static program holding the checkpoint's weights and through the converted dygraph model.

    source = read_source("output/model_last")          # checkpoint or exported task model
    result = convert(source, "converted")               # writes the directory atomically
    report = verify(source, "converted", atol=1e-5)     # raises VerificationError if it differs

Output layout (docs/convert.md has the details and the design decisions)::

    model_state.pdparams  config.json  vocab.txt  tokenizer_config.json  special_tokens_map.json
    backbone/             the same without the cls.* weights (only when cls.* weights exist)
    heads/<group>.pdparams, heads/<group>.json      one per task head (multi-task sources)
    optimizer_state.pdparams                        only with with_optimizer=True
    conversion.json                                 what was converted from where, and how
"""
from __future__ import annotations

import contextlib
import json
import os
import pickle
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np

WEIGHTS = "model_state.pdparams"
OPTIMIZER = "optimizer_state.pdparams"
REPORT = "conversion.json"
_BACKBONE_PREFIX = {"ernie": "ernie", "bert": "bert"}
# Optimizer accumulators kept by --with_optimizer: `<param>_<suffix>` (Adam moments, beta powers).
# Gradient-merge buffers (`@GRAD@GradiantMerge`) and global counters are transient or run-level.
_ACCUMULATOR = re.compile(r"^(moment\d+|beta\d+_pow_acc|velocity|mean_square|mean_grad)_\d+$")
_PAIR_KEYS = ("cls.seq_relationship.weight", "cls.seq_relationship.bias")


from data_tools.cli_utils import UserError  # noqa: E402
from ernie_mtl.checkpoint import CheckpointError, verified_state  # noqa: E402
from ernie_mtl.checkpoint.store import output_problem  # noqa: E402
from ernie_mtl.checkpoint.io import replace_dir, write_json_atomic  # noqa: E402
from ernie_mtl.checkpoint.layout import EXPORT_NAME, MANIFEST, TRAIN_STATE, state_prefix  # noqa: E402
from ernie_mtl.config import ConfigError, ModelConfig, model_family  # noqa: E402
from ernie_mtl.program.builder import load_pretrained_into_scope  # noqa: E402
from ernie_mtl.program.edits import static_mode  # noqa: E402
from ernie_mtl.program.forward import model_names  # noqa: E402


class ConvertError(UserError):
    """The source cannot be converted; the message names the file/field and the fix."""


class VerificationError(RuntimeError):
    """The converted model's outputs differ from the static program's beyond the tolerance."""


@dataclass
class Source:
    """Weights and facts read from a checkpoint or an exported model, keyed by structured name."""

    path: Path
    kind: str  # "checkpoint" or "exported"
    model_type: str
    arch: Dict[str, Any]  # paddlenlp config keys (model_type removed)
    weights: Dict[str, np.ndarray]  # structured name -> array (tied weights under each name)
    static_names: Dict[str, str]  # structured name -> static name (the stored name map)
    tasks: List[Dict[str, Any]] = field(default_factory=list)
    vocab_file: Optional[Path] = None
    optimizer: Dict[str, np.ndarray] = field(default_factory=dict)  # "<structured>_<suffix>" -> array
    step: Optional[int] = None


@dataclass
class Result:
    """What `convert` wrote."""

    output_dir: Path
    pretraining_heads: Optional[str]  # None, "checkpoint" (flag mode) or "heads.<group>"
    filled: List[str]  # keys written with zeros so ErnieForPretraining loads (documented)
    heads: List[str]  # head groups written under heads/
    optimizer_keys: int


# -- reading ---------------------------------------------------------------------------------------
def read_source(path: os.PathLike, *, vocab_file: Optional[os.PathLike] = None,
                with_optimizer: bool = False) -> Source:
    """Read a checkpoint folder (`model_last`, `model_<step>`) or an exported task model
    (`<task>/infer_model/` or `<task>/`). `vocab_file` overrides the vocabulary the source names."""
    path = Path(path)
    if not path.is_dir():
        raise ConvertError(f"--input {path}: no such directory; give a checkpoint folder (model_last, "
                           f"model_<step>) or an exported model folder (<output_dir>/<task>/infer_model)")
    if (path / TRAIN_STATE).is_file():
        source = read_checkpoint(path, with_optimizer=with_optimizer)
    elif (path / MANIFEST).is_file() or (path / EXPORT_NAME / MANIFEST).is_file():
        if with_optimizer:
            raise ConvertError(f"--with_optimizer: {path} is an exported model, which holds no optimizer state; "
                               "convert a checkpoint folder instead, or drop --with_optimizer")
        source = read_exported(path if (path / MANIFEST).is_file() else path / EXPORT_NAME)
    else:
        raise ConvertError(f"--input {path} is not a checkpoint ({TRAIN_STATE} missing: an incomplete or "
                           f"interrupted save?) nor an exported model ({MANIFEST} missing); point it at "
                           "output_dir/model_last, output_dir/model_<step> or output_dir/<task>/infer_model")
    if vocab_file is not None:
        source.vocab_file = Path(vocab_file)
    if source.vocab_file is None or not source.vocab_file.is_file():
        raise ConvertError(f"vocabulary {source.vocab_file} of {path} not found; pass --vocab_file "
                           "path/to/vocab.txt (the tokenizer the model was trained with)")
    return source


def read_checkpoint(path: Path, *, with_optimizer: bool = False) -> Source:
    """A checkpoint folder; a sharded run's per-rank files are merged (union, duplicates must agree); a
    portable checkpoint's tensors are read by structured name."""

    try:  # train_state.json field by field, every file's size and SHA-1: as resume checks them
        raw = verified_state(path, use="convert")
    except CheckpointError as e:
        raise ConvertError(str(e)) from None
    if with_optimizer and raw.get("weights_only"):
        n = len(raw.get("averaged_from") or [])
        raise ConvertError(f"--with_optimizer: {path} is weights only (the mean of {n} checkpoints by "
                           "ernie-mtl-reshard --average) and holds "
                           "no optimizer state; drop --with_optimizer, or convert one of the averaged checkpoints")
    name_map = raw.get("name_map")
    if isinstance(name_map, dict):  # the loss-balancing log-variances are not model weights
        name_map = model_names(name_map)
    if not isinstance(name_map, dict) or not name_map:
        raise ConvertError(f"{path / TRAIN_STATE} has no name_map (structured name -> static name); it was not "
                           "written by ernie_mtl's trainer, so its parameters cannot be named reliably")
    _refuse_custom_backbone(name_map, raw.get("extra", {}).get("tasks", []), path)
    config = raw.get("config", {})
    arch = dict(raw.get("extra", {}).get("arch") or _arch_from_config(config, path))
    model_type = arch.pop("model_type", config.get("model", {}).get("model_type", "ernie"))
    if raw.get("state_format") == "portable":  # tensors by structured name (ernie_mtl/checkpoint/portable.py)
        from ernie_mtl.checkpoint import merged_state

        merged = {k: np.asarray(v) for k, v in merged_state(path, verify=False).items()}
        weights = _by_structured(name_map, merged, path)
        arch = _with_task_embedding(arch, weights, model_type)
        key = _accumulator_names(name_map, list(expected_shapes(model_type, arch)))
        optimizer = {key(k): v for k, v in merged.items() if key(k) is not None} if with_optimizer else {}
        return Source(path=path, kind="checkpoint", model_type=model_type, arch=arch, weights=weights,
                      static_names=dict(name_map), tasks=list(raw.get("extra", {}).get("tasks", [])),
                      vocab_file=_vocab_from_config(config), optimizer=optimizer, step=raw.get("step"))
    ranks = range(int(raw.get("world_size", 1))) if raw.get("per_rank_state") else [0]
    files = [state_prefix(path, r).with_suffix(".pdparams") for r in ranks]
    absent = [str(f) for f in files if not f.is_file()]
    if absent:
        raise ConvertError(f"{path} lacks {', '.join(absent)} (per_rank_state={bool(raw.get('per_rank_state'))}, "
                           f"world_size={raw.get('world_size', 1)}: every rank's file is needed); the checkpoint is "
                           "incomplete, copy the missing rank files from the node that wrote them")
    weights = _by_structured(name_map, _merge(files), path)
    arch = _with_task_embedding(arch, weights, model_type)
    optimizer = {}
    if with_optimizer:
        opt_files = [f.with_suffix(".pdopt") for f in files]
        absent = [str(f) for f in opt_files if not f.is_file()]
        if absent:
            raise ConvertError(f"--with_optimizer: {path} lacks {', '.join(absent)}; convert without "
                               "--with_optimizer, or copy the optimizer files of every rank")
        key = _accumulator_names(name_map, list(expected_shapes(model_type, arch)))
        optimizer = {key(k): v for k, v in _merge(opt_files, keep=lambda n: key(n) is not None).items()}
    return Source(path=path, kind="checkpoint", model_type=model_type, arch=arch, weights=weights,
                  static_names=dict(name_map), tasks=list(raw.get("extra", {}).get("tasks", [])),
                  vocab_file=_vocab_from_config(config), optimizer=optimizer, step=raw.get("step"))


def read_exported(path: Path) -> Source:
    """An exported task model: `model.pdmodel` + `model.pdiparams` + `manifest.json` (+ vocab)."""
    import paddle

    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except ValueError as e:
        raise ConvertError(f"{path / MANIFEST} is not valid JSON ({e}); re-export the model") from e
    missing = [k for k in ("task", "reader", "arch", "name_map") if k not in manifest]
    if missing:
        raise ConvertError(f"{path / MANIFEST} lacks {missing}; re-export the model with ernie_mtl")
    for name in ("model.pdmodel", "model.pdiparams"):
        if not (path / name).is_file():
            raise ConvertError(f"exported model {path} lacks {name}; re-export it")
    _refuse_custom_backbone(manifest["name_map"], [{"manifest": manifest}], path)
    arch = dict(manifest["arch"])
    model_type = arch.pop("model_type", manifest.get("model_type", "ernie"))
    scope = paddle.static.Scope()
    with static_mode(), paddle.static.scope_guard(scope):
        exe = paddle.static.Executor(paddle.CPUPlace())
        try:
            paddle.static.load_inference_model(str(path / "model"), exe)
        except Exception as e:  # noqa: BLE001  (paddle raises several types for damaged files)
            detail = [line.strip() for line in str(e).splitlines() if line.strip()]
            raise ConvertError(f"cannot load the exported model {path} (model.pdmodel + model.pdiparams: "
                               f"{type(e).__name__}: {detail[-1][:200] if detail else ''}); a file is damaged or "
                               "truncated: re-export it") from None
        params = {}
        for static in set(manifest["name_map"].values()):
            var = scope.find_var(static)
            if var is not None and var.get_tensor()._is_initialized():
                params[static] = np.array(var.get_tensor())
    # Other tasks' heads appear in the map only through weights tied to the backbone (the MLM decoder
    # is the word embedding): those aliases are not this task's head.
    name_map = dict(manifest["name_map"])
    backbone = {v for k, v in name_map.items() if not k.startswith("heads.")}
    groups = {k.split(".")[1] for k, v in name_map.items() if k.startswith("heads.") and v not in backbone}
    name_map = {k: v for k, v in name_map.items() if not k.startswith("heads.") or k.split(".")[1] in groups}
    weights = _by_structured(name_map, params, path / "model.pdiparams")
    extra = {k: v for k, v in manifest.items() if k not in ("arch", "name_map", "feeds", "fetches")}
    tasks = [{"name": manifest["task"], "reader": manifest["reader"], "group": g, "is_target": True,
              "manifest": extra} for g in sorted(groups)]
    vocab = path / manifest.get("vocab", "vocab.txt")
    return Source(path=path, kind="exported", model_type=model_type,
                  arch=_with_task_embedding(arch, weights, model_type), weights=weights,
                  static_names=name_map, tasks=tasks, vocab_file=vocab)


def _arch_from_config(config: Mapping, path: Path) -> Dict[str, Any]:

    try:
        return ModelConfig(**config["model"]).resolve().arch
    except (KeyError, TypeError, ConfigError) as e:
        raise ConvertError(f"{path / TRAIN_STATE} has no extra.arch and its config.model cannot be resolved "
                           f"({e}); the architecture of the weights is unknown") from e


def _vocab_from_config(config: Mapping) -> Optional[Path]:
    data = config.get("data", {})
    for key in ("tokenizer_name_or_path", "vocab_file", "vocab_path"):
        if data.get(key):
            p = Path(data[key])
            return p / "vocab.txt" if p.is_dir() else p
    model_dir = Path(config.get("model", {}).get("model_name_or_path", "") or ".")
    return model_dir / "vocab.txt" if (model_dir / "vocab.txt").is_file() else None


def _with_task_embedding(arch: Dict[str, Any], weights: Mapping[str, np.ndarray], model_type: str) -> Dict:
    """A task-embedding table in the weights means the backbone was built with use_task_id (the
    trainer sets it at build time, so the stored arch may not say so)."""
    key = f"{_BACKBONE_PREFIX[model_type]}.embeddings.task_type_embeddings.weight"
    if key in weights:
        arch = dict(arch, use_task_id=True, task_type_vocab_size=int(weights[key].shape[0]))
    return arch


def _load_pickle(file: Path) -> Dict[str, np.ndarray]:
    try:
        with open(file, "rb") as f:
            data = pickle.load(f)
    except (OSError, EOFError, pickle.UnpicklingError, ValueError) as e:
        raise ConvertError(f"cannot read {file} ({type(e).__name__}: {e}); the file is damaged or truncated, "
                           "convert another checkpoint") from e
    return {k: np.asarray(v) for k, v in data.items() if not k.startswith("StructuredToParameterName")}


def _merge(files: Sequence[Path], *, keep: Callable[[str], bool] = lambda name: True) -> Dict[str, np.ndarray]:
    """Union of per-rank state files (variables `keep` accepts); a variable held by several ranks
    must be identical."""
    merged: Dict[str, np.ndarray] = {}
    origin: Dict[str, Path] = {}
    for file in files:
        for name, array in _load_pickle(file).items():
            if not keep(name):
                continue
            if name in merged and not (merged[name].shape == array.shape and np.array_equal(merged[name], array)):
                raise ConvertError(f"variable {name} differs between {origin[name].name} and {file.name} in "
                                   f"{file.parent}: the ranks' states disagree (a checkpoint mixed from different "
                                   "saves?); convert a checkpoint written in one save")
            merged.setdefault(name, array)
            origin.setdefault(name, file)
    return merged


def _refuse_custom_backbone(name_map: Mapping[str, str], tasks: Sequence[Mapping], where: Path) -> None:
    """A model whose backbone is a PaddlePALM script's own (`backbone.*` parameters, ernie_mtl/palm/adaptor.py)
    has no PaddleNLP equivalent: one clear refusal instead of a list of missing ERNIE weights."""
    own = sorted(k for k in name_map if k.startswith("backbone."))
    if not own:
        return
    classes = set()
    for task in tasks:
        components = task.get("spec", {}).get("options", {}).get("components") or \
            json.dumps(task.get("manifest", {}).get("palm_components") or {})
        try:
            classes.add(json.loads(components).get("backbone"))
        except (ValueError, AttributeError):
            pass
    name = ", ".join(sorted(c for c in classes if c)) or "a PaddlePALM script's own backbone"
    raise ConvertError(f"{where}: its backbone is user-defined ({name}; parameters {', '.join(own[:4])}"
                       f"{', ...' if len(own) > 4 else ''}), not ERNIE or BERT: there is no PaddleNLP model to convert "
                       "it to. Use the checkpoint (or its exported inference model) as it is")


def _by_structured(name_map: Mapping[str, str], params: Mapping[str, np.ndarray], where: Path) -> Dict:
    missing = sorted(f"{k} ({v})" for k, v in name_map.items() if v not in params)
    if missing:
        raise ConvertError(f"{where} lacks {len(missing)} parameter(s) named in the name map: "
                           f"{', '.join(missing[:10])}{' ...' if len(missing) > 10 else ''}; the state files do not "
                           "belong to this train_state.json/manifest, or a rank's share is missing")
    return {k: params[v] for k, v in name_map.items()}


def _accumulator_names(name_map: Mapping[str, str], order: Sequence[str]) -> Callable[[str], Optional[str]]:
    """f(static variable name) -> `<structured>_<suffix>` for an optimizer accumulator of a mapped
    parameter (`<param>_<acc>_<n>`), else None. A tied parameter is named as PaddleNLP's
    `named_parameters()` names it: its first key in state_dict order (`order`; a head's keys ranked
    as their `cls.` counterparts), so dygraph optimizers can be fed by parameter."""
    rank = {k: i for i, k in enumerate(order)}

    def position(key: str) -> Tuple[int, str]:
        probe = "cls." + key.split(".", 2)[2] if key.startswith("heads.") else key
        return rank.get(probe, len(rank)), key

    canonical: Dict[str, str] = {}
    for structured in sorted(name_map, key=position):
        canonical.setdefault(name_map[structured], structured)

    def key(name: str) -> Optional[str]:
        parts = name.split("_")
        for cut in range(len(parts) - 1, 0, -1):
            static, suffix = "_".join(parts[:cut]), "_".join(parts[cut:])
            if static in canonical and _ACCUMULATOR.match(suffix):
                return f"{canonical[static]}_{suffix}"
        return None

    return key


# -- mapping ---------------------------------------------------------------------------------------
def _classes(model_type: str):
    return model_family(model_type).classes()


def expected_shapes(model_type: str, arch: Mapping[str, Any]) -> Dict[str, Tuple[int, ...]]:
    """Keys and shapes of PaddleNLP's pretraining model (`*ForPretraining.state_dict()`) for `arch`,
    built into a throw-away static program (declared, never initialised: no memory for weights)."""
    import paddle
    from paddle.utils import unique_name

    config_cls, _, pretraining_cls, _ = _classes(model_type)
    with static_mode(), paddle.static.program_guard(paddle.static.Program(), paddle.static.Program()), \
            unique_name.guard():
        model = pretraining_cls(config_cls(**arch))
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def _pretraining_group(source: Source) -> Optional[str]:
    """The head group that provides cls.*: a `pretrain` task's head (MLM + pair classifier) wins over
    an `mlm` head; among equals a target task, then the first listed."""
    groups = {k.split(".")[1] for k in source.weights if k.startswith("heads.")}
    candidates = [(("pretrain", "mlm").index(task["reader"]), not task.get("is_target", True), i,
                   task.get("group", task["name"]))
                  for i, task in enumerate(source.tasks) if task.get("reader") in ("pretrain", "mlm")]
    return next((c[-1] for c in sorted(candidates) if c[-1] in groups), None)


def map_weights(source: Source) -> Tuple[Dict[str, np.ndarray], Optional[str], List[str]]:
    """(PaddleNLP state dict, where cls.* came from, keys filled with zeros).

    Backbone keys pass unchanged; flag-mode checkpoints already use `cls.*`; in multi-task sources
    the `pretrain` (else `mlm`) head group's `heads.<group>.<k>` becomes `cls.<k>`. A missing pair
    classifier (MLM-only) is written as zeros (logits 0: "no preference") so ErnieForPretraining
    loads every key; the checkpoint never trained it either way."""
    expected = expected_shapes(source.model_type, source.arch)
    prefix = _BACKBONE_PREFIX[source.model_type] + "."
    state = {k: v for k, v in source.weights.items() if k.startswith(prefix) or k.startswith("cls.")}
    origin = "checkpoint" if any(k.startswith("cls.") for k in state) else None
    if origin is None:
        group = _pretraining_group(source)
        if group is not None:
            head = f"heads.{group}."
            state.update({"cls." + k[len(head):]: v for k, v in source.weights.items() if k.startswith(head)})
            origin = head[:-1]
    filled = []
    if origin is not None and all(k in expected for k in _PAIR_KEYS) and not any(k in state for k in _PAIR_KEYS):
        for key in _PAIR_KEYS:
            state[key] = np.zeros(expected[key], dtype=np.float32)
        filled = list(_PAIR_KEYS)
    problems = [f"{k}: shape {list(v.shape)} in the source but {list(expected[k])} for the stored architecture"
                for k, v in state.items() if k in expected and tuple(v.shape) != expected[k]]
    problems += [f"{k}: not a parameter of PaddleNLP's {model_family(source.model_type).pretraining} for the stored "
                 "architecture" for k in state if k not in expected]
    wanted = [k for k in expected if k.startswith(prefix) or (origin is not None and k.startswith("cls."))]
    missing = [k for k in wanted if k not in state]
    if missing and source.kind == "exported":  # save_inference_model keeps only what the task's fetches use
        task = source.tasks[0]["name"] if source.tasks else "?"
        raise ConvertError(f"exported model {source.path} lacks {missing} (task {task} does not use them, so "
                           "the export pruned them); convert the run's checkpoint "
                           "(output_dir/model_last), which holds every weight")
    problems += [f"{k}: missing from the source" for k in missing]
    if problems:
        raise ConvertError(f"{source.path}: the weights do not fit the architecture {_arch_summary(source)}:\n  - "
                           + "\n  - ".join(problems))
    return {k: state[k] for k in expected if k in state}, origin, filled


def _arch_summary(source: Source) -> str:
    keys = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
            "max_position_embeddings", "type_vocab_size")
    return f"({source.model_type}, " + ", ".join(f"{k}={source.arch.get(k)}" for k in keys) + ")"


def head_groups(source: Source) -> Dict[str, Dict[str, np.ndarray]]:
    """group -> the head layer's own state dict (`heads.<group>.` removed)."""
    out: Dict[str, Dict[str, np.ndarray]] = {}
    for key, array in source.weights.items():
        if key.startswith("heads."):
            _, group, rest = key.split(".", 2)
            out.setdefault(group, {})[rest] = array
    return out


# -- writing ---------------------------------------------------------------------------------------
def convert(source: Source, output_dir: os.PathLike, *, overwrite: bool = False) -> Result:
    """Write the PaddleNLP directory for `source` (atomically: a temporary folder renamed into place)."""
    import paddle

    out = Path(output_dir)
    problem = output_problem(out, [source.path], flag="--output_dir")
    if problem:
        raise ConvertError(problem)
    if out.exists() and not out.is_dir():
        raise ConvertError(f"--output_dir {out} is a file, not a folder; --overwrite replaces a converted folder "
                           "only: choose another path")
    if out.exists() and not overwrite:
        raise ConvertError(f"--output_dir {out} already exists; choose another directory or pass --overwrite")
    state, origin, filled = map_weights(source)
    config_cls, model_cls, pretraining_cls, tokenizer_cls = _classes(source.model_type)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        backbone_prefix = _BACKBONE_PREFIX[source.model_type] + "."
        backbone = {k: v for k, v in state.items() if k.startswith(backbone_prefix)}
        targets = [(tmp, state, pretraining_cls if origin else model_cls)]
        if origin:  # ErnieModel would report the cls.* weights as unused: give it its own directory
            targets.append((tmp / "backbone", backbone, model_cls))
        for folder, weights, cls in targets:
            folder.mkdir(exist_ok=True)
            config = config_cls(**source.arch)
            config.architectures = [cls.__name__]
            with _quiet_paddlenlp():
                config.save_pretrained(str(folder))
                tokenizer_cls(vocab_file=str(source.vocab_file),
                              do_lower_case=_do_lower_case(source)).save_pretrained(str(folder))
            paddle.save(weights, str(folder / WEIGHTS))
        heads = head_groups(source)
        if heads:
            (tmp / "heads").mkdir()
        tied = {v: k for k, v in source.static_names.items() if not k.startswith(("heads.", "cls."))}
        for group, weights in heads.items():
            paddle.save(weights, str(tmp / "heads" / f"{group}.pdparams"))
            static = {k: source.static_names[f"heads.{group}.{k}"] for k in weights}
            meta = {"group": group, "model_type": source.model_type,
                    "tasks": [task for task in source.tasks if task.get("group", task.get("name")) == group],
                    "params": {k: list(v.shape) for k, v in weights.items()},
                    "tied_to_backbone": {k: tied[s] for k, s in static.items() if s in tied},
                    "written_as_cls": origin == f"heads.{group}"}
            write_json_atomic(tmp / "heads" / f"{group}.json", meta)
        if source.optimizer:  # keyed like the weights: the pretraining head's accumulators under cls.*
            head = f"{origin}." if origin and origin.startswith("heads.") else None
            optimizer = {("cls." + k[len(head):] if head and k.startswith(head) else k): v
                         for k, v in source.optimizer.items()}
            paddle.save(optimizer, str(tmp / OPTIMIZER))
        write_json_atomic(tmp / REPORT, {
            "source": str(source.path), "kind": source.kind, "step": source.step, "model_type": source.model_type,
            "pretraining_heads_from": origin, "filled_with_zeros": filled, "heads": sorted(heads),
            "optimizer_state": bool(source.optimizer), "name_map": source.static_names})
        replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Result(output_dir=out, pretraining_heads=origin, filled=filled, heads=sorted(heads),
                  optimizer_keys=len(source.optimizer))


def _do_lower_case(source: Source) -> bool:
    """The tasks' do_lower_case (exported manifest, or the task spec of a multi-task checkpoint); True
    (ERNIE's Chinese vocabularies) when no task says."""
    flags = [task.get("manifest", {}).get("do_lower_case", task.get("spec", {}).get("do_lower_case"))
             for task in source.tasks]
    return next((bool(f) for f in flags if f is not None), True)


# -- verification ----------------------------------------------------------------------------------
@dataclass
class Difference:
    """Largest absolute difference of one output, and where it is."""

    output: str
    max_abs_diff: float
    index: Tuple[int, ...]
    static_value: float
    dygraph_value: float

    def __str__(self) -> str:
        return (f"{self.output}: max |diff| {self.max_abs_diff:.3g} at {list(self.index)} "
                f"(static {self.static_value:.6g}, dygraph {self.dygraph_value:.6g})")


def verification_batch(arch: Mapping[str, Any], *, seed: int = 0, batch: int = 3,
                       seq_len: int = 16) -> Dict[str, np.ndarray]:
    """Seeded random ids; the last row is half padding (pad id, additive mask -1e4)."""
    rng = np.random.RandomState(seed)
    seq_len = min(seq_len, int(arch["max_position_embeddings"]))
    pad = int(arch.get("pad_token_id", 0))
    ids = rng.randint(1, int(arch["vocab_size"]), size=(batch, seq_len)).astype(np.int64)
    ids[ids == pad] = pad + 1
    segments = np.zeros_like(ids)
    if int(arch.get("type_vocab_size", 2)) > 1:
        segments[:, seq_len // 2:] = 1
    mask = np.zeros((batch, 1, 1, seq_len), dtype=np.float32)
    ids[-1, seq_len // 2:] = pad
    segments[-1, seq_len // 2:] = 0
    mask[-1, ..., seq_len // 2:] = -1e4
    return {"input_ids": ids, "segment_ids": segments, "input_mask": mask}


@dataclass
class StaticReference:
    """A for-test static forward of PaddleNLP's model and its own name map."""

    program: Any
    startup: Any
    name_map: Dict[str, str]  # structured -> static (of this program)
    fetches: Dict[str, Any]


def build_static_reference(model_type: str, arch: Mapping[str, Any], *, pretraining: bool) -> StaticReference:
    """Build `*ForPretraining` (or the backbone alone) into fresh programs, without fleet; fetches
    sequence_output, pooled_output and, with `pretraining`, prediction_scores (every position) and
    seq_relationship_score."""
    import paddle
    from paddle.utils import unique_name

    config_cls, model_cls, pretraining_cls, _ = _classes(model_type)
    main, startup = paddle.static.Program(), paddle.static.Program()
    with static_mode(), paddle.static.program_guard(main, startup), unique_name.guard():
        ids = paddle.static.data("input_ids", [-1, -1], "int64")
        seg = paddle.static.data("segment_ids", [-1, -1], "int64")
        mask = paddle.static.data("input_mask", [-1, 1, 1, -1], "float32")
        model = (pretraining_cls if pretraining else model_cls)(config_cls(**arch))
        backbone = getattr(model, _BACKBONE_PREFIX[model_type]) if pretraining else model
        captured: Dict[str, Any] = {}
        hook = backbone.register_forward_post_hook(
            lambda layer, inputs, output: captured.update(sequence_output=output[0], pooled_output=output[1]))
        outputs = model(ids, token_type_ids=seg, attention_mask=mask)
        hook.remove()
        if pretraining:
            captured.update(prediction_scores=outputs[0], seq_relationship_score=outputs[1])
        prefix = "" if pretraining else _BACKBONE_PREFIX[model_type] + "."  # keys as in the converted file
        name_map = {prefix + k: v.name for k, v in model.state_dict().items()}
        program = main.clone(for_test=True)
    return StaticReference(program, startup, name_map, captured)


def run_static(ref: StaticReference, weights: Any, batch: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """Run `ref` on `batch` in a fresh scope holding `weights`: a mapping structured name -> array, or
    a PaddleNLP directory, loaded the way the static trainer starts from one
    (`ernie_mtl.program.builder.load_pretrained_into_scope`)."""
    import paddle


    scope = paddle.static.Scope()
    with static_mode():
        exe = paddle.static.Executor(paddle.CPUPlace())
        exe.run(ref.startup, scope=scope)
        if isinstance(weights, Mapping):
            for structured, static in ref.name_map.items():
                if structured not in weights:
                    raise ConvertError(f"the weights lack {structured}, which the static reference needs")
                scope.find_var(static).get_tensor().set(np.asarray(weights[structured], np.float32),
                                                        paddle.CPUPlace())
        else:
            load_pretrained_into_scope(weights, ref.name_map, scope, program=ref.program, place=paddle.CPUPlace())
        names = list(ref.fetches)
        values = exe.run(ref.program, feed=dict(batch), fetch_list=[ref.fetches[n] for n in names], scope=scope)
    return dict(zip(names, (np.asarray(v) for v in values)))


def run_dygraph(output_dir: os.PathLike, model_type: str, batch: Mapping[str, np.ndarray], *,
                pretraining: bool) -> Dict[str, np.ndarray]:
    """Load the converted directory with PaddleNLP (`from_pretrained`, eval mode) and run `batch`."""
    import paddle

    _, model_cls, pretraining_cls, _ = _classes(model_type)
    with _dygraph_mode(), _quiet_paddlenlp():
        model = (pretraining_cls if pretraining else model_cls).from_pretrained(str(output_dir))
        model.eval()
        backbone = getattr(model, _BACKBONE_PREFIX[model_type]) if pretraining else model
        captured: Dict[str, Any] = {}
        hook = backbone.register_forward_post_hook(
            lambda layer, inputs, output: captured.update(sequence_output=output[0], pooled_output=output[1]))
        with paddle.no_grad():
            outputs = model(paddle.to_tensor(batch["input_ids"]), token_type_ids=paddle.to_tensor(batch["segment_ids"]),
                            attention_mask=paddle.to_tensor(batch["input_mask"]))
        hook.remove()
        if pretraining:
            captured.update(prediction_scores=outputs[0], seq_relationship_score=outputs[1])
        return {k: v.numpy() for k, v in captured.items()}


def compare(static: Mapping[str, np.ndarray], dygraph: Mapping[str, np.ndarray]) -> List[Difference]:
    """Largest absolute difference per output present in both."""
    out = []
    for name in static:
        a, b = np.asarray(static[name], np.float64), np.asarray(dygraph[name], np.float64).reshape(static[name].shape)
        diff = np.abs(a - b)
        index = np.unravel_index(int(np.argmax(diff)), diff.shape) if diff.size else ()
        out.append(Difference(name, float(diff.max()) if diff.size else 0.0, tuple(int(i) for i in index),
                              float(a[index]) if diff.size else 0.0, float(b[index]) if diff.size else 0.0))
    return out


def verify(source: Source, output_dir: os.PathLike, *, atol: float = 1e-5, seed: int = 0) -> List[Difference]:
    """Same batch through a static program holding the source's weights and through the converted
    dygraph model; raises VerificationError naming the worst output if any differs by more than `atol`."""
    arch = dict(source.arch, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    state, origin, _ = map_weights(source)
    pretraining = origin is not None  # cls.* weights were written
    batch = verification_batch(arch, seed=seed)
    ref = build_static_reference(source.model_type, arch, pretraining=pretraining)
    diffs = compare(run_static(ref, state, batch), run_dygraph(output_dir, source.model_type, batch,
                                                               pretraining=pretraining))
    worst = max(diffs, key=lambda diff: diff.max_abs_diff)
    if not worst.max_abs_diff <= atol:  # also catches NaN
        raise VerificationError(f"converted model differs from the static program by more than --atol {atol}: "
                                f"{worst}\n" + "\n".join(str(d) for d in diffs))
    return diffs


# -- modes -----------------------------------------------------------------------------------------
@contextlib.contextmanager
def _dygraph_mode() -> Iterator[None]:
    """Dynamic mode for paddlenlp's dygraph models, without any hybrid-parallel group a training run
    in this process set up (paddlenlp's from_pretrained would ask it for a tensor-parallel group)."""
    import paddle
    import paddle.distributed.fleet as fleet

    was_static = not paddle.in_dynamic_mode()
    hcg = getattr(fleet.fleet, "_hcg", None)
    paddle.disable_static()
    fleet.fleet._hcg = None
    try:
        yield
    finally:
        fleet.fleet._hcg = hcg
        if was_static:
            paddle.enable_static()


@contextlib.contextmanager
def _quiet_paddlenlp() -> Iterator[None]:
    """PaddleNLP logs every saved/loaded file at INFO; keep warnings."""
    import logging

    logger = logging.getLogger("PaddleNLP")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)
