"""Prediction programs of the PALM face: the predict-phase heads of one trainer, or of every trainer of
a MultiHeadTrainer (PALM's joint multi-head prediction), on the shared backbone, built by the engine's
forward (ernie_mtl/program/forward.py) and run on the device of the build (a GPU when Paddle is
compiled with CUDA and one is present, as PALM did; the CPU otherwise, or as `configure(device=...)`
says).

Weights come from one of three sources:
- the run in progress (`live`): the training scope's current values, read at each use after a step
  (EMA averages when the run keeps them, AMP O2's fp32 masters); under sharding a rank holds only its
  shard, so prediction with live weights is refused there (predict from a checkpoint);
- a checkpoint (verified, every rank's files merged), as `--do_eval --checkpoint` reads it;
- pretrained backbone parameters (`load_predict_model(params)`, PALM's examples/predict): the heads are
  untrained (seeded random values) and a warning says so.

Parameters are matched by structured name: the predicting task's `heads.<its group in training>.*`
and the backbone's names, so a prediction program with fewer heads than the training run (one trainer
of a multi-task run) reads the right values. A head's parameter the source does not have is an error
naming it (a predict-phase head must create the parameters the train-phase head trained, with the
same names: PALM shared them by name).
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence

import numpy as np

from ernie_mtl.config import ConfigError, TaskSpec
from ernie_mtl.palm import adaptor
from ernie_mtl.palm.reader import is_builtin_reader
from ernie_mtl.tasks.base import TaskContext, TaskType, get_task_type
from ernie_mtl.tasks.feeds import TASK_TYPE_IDS


def prediction_place(device: Optional[str] = None):
    """The place prediction runs on: `device` ("cpu", "gpu", "gpu:N") when given, else a GPU when
    Paddle is compiled with CUDA and sees one (this process's `FLAGS_selected_gpus`, as
    paddle.distributed.launch sets it), else the CPU."""
    import paddle

    device = (device or "auto").lower()
    if device == "auto":
        try:
            use_gpu = bool(paddle.is_compiled_with_cuda()) and int(paddle.device.cuda.device_count()) > 0
        except Exception:  # noqa: BLE001  (no driver: the CPU)
            use_gpu = False
        gpu = int((os.environ.get("FLAGS_selected_gpus") or "0").split(",")[0])
    else:
        use_gpu = device.startswith("gpu")
        gpu = int(device.split(":")[1]) if ":" in device else int(
            (os.environ.get("FLAGS_selected_gpus") or "0").split(",")[0])
    return paddle.CUDAPlace(gpu) if use_gpu else paddle.CPUPlace()


@dataclass
class Record:
    """What the source knows of a task of its training run."""

    name: str
    index: int
    group: str
    reader: str
    spec: Optional[Dict[str, Any]] = None


@dataclass
class Source:
    """Where the weights come from and what the training run was."""

    kind: str  # "live", "checkpoint", "pretrained"
    where: str  # for messages
    model_type: str
    arch: Dict[str, Any]
    use_task_id: bool
    use_ema: bool
    seed: int
    vocab: Optional[str]
    records: Dict[str, Record]
    name_map: Dict[str, str]
    run: Any = None  # live: the SteppedRun
    path: Optional[str] = None  # checkpoint or pretrained directory
    step: Optional[int] = None

    @classmethod
    def live(cls, run) -> "Source":
        s, p = run.session, run.trainer.programs
        if s.topo.sharding_degree > 1:
            raise ConfigError(["predict/evaluate with the weights of the run in progress: under sharding each rank "
                               "holds a shard of them; predict from a checkpoint (load_ckpt(...)) instead"])
        groups = {task_name: g.name for g in p.groups for task_name in g.tasks}
        records = {task.spec.name: Record(task.spec.name, task.spec.index, groups[task.spec.name], task.name,
                                          task.spec.to_json())
                   for task in run.trainer.tasks}
        return cls("live", f"the run in progress (step {run.steps})", s.cfg.model.model_type, _arch(p.arch),
                   s.cfg.setup.mtl.use_task_id, p.ema is not None, s.cfg.train.seed, str(s.cfg.data.vocab_file),
                   records, dict(p.name_map), run=run, step=run.steps)

    @classmethod
    def checkpoint(cls, path: str) -> "Source":
        from ernie_mtl.checkpoint.store import CheckpointError, verified_state

        try:
            raw = verified_state(Path(path), use="predict")
        except CheckpointError as e:
            raise ConfigError([f"{path}: {e}"]) from None
        config = raw.get("config", {})
        mtl = config.get("mtl", {})
        records = {r["name"]: Record(r["name"], int(r["spec"]["index"]), r.get("group", r["name"]), r["reader"],
                                     r["spec"]) for r in raw.get("extra", {}).get("tasks", [])}
        vocab = config.get("data", {}).get("tokenizer_name_or_path")
        vocab = str(Path(vocab) / "vocab.txt") if vocab and Path(vocab).is_dir() else vocab
        return cls("checkpoint", f"checkpoint {path}", config.get("model", {}).get("model_type", "ernie"),
                   _arch(raw["extra"]["arch"]), bool(mtl.get("use_task_id")), bool(mtl.get("use_ema")),
                   int(config.get("train", {}).get("seed", 0)), vocab, records, dict(raw["name_map"]), path=path,
                   step=raw.get("step"))

    @classmethod
    def pretrained(cls, path: str, backbone, seed: int) -> "Source":
        flags = backbone.flags()
        model_type = flags.pop("model_type")
        use_task_id = bool(flags.pop("use_task_id", False))
        arch = {k: v for k, v in flags.items() if k not in ("hidden_dropout_prob", "attention_probs_dropout_prob")}
        return cls("pretrained", f"pretrained parameters {path}", model_type, arch, use_task_id, False, seed, None,
                   {}, {}, path=path)

    def values(self, needed: Sequence[str]) -> Dict[str, np.ndarray]:
        """static name -> value of the parameters `needed` (and their EMA averages and fp32 masters)."""
        if self.kind == "live":
            scope = self.run.session.scope
            names = {v.name for v in self.run.trainer.programs.main.list_vars() if v.persistable}
            out = {}
            for name in names:
                var = scope.find_var(name)
                if var is not None and var.get_tensor()._is_initialized():
                    out[name] = np.array(var.get_tensor())
            return out
        from ernie_mtl.checkpoint.store import merged_state

        return merged_state(Path(self.path), verify=False)  # verified when the source was opened


class Predictor:
    """The prediction program of `trainers` (their predict-phase heads and readers) with the weights of
    `source`: `run(task, batch)` -> {output name: array}."""

    def __init__(self, trainers: Sequence[Any], source: Source, *, device: Optional[str] = None):
        import paddle
        from paddle.utils import unique_name

        from ernie_mtl.program.edits import static_mode
        from ernie_mtl.program.forward import build_forward
        from ernie_mtl.program.randomness import seed_initializers

        self.source = source
        self.trainers = list(trainers)
        self.names = [trainer.task_name for trainer in self.trainers]
        self.records = [self._record(trainer, i) for i, trainer in enumerate(self.trainers)]
        self.tasks = [self._task(trainer, r, i) for i, (trainer, r) in enumerate(zip(self.trainers, self.records))]
        self.place = prediction_place(device)
        with static_mode():
            main, startup = paddle.static.Program(), paddle.static.Program()
            startup.random_seed = source.seed
            with paddle.static.program_guard(main, startup), unique_name.guard():
                self.fwd = build_forward(source.model_type, source.arch, self.tasks, use_task_id=source.use_task_id)
            seed_initializers(startup, self.fwd.name_map, source.seed)
            self.program = main.clone(for_test=True)
            self.exe = paddle.static.Executor(self.place)
            self.scope = paddle.static.Scope()
            self.exe.run(startup, scope=self.scope)
            self._main = main
        self.loaded_step: Optional[int] = None
        self.load()

    # -- tasks ---------------------------------------------------------------------------------------
    def _record(self, trainer, i: int) -> Record:
        record = self.source.records.get(trainer.task_name)
        if record is None and self.source.kind != "pretrained":
            raise ConfigError([f"trainer {trainer.name!r}: {self.source.where} has no task {trainer.task_name!r} "
                               f"(it has {sorted(self.source.records)}); name the Trainer as in training"])
        return record or Record(trainer.task_name, i, trainer.task_name, "")

    def _task(self, trainer, record: Record, i: int) -> TaskType:
        from ernie_mtl.palm.backbone import runs_own_build as backbone_builds
        from ernie_mtl.palm.head import runs_own_build as head_builds

        head, reader = trainer._pred_head, trainer._pred_reader
        backbone = trainer._pred_backbone
        if head is None:
            raise RuntimeError(f"trainer {trainer.name!r}: build_predict_forward(backbone, head) first")
        custom_backbone = backbone if backbone is not None and backbone_builds(backbone) else None
        vocab = (reader.vocab_path if reader is not None and is_builtin_reader(reader) else None) or self.source.vocab
        ctx = TaskContext(vocab_file=vocab or "", seed=self.source.seed, model_type=self.source.model_type,
                          log=lambda message: None)
        if adaptor.needs_adaptor(head, reader, custom_backbone):
            inner, inner_options = None, {}
            if reader is not None and is_builtin_reader(reader):
                inner = reader.engine_type()
                inner_options = {**reader.counting_options(), **reader.options()}
                if not head_builds(head):
                    inner_options.update(head.options(reader))
            elif not head_builds(head):
                inner = next((adaptor.READER_HEADS[c.__name__] for c in type(head).__mro__
                              if c.__name__ in adaptor.READER_HEADS), None)
                if inner is None:
                    raise ConfigError([f"trainer {trainer.name!r}: {type(head).__name__} reads the engine's features "
                                       "of a built-in reader; give it one, or write a head (palm.head.Head)"])
                inner_options = head.options(reader)
            key = adaptor.bind(f"predict:{trainer.task_name}", adaptor.Binding(
                task=trainer.task_name, pred_head=head, pred_reader=reader, backbone=custom_backbone, inner=inner,
                inner_options=inner_options, scope=record.group + "."))
            spec = TaskSpec(name=trainer.task_name, reader=adaptor.TYPE, index=i, batch_size=_batch_size(reader),
                            max_seq_len=getattr(reader, "max_len", 128) if reader is not None else 128,
                            options={"binding": key, "components": ""})
            return adaptor.PalmTask(spec, ctx)
        if record.spec is not None and record.reader not in ("", adaptor.TYPE):
            file = reader.input_file if reader is not None else None  # predicted, or evaluated when labelled
            spec = TaskSpec(**{**record.spec, "index": i, "reuse_tag": None, "train_file": None, "dev_file": file,
                               "test_file": None, "pred_file": file})
            reader_type = record.reader
        else:
            keys = dict(reader.task_keys()) if reader is not None else {}
            reader_type = keys.pop("reader", None) or _head_type(head)
            cls = get_task_type(reader_type)
            options = {k: o.default for k, o in cls.options.items()}
            options.update({k: keys.pop(k) for k in list(keys) if k in cls.options})
            options.update(head.options(reader))
            spec = TaskSpec(name=trainer.task_name, reader=reader_type, index=i, options=options,
                            dev_file=keys.get("pred_file"),
                            **{k: v for k, v in keys.items() if k in ("pred_file", "max_seq_len", "batch_size",
                                                                     "do_lower_case", "for_cn")})
        if reader is not None:
            spec = replace(spec, max_seq_len=reader.max_len, batch_size=reader.batch_size or spec.batch_size)
        return get_task_type(reader_type)(spec, ctx)

    # -- weights -------------------------------------------------------------------------------------
    def load(self) -> None:
        """Put the source's current weights into this program's scope (live: again only after a step)."""
        s = self.source
        if s.kind == "pretrained":
            if self.loaded_step is None:
                self._load_pretrained()
                self.loaded_step = 0
            return
        step = s.run.steps if s.kind == "live" else s.step
        if self.loaded_step is not None and self.loaded_step == step:
            return
        values = s.values(list(self.fwd.name_map.values()))
        averaged = {}
        if s.use_ema:
            from ernie_mtl.program.ema import averages_from_state

            averaged = averages_from_state(values)
        problems = []
        assignments = []
        for key, static in self.fwd.name_map.items():
            source_key = self._source_key(key)
            name = s.name_map.get(source_key)
            if name is None:
                problems.append(self._missing(key, static))
                continue
            value = averaged.get(name, values.get(name + "_fp32_master_0", values.get(name)))
            if value is None:
                problems.append(f"{s.where} lacks the value of {source_key} ({name})")
                continue
            tensor = self.scope.find_var(static).get_tensor()
            if tuple(tensor.shape()) != np.shape(value):
                problems.append(f"{key}: shape {list(tensor.shape())} in the prediction program but "
                                f"{list(np.shape(value))} in {s.where}; build the predict phase with the sizes the "
                                "model was trained with")
                continue
            assignments.append((tensor, value))
        if problems:
            raise ConfigError(problems)
        for tensor, value in assignments:
            tensor.set(np.asarray(value, dtype=np.float32), self.place)
        self.loaded_step = step

    def _source_key(self, key: str) -> str:
        if not key.startswith("heads."):
            return key
        group, rest = key[len("heads."):].split(".", 1)
        record = self.records[self.names.index(group)] if group in self.names else None
        return f"heads.{record.group if record is not None else group}.{rest}"

    def _missing(self, key: str, static: str) -> str:
        s = self.source
        if key.startswith("heads."):
            group = key[len("heads."):].split(".", 1)[0]
            trainer = self.trainers[self.names.index(group)] if group in self.names else None
            head = type(trainer._pred_head).__name__ if trainer is not None else "the head"
            trained = sorted(k for k in s.name_map if k.startswith(f"heads.{self._source_key(key).split('.')[1]}."))
            return (f"the predict-phase head {head} creates parameter {static} ({self._source_key(key)}), which "
                    f"{s.where} does not have (its parameters of that head: {trained}); build the same parameters, "
                    "with the same names, in the train and predict phases (PALM shared them by name)")
        return (f"{s.where} has no {key} ({static}): the prediction backbone differs from the trained one; build "
                "it from the same config")

    def _load_pretrained(self) -> None:
        from ernie_mtl.program.builder import load_pretrained_into_scope
        from ernie_mtl.program.forward import backbone_names

        load_pretrained_into_scope(self.source.path, backbone_names(self.fwd.name_map), self.scope,
                                   program=self._main, place=self.place)
        for trainer in self.trainers:
            message = (f"task {trainer.task_name}: predicting with the pretrained parameters {self.source.path}: the "
                       f"head {type(trainer._pred_head).__name__} is untrained (random values, seed "
                       f"{self.source.seed}), so the predictions are a random head's (PALM's examples/predict did "
                       "this; its accuracy was chance). Train first and predict with the checkpoint or exported model")
            warnings.warn(message, UserWarning, stacklevel=3)

    # -- running ---------------------------------------------------------------------------------------
    def run(self, name: str, batch: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
        """The prediction variables of task `name` for its collated `batch`, by name."""
        from ernie_mtl.program.edits import static_mode
        from ernie_mtl.program.forward import make_feed

        self.load()
        i = self.names.index(name)
        feed = make_feed(self.tasks, i, dict(batch), use_task_id=self.source.use_task_id)
        if self.source.use_task_id:  # the task's id in its training run
            feed[TASK_TYPE_IDS] = np.full_like(np.asarray(batch["input_ids"]), self.records[i].index)
        block = self.program.global_block()
        feed = {k: v for k, v in feed.items() if block.has_var(k)}
        preds = self.fwd.predictions[name]
        with static_mode():
            values = self.exe.run(self.program, feed=feed, fetch_list=[v.name for v in preds.values()],
                                  scope=self.scope)
        return {n: np.asarray(v) for n, v in zip(preds, values)}

    def task(self, name: str) -> TaskType:
        return self.tasks[self.names.index(name)]


def palm_outputs(task: TaskType, outputs: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """A built-in head's prediction outputs with PALM's names too: Classify/Match `logits` (log-probabilities,
    as the prediction files write them) beside `probs`; pairwise Match `probs` = sigmoid(score)."""
    out = dict(outputs)
    if "probs" in out and "logits" not in out:
        out["logits"] = np.log(np.clip(out["probs"].astype(np.float64), 1e-30, None)).astype(np.float32)
    if "score" in out and "probs" not in out:
        out["probs"] = (1.0 / (1.0 + np.exp(-out["score"].astype(np.float64)))).astype(np.float32)
    return out


def _arch(arch: Mapping[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in arch.items() if k != "model_type"}


def _batch_size(reader) -> int:
    if reader is None:
        return 1

    return int(reader.batch_size or 1) if is_builtin_reader(reader) else 1


def _head_type(head) -> str:
    from ernie_mtl.palm.head import MRC, Classify, MaskLM, Match, SequenceLabel

    for cls, name in ((Classify, "cls"), (Match, "match"), (SequenceLabel, "seq_label"), (MRC, "mrc"), (MaskLM, "mlm")):
        if isinstance(head, cls):
            return name
    raise ConfigError([f"{type(head).__name__}: no reader to predict with: fit_reader(reader, phase='predict')"])


__all__ = ["Predictor", "Source", "prediction_place", "palm_outputs"]
