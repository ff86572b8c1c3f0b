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

This module is PALM's facade; `train()` and `train_one_step()` drive the engine's `SteppedRun`
(ernie_mtl/engine/stepping.py) through the stepping adaptor (ernie_mtl/palm/stepping.py), and the
prediction calls go through ernie_mtl/palm/predicting.py. The run has the
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
from typing import Any, Dict, List, Optional, Sequence


from ernie_mtl.config import ConfigError
from ernie_mtl.palm.batches import PALM_KEYS, PalmBatch  # noqa: F401  (PalmBatch: re-exported)
from ernie_mtl.palm.predicting import PredictionDriver
from ernie_mtl.palm.stepping import StepDriver

_TASK_NAME = re.compile(r"[^A-Za-z0-9_-]+")


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


class Trainer(StepDriver, PredictionDriver):
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
        self._predict_kind: Optional[str] = None  # "ckpt" (load_ckpt) or "model" (load_predict_model)
        self._predictor = None  # (key, palm.predictor.Predictor) the prediction program in use
        self._pred_batches = None  # get_one_batch('predict')'s pass over the prediction reader
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
        """Record this task's backbone and head (the engine builds the program when training starts;
        a head's own `build` runs then, inside the engine's programs)."""
        self._require_phase(backbone, task_head, "train", "build_forward")
        _check_builds(task_head, backbone)
        self._backbone, self._head = backbone, task_head
        return LossVar([self._task])

    def build_predict_forward(self, pred_backbone, pred_head) -> Dict[str, Any]:
        """Record the prediction backbone and head; returns the head's outputs by PALM's names. Unlike
        PALM, this does not re-initialise the trained weights: `predict()` after `train()` uses them."""
        from ernie_mtl.palm.backbone import runs_own_build as backbone_builds
        from ernie_mtl.palm.head import declared_outputs

        self._require_phase(pred_backbone, pred_head, "predict", "build_predict_forward")
        _check_builds(pred_head, pred_backbone)
        trained = self._backbone or (self._owner._backbone if self._owner is not None else None)
        if trained is not None and not backbone_builds(trained) and not backbone_builds(pred_backbone) \
                and not trained.same_model(pred_backbone):
            raise ValueError("build_predict_forward: the prediction backbone's architecture differs from the "
                             "training backbone's; build both from the same config")
        if trained is not None and backbone_builds(trained) != backbone_builds(pred_backbone):
            raise ValueError("build_predict_forward: the prediction backbone is of another kind than the training "
                             f"backbone ({type(pred_backbone).__name__} vs {type(trained).__name__}); build both "
                             "the same")
        self._pred_backbone, self._pred_head = pred_backbone, pred_head
        self._root()._predictor = None
        return {f"{self._name}.{k}": v for k, v in declared_outputs(pred_head).items()}

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
        from ernie_mtl.palm.reader import is_builtin_reader

        if phase not in ("train", "predict"):
            raise ValueError(f"phase {phase!r}: 'train' or 'predict'")
        if reader.phase != phase:
            raise ValueError(f"fit_reader(phase={phase!r}) got a {reader.phase}-phase {type(reader).__name__}")
        if (reader.input_file is None) if is_builtin_reader(reader) else not reader.batch_size:
            raise RuntimeError(f"fit_reader: call {type(reader).__name__}.load_data(...) first (it sets the batch "
                               "size)")
        if phase == "predict":
            self._pred_reader = reader
            self._pred_batches = None
            self._root()._predictor = None
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
        Before training a forward built with `build_forward`: the run continues from it exactly (step,
        schedule, optimizer, LR), as PALM loaded it into the training program; prediction then uses the
        run's weights. Otherwise (a prediction script, or after training): `predict()` and `evaluate()` use
        its weights."""
        path = _existing(model_path, "load_ckpt")
        root = self._root()
        if root._run is None and root._result is None and root._backbone is not None:
            root._resume = path
        else:
            self._predict_from, self._predict_kind = path, "ckpt"
        root._predictor = None

    def load_predict_model(self, model_path, convert=False) -> None:
        """The model `predict()` uses: an exported inference model (`<save_path>/<task>/infer_model`,
        `pred.step<N>`, or the folder holding `<task>/infer_model`), a checkpoint, or pretrained backbone
        parameters (PALM's examples/predict: the head is then untrained, and a warning says so)."""
        if convert:
            raise ConfigError(["load_predict_model(convert=True) unpacked PALM 1.x's __palmmodel__ archives; pass the "
                               "unpacked params/ directory instead"])
        self._predict_from, self._predict_kind = _existing(model_path, "load_predict_model"), "model"
        self._root()._predictor = None

    def set_saver(self, save_path, save_steps, save_type="ckpt") -> None:
        """Keep a checkpoint every `save_steps` steps under `save_path` (see the module docstring);
        `save_type`: "ckpt", "predict" or "ckpt,predict"."""
        types = tuple(part.strip() for part in str(save_type).split(",") if part.strip())
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
        from ernie_mtl.palm.run_config import run_config

        return run_config(self, self._members(), print_steps=print_steps or self._print_steps)

    # -- training -----------------------------------------------------------------------------------
    def train(self, print_steps=5, resume_from_checkpoint=None):
        """Train to the end (every batch through `train_one_step`); returns the engine's RunResult.
        `resume_from_checkpoint`: True = the newest checkpoint under save_path, a path = that one
        (load_ckpt before train does the same); default: a fresh run (PALM overwrote its outputs too).
        A user-defined train head's `batch_postprocess` gets each step's {'loss': ...}, as PALM's did."""
        self._print_steps = int(print_steps)
        if resume_from_checkpoint is not None:
            self._resume = "auto" if resume_from_checkpoint is True else _existing(resume_from_checkpoint, "train")
        try:
            for batch in self._batches():
                outputs = self._step(batch)
                self._postprocess_step(batch.task, outputs)
        except BaseException:
            self._abort()
            raise
        return self._root()._result

    def train_one_step(self, batch):
        """Train one step; returns {"<name>.loss": loss} as PALM did. `batch`: a batch of the `fit_reader`
        iterator or `get_one_batch()` (the run's seeded schedule decides them, so that resume is exact), or
        a batch the script built (PALM's dict: token_ids, segment_ids, input_mask [B, L, 1] and the task's
        fields, as `<name>.label_ids` or `label_ids`), trained in place of the schedule's batch of its step."""
        return self._step(batch)

    def get_one_batch(self, phase="train"):
        """The run's next training batch (the same one until it is trained); `phase='predict'`: the next
        batch of the prediction reader (PALM's dict; one pass, then it starts over)."""
        if phase == "predict":
            return self._next_predict_batch()
        if phase != "train":
            raise ValueError(f"get_one_batch: phase {phase!r}: 'train' or 'predict'")
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
        `load_predict_model` (default: the weights of this trainer's run: the current ones while it runs,
        the final ones after it). A built-in head writes PALM's files to `output_dir` (when given; rank 0
        writes them in a launched job) and returns the records (also `pred_head.get_results()`); a
        user-defined head gets every batch's outputs in `batch_postprocess` and `epoch_postprocess` ends it,
        as in PALM: its return value is returned."""
        from ernie_mtl.dist.process import ProcessInfo
        from ernie_mtl.engine.run import static_mode_restored
        from ernie_mtl.palm import outputs
        from ernie_mtl.palm.head import postprocesses_itself

        if self._pred_reader is None or self._pred_head is None:
            raise RuntimeError("predict: build_predict_forward(backbone, head) and fit_reader(reader, "
                               "phase='predict') first")
        out_dir = output_dir if ProcessInfo.from_env().rank == 0 else None
        if postprocesses_itself(self._pred_head):
            return self._predict_postprocessing(out_dir)
        if self._own_components():
            with static_mode_restored():
                predicted = self._predicted(self._pred_reader, program=True)
            results = outputs.write(self._pred_head, predicted, out_dir)
            self._pred_head._set_results(results)
            return results
        self._pred_head.check(self._pred_reader, self._pred_backbone)
        with static_mode_restored():
            predicted = self._predicted(self._pred_reader)
        expected = self._pred_reader.engine_type()
        if predicted.task.name != expected:
            raise ConfigError([f"predict: the model's task {self._task} is a {predicted.task.name} task but the "
                               f"prediction reader is a {type(self._pred_reader).__name__} ({expected})"])
        # under paddle.distributed.launch every rank predicts the same file: rank 0 writes it
        results = outputs.write(self._pred_head, predicted, out_dir)
        self._pred_head._set_results(results)
        return results

    def predict_one_batch(self, batch):
        """The prediction head's outputs for one batch (PALM's dict, from the prediction reader or built
        by the script): {output name: array}. A built-in head's outputs are the engine's prediction
        variables, Classify/Match's also under PALM's `logits`/`probs`."""
        from ernie_mtl.palm.adaptor import engine_batch
        from ernie_mtl.palm.predictor import palm_outputs

        predictor = self._prediction_program([self])
        task = predictor.task(self._task)
        collated = engine_batch(task, batch, prefix=f"{self._name}.", required=False,
                                where=f"predict_one_batch: the batch of task {self._task!r}")
        return palm_outputs(task, predictor.run(self._task, collated))

    def evaluate(self, reader=None, checkpoint=None) -> Dict[str, float]:
        """Metrics of a labelled file (`reader`'s, default the prediction reader's) with the weights of
        `checkpoint` (default: as `predict()` chooses, the run's current weights while it runs):
        accuracy/F1, chunk F1, EM/F1 per task type. A user-defined head has no metrics here (score what
        its postprocessing kept)."""
        from ernie_mtl.engine.saved_models import evaluate_checkpoint, evaluate_exported
        from ernie_mtl.engine.run import static_mode_restored
        from ernie_mtl.palm.head import runs_own_build
        from ernie_mtl.palm.reader import is_builtin_reader

        reader = reader or self._pred_reader
        if reader is None or not is_builtin_reader(reader) or reader.input_file is None:
            raise RuntimeError("evaluate: give a built-in reader with load_data(...) done (a labelled file)")
        head = self._pred_head or self._head
        if head is not None and runs_own_build(head):
            raise ConfigError([f"evaluate: {type(head).__name__} builds its own graph and has no metrics here; "
                               "predict() and score what its batch_postprocess/epoch_postprocess kept"])
        if checkpoint is None and self._uses_live_weights():
            from ernie_mtl.engine.prediction_loop import by_name, predict_batches

            predictor = self._prediction_program([self], reader=reader)
            task = predictor.task(self._task)
            data = task.load("dev")
            names = list(predictor.fwd.predictions[self._task])
            outs = by_name(predict_batches(task, data,
                                           lambda batch: [o for o in predictor.run(self._task, batch).values()],
                                           names, batch_size=reader.batch_size), names)
            return {k: float(v) for k, v in task.evaluate(data, outs).items()}
        kind, path = self._model_source(checkpoint)
        with static_mode_restored():
            if kind == "exported":
                report = evaluate_exported(path, reader.input_file)
            elif kind == "checkpoint":
                report = evaluate_checkpoint(path, self._task, reader.input_file)
            else:
                raise ConfigError([f"evaluate: {path} holds pretrained parameters, not a trained model; its head "
                                   "would be random"])
        return report["metrics"]

    # -- internals ----------------------------------------------------------------------------------
    def _require_phase(self, backbone, head, phase: str, what: str) -> None:
        from ernie_mtl.palm.head import phase_of

        got = (getattr(backbone, "phase", phase), phase_of(head))
        if got != (phase, phase):
            raise ValueError(f"{what}: needs a {phase}-phase backbone and head (phase={phase!r}), got "
                             f"{got[0]!r} and {got[1]!r}")

    def _display(self, task: str) -> str:
        return self._name if task == self._task else task

    def _root(self) -> "Trainer":
        """The trainer that runs: this one, or the MultiHeadTrainer it is part of."""
        return self._owner if self._owner is not None else self

    def _members(self) -> List["Trainer"]:
        return [self]

def _check_builds(head, backbone) -> None:
    """A head or backbone built from PALM's bases must implement build (ValueError now, not at training)."""
    from ernie_mtl.palm.backbone import Backbone, runs_own_build as backbone_builds
    from ernie_mtl.palm.head import Head, runs_own_build as head_builds

    for obj, base in ((head, Head), (backbone, Backbone)):
        if isinstance(obj, base) and (head_builds(obj) if base is Head else backbone_builds(obj)) \
                and type(obj).build is base.build:
            raise ValueError(f"{type(obj).__name__} does not implement build(inputs, scope_name): a "
                             f"{base.__name__.lower()} written on palm.{base.__module__.split('.')[-1]}."
                             f"{base.__name__} builds its graph there (docs/palm_extending.md)")


def _existing(path, what: str) -> str:
    """The absolute path, PALM's `ckpt.step<N>` link resolved to the checkpoint folder it names."""
    if not os.path.exists(path):
        raise ConfigError([f"{what}: {path}: no such file or directory"])
    return os.path.realpath(path)


__all__ = ["Trainer", "LossVar", "PalmBatch", "task_name"]
