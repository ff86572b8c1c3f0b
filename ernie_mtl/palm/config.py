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
from typing import Any, Dict, List, Optional, Sequence

from ernie_mtl.config import ConfigError
from ernie_mtl.engine.callbacks import Callback

# A family's known architecture name: the engine resolves it, then every architecture flag replaces its value.
FAMILY_BASE = {"ernie": "ernie-1.0-base-zh", "bert": "bert-base-chinese"}
DEFAULT_OUTPUT = "output"


def run_config(root, members: Sequence, *, print_steps: int) -> Dict[str, Any]:
    """The configuration mapping of `root` (a Trainer or MultiHeadTrainer) over its `members`."""
    from ernie_mtl.palm.trainer import KEEP_ALL, NO_KEPT

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
    for m in members[1:]:
        if m._backbone is not backbone and not backbone.same_model(m._backbone):
            problems.append(f"trainer {m.name!r}: its backbone differs from {members[0].name!r}'s; the tasks share "
                            "one backbone: build every trainer's forward with the same one")
    vocabs = sorted({m._train_reader.vocab_path for m in members})
    if len(vocabs) > 1:
        problems.append(f"the readers use different vocabularies {vocabs}; the tasks share one tokenizer")
    seeds = [m._train_reader.seed for m in members if m._train_reader.seed is not None]
    names = [m._task for m in members]
    if len(set(names)) != len(names):
        problems.append(f"trainer names {[m.name for m in members]} are not distinct once made folder-safe "
                        f"({names}); rename them")
    tasks: Dict[str, Dict[str, Any]] = {}
    multi = len(members) > 1 or getattr(root, "_multi", False)
    for m in members:
        reader, head = m._train_reader, m._head
        try:
            head.check(reader, m._backbone)
        except ValueError as e:
            problems.append(f"trainer {m.name!r}: {e}")
            continue
        keys = reader.task_keys()
        keys.update(head.options(reader))
        epochs = reader.num_epochs
        if not multi:
            keys["num_epochs"] = epochs if epochs is not None else 1
        elif epochs is not None:
            keys["num_epochs"] = epochs
        tasks[m._task] = keys
    if problems:
        raise ConfigError(problems)
    order = root._order()
    by_name = {m._task: m for m in members}
    tags: Dict[str, int] = {}
    for name in order:
        other = by_name[name]._reuse_head_with
        other = other._task if hasattr(other, "_task") else None if other is None else str(other)
        tags[name] = tags[other] if other in tags else len(set(tags.values()))
    flags = backbone.flags()
    model_type = flags.pop("model_type")
    mapping: Dict[str, Any] = {
        "task_instance": order,
        "target_tag": [0 if by_name[n]._as_aux else 1 for n in order],
        "mix_ratio": [by_name[n]._mix_ratio for n in order],
        "task_reuse_tag": [tags[n] for n in order],
        "sampling": "palm",
        "num_epochs": float(root._num_epochs or 1) if multi else 1.0,
        "tasks": {n: tasks[n] for n in order},
        "model_type": model_type,
        "model_name_or_path": root._pretrain or FAMILY_BASE[model_type],
        **flags,
        "tokenizer_name_or_path": vocabs[0],
        **root._optimizer.flags(),
        "weight_decay": root._weight_decay,
        "use_ema": root._use_ema,
        "output_dir": root._save_path or os.path.join(DEFAULT_OUTPUT, order[0]),
        "save_steps": root._save_steps or NO_KEPT,
        "logging_freq": int(print_steps),
        "resume": root._resume or "none",
        "overwrite_output_dir": root._resume is None,
    }
    if root._save_steps:
        mapping["keep_last"] = KEEP_ALL
    if seeds:
        mapping["seed"] = int(seeds[0])
    if root._use_ema and root._ema_decay is not None:
        mapping["ema_decay"] = float(root._ema_decay)
    mapping.update(root._flags)
    return mapping


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
            from ernie_mtl.engine.exporter import export_from_checkpoint

            for task in self.targets:
                if trainer.task(task).exportable:
                    export_from_checkpoint(Path(path), task, export_dir(self.save_path / f"pred.step{step}", task))
                    trainer.print("predict model has been saved at "
                                  f"{export_dir(os.path.join(self.shown, f'pred.step{step}'), task)}")
