"""The engine configuration a PALM script's calls amount to, and PALM's names in the output folder.

`run_config(root, members)` turns trainers (their readers, backbone, heads, optimizer, saver) into
the mapping `ernie_mtl.train` and `run_multitask_static.py --config` take, tasks inline:

    trainer names          -> task_instance (names made folder-safe: `trainer.task_name`); a
                              MultiHeadTrainer's sampling reference first (the engine's main task)
    mix_ratio, set_as_aux, reuse_head_with -> mix_ratio, target_tag, task_reuse_tag (sampling: palm)
    reader                 -> the task's reader, train_file, batch_size, max_seq_len, do_lower_case,
                              for_cn (lang), num_epochs and options (label_map, doc_stride, ...);
                              vocab_path -> tokenizer_name_or_path, seed -> seed
    head                   -> the task type's options (n_classes, dropout, use_crf, ...)
    backbone config        -> model_type and the architecture flags (hidden_size, ...)
    load_pretrain(path)    -> model_name_or_path (else a known name of the family, random weights)
    Adam + schedule        -> max_lr, min_lr, warmup_steps, decay_steps, grad_clip
    build_backward         -> weight_decay, use_ema, ema_decay
    set_saver              -> output_dir, save_steps, keep_last (all kept)
    train(print_steps)     -> logging_freq
    Trainer.configure(...) -> any other flag
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ernie_mtl.config import ConfigError
from ernie_mtl.engine.callbacks import Callback
from ernie_mtl.palm.reader import is_builtin_reader

# A family's known architecture name: the engine resolves it, then every architecture flag replaces its value.
FAMILY_BASE = {"ernie": "ernie-1.0-base-zh", "bert": "bert-base-chinese"}
DEFAULT_OUTPUT = "output"


KEEP_ALL = 10 ** 9  # keep_last when PALM's saver is on: PALM never removed a checkpoint
NO_KEPT = 10 ** 12  # save_steps without a saver: model_last only

def run_config(root, members: Sequence, *, print_steps: int) -> Dict[str, Any]:
    """The configuration mapping of `root` (a Trainer or MultiHeadTrainer) over its `members`. A task
    with a user's head, reader or backbone becomes a `palm` task bound to its objects in this process
    (ernie_mtl/palm/adaptor.py)."""
    from ernie_mtl.palm import adaptor
    from ernie_mtl.palm.backbone import runs_own_build as backbone_builds

    problems: List[str] = []
    for m in members:
        if m._backbone is None or m._head is None:
            problems.append(f"trainer {m.name!r}: build_forward(backbone, head) first")
        if m._train_reader is None:
            problems.append(f"trainer {m.name!r}: fit_reader(reader) (or the MultiHeadTrainer's "
                            "fit_readers_with_mixratio) first")
    if root._optimizer is None:
        problems.append("build_backward(optimizer=...) first: the optimizer sets the learning rate")
    if problems:
        raise ConfigError(problems)
    backbone = members[0]._backbone
    custom_backbone = backbone_builds(backbone)
    for m in members[1:]:
        same = m._backbone is backbone or (not custom_backbone and not backbone_builds(m._backbone)
                                           and backbone.same_model(m._backbone))
        if not same:
            problems.append(f"trainer {m.name!r}: its backbone differs from {members[0].name!r}'s; the tasks share "
                            "one backbone: build every trainer's forward with the same one")
    vocabs = sorted({v for v in (_vocab_of(m._train_reader) for m in members) if v})
    if len(vocabs) > 1:
        problems.append(f"the readers use different vocabularies {vocabs}; the tasks share one tokenizer")
    if not vocabs and "tokenizer_name_or_path" not in root._flags:
        problems.append("no reader names a vocabulary (PALM's readers take vocab_path): give the run one with "
                        "trainer.configure(tokenizer_name_or_path='<vocab.txt>') (exported models ship it)")
    seeds = [s for s in (_seed_of(m._train_reader) for m in members) if s is not None]
    names = [m._task for m in members]
    if len(set(names)) != len(names):
        seen: Dict[str, str] = {}
        for m in members:
            if m._task in seen:
                problems.append(f"trainers {seen[m._task]!r} and {m.name!r} collide: both become task {m._task!r} "
                                "(a task name is made folder-safe: characters other than letters, digits, '-' and "
                                "'_' become '_'); rename one of them")
            seen.setdefault(m._task, m.name)
    tasks: Dict[str, Dict[str, Any]] = {}
    bindings: Dict[str, Any] = {}
    multi = len(members) > 1 or getattr(root, "_multi", False)
    for m in members:
        reader, head = m._train_reader, m._head
        try:
            if custom_backbone or adaptor.needs_adaptor(head, reader, None):
                keys, bindings[m._task] = palm_task_keys(m, backbone if custom_backbone else None)
            else:
                head.check(reader, m._backbone)
                keys = reader.task_keys()
                keys.update(head.options(reader))
        except (ValueError, ConfigError) as e:
            problems += [f"trainer {m.name!r}: {p}" for p in getattr(e, "problems", [str(e)])]
            continue
        epochs = reader.num_epochs
        if not multi:
            keys["num_epochs"] = epochs if epochs is not None else 1
        elif epochs is not None:
            keys["num_epochs"] = epochs
        tasks[m._task] = keys
    custom_readers = [m.name for m in members if not is_builtin_reader(m._train_reader)]
    if custom_readers and int(root._flags.get("num_workers", 0)) > 0:
        problems.append(f"num_workers {root._flags['num_workers']}: trainer(s) {custom_readers} read a user-defined "
                        "reader, which runs in the training process; drop num_workers (it is 0 for such runs)")
    if custom_backbone:
        if root._pretrain is not None:
            problems.append(f"load_pretrain({root._pretrain}) loads ERNIE/BERT parameters, but the backbone is the "
                            f"user-defined {type(backbone).__name__}, which initialises its own parameters (its "
                            "build's initializers); drop load_pretrain")
        if root._flags.get("use_recompute"):
            problems.append(f"use_recompute: recompute checkpoints are ERNIE/BERT's layer outputs; the user-defined "
                            f"backbone {type(backbone).__name__} has none: drop use_recompute")
    if problems:
        raise ConfigError(problems)
    order = root._order()
    by_name = {m._task: m for m in members}
    tags: Dict[str, int] = {}
    for name in order:
        other = by_name[name]._reuse_head_with
        other = other._task if hasattr(other, "_task") else None if other is None else str(other)
        tags[name] = tags[other] if other in tags else len(set(tags.values()))
    for name, binding in bindings.items():  # a head's scope: its group's name, as the engine groups heads
        binding.scope = next(n for n in order if tags[n] == tags[name]) + "."
        adaptor.bind(name, binding)
    if custom_backbone:
        model = {"model_type": "ernie", "model_name_or_path": CUSTOM_BACKBONE_ARCH,
                 "vocab_size": max(_vocab_size(vocabs[0]) if vocabs else 0, 1000)}
    else:
        flags = backbone.flags()
        model = {"model_type": flags.pop("model_type"), "model_name_or_path": root._pretrain or
                 FAMILY_BASE[backbone.model_type], **flags}
    mapping: Dict[str, Any] = {
        "task_instance": order,
        "target_tag": [0 if by_name[n]._as_aux else 1 for n in order],
        "mix_ratio": [by_name[n]._mix_ratio for n in order],
        "task_reuse_tag": [tags[n] for n in order],
        "sampling": "palm",
        "num_epochs": float(root._num_epochs or 1) if multi else 1.0,
        "tasks": {n: tasks[n] for n in order},
        **model,
        **root._optimizer.flags(),
        "weight_decay": root._weight_decay,
        "use_ema": root._use_ema,
        "output_dir": root._save_path or os.path.join(DEFAULT_OUTPUT, order[0]),
        "save_steps": root._save_steps or NO_KEPT,
        "logging_freq": int(print_steps),
        "resume": root._resume or "none",
        "overwrite_output_dir": root._resume is None,
    }
    if root._resume not in (None, "auto") and _checkpoint_tasks(root._resume) != set(order):
        # load_ckpt of another run's checkpoint (a single-task trainer after a multi-task one, MT-DNN's
        # second stage): a new run warm-started from its weights -- the backbone, and the heads of the tasks
        # both runs have -- not a resume (ernie_mtl/engine/elastic.warm_start)
        mapping.update(resume="none", overwrite_output_dir=True, init_from=root._resume)
    if vocabs:
        mapping["tokenizer_name_or_path"] = vocabs[0]
    if custom_readers:
        mapping["num_workers"] = 0
    if root._save_steps:
        mapping["keep_last"] = KEEP_ALL
    if seeds:
        mapping["seed"] = int(seeds[0])
    if root._use_ema and root._ema_decay is not None:
        mapping["ema_decay"] = float(root._ema_decay)
    mapping.update(root._flags)
    if mapping.get("overwrite_output_dir") and mapping.get("resume") == "none":
        other = _another_run(mapping["output_dir"], order)
        if other:
            raise ConfigError([other])
    return mapping


def _another_run(output_dir: str, tasks: Sequence[str]) -> Optional[str]:
    """Why a fresh PALM run must not start in `output_dir`, or None. PALM overwrote its own outputs when a
    script ran again, and so does this face; but a folder holding the checkpoints of another run (other
    tasks, or a run of the command line) is not this script's to delete."""
    from data_tools.safe_io import read_json_bounded
    from ernie_mtl.checkpoint.layout import TRAIN_STATE
    from ernie_mtl.checkpoint.store import existing_outputs

    for path in existing_outputs(output_dir):
        try:
            raw = read_json_bounded(path / TRAIN_STATE, max_bytes=64 << 20, what="train state")
        except (OSError, ValueError) as e:
            return (f"set_saver / save_path {output_dir} holds {path.name}, whose {TRAIN_STATE} cannot be read "
                    f"({str(e)[:120]}): whose run it is cannot be told, so this script does not delete it; give this "
                    "run another save_path, or delete the folder yourself")
        raw = raw if isinstance(raw, dict) else {}
        extra = raw.get("extra") if isinstance(raw.get("extra"), dict) else {}
        theirs = [task.get("name") for task in extra.get("tasks") or [] if isinstance(task, dict)]
        palm = "PalmLayout" in (extra.get("callbacks") or {})  # the PALM face's layout callback saved its state
        if not palm or sorted(theirs) != sorted(tasks):
            what = f"tasks {theirs}" if theirs else "another configuration"
            return (f"set_saver / save_path {output_dir} holds the checkpoints of another run ({path.name}: step "
                    f"{raw.get('step')}, {what}{'' if palm else ', not written through the PALM API'}), which this "
                    f"script's run of {list(tasks)} would delete: give this run another save_path, resume that run "
                    "(train(resume_from_checkpoint=True)), or delete the folder yourself")
    return None


# The architecture a run with a user-defined backbone names (never built: the backbone replaces it; the
# tokenizer family and the export manifest read it)
CUSTOM_BACKBONE_ARCH = "ernie-tiny-test"


def palm_task_keys(trainer, custom_backbone) -> Tuple[Dict[str, Any], Any]:
    """(task keys, Binding) of `trainer` whose head, reader or backbone is the user's."""
    from ernie_mtl.palm import adaptor
    from ernie_mtl.palm.head import MaskLM, runs_own_build as head_builds

    reader, head, pred_head = trainer._train_reader, trainer._head, trainer._pred_head
    builtin_reader = is_builtin_reader(reader)
    custom_head = head_builds(head)
    if pred_head is not None and head_builds(pred_head) != custom_head:
        raise ValueError(f"its train head {type(head).__name__} and predict head {type(pred_head).__name__}: one "
                         "builds its own graph, the other is built in; give both phases the same kind of head")
    if custom_backbone is not None and isinstance(head, MaskLM) and not custom_head:
        raise ValueError(f"MaskLM ties its output layer to ERNIE/BERT's word embedding, which the user-defined "
                         f"backbone {type(custom_backbone).__name__} does not have; write a head that reads "
                         "inputs['backbone'] of your backbone")
    inner, inner_options = None, {}
    if builtin_reader:
        inner = reader.engine_type()
        inner_options = {**reader.counting_options(), **reader.options()}
        if not custom_head:
            head.check(reader, trainer._backbone if custom_backbone is None else None)
            inner_options.update(head.options(reader))
    elif not custom_head:
        inner = next((adaptor.READER_HEADS[c.__name__] for c in type(head).__mro__ if c.__name__ in
                      adaptor.READER_HEADS), None)
        if inner is None or getattr(head, "learning_strategy", "pointwise") != "pointwise":
            raise ValueError(f"{type(head).__name__} reads the engine's own features of its built-in reader; a "
                             f"user-defined reader ({type(reader).__name__}) feeds a head that builds its own graph "
                             "(palm.head.Head), or Classify / pointwise Match (from its label_ids)")
        inner_options = head.options(reader)
    if custom_head:
        check_custom_head(head, reader, trainer._backbone, inner)
        if pred_head is not None:
            check_custom_head(pred_head, trainer._pred_reader or reader, trainer._pred_backbone or trainer._backbone,
                              inner)
    binding = adaptor.Binding(task=trainer._task, head=head, pred_head=pred_head if custom_head else None,
                              reader=reader,
                              pred_reader=trainer._pred_reader, backbone=custom_backbone, inner=inner,
                              inner_options=inner_options)
    keys: Dict[str, Any] = {"reader": adaptor.TYPE, "binding": trainer._task, "components": binding.components()}
    if builtin_reader:
        keys.update({k: v for k, v in reader.task_keys().items() if k in _TASK_KEYS})
    else:
        path = reader.__dict__.get("_input_file")
        if not (isinstance(path, str) and os.path.exists(path)):
            raise ValueError(f"reader {type(reader).__name__}: load_data's input_file {path!r} is not an existing "
                             "file or folder; the run records its training data (its identity decides whether a "
                             "checkpoint may be resumed): load the data from a file")
        keys.update(train_file=path, batch_size=1, max_seq_len=int(getattr(reader, "max_len", 0) or
                                                                   reader.__dict__.get("_max_len") or 128))
    return keys, binding


_TASK_KEYS = ("train_file", "pred_file", "max_seq_len", "batch_size", "do_lower_case", "for_cn", "shuffle")


def check_custom_head(head, reader, backbone, inner: Optional[str]) -> None:
    """PALM's check_io between a user's head and its reader and backbone: every field it declares
    exists (ValueError naming it otherwise)."""
    from ernie_mtl.palm import adaptor

    try:
        attrs = head.inputs_attrs or {}
    except NotImplementedError:
        attrs = {}
    name = type(head).__name__
    if not isinstance(attrs, Mapping):
        raise ValueError(f"head {name}: inputs_attrs is {type(attrs).__name__}; return {{'reader': {{...}}, "
                         "'backbone': {...}}")
    if backbone is not None:
        try:
            outputs = set(backbone.outputs_attr)
        except NotImplementedError:
            outputs = set()
        missing = sorted(set(attrs.get("backbone") or {}) - outputs)
        if missing:
            raise ValueError(f"head {name} reads inputs['backbone'] {missing}, which backbone "
                             f"{type(backbone).__name__} does not output (its outputs_attr: {sorted(outputs)})")
    wanted = set(attrs.get("reader") or {}) - set(adaptor.DERIVED)
    if reader is None or not wanted:
        return
    if is_builtin_reader(reader):
        from ernie_mtl.tasks.base import get_task_type

        feeds = [f.name for f in _label_feeds_of(get_task_type(inner), reader)]
        available = set(feeds) | {adaptor.PALM_FIELDS.get(f, f) for f in feeds}
    else:
        try:
            available = set(reader.outputs_attr)
        except NotImplementedError:
            return  # an undeclared reader: its batches are checked when read
    missing = sorted(wanted - available)
    if missing:
        raise ValueError(f"head {name} reads inputs['reader'] {missing}, which reader {type(reader).__name__} does "
                         f"not give (it gives {sorted(available | set(adaptor.DERIVED))})")


def _label_feeds_of(cls, reader):
    from ernie_mtl.config import TaskSpec
    from ernie_mtl.tasks.base import TaskContext

    options = {k: o.default for k, o in cls.options.items()}
    options.update({**reader.counting_options(), **reader.options()})
    task = cls(TaskSpec(name="palm_check", reader=cls.name, index=0, max_seq_len=reader.max_len, batch_size=1,
                        options=options), TaskContext(vocab_file=reader.vocab_path, seed=0, log=lambda message: None))
    return task.label_feeds()


def _vocab_of(reader) -> Optional[str]:
    """A reader's vocabulary file: a built-in reader's vocab_path; a user's reader's `vocab_path` or
    `_vocab_path` attribute, when it keeps one."""
    try:
        value = getattr(reader, "vocab_path", None)
    except Exception:  # noqa: BLE001  (a user's property that fails: no vocabulary known)
        value = None
    value = value if isinstance(value, str) else reader.__dict__.get("_vocab_path")
    return os.path.abspath(value) if isinstance(value, str) and os.path.isfile(value) else None


def _seed_of(reader):
    return reader.__dict__.get("_seed")


def _vocab_size(path: str) -> int:
    with open(path, encoding="utf-8") as f:
        return sum(1 for line in f if line.strip())


class PalmLayout(Callback):
    """PALM's names in the output folder: `<save_path>/ckpt.step<N>` (a relative link to the kept
    checkpoint `model_<N>`) and, with save_type 'predict', `<save_path>/pred.step<N>/<task>/infer_model`.
    A fresh run first removes such names left by an earlier run in the folder."""

    def __init__(self, save_path: Optional[str], save_types: Sequence[str], targets: Sequence[str], *, fresh: bool,
                 shown: Optional[str] = None):
        self.save_path = Path(save_path) if save_path else None
        self.shown = shown or save_path  # the path as the script gave it, for PALM's messages
        self.save_types = tuple(save_types)
        self.targets = list(targets)
        self.fresh = fresh

    def on_train_begin(self, trainer) -> None:
        if not (self.fresh and trainer.is_rank0 and self.save_path is not None and self.save_path.is_dir()):
            return
        for p in list(self.save_path.glob("ckpt.step*")) + list(self.save_path.glob("pred.step*")):
            if p.is_symlink() or p.is_file():
                p.unlink()
            elif p.is_dir() and p.name.startswith("pred.step"):
                shutil.rmtree(p)

    def on_save(self, trainer, path: str) -> None:
        from ernie_mtl.checkpoint.layout import export_dir, kept_step

        step = kept_step(Path(path).name)
        if step is None or self.save_path is None or not trainer.is_rank0:
            return
        if "ckpt" in self.save_types:
            link = self.save_path / f"ckpt.step{step}"
            if link.is_symlink() or link.exists():
                link.unlink()
            os.symlink(Path(path).name, link)
            trainer.print(f"checkpoint has been saved at {os.path.join(self.shown, link.name)}")
        if "predict" in self.save_types:
            from ernie_mtl.engine.saved_models import export_from_checkpoint

            for task in self.targets:
                if trainer.task(task).exportable:
                    export_from_checkpoint(Path(path), task, export_dir(self.save_path / f"pred.step{step}", task))
                    trainer.print("predict model has been saved at "
                                  f"{export_dir(os.path.join(self.shown, f'pred.step{step}'), task)}")


def _checkpoint_tasks(path: str) -> Optional[set]:
    """The task names a checkpoint of the engine was trained on (None when it records none)."""
    import json

    from ernie_mtl.checkpoint.layout import TRAIN_STATE

    try:
        with open(os.path.join(path, TRAIN_STATE), encoding="utf-8") as f:
            records = json.load(f).get("extra", {}).get("tasks", [])
        return {r["name"] for r in records}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # the engine's own checks name what is wrong with it
