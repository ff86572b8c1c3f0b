"""Per-task inference models (export) and `--do_predict` through Paddle Inference.

Layout of an exported task (`<output_dir>/<task>/infer_model/`)::

    model.pdmodel, model.pdiparams   pruned inference program: backbone + this task's head
    manifest.json                    feeds, fetches, task spec, label map, arch, name map, metrics
    vocab.txt                        the tokenizer's vocabulary

Prediction loads the model with `paddle.inference` (the deployment runtime, not the training
executor), featurizes `--pred_file` with the task's own reader and writes the task's records
(class + probabilities, tag sequences, or an MRC answer JSON keyed by question id).
"""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np

from ernie_mtl.config import ConfigError
from ernie_mtl.tasks.base import TaskContext, TaskSpec, TaskType, get_task_type
from ernie_mtl.layout import MANIFEST, MODEL_PREFIX, export_dir  # noqa: F401  (re-exported)



def export_task_model(out_dir: Path, *, program, fwd, task: TaskType, exe, vocab_file: str, arch: Mapping[str, Any],
                      model_type: str, use_task_id: bool, extra: Optional[Mapping[str, Any]] = None) -> Path:
    """Save `task`'s pruned inference model from `program` (the plain forward; parameters read from
    the current global scope) and its manifest, atomically (temp folder, then rename)."""
    import paddle

    name = task.spec.name
    group = next(g.name for g in fwd.groups if name in g.tasks)
    block = program.global_block()
    feed_names = list(fwd.backbone_feed_names)
    fetch_names = list(fwd.predictions[name])
    feed_vars = [block.var(fwd.feed_vars[n].name) for n in feed_names]
    fetch_vars = [block.var(fwd.predictions[name][n].name) for n in fetch_names]
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    paddle.static.save_inference_model(str(tmp / MODEL_PREFIX), feed_vars, fetch_vars, exe, program=program)
    used = _persistables(tmp / f"{MODEL_PREFIX}.pdmodel")
    manifest = {
        "format": 1, "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S"), "task": name, "reader": task.name,
        "spec": task.spec.to_json(), "model_type": model_type, "arch": dict(arch), "use_task_id": use_task_id,
        "task_index": task.spec.index,
        "feeds": [{"name": n, "var": fwd.feed_vars[n].name, "shape": list(fwd.feed_vars[n].shape),
                   "dtype": str(fwd.feed_vars[n].dtype).replace("paddle.", "")} for n in feed_names],
        "fetches": [{"name": n, "var": fwd.predictions[name][n].name} for n in fetch_names],
        "name_map": {k: v for k, v in fwd.name_map.items()
                     if v in used and (not k.startswith("heads.") or k.startswith(f"heads.{group}."))},
        "vocab": "vocab.txt", "max_seq_len": task.spec.max_seq_len, "do_lower_case": task.spec.do_lower_case,
        **task.manifest(), **dict(extra or {})}
    shutil.copyfile(vocab_file, tmp / "vocab.txt")
    with open(tmp / MANIFEST, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2, ensure_ascii=False, default=str)
    backup = out_dir.with_name(f".{out_dir.name}.old")
    shutil.rmtree(backup, ignore_errors=True)
    if out_dir.exists():
        os.rename(out_dir, backup)
    os.rename(tmp, out_dir)
    shutil.rmtree(backup, ignore_errors=True)
    return out_dir


def _persistables(model_file: Path) -> set:
    import paddle

    program = paddle.static.Program.parse_from_string(model_file.read_bytes())
    return {v.name for v in program.list_vars() if v.persistable}


def write_from_scope(writer, scope) -> None:
    """Run `writer` (export_task_model with its arguments bound) reading parameters from `scope`."""
    import paddle

    with paddle.static.scope_guard(scope):
        writer()


def float32_scope(values: Mapping[str, np.ndarray], name_map: Mapping[str, str], *, use_ema: bool, place):
    """A fresh scope with every parameter of the (float32) export program, from a saved program
    state `values`: the EMA average (`<param>@EMA`) when use_ema, else AMP O2's fp32 master copy
    where there is one, else the value cast to float32."""
    import paddle

    from ernie_mtl.ema import averages_from_state

    scope = paddle.static.Scope()
    averaged = averages_from_state(values) if use_ema else {}
    for name in set(name_map.values()):
        value = averaged.get(name, values.get(name + "_fp32_master_0", values.get(name)))
        if value is None:
            raise ConfigError([f"the saved state lacks parameter {name}: the checkpoint is incomplete"])
        scope.var(name).get_tensor().set(np.asarray(value, dtype=np.float32), place)
    return scope


def write_from_state(writer, values: Mapping[str, np.ndarray], name_map: Mapping[str, str], *, use_ema: bool,
                     place) -> None:
    """Run `writer` on the parameters of a saved (possibly merged) program state."""
    write_from_scope(writer, float32_scope(values, name_map, use_ema=use_ema, place=place))


def merged_state(folder: Path) -> Dict[str, np.ndarray]:
    """Every rank's saved program state in `folder` (rank_<r>.pdparams and .pdopt: parameters, AMP O2
    master weights and EMA averages), merged by name (sharded ranks hold disjoint parts)."""
    import paddle

    merged: Dict[str, np.ndarray] = {}
    for path in sorted(Path(folder).glob("rank_*.pdparams")) + sorted(Path(folder).glob("rank_*.pdopt")):
        merged.update(paddle.load(str(path), return_numpy=True))
    return merged


def gather_program_state(program, output_dir: str, task: str, info, barrier, *, sharded: bool,
                         scope) -> Optional[Dict[str, np.ndarray]]:
    """The current program state on rank 0: its own scope's, or under sharding every rank's saved to
    a temporary folder and merged there (a file system all ranks share is needed, as for
    checkpoints). Every rank calls it; ranks other than 0 get None."""
    import paddle

    if not sharded:
        if info.rank != 0:
            return None
        names = {v.name for v in program.list_vars() if v.persistable}
        return {n: np.array(scope.find_var(n).get_tensor()) for n in names
                if scope.find_var(n) is not None and scope.find_var(n).get_tensor()._is_initialized()}
    tmp = Path(output_dir) / f".export-{task}"
    if info.rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True, exist_ok=True)
    barrier("export dir")
    paddle.static.save(program, str(tmp / f"rank_{info.rank}"))
    barrier("export states")
    if info.rank != 0:
        return None
    try:
        return merged_state(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


_MANIFEST_KEYS = {"task": str, "reader": str, "spec": dict, "feeds": list, "fetches": list}


def read_manifest(model_dir: os.PathLike) -> Dict[str, Any]:
    """The manifest of an exported model; ConfigError naming the file and its defect (missing,
    unreadable, not JSON, keys absent or of the wrong type) and the way out."""
    path = Path(model_dir) / MANIFEST
    out, task = Path(model_dir).parent.parent, Path(model_dir).parent.name
    redo = (f"evaluate or convert the task's checkpoint instead ({out / f'best_{task}'} or {out / 'model_last'}), or "
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
                            dev_file: Optional[str] = None, seed: int = 0) -> TaskType:
    """The task type instance of an exported model, reading `pred_file` (prediction) or `dev_file`
    (evaluation on a labelled file)."""
    _import_plugins(manifest.get("plugins", ()))
    spec_data = dict(manifest["spec"])
    spec_data.update(train_file=None, dev_file=os.path.abspath(dev_file) if dev_file else None, test_file=None,
                     pred_file=os.path.abspath(pred_file) if pred_file else None)
    spec = TaskSpec(**spec_data)
    ctx = TaskContext(vocab_file=str(Path(model_dir) / manifest.get("vocab", "vocab.txt")), seed=seed,
                      model_type=manifest.get("model_type", "ernie"))
    return get_task_type(manifest["reader"])(spec, ctx)


def _import_plugins(paths: Sequence[str]) -> None:
    """The plugin files the training run imported (a custom task type must be registered to predict)."""
    from ernie_mtl.plugins import import_plugins

    problems = import_plugins(paths, where="the exported model's manifest (plugins)")
    if problems:
        raise ConfigError([p + "; the exported model needs its plugin's task type" for p in problems])


def infer(model_dir: Path, manifest: Mapping[str, Any], task: TaskType, data, *, batch_size: Optional[int] = None,
          use_gpu: bool = False, desc: str = "predict") -> Dict[str, List[np.ndarray]]:
    """The prediction outputs (per batch, in order) of an exported model over `data`, with Paddle
    Inference (the deployment runtime, not the training executor)."""
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
    fetch_names = [f["name"] for f in manifest["fetches"]]
    input_handles = {f["name"]: predictor.get_input_handle(f["var"]) for f in manifest["feeds"]}
    output_handles = [predictor.get_output_handle(v) for v in predictor.get_output_names()]
    batch_size = batch_size or task.spec.batch_size
    outputs: Dict[str, List[np.ndarray]] = {n: [] for n in fetch_names}
    from tqdm import tqdm

    for start in tqdm(range(0, len(data), batch_size), desc=f"{desc} {task.spec.name}", unit="batch",
                      dynamic_ncols=True, mininterval=1.0, disable=None):
        batch = task.collate([data.get(i) for i in range(start, min(start + batch_size, len(data)))])
        if manifest.get("use_task_id"):
            batch["task_type_ids"] = np.full_like(batch["input_ids"], manifest["task_index"])
        for n, handle in input_handles.items():
            handle.copy_from_cpu(np.ascontiguousarray(batch[n]))
        predictor.run()
        for n, handle in zip(fetch_names, output_handles):
            outputs[n].append(handle.copy_to_cpu())
    return outputs


def write_json(path: os.PathLike, data: Any) -> Path:
    """`data` as JSON at `path`, atomically (a temporary name, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f, ensure_ascii=False, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def predict(model_dir: os.PathLike, pred_file: str, output: os.PathLike, *, batch_size: Optional[int] = None,
            use_gpu: bool = False, log=print) -> Path:
    """Run an exported task model on `pred_file` with Paddle Inference; write the task's predictions
    (JSON) to `output` atomically. Returns the output path."""
    model_dir = Path(model_dir)
    manifest = read_manifest(model_dir)
    if not os.path.isfile(pred_file):
        raise ConfigError([f"--pred_file {pred_file}: not found"])
    task = load_task_from_manifest(manifest, model_dir, pred_file=pred_file)
    data = task.load("pred")
    if len(data) == 0:
        raise ConfigError([f"--pred_file {pred_file}: no examples to predict (only a header?)"])
    outputs = infer(model_dir, manifest, task, data, batch_size=batch_size, use_gpu=use_gpu)
    output = write_json(output, task.predictions(data, outputs))
    log(f"wrote {len(data)} predictions of task {task.spec.name} to {output}")
    return output
