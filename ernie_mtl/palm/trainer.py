"""PaddlePALM's trainer layer (`palm.Trainer`): one task's reader, backbone, head, optimizer and saver,
collected into the engine's configuration and run by the engine (docs/palm.md maps every call).

    trainer = palm.Trainer("sentiment")
    loss = trainer.build_forward(ernie, cls_head)          # records backbone + head
    trainer.build_backward(optimizer=adam, weight_decay=0.01)
    trainer.fit_reader(cls_reader)                          # -> an iterator of the run's batches
    trainer.load_pretrain("pretrain/ERNIE-v1-zh-base/params")
    trainer.set_saver(save_path="outputs/", save_steps=100)
    result = trainer.train(print_steps=20)                  # -> RunResult (steps, exports, metrics)
    trainer.build_predict_forward(pred_ernie, cls_pred_head)
    trainer.load_ckpt("outputs/ckpt.step300")
    trainer.fit_reader(pred_reader, phase="predict")
    records = trainer.predict(output_dir="outputs/predict")  # -> the records, also written as PALM wrote them

`train()` and `train_one_step()` drive the engine's `SteppedRun` (ernie_mtl/engine/stepping.py): the
programs, task schedule, checkpoints (exact resume), idle-head freezing, EMA, VisualDL and exports of
the command line, from a configuration this module assembles (`to_config()` shows it: the same
mapping as a YAML file gives `run_multitask_static.py --config`). `predict()` reads a checkpoint through
the engine's `CheckpointModel`, or an exported model through Paddle Inference.

Checkpoints. `set_saver(save_path, save_steps)` makes the engine keep `<save_path>/model_<N>` every
`save_steps` steps (all of them, as PALM kept all) and adds PALM's name for each, `<save_path>/ckpt.step<N>`,
a relative symbolic link to it; `load_ckpt` takes either name. `save_type='predict'` also writes
`<save_path>/pred.step<N>/<task>/infer_model` (PALM's was broken). The run also keeps
`<save_path>/model_last` (for resume) and exports `<save_path>/<task>/infer_model` at the end.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence

import numpy as np

from ernie_mtl.config import ConfigError

_TASK_NAME = re.compile(r"[^A-Za-z0-9_-]+")
_PALM_KEYS = {"input_ids": "token_ids", "label": "label_ids", "labels": "label_ids",
              "masked_lm_positions": "mask_pos", "masked_lm_labels": "mask_label"}
KEEP_ALL = 10 ** 9  # keep_last when PALM's saver is on: PALM never removed a checkpoint
NO_KEPT = 10 ** 12  # save_steps without a saver: model_last only


def task_name(name: str) -> str:
    """The engine's task name for a PALM trainer name: runs of characters other than ASCII letters,
    digits, `_` and `-` become `_` (a name is a file, feed and VisualDL tag name):
    'Quora Question Pairs matching' -> 'Quora_Question_Pairs_matching'."""
    out = _TASK_NAME.sub("_", str(name)).strip("_")
    if not out:
        raise ValueError(f"trainer name {name!r}: give a name with letters or digits")
    return out


class LossVar:
    """What `build_forward` returns: the task's loss as the engine computes it (a handle for
    `palm.optimizer.Adam`; the engine fetches the value every step: see `train_one_step`)."""

    def __init__(self, names: Sequence[str]):
        self.names = list(names)
        self.name = " + ".join(f"{n}.loss" for n in self.names)

    def __repr__(self) -> str:
        return f"LossVar({self.name})"


class PalmBatch(dict):
    """One training step's batch, by PALM's names (`token_ids`, `position_ids`, `segment_ids`,
    `input_mask` [B, L, 1], `task_ids`, `<trainer name>.label_ids`, ...; `__task_id` in a
    MultiHeadTrainer). It is a view of the engine's micro-batch, which `train_one_step` trains."""

    prepared: Any = None
    task: str = ""


class Trainer:
    """PALM's `Trainer(name, mix_ratio, reuse_head_with)`; see the module docstring."""

    def __init__(self, name, mix_ratio=1.0, reuse_head_with=None):
        if not isinstance(mix_ratio, (int, float)) or isinstance(mix_ratio, bool) or mix_ratio < 0:
            raise ValueError(f"mix_ratio {mix_ratio!r}: a sampling weight >= 0")
        self._name = str(name)
        self._task = task_name(name)
        self._mix_ratio = float(mix_ratio)
        self._reuse_head_with = reuse_head_with
        self._backbone = self._head = None
        self._pred_backbone = self._pred_head = None
        self._train_reader = self._pred_reader = None
        self._optimizer = None
        self._weight_decay = 0.0
        self._use_ema, self._ema_decay = False, None
        self._pretrain: Optional[str] = None
        self._resume: Optional[str] = None  # a checkpoint to continue from (load_ckpt before training)
        self._predict_from: Optional[str] = None  # load_ckpt / load_predict_model
        self._save_path: Optional[str] = None
        self._save_steps: Optional[int] = None
        self._save_types = ("ckpt",)
        self._callbacks: List[Any] = []
        self._flags: Dict[str, Any] = {}
        self._as_aux = False
        self._owner = None  # the MultiHeadTrainer this trainer is a part of
        self._run = None  # the engine's SteppedRun while training
        self._result = None  # the RunResult once trained
        self._print_steps = 5
        self._steps_per_epoch: Optional[int] = None
        self._num_epochs = None  # a MultiHeadTrainer's epochs of its sampling reference

    # -- properties (PALM's) ------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self._name

    @property
    def task_name(self) -> str:
        """The engine's name of this task (folders, feeds, logs): `task_name(name)`."""
        return self._task

    @property
    def mix_ratio(self) -> float:
        return self._mix_ratio

    @mix_ratio.setter
    def mix_ratio(self, value) -> None:
        self._mix_ratio = float(value)

    @property
    def num_examples(self) -> int:
        if self._train_reader is None:
            raise RuntimeError(f"trainer {self._name}: fit_reader(reader) first")
        return self._train_reader.num_examples

    @property
    def num_epochs(self):
        return None if self._train_reader is None else self._train_reader.num_epochs

    @property
    def steps_per_epoch(self) -> int:
        """Batches of this task per epoch: ceil(examples / batch size) (PALM: examples // batch size,
        while its reader yielded one batch fewer when that division was exact)."""
        reader = self._train_reader
        if reader is None:
            raise RuntimeError(f"trainer {self._name}: fit_reader(reader) first")
        return -(-reader.num_examples // reader.batch_size)

    steps_pur_epoch = steps_per_epoch  # PALM's spelling

    @property
    def cur_train_step(self) -> int:
        """Batches of this task trained so far (a resumed run counts its checkpoint's)."""
        run = self._live_run()
        if run is None:
            return 0
        return int(run.trainer.schedule.counts[self._index(run)])

    @property
    def cur_train_epoch(self) -> int:
        return self.cur_train_step // self.steps_per_epoch if self._train_reader is not None else 0

    def set_as_aux(self) -> None:
        """An auxiliary task: trained until the targets finish, never exported (PALM's aux tasks)."""
        self._as_aux = True

    # -- building -----------------------------------------------------------------------------------
    def build_forward(self, backbone, task_head) -> LossVar:
        """Record this task's backbone and head (the engine builds the program when training starts)."""
        self._require_phase(backbone, task_head, "train", "build_forward")
        self._backbone, self._head = backbone, task_head
        return LossVar([self._task])

    def build_predict_forward(self, pred_backbone, pred_head) -> Dict[str, Any]:
        """Record the prediction backbone and head; returns the head's outputs by PALM's names. Unlike
        PALM, this does not re-initialise the trained weights: `predict()` after `train()` uses them."""
        self._require_phase(pred_backbone, pred_head, "predict", "build_predict_forward")
        if self._backbone is not None and not self._backbone.same_model(pred_backbone):
            raise ValueError("build_predict_forward: the prediction backbone's architecture differs from the "
                             "training backbone's; build both from the same config")
        self._pred_backbone, self._pred_head = pred_backbone, pred_head
        return {f"{self._name}.{k}": v for k, v in pred_head.outputs_attr.items()}

    def build_backward(self, optimizer, weight_decay=None, use_ema=False, ema_decay=None) -> None:
        """Record the optimizer (its rate and schedule), the decoupled weight decay (None: 0) and the
        EMA of the weights (used for evaluation and export here; PALM computed it and never used it)."""
        if weight_decay is not None and (not isinstance(weight_decay, (int, float)) or weight_decay < 0):
            raise ValueError(f"weight_decay {weight_decay!r}: a number >= 0, or None")
        if use_ema and ema_decay is not None and not 0 < ema_decay < 1:
            raise ValueError(f"ema_decay {ema_decay!r}: within (0, 1)")
        self._optimizer = optimizer
        self._weight_decay = float(weight_decay or 0.0)
        self._use_ema = bool(use_ema)
        self._ema_decay = ema_decay

    def fit_reader(self, reader, phase="train"):
        """Give the trainer its data. Train phase: returns an iterator of the run's batches (PalmBatch),
        for `for batch in it: trainer.train_one_step(batch)`; the run opens at the first batch and is
        finished (exports, final checkpoint) when the iterator ends."""
        if phase not in ("train", "predict"):
            raise ValueError(f"phase {phase!r}: 'train' or 'predict'")
        if reader.phase != phase:
            raise ValueError(f"fit_reader(phase={phase!r}) got a {reader.phase}-phase {type(reader).__name__}")
        if reader.input_file is None:
            raise RuntimeError(f"fit_reader: call {type(reader).__name__}.load_data(...) first")
        if phase == "predict":
            self._pred_reader = reader
            return None
        self._train_reader = reader
        self._steps_per_epoch = self.steps_per_epoch
        return self._batches()

    # -- weights ------------------------------------------------------------------------------------
    def load_pretrain(self, model_path, convert=False) -> None:
        """Initialise the backbone from pretrained weights: an ERNIE 1.0 / PALM static parameter directory
        (`params/`, one file per variable) or a PaddleNLP model directory. Unlike PALM, a missing or extra
        variable is an error (naming it), not a warning."""
        if convert:
            raise ConfigError(["load_pretrain(convert=True) unpacked PALM 1.x's __palmmodel__ archives; pass the "
                               "unpacked params/ directory instead"])
        if not os.path.isdir(model_path):
            raise ConfigError([f"load_pretrain: {model_path}: no such directory (an ERNIE params/ directory or a "
                               "PaddleNLP model directory)"])
        self._pretrain = os.path.abspath(model_path)

    def load_ckpt(self, model_path) -> None:
        """A checkpoint of this engine (`<save_path>/ckpt.step<N>`, `model_<N>`, `model_last`, `best_<task>`).
        Before training: the run continues from it exactly (step, schedule, optimizer, LR). Afterwards (and
        for prediction): `predict()` and `evaluate()` use its weights."""
        path = _existing(model_path, "load_ckpt")
        root = self._root()
        if root._run is None and root._result is None and root._backbone is not None and self._pred_head is None:
            root._resume = path
        self._predict_from = path

    def load_predict_model(self, model_path, convert=False) -> None:
        """The model `predict()` uses: an exported inference model (`<save_path>/<task>/infer_model`,
        `pred.step<N>`, or the folder holding `<task>/infer_model`) or a checkpoint."""
        self._predict_from = _existing(model_path, "load_predict_model")

    def set_saver(self, save_path, save_steps, save_type="ckpt") -> None:
        """Keep a checkpoint every `save_steps` steps under `save_path` (see the module docstring);
        `save_type`: "ckpt", "predict" or "ckpt,predict"."""
        types = tuple(t.strip() for t in str(save_type).split(",") if t.strip())
        if not types or set(types) - {"ckpt", "predict"}:
            raise ValueError(f"save_type {save_type!r}: 'ckpt', 'predict' or 'ckpt,predict'")
        if isinstance(save_steps, bool) or not isinstance(save_steps, int) or save_steps < 1:
            raise ValueError(f"save_steps {save_steps!r}: an integer >= 1")
        self._save_path, self._save_steps, self._save_types = str(save_path), save_steps, types

    # -- beyond PALM --------------------------------------------------------------------------------
    def add_callback(self, callback) -> None:
        """An `ernie_mtl.Callback` object (on_step_end, on_log, on_evaluate, on_save, ...) for the run."""
        from ernie_mtl.engine.callbacks import Callback

        if not isinstance(callback, Callback):
            raise TypeError(f"{callback!r} is not an ernie_mtl Callback")
        self._callbacks.append(callback)

    def configure(self, **flags) -> None:
        """Any flag of the engine for the run (`use_amp=True`, `device="gpu"`, `eval_freq=100`,
        `use_sharding=True, sharding_degree=2`, `keep_last=3`, ...); they win over what the PALM calls set."""
        self._flags.update(flags)

    def to_config(self, print_steps: Optional[int] = None) -> Dict[str, Any]:
        """The engine configuration these calls amount to: the mapping `ernie_mtl.train` takes (a YAML
        file with the same content runs the same with `run_multitask_static.py --config`)."""
        from ernie_mtl.palm.config import run_config

        return run_config(self, self._members(), print_steps=print_steps or self._print_steps)

    # -- training -----------------------------------------------------------------------------------
    def train(self, print_steps=5, resume_from_checkpoint=None):
        """Train to the end (every batch through `train_one_step`); returns the engine's RunResult.
        `resume_from_checkpoint`: True = the newest checkpoint under save_path, a path = that one
        (load_ckpt before train does the same); default: a fresh run (PALM overwrote its outputs too)."""
        self._print_steps = int(print_steps)
        if resume_from_checkpoint is not None:
            self._resume = "auto" if resume_from_checkpoint is True else _existing(resume_from_checkpoint, "train")
        try:
            for batch in self._batches():
                self.train_one_step(batch)
        except BaseException:
            self._abort()
            raise
        return self._root()._result

    def train_one_step(self, batch):
        """Train the step of `batch` (from the `fit_reader` iterator or `get_one_batch`); returns
        {"<name>.loss": loss} as PALM did."""
        run = self._live_run()
        if run is None or not isinstance(batch, PalmBatch):
            raise ValueError("train_one_step: pass a batch of the fit_reader(...) iterator or of get_one_batch(): "
                             "the run's seeded schedule decides the batches (so that resume is exact)")
        losses = run.step(batch.prepared)
        return {f"{self._display(t)}.loss": np.array([v], dtype=np.float32) for t, v in losses.items()}

    def get_one_batch(self, phase="train"):
        """The run's next training batch (the same one until it is trained)."""
        if phase != "train":
            raise ValueError("get_one_batch: only the train phase has batches to fetch; predict() reads its reader")
        run = self._ensure_run()
        if run.done:
            self._finish()
            raise StopIteration("the run is over")
        return self._palm_batch(run.next_batch())

    def close(self) -> None:
        """Stop a run driven by `train_one_step` before its end: the checkpoints written stay (a later
        `load_ckpt(<save_path>/ckpt.step<N>)` + `train()` continues exactly), nothing more is trained."""
        self._abort()

    # -- prediction and evaluation ------------------------------------------------------------------
    def predict(self, output_dir=None, print_steps=1000):
        """Predict the `fit_reader(..., phase='predict')` file with the model of `load_ckpt` /
        `load_predict_model` (default: this trainer's final weights); write PALM's files to `output_dir`
        (when given; rank 0 writes them in a launched job) and return the records (also
        `pred_head.get_results()`, on every rank)."""
        from ernie_mtl.engine.run import static_mode_restored
        from ernie_mtl.palm import outputs

        if self._pred_reader is None or self._pred_head is None:
            raise RuntimeError("predict: build_predict_forward(backbone, head) and fit_reader(reader, "
                               "phase='predict') first")
        self._pred_head.check(self._pred_reader, self._pred_backbone)
        with static_mode_restored():
            predicted = self._predicted(self._pred_reader)
        expected = self._pred_reader.engine_type()
        if predicted.task.name != expected:
            raise ConfigError([f"predict: the model's task {self._task} is a {predicted.task.name} task but the "
                               f"prediction reader is a {type(self._pred_reader).__name__} ({expected})"])
        from ernie_mtl.dist.process import ProcessInfo

        # under paddle.distributed.launch every rank predicts the same file: rank 0 writes it
        results = outputs.write(self._pred_head, predicted, output_dir if ProcessInfo.from_env().rank == 0 else None)
        self._pred_head._set_results(results)
        return results

    def evaluate(self, reader=None, checkpoint=None) -> Dict[str, float]:
        """Metrics of a labelled file (`reader`'s, default the prediction reader's) with the weights of
        `checkpoint` (default: as `predict()` chooses): accuracy/F1, chunk F1, EM/F1 per task type."""
        from ernie_mtl.engine.inference import evaluate_checkpoint, evaluate_exported
        from ernie_mtl.engine.run import static_mode_restored

        reader = reader or self._pred_reader
        if reader is None or reader.input_file is None:
            raise RuntimeError("evaluate: give a reader with load_data(...) done (a labelled file)")
        kind, path = self._model_source(checkpoint)
        with static_mode_restored():
            if kind == "exported":
                report = evaluate_exported(path, reader.input_file)
            else:
                report = evaluate_checkpoint(path, self._task, reader.input_file)
        return report["metrics"]

    # -- internals ----------------------------------------------------------------------------------
    def _require_phase(self, backbone, head, phase: str, what: str) -> None:
        if backbone.phase != phase or head.phase != phase:
            raise ValueError(f"{what}: needs a {phase}-phase backbone and head (phase={phase!r}), got "
                             f"{backbone.phase!r} and {head.phase!r}")

    def _display(self, task: str) -> str:
        return self._name if task == self._task else task

    def _root(self) -> "Trainer":
        """The trainer that runs: this one, or the MultiHeadTrainer it is part of."""
        return self._owner if self._owner is not None else self

    def _members(self) -> List["Trainer"]:
        return [self]

    def _order(self, run=None) -> List[str]:
        """The engine's task names, in the engine's order."""
        return [self._task]

    def _live_run(self):
        return self._root()._run

    def _index(self, run) -> int:
        return [t.spec.name for t in run.trainer.tasks].index(self._task)

    def _ensure_run(self):
        root = self._root()
        if root._run is None:
            if root._result is not None:
                raise RuntimeError("the run is over: train() finished; build a new Trainer to train again")
            root._run = root._open()
        return root._run

    def _open(self):
        """The engine's run of this trainer's configuration (ernie_mtl/engine/stepping.py)."""
        from ernie_mtl.config.cli import parse_config
        from ernie_mtl.engine.run import static_mode_restored
        from ernie_mtl.engine.stepping import SteppedRun
        from ernie_mtl.engine.validate import HOOKS
        from ernie_mtl.palm.config import PalmLayout, run_config

        mapping = run_config(self, self._members(), print_steps=self._print_steps)
        with static_mode_restored():
            cfg = parse_config([], hooks=HOOKS, config=mapping, config_dir=os.getcwd())
        layout = PalmLayout(cfg.train.output_dir if self._save_path else None, self._save_types,
                            [m._task for m in self._members() if not m._as_aux], fresh=mapping["resume"] == "none",
                            shown=self._save_path)
        run = SteppedRun(cfg, callbacks=[layout, *self._callbacks])
        self._warn_schedule(run)
        return run

    def _warn_schedule(self, run) -> None:
        sched = self._optimizer._lr_schedualer if self._optimizer is not None else None
        total = run.trainer.plan.planned.total_steps
        n = getattr(sched, "num_train_steps", None)
        if n is not None and n < total:
            run.trainer.print(f"the learning-rate schedule reaches 0 at step {n} (TriangularSchedualer's "
                              f"num_train_steps) but the run plans {total} steps: the last {total - n} steps train "
                              "with rate 0; pass the run's steps as num_train_steps to use them")

    def _batches(self) -> Iterator[PalmBatch]:
        run = self._ensure_run()
        while not run.done:
            yield self._palm_batch(run.next_batch())
        self._finish()

    def _abort(self) -> None:
        """Close the run after an error (logs closed, Paddle's flags restored); it cannot continue."""
        root = self._root()
        if root._run is not None:
            run, root._run = root._run, None
            run.close()

    def _finish(self):
        root = self._root()
        if root._result is None and root._run is not None:
            root._result = root._run.finish()
            root._run = None
        return root._result

    def _palm_batch(self, prepared) -> PalmBatch:
        """The engine's micro-batch as PALM's reader dict (a view: `train_one_step` trains `prepared`)."""
        micro = prepared.micro[0]
        feed = micro.feed
        ids = np.asarray(feed["input_ids"])
        b, s = ids.shape
        out = PalmBatch(token_ids=ids, position_ids=np.tile(np.arange(s, dtype=np.int64), (b, 1)),
                        segment_ids=np.asarray(feed["segment_ids"]),
                        input_mask=(np.asarray(feed["input_mask"]).reshape(b, s, 1) == 0).astype(np.float32),
                        task_ids=np.zeros((b, s), dtype=np.int64))
        display = {m._task: m._name for m in self._root()._members()}
        prefix = micro.task + "."
        for key, value in feed.items():
            if key.startswith(prefix):
                own = key[len(prefix):]
                out[f"{display.get(micro.task, micro.task)}.{_PALM_KEYS.get(own, own)}"] = np.asarray(value)
        if len(display) > 1:  # PALM's task id: the trainer's position in the MultiHeadTrainer's list
            out["__task_id"] = np.array([list(display).index(micro.task)], dtype=np.int64)
        out.prepared, out.task = prepared, micro.task
        return out

    def _model_source(self, explicit=None):
        """("exported" | "checkpoint", path) of the weights predict/evaluate use."""
        from ernie_mtl.checkpoint.layout import MANIFEST, export_dir, is_complete

        path = explicit if explicit is not None else self._predict_from
        if path is None:
            result = self._root()._result
            if result is None or result.last_checkpoint is None:
                raise RuntimeError("no model to predict with: train() first, or load_ckpt(path) / "
                                   "load_predict_model(path)")
            return "checkpoint", str(result.last_checkpoint)
        p = Path(path).resolve()
        if (p / MANIFEST).is_file():
            return "exported", str(p)
        if (export_dir(p, self._task) / MANIFEST).is_file():
            return "exported", str(export_dir(p, self._task))
        if is_complete(p):
            return "checkpoint", str(p)
        from ernie_mtl.config.model import is_static_params_dir

        if is_static_params_dir(p) or (p / "model_state.pdparams").is_file():
            raise ConfigError([f"{path}: pretrained parameters, not a trained model: the head of task {self._task} "
                               "would be random (PALM's examples/predict did that; its accuracy was chance). Train "
                               "first, then predict with <save_path>/ckpt.step<N> or <save_path>/<task>/infer_model"])
        raise ConfigError([f"{path}: neither a checkpoint of this engine (model_<N>, model_last, best_<task>, "
                           "ckpt.step<N>) nor an exported model (<task>/infer_model with manifest.json)"])

    def _predicted(self, reader):
        from ernie_mtl.engine.inference import predict_checkpoint, predict_exported

        kind, path = self._model_source()
        overrides = {"max_seq_len": reader.max_len}
        if kind == "exported":
            return predict_exported(path, reader.input_file, batch_size=reader.batch_size, overrides=overrides,
                                    flag="predict reader file")
        return predict_checkpoint(path, self._task, reader.input_file, batch_size=reader.batch_size,
                                  overrides=overrides, flag="predict reader file")


def _existing(path, what: str) -> str:
    """The absolute path, PALM's `ckpt.step<N>` link resolved to the checkpoint folder it names."""
    if not os.path.exists(path):
        raise ConfigError([f"{what}: {path}: no such file or directory"])
    return os.path.realpath(path)


__all__ = ["Trainer", "LossVar", "PalmBatch", "task_name"]
