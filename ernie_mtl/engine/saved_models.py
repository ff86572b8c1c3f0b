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
(ernie_mtl/engine/prediction_loop.py).

**CPU threads and kernels.** Paddle Inference's predictor runs its math library on one thread unless
`set_cpu_math_library_num_threads` is called; it gets the process's thread budget, the rule training
uses (`dist.threads.process_threads`). Its kernels follow `--cpu_kernels`: `plain` turns oneDNN off
(`disable_mkldnn`: Paddle's native kernels, MKL for matmul), `exact` or a list of op types restricts
oneDNN to the forward ones (`set_mkldnn_op`), and `auto` (the default) times both predictors on the
first examples of the file at start-up (`choose_predictor_kernels`) and keeps oneDNN (`enable_mkldnn`:
Paddle 2.6.2's default, with its fusion passes) only where it is faster and its outputs agree with the
plain predictor's within `PREDICTOR_RTOL`; the measurement is cached per machine and model like the
training kernels' (ernie_mtl/program/kernel_choice.py). A checkpoint evaluated with `--do_eval
--checkpoint` runs its forward program with the forward op types its run recorded, so it reproduces the
run's own evaluation; one line on the console says what was used.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from ernie_mtl.checkpoint.io import write_json_atomic
from ernie_mtl.checkpoint.layout import (MANIFEST, MODEL_PREFIX, STATE_DIR, best_dir, export_dir, last_dir,
                                         multitask_export_dir)
from ernie_mtl.config import ConfigError, TaskSpec
from ernie_mtl.dist.threads import process_threads
from ernie_mtl.engine.exporter import float32_scope
from ernie_mtl.engine.prediction_loop import by_name, executor_runner, predict_batches
from ernie_mtl.tasks.base import TaskContext, TaskType, get_task_type
from ernie_mtl.checkpoint.store import CheckpointError, merged_state, unreadable_state_file, verified_state
from ernie_mtl.program.builder import build_forward_program
from ernie_mtl.program.forward import make_feed, model_names
from ernie_mtl.program.edits import static_mode


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


def predictor_runner(model_dir: Path, manifest: Mapping[str, Any], *, use_gpu: bool = False,
                     threads: Optional[int] = None, onednn: Union[bool, Sequence[str]] = True):
    """(runner, names): an exported model as a runner of the prediction loop, through Paddle Inference.
    CPU: `threads` for its math library (default: `dist.threads.process_threads`), oneDNN on (True), off
    (False) or on the listed op types only."""
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
        config.set_cpu_math_library_num_threads(int(threads or process_threads()[0]))
        if onednn is False:
            config.disable_mkldnn()
        else:
            config.enable_mkldnn()
            if onednn is not True:
                config.set_mkldnn_op(set(onednn))
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


# --oneDNN's predictor is kept only when its outputs agree with the plain one's: |a - b| <= PREDICTOR_RTOL x
# max(1, max |plain|) for every float output, integer outputs (tag paths) equal. Measured on a tiny ERNIE
# classifier: 5e-7 on the logits
PREDICTOR_RTOL = 1e-4
PREDICTOR_SAMPLE = 8  # examples of the file the two predictors are timed on


def output_difference(plain: Sequence[np.ndarray], other: Sequence[np.ndarray]) -> float:
    """The largest difference of `other`'s outputs from `plain`'s, relative to max(1, max |plain|) per
    output; inf when an integer output or a shape differs."""
    worst = 0.0
    for a, b in zip(plain, other):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            return float("inf")
        if not np.issubdtype(a.dtype, np.floating):
            if not np.array_equal(a, b):
                return float("inf")
            continue
        if a.size:
            worst = max(worst, float(np.max(np.abs(a.astype("float64") - b))) / max(1.0, float(np.max(np.abs(a)))))
    return worst


def time_predictors(make_runner, sample, *, budget_s: float = 1.0, max_rounds: int = 5):
    """The default `measure` of `choose_predictor_kernels`: ((plain s, oneDNN s) per run of `sample`, the
    oneDNN outputs' difference from the plain ones, {kernel: runner}). One predictor is alive at a time
    (two ERNIE-base predictors at once double the peak memory): the plain one is built, warmed up (its
    outputs are the reference), timed for half of `budget_s` and dropped, then the oneDNN one; the minimum
    of each is kept. The oneDNN runner is returned for reuse; a plain choice builds its predictor again."""
    import gc

    times: Dict[bool, List[float]] = {False: [], True: []}
    first: Dict[bool, List[np.ndarray]] = {}
    for onednn in (False, True):
        run = None  # drop the previous predictor: its memory goes before the next is built
        gc.collect()
        run = make_runner(onednn)
        first[onednn] = [np.asarray(o) for o in run(dict(sample))]  # warm-up
        start = time.perf_counter()
        for _ in range(max_rounds):
            started = time.perf_counter()
            run(dict(sample))
            times[onednn].append(time.perf_counter() - started)
            if time.perf_counter() - start >= budget_s / 2:
                break
    return (min(times[False]), min(times[True])), output_difference(first[False], first[True]), {True: run}


def choose_predictor_kernels(model_dir: Path, manifest: Mapping[str, Any], sample: Mapping[str, np.ndarray], *,
                             threads: int, make_runner, cache_path: Optional[os.PathLike] = None, measure=None,
                             margin: float = 0.05):
    """(oneDNN on?, a line for the log, the runner of the kernel chosen if it was built here, else None):
    `--cpu_kernels auto` for a predictor. The plain (`disable_mkldnn`) and oneDNN (`enable_mkldnn`)
    predictors run `sample` (the file's first examples); oneDNN is kept when it is faster by `margin` and
    its outputs are within PREDICTOR_RTOL of the plain ones. Cached per machine (its threads included),
    model (the .pdmodel's SHA-1) and sample shapes, as the training kernels are."""
    import hashlib

    from ernie_mtl.program.kernel_choice import KernelCache, machine_identity

    digest = hashlib.sha1((model_dir / f"{MODEL_PREFIX}.pdmodel").read_bytes()).hexdigest()
    shapes = {k: list(np.shape(v)) for k, v in sorted(sample.items())}
    key = hashlib.sha1(json.dumps(["predictor", digest, shapes]).encode()).hexdigest()[:16]
    cache = KernelCache(cache_path, machine=machine_identity(threads))
    entry = cache.entry(key)
    runners = {}
    if entry is None:
        (plain_s, onednn_s), diff, runners = (measure or time_predictors)(make_runner, sample)
        cache.put(key, f"predictor {model_dir.name} {json.dumps(shapes)}", plain_s, onednn_s, max_difference=diff)
        cache.save()
        entry = cache.entry(key) or {"plain_s": plain_s, "onednn_s": onednn_s, "max_difference": diff}
        how = "measured"
    else:
        how = "from the kernel cache"
    plain_s, onednn_s = float(entry["plain_s"]), float(entry["onednn_s"])
    diff = float(entry.get("max_difference", float("inf")))
    rows = max((len(v) for v in sample.values() if np.ndim(v)), default=1)
    rates = f"{rows / onednn_s:,.1f} vs {rows / plain_s:,.1f} samples/s plain"
    within = diff <= PREDICTOR_RTOL
    use = within and onednn_s < (1.0 - margin) * plain_s
    why = (f"oneDNN {rates}, outputs within {diff:.1g}" if use else
           f"oneDNN outputs differ by {diff:.2g} (> {PREDICTOR_RTOL:g}), kept plain ({rates})" if not within else
           f"plain: oneDNN not faster ({rates})")
    notes = "".join(f"; {n}" for n in cache.notes)
    return use, f"--cpu_kernels auto ({how} on {rows} examples): {why}{notes}", runners.get(use)


def cpu_predictor(model_dir: Path, manifest: Mapping[str, Any], task: TaskType, data, *, cpu_kernels="auto",
                  threads: Optional[int] = None, cache_path: Optional[os.PathLike] = None, measure=None, log=None):
    """(runner, names) of an exported model on CPU with this process's thread budget and the kernels
    `cpu_kernels` gives (module docstring); logs one line saying which."""
    from ernie_mtl.config import parse_cpu_kernels
    from ernie_mtl.program.kernel_choice import KernelChoice

    threads, why_threads = (threads, "given") if threads else process_threads()
    mode, types = parse_cpu_kernels(cpu_kernels)
    names = [f["name"] for f in manifest["fetches"]]

    def make_runner(onednn):
        return predictor_runner(model_dir, manifest, threads=threads, onednn=onednn)[0]

    run = None
    onednn: Union[bool, Tuple[str, ...]]
    if mode == "plain":
        onednn, what = False, "plain kernels (--cpu_kernels plain)"
    elif mode == "auto":
        sample = task.collate([data.get(i) for i in range(min(len(data), PREDICTOR_SAMPLE))])
        onednn, what, run = choose_predictor_kernels(model_dir, manifest, sample, threads=threads,
                                                     make_runner=make_runner, cache_path=cache_path, measure=measure)
    else:
        forward = KernelChoice.fixed(mode, types).forward_types()
        what = f"oneDNN on {', '.join(forward) or 'no op types'} (--cpu_kernels {cpu_kernels})"
        onednn = forward or False
    if log:
        log(f"prediction: Paddle Inference on {threads} thread{'s' if threads > 1 else ''} ({why_threads}); {what}")
    return (run or make_runner(onednn)), names


def infer(model_dir: Path, manifest: Mapping[str, Any], task: TaskType, data, *, batch_size: Optional[int] = None,
          use_gpu: bool = False, desc: str = "predict", cpu_kernels="auto", threads: Optional[int] = None,
          log=None) -> Dict[str, List[np.ndarray]]:
    """The prediction outputs (per batch, in order) of an exported model over `data`."""
    if use_gpu:
        run, names = predictor_runner(Path(model_dir), manifest, use_gpu=True)
    else:
        run, names = cpu_predictor(Path(model_dir), manifest, task, data, cpu_kernels=cpu_kernels, threads=threads,
                                   log=log)
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
                     flag: str = "--pred_file", cpu_kernels="auto", threads: Optional[int] = None,
                     log=None) -> Predicted:
    """An exported task model (Paddle Inference) over `pred_file`; `overrides`: task keys read
    differently from training (e.g. `max_seq_len`). CPU: `threads` (default: the process's thread
    budget) and `cpu_kernels` as the module docstring says; `log` gets the line saying what was used."""
    model_dir = Path(model_dir)
    manifest = read_manifest(model_dir)
    if not os.path.isfile(pred_file):
        raise ConfigError([f"{flag} {pred_file}: not found"])
    task = load_task_from_manifest(manifest, model_dir, pred_file=pred_file, overrides=overrides)
    data = _predictable(task, pred_file, flag)
    outputs = infer(model_dir, manifest, task, data, batch_size=batch_size, use_gpu=use_gpu, cpu_kernels=cpu_kernels,
                    threads=threads, log=log)
    return Predicted(task, data, outputs, step=manifest.get("step"))


def predict_checkpoint(checkpoint: os.PathLike, task_name: str, pred_file: str, *, batch_size: Optional[int] = None,
                       overrides: Optional[Mapping[str, Any]] = None, flag: str = "--pred_file",
                       cpu_kernels="auto", log=None) -> Predicted:
    """The weights of `checkpoint` (verified; EMA averages when the run kept them) over `pred_file`,
    through the checkpoint's forward program rebuilt (`CheckpointModel`): every task type, the
    exportable ones or not, with the forward kernels its run recorded (`cpu_kernels` "auto"; an explicit
    mode is obeyed). `overrides`: task keys read differently from training (`max_seq_len`)."""
    if not os.path.isfile(pred_file):
        raise ConfigError([f"{flag} {pred_file}: not found"])
    with static_mode():
        model = CheckpointModel(Path(checkpoint), task_name, what="predict", pred_file=pred_file,
                                overrides=overrides)
        model.use_kernels(cpu_kernels, log=log, what="prediction")
        data = _predictable(model.task, pred_file, flag)
        outputs = model.predict(data, batch_size=batch_size)
    return Predicted(model.task, data, outputs, step=model.raw.get("step"))


def _predictable(task: TaskType, pred_file: str, flag: str):
    data = task.load("pred")
    if len(data) == 0:
        raise ConfigError([f"{flag} {pred_file}: no examples to predict (only a header?)"])
    return data


def predict(model_dir: os.PathLike, pred_file: str, output: Union[str, os.PathLike], *,
            batch_size: Optional[int] = None, use_gpu: bool = False, log=print, cpu_kernels="auto",
            threads: Optional[int] = None) -> Path:
    """Run an exported task model on `pred_file` with Paddle Inference; write the task's predictions
    (JSON) to `output` atomically. Returns the output path. CPU: `threads` (default: the process's thread
    budget) and `cpu_kernels` as the module docstring says."""
    result = predict_exported(model_dir, pred_file, batch_size=batch_size, use_gpu=use_gpu, cpu_kernels=cpu_kernels,
                              threads=threads, log=log)
    output = write_json_atomic(output, result.records, indent=1, sort_keys=False)
    log(f"wrote {len(result.data)} predictions of task {result.task.spec.name} to {output}")
    return output


# -- evaluation on a labelled file --------------------------------------------------------------------
def evaluate_exported(model_dir: Path, eval_file: str, *, use_gpu: bool = False, cpu_kernels="auto",
                      log=None) -> Dict[str, Any]:
    manifest = read_manifest(model_dir)
    task = load_task_from_manifest(manifest, model_dir, dev_file=eval_file)
    data = _labelled(task, eval_file)
    outputs = infer(model_dir, manifest, task, data, use_gpu=use_gpu, desc="evaluate", cpu_kernels=cpu_kernels, log=log)
    return _report(task, data, task.evaluate(data, outputs), source=str(model_dir), step=manifest.get("step"))


def checkpoint_forward_types(raw: Mapping[str, Any], cpu_kernels="auto") -> Tuple[Tuple[str, ...], str]:
    """(op types on oneDNN, why) for evaluating a checkpoint's forward program on CPU: with `auto`, the
    forward types its run recorded (so the run's own evaluation is reproduced; a checkpoint from before
    the record: what its boolean meant), plain for a GPU run's; an explicit mode is obeyed."""
    from ernie_mtl.config import parse_cpu_kernels
    from ernie_mtl.program.kernel_choice import KernelChoice

    mode, types = parse_cpu_kernels(cpu_kernels)
    if mode != "auto":
        choice = KernelChoice.fixed(mode, types)
        return choice.forward_types(), f"--cpu_kernels {cpu_kernels}"
    record = raw.get("extra", {}).get("cpu_kernels")
    if isinstance(record, dict):
        return KernelChoice.from_json(record).forward_types(), "the kernels its run recorded"
    legacy = raw.get("config", {}).get("train", {}).get("cpu_kernels")
    if legacy is True and "cpu_kernels" not in raw.get("extra", {}):
        return KernelChoice.fixed("exact").forward_types(), "its run's kernels (--cpu_kernels true then: exact)"
    return (), "plain: its run recorded no CPU kernels"


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
            raise ConfigError([f"--task {task_name}: checkpoint {checkpoint} holds the tasks {names}; "
                               "pick one of them"])
        vocab = config.get("data", {}).get("tokenizer_name_or_path")
        vocab = str(Path(vocab) / "vocab.txt") if vocab and Path(vocab).is_dir() else vocab
        if not vocab or not Path(vocab).is_file():
            raise ConfigError([f"{checkpoint}: its run's vocabulary {vocab} no longer exists; restore it"])
        self.vocab = vocab
        self.model_type = config.get("model", {}).get("model_type", "ernie")
        ctx = TaskContext(vocab_file=vocab, seed=config.get("train", {}).get("seed", 0), model_type=self.model_type,
                          log=lambda message: None)
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
        if model_names(self.fwd.name_map) != model_names(raw["name_map"]):
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

    def use_kernels(self, cpu_kernels="auto", *, log=None, what: str = "evaluation") -> Dict[str, int]:
        """Put the forward op types `checkpoint_forward_types` gives on oneDNN (the kernels the checkpoint's
        run recorded, with "auto"); `log` gets one line saying which, and the threads. {op type: ops}."""
        from ernie_mtl.program.cpu_kernels import use_onednn_ops

        types, why = checkpoint_forward_types(self.raw, cpu_kernels)
        changed = use_onednn_ops(self.program, types) if types else {}
        if log:
            log(f"{what}: the checkpoint's forward program with oneDNN on {sum(changed.values())} ops "
                f"({', '.join(sorted(changed)) or 'none'}: {why}), {process_threads()[0]} threads")
        return changed

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


def evaluate_checkpoint(checkpoint: Path, task_name: str, eval_file: str, *, cpu_kernels="auto",
                        log=None) -> Dict[str, Any]:
    """The report of the checkpoint's forward program on `eval_file`, run with the forward kernels its run
    recorded (`cpu_kernels` "auto"; an explicit mode is obeyed: `checkpoint_forward_types`), on this
    process's threads."""
    with static_mode():
        model = CheckpointModel(checkpoint, task_name, what="evaluate", data_file=eval_file)
        model.use_kernels(cpu_kernels, log=log, what="evaluation")
        data = _labelled(model.task, eval_file)
        outputs = model.predict(data)
    return _report(model.task, data, model.task.evaluate(data, outputs), source=str(checkpoint),
                   step=model.raw.get("step"))


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


def stage_export_dir(output_dir, task: str, stage: str = "final") -> Path:
    """The exported model --do_predict / --do_eval read: output_dir/<task>/infer_model (`final`: the refined
    model of a run with refine stages), or the multi-task stage's (`multitask`; ConfigError when absent)."""
    if stage == "multitask":
        folder = multitask_export_dir(output_dir, task)
        if not folder.is_dir():
            raise ConfigError([f"--stage multitask: {folder} does not exist: only a run with refine stages keeps the "
                               f"multi-task stage's export of a target (there, {export_dir(output_dir, task)} is the "
                               "refined model); drop --stage to use that"])
        return folder
    if stage != "final":
        raise ConfigError([f"--stage {stage!r} is none of final, multitask"])
    return export_dir(output_dir, task)


def evaluate_saved(train_cfg, *, use_gpu: bool, log=None) -> Dict[str, Any]:
    """`--do_eval`: evaluate the checkpoint (`--checkpoint`) or the exported model of `--task` on
    `--eval_file`, write the report JSON (`--eval_output`); returns the report."""
    if train_cfg.checkpoint:
        report = evaluate_checkpoint(Path(train_cfg.checkpoint), train_cfg.task, train_cfg.eval_file,
                                     cpu_kernels=train_cfg.cpu_kernels, log=log)
    else:
        report = evaluate_exported(stage_export_dir(train_cfg.output_dir, train_cfg.task, train_cfg.stage),
                                   train_cfg.eval_file, use_gpu=use_gpu, cpu_kernels=train_cfg.cpu_kernels, log=log)
    output = Path(train_cfg.eval_output or Path(train_cfg.output_dir) / train_cfg.task / "eval_results.json")
    write_json_atomic(output, report, indent=1, sort_keys=False)
    return report


def export_from_checkpoint(checkpoint: Path, task_name: str, output: Optional[Path] = None) -> Path:
    """`task_name`'s inference model from the weights of `checkpoint` (verified; EMA averages when the
    run kept them), written to `output` (default: `<the checkpoint's output dir>/<task>/infer_model`)."""
    import paddle

    from ernie_mtl.engine.exporter import export_task_model

    with static_mode():
        model = CheckpointModel(Path(checkpoint), task_name, what="export")
        out = output or export_dir(Path(checkpoint).parent, task_name)
        if not model.task.exportable:
            raise ConfigError([f"--task {task_name}: a {model.task.name} task has no inference model (its predictions "
                               "need more than the backbone inputs); use the checkpoint itself"])
        with paddle.static.scope_guard(model.scope):
            export_task_model(out, program=model.program, fwd=model.fwd, task=model.task, exe=model.exe,
                              vocab_file=model.vocab, arch=model.raw["extra"]["arch"], model_type=model.model_type,
                              use_task_id=model.use_task_id,
                              extra={"step": model.raw.get("step"), "export_from": str(checkpoint),
                                     "ema": bool(model.mtl.get("use_ema")), "exported_by": "ernie_mtl",
                                     "plugins": list(model.mtl.get("plugins", []))})
    return out
