"""Prediction and evaluation with saved models, outside training: `--do_predict` and `--do_eval`.

    run_multitask_static.py --do_predict --task sentiment --pred_file F --output_dir OUT
        -> OUT/sentiment/infer_model through Paddle Inference -> OUT/sentiment/predictions.json
    run_multitask_static.py --do_eval --task sentiment --eval_file test.tsv --output_dir OUT
        -> the exported model through Paddle Inference
    run_multitask_static.py --do_eval --task sentiment --eval_file test.tsv --checkpoint OUT/best_sentiment
        -> a checkpoint's weights (its EMA averages when the run kept them), through the plain forward
           program rebuilt from the checkpoint's own record (architecture, tasks, name map)

Prediction loads the exported model with `paddle.inference` (the deployment runtime, not the
training executor), featurizes the file with the task's own reader and writes the task's records
(class + probabilities, tag sequences, or an MRC answer JSON keyed by question id). Every task type
can be evaluated from a checkpoint; with an exported model every exportable one (`mlm` and
`pretrain` have no inference model). All three run the batches through the one prediction loop
(ernie_mtl/engine/prediction.py).
"""
from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np

from ernie_mtl.checkpoint.io import write_json_atomic
from ernie_mtl.checkpoint.layout import MANIFEST, MODEL_PREFIX, STATE_DIR, best_dir, export_dir, last_dir
from ernie_mtl.config import ConfigError, TaskSpec
from ernie_mtl.engine.prediction import by_name, executor_runner, predict_batches
from ernie_mtl.tasks.base import TaskContext, TaskType, get_task_type
from ernie_mtl.checkpoint.store import CheckpointError, merged_state, unreadable_state_file, verified_state
from ernie_mtl.program.builder import build_forward_program
from ernie_mtl.program.forward import make_feed


# -- exported models --------------------------------------------------------------------------------
_MANIFEST_KEYS = {"task": str, "reader": str, "spec": dict, "feeds": list, "fetches": list}


def read_manifest(model_dir: os.PathLike) -> Dict[str, Any]:
    """The manifest of an exported model; ConfigError naming the file and its defect (missing,
    unreadable, not JSON, keys absent or of the wrong type) and the way out."""
    path = Path(model_dir) / MANIFEST
    out, task = Path(model_dir).parent.parent, Path(model_dir).parent.name
    redo = (f"evaluate or convert the task's checkpoint instead ({best_dir(out, task)} or {last_dir(out)}), or "
            "train again to export it anew")
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise ConfigError([f"{model_dir}: no {MANIFEST}; give a folder written by the trainer's export "
                           "(<output_dir>/<task>/infer_model)"]) from None
    except OSError as e:
        raise ConfigError([f"{path}: cannot read it ({e.strerror})"]) from None
    except UnicodeDecodeError as e:
        raise ConfigError([f"{path} is damaged (not UTF-8 text, byte {e.start}); {redo}"]) from None
    except ValueError as e:  # json.JSONDecodeError
        raise ConfigError([f"{path} is damaged (not valid JSON: {e}); {redo}"]) from None
    if not isinstance(manifest, dict):
        raise ConfigError([f"{path} is damaged (a JSON {type(manifest).__name__}, not an object); {redo}"])
    bad = [f"{k!r} missing" if k not in manifest else f"{k!r} is {type(manifest[k]).__name__}, expected "
           f"{kind.__name__}" for k, kind in _MANIFEST_KEYS.items() if not isinstance(manifest.get(k), kind)]
    if bad:
        raise ConfigError([f"{path} is damaged ({'; '.join(bad)}); {redo}"])
    return manifest


def load_task_from_manifest(manifest: Mapping[str, Any], model_dir: os.PathLike, *, pred_file: Optional[str] = None,
                            dev_file: Optional[str] = None, seed: int = 0,
                            overrides: Optional[Mapping[str, Any]] = None) -> TaskType:
    """The task type instance of an exported model, reading `pred_file` (prediction) or `dev_file`
    (evaluation on a labelled file); `overrides`: task keys read differently (`max_seq_len`)."""
    _import_plugins(manifest.get("plugins", ()), where="the exported model's manifest (plugins)",
                    fix="the exported model needs its plugin's task type")
    spec_data = dict(manifest["spec"])
    spec_data.update(train_file=None, dev_file=os.path.abspath(dev_file) if dev_file else None, test_file=None,
                     pred_file=os.path.abspath(pred_file) if pred_file else None, **_checked(overrides))
    spec = TaskSpec(**spec_data)
    ctx = TaskContext(vocab_file=str(Path(model_dir) / manifest.get("vocab", "vocab.txt")), seed=seed,
                      model_type=manifest.get("model_type", "ernie"))
    return get_task_type(manifest["reader"])(spec, ctx)


def _import_plugins(paths: Sequence[str], *, where: str, fix: str = "") -> None:
    """The plugin files the training run imported (a custom task type must be registered)."""
    from ernie_mtl.engine.plugins import import_plugins

    problems = import_plugins(paths, where=where)
    if problems:
        raise ConfigError([p + (f"; {fix}" if fix else "") for p in problems])


def predictor_runner(model_dir: Path, manifest: Mapping[str, Any], *, use_gpu: bool = False):
    """(runner, names): an exported model as a runner of the prediction loop, through Paddle Inference."""
    import paddle.inference as pi

    files = [model_dir / f"{MODEL_PREFIX}.pdmodel", model_dir / f"{MODEL_PREFIX}.pdiparams"]
    for f in files:
        if not f.is_file():
            raise ConfigError([f"{f}: missing; the exported model {model_dir} is incomplete: export it again"])
    config = pi.Config(*(str(f) for f in files))
    if use_gpu:
        config.enable_use_gpu(256, 0)
    else:
        config.disable_gpu()
    config.disable_glog_info()
    try:
        predictor = pi.create_predictor(config)
    except Exception as e:  # noqa: BLE001  (Paddle raises generic errors for damaged files)
        raise ConfigError([f"{model_dir}: cannot load the exported model ({type(e).__name__}: "
                           f"{str(e).strip().splitlines()[-1][:200]}); {files[1].name} or {files[0].name} is "
                           "damaged or truncated: export the model again"]) from None
    names = [f["name"] for f in manifest["fetches"]]
    inputs = {f["name"]: predictor.get_input_handle(f["var"]) for f in manifest["feeds"]}
    outputs = [predictor.get_output_handle(v) for v in predictor.get_output_names()]

    def run(batch):
        if manifest.get("use_task_id"):
            batch["task_type_ids"] = np.full_like(batch["input_ids"], manifest["task_index"])
        for n, handle in inputs.items():
            handle.copy_from_cpu(np.ascontiguousarray(batch[n]))
        predictor.run()
        return [handle.copy_to_cpu() for handle in outputs]

    return run, names


def infer(model_dir: Path, manifest: Mapping[str, Any], task: TaskType, data, *, batch_size: Optional[int] = None,
          use_gpu: bool = False, desc: str = "predict") -> Dict[str, List[np.ndarray]]:
    """The prediction outputs (per batch, in order) of an exported model over `data`."""
    run, names = predictor_runner(Path(model_dir), manifest, use_gpu=use_gpu)
    return by_name(predict_batches(task, data, run, names, batch_size=batch_size, desc=f"{desc} {task.spec.name}"),
                   names)


@dataclass
class Predicted:
    """A task's prediction over a file: the task type instance, the featurized file (`pred` split) and
    the prediction variables per batch (what `TaskType.predictions` / `evaluate` take)."""

    task: TaskType
    data: Any  # TaskData
    outputs: Dict[str, List[np.ndarray]]
    step: Optional[int] = None  # the weights' optimizer step, when known

    @property
    def records(self) -> Any:
        """The task's prediction records (what --do_predict writes)."""
        return self.task.predictions(self.data, self.outputs)


def predict_exported(model_dir: os.PathLike, pred_file: str, *, batch_size: Optional[int] = None,
                     overrides: Optional[Mapping[str, Any]] = None, use_gpu: bool = False,
                     flag: str = "--pred_file") -> Predicted:
    """An exported task model (Paddle Inference) over `pred_file`; `overrides`: task keys read
    differently from training (e.g. `max_seq_len`)."""
    model_dir = Path(model_dir)
    manifest = read_manifest(model_dir)
    if not os.path.isfile(pred_file):
        raise ConfigError([f"{flag} {pred_file}: not found"])
    task = load_task_from_manifest(manifest, model_dir, pred_file=pred_file, overrides=overrides)
    data = _predictable(task, pred_file, flag)
    outputs = infer(model_dir, manifest, task, data, batch_size=batch_size, use_gpu=use_gpu)
    return Predicted(task, data, outputs, step=manifest.get("step"))


def predict_checkpoint(checkpoint: os.PathLike, task_name: str, pred_file: str, *, batch_size: Optional[int] = None,
                       overrides: Optional[Mapping[str, Any]] = None, flag: str = "--pred_file") -> Predicted:
    """The weights of `checkpoint` (verified; EMA averages when the run kept them) over `pred_file`,
    through the checkpoint's forward program rebuilt (`CheckpointModel`): every task type, the
    exportable ones or not. `overrides`: task keys read differently from training (`max_seq_len`)."""
    if not os.path.isfile(pred_file):
        raise ConfigError([f"{flag} {pred_file}: not found"])
    with _static():
        model = CheckpointModel(Path(checkpoint), task_name, what="predict", pred_file=pred_file,
                                overrides=overrides)
        data = _predictable(model.task, pred_file, flag)
        outputs = model.predict(data, batch_size=batch_size)
    return Predicted(model.task, data, outputs, step=model.raw.get("step"))


def _predictable(task: TaskType, pred_file: str, flag: str):
    data = task.load("pred")
    if len(data) == 0:
        raise ConfigError([f"{flag} {pred_file}: no examples to predict (only a header?)"])
    return data


def predict(model_dir: os.PathLike, pred_file: str, output: os.PathLike, *, batch_size: Optional[int] = None,
            use_gpu: bool = False, log=print) -> Path:
    """Run an exported task model on `pred_file` with Paddle Inference; write the task's predictions
    (JSON) to `output` atomically. Returns the output path."""
    result = predict_exported(model_dir, pred_file, batch_size=batch_size, use_gpu=use_gpu)
    output = write_json_atomic(output, result.records, indent=1, sort_keys=False)
    log(f"wrote {len(result.data)} predictions of task {result.task.spec.name} to {output}")
    return output


# -- evaluation on a labelled file --------------------------------------------------------------------
def evaluate_exported(model_dir: Path, eval_file: str, *, use_gpu: bool = False) -> Dict[str, Any]:
    manifest = read_manifest(model_dir)
    task = load_task_from_manifest(manifest, model_dir, dev_file=eval_file)
    data = _labelled(task, eval_file)
    outputs = infer(model_dir, manifest, task, data, use_gpu=use_gpu, desc="evaluate")
    return _report(task, data, task.evaluate(data, outputs), source=str(model_dir), step=manifest.get("step"))


class CheckpointModel:
    """A checkpoint's network rebuilt from its own record (architecture, tasks, name map) as the plain
    forward program, its weights (the EMA averages when the run kept them, AMP O2's fp32 masters) in
    a float32 scope of their own: for evaluation and export outside the training run. The checkpoint
    is verified first, as resume and the converter verify it. `what` names the use in messages
    ("evaluate", "export"); `data_file`: the labelled file the task will read (its dev split)."""

    def __init__(self, checkpoint: Path, task_name: str, *, what: str, flag: str = "--checkpoint",
                 data_file: Optional[str] = None, pred_file: Optional[str] = None,
                 overrides: Optional[Mapping[str, Any]] = None):
        import paddle

        from ernie_mtl.engine.exporter import float32_scope

        self.checkpoint = checkpoint
        try:  # the checks resume and the converter make: a damaged file is never used
            raw = verified_state(checkpoint, use=what)
        except CheckpointError as e:
            raise ConfigError([f"{flag} {checkpoint}: {e}, or the exported model"]) from None
        self.raw = raw
        config = raw.get("config", {})
        self.mtl = mtl = config.get("mtl", {})
        _import_plugins(mtl.get("plugins", []), where=f"{checkpoint}: the run's plugins")
        records = raw.get("extra", {}).get("tasks", [])
        self.names = names = [r["name"] for r in records]
        if task_name not in names:
            raise ConfigError([f"--task {task_name}: checkpoint {checkpoint} holds the tasks {names}; pick one of them"])
        vocab = config.get("data", {}).get("tokenizer_name_or_path")
        vocab = str(Path(vocab) / "vocab.txt") if vocab and Path(vocab).is_dir() else vocab
        if not vocab or not Path(vocab).is_file():
            raise ConfigError([f"{checkpoint}: its run's vocabulary {vocab} no longer exists; restore it"])
        self.vocab = vocab
        self.model_type = config.get("model", {}).get("model_type", "ernie")
        ctx = TaskContext(vocab_file=vocab, seed=config.get("train", {}).get("seed", 0), model_type=self.model_type,
                          log=lambda m: None)
        self.tasks = []
        for r in records:
            spec = dict(r["spec"])
            if r["name"] == task_name and data_file is not None:
                spec.update(dev_file=str(Path(data_file).resolve()) if Path(data_file).exists() else data_file)
            if r["name"] == task_name and pred_file is not None:
                spec.update(pred_file=str(Path(pred_file).resolve()))
            if r["name"] == task_name:
                spec.update(_checked(overrides))
            self.tasks.append(get_task_type(r["reader"])(TaskSpec(**spec), ctx))
        self.index = names.index(task_name)
        self.task = self.tasks[self.index]
        self.arch = {k: v for k, v in raw["extra"]["arch"].items() if k != "model_type"}
        self.use_task_id = bool(mtl.get("use_task_id"))
        self.program, self.fwd = build_forward_program(self.model_type, self.arch, self.tasks,
                                                       use_task_id=self.use_task_id)
        if self.fwd.name_map != raw["name_map"]:
            raise ConfigError([f"{checkpoint}: its name map does not match the network rebuilt from its own record "
                               "(written by another version?); use its exported model instead"])
        self.exe = paddle.static.Executor(paddle.CPUPlace())
        try:
            state = merged_state(checkpoint, verify=False)  # verified above
        except Exception:  # noqa: BLE001  (a file that passed the checks but paddle cannot read)
            bad = next(filter(None, (unreadable_state_file(p.with_suffix("")) for p in
                                     sorted((checkpoint / STATE_DIR).glob("rank_*.pdparams")))), None)
            if bad is None:
                raise
            raise ConfigError([f"{flag} {checkpoint}: {bad[0]} is damaged ({bad[1]}), although its size and "
                               f"SHA-1 are the ones recorded at save time: it was written damaged; {what} another "
                               "checkpoint or the exported model"]) from None
        self.scope = float32_scope(state, self.fwd.name_map, use_ema=bool(mtl.get("use_ema")), place=self.exe.place)

    def predict(self, data, batch_size: Optional[int] = None) -> Dict[str, List[np.ndarray]]:
        """The task's prediction variables over `data`, per batch (of `batch_size`, default the task's)."""
        import paddle

        preds = self.fwd.predictions[self.task.spec.name]
        block = self.program.global_block()

        def feed_of(batch):
            feed = make_feed(self.tasks, self.index, batch, use_task_id=self.use_task_id)
            return {k: v for k, v in feed.items() if block.has_var(k)}

        run = executor_runner(self.exe, self.program, [v.name for v in preds.values()], feed_of)
        with paddle.static.scope_guard(self.scope):
            return by_name(predict_batches(self.task, data, run, list(preds), batch_size=batch_size), list(preds))


_OVERRIDABLE = ("max_seq_len",)  # task keys a saved model may read a file with differently


def _checked(overrides: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    bad = sorted(set(overrides or {}) - set(_OVERRIDABLE))
    if bad:
        raise ValueError(f"task keys {bad} cannot change after training; only {list(_OVERRIDABLE)} can")
    return dict(overrides or {})


def evaluate_checkpoint(checkpoint: Path, task_name: str, eval_file: str) -> Dict[str, Any]:
    with _static():
        model = CheckpointModel(checkpoint, task_name, what="evaluate", data_file=eval_file)
        data = _labelled(model.task, eval_file)
        outputs = model.predict(data)
    return _report(model.task, data, model.task.evaluate(data, outputs), source=str(checkpoint),
                   step=model.raw.get("step"))


@contextlib.contextmanager
def _static():
    """Static mode for the block; the caller's mode afterwards."""
    import paddle

    was_dynamic = paddle.in_dynamic_mode()
    paddle.enable_static()
    try:
        yield
    finally:
        if was_dynamic:
            paddle.disable_static()


def _labelled(task, eval_file: str):
    data = task.load("dev")
    if len(data) == 0:
        raise ConfigError([f"--eval_file {eval_file}: no examples to evaluate (only a header?)"])
    if not getattr(data, "has_labels", True):
        raise ConfigError([f"--eval_file {eval_file}: no labels; evaluation needs a labelled file in the task's "
                           f"{task.name} format (use --do_predict for unlabelled rows)"])
    return data


def _report(task, data, metrics: Dict[str, float], *, source: str, step: Optional[int]) -> Dict[str, Any]:
    return {"task": task.spec.name, "reader": task.name, "source": source, "step": step, "examples": len(data),
            "eval_file": task.spec.dev_file, "metrics": {k: float(v) for k, v in metrics.items()}}


def evaluate_saved(train_cfg, *, use_gpu: bool) -> Dict[str, Any]:
    """`--do_eval`: evaluate the checkpoint (`--checkpoint`) or the exported model of `--task` on
    `--eval_file`, write the report JSON (`--eval_output`); returns the report."""
    t = train_cfg
    if t.checkpoint:
        report = evaluate_checkpoint(Path(t.checkpoint), t.task, t.eval_file)
    else:
        report = evaluate_exported(export_dir(t.output_dir, t.task), t.eval_file, use_gpu=use_gpu)
    output = Path(t.eval_output or Path(t.output_dir) / t.task / "eval_results.json")
    write_json_atomic(output, report, indent=1, sort_keys=False)
    return report
