"""`--do_eval`: a saved model's metrics on a labelled file, with the task's own reader and metrics.

    run_multitask_static.py --do_eval --task sentiment --eval_file test.tsv --output_dir OUT
        -> the exported model OUT/sentiment/infer_model through Paddle Inference
    run_multitask_static.py --do_eval --task sentiment --eval_file test.tsv --checkpoint OUT/best_sentiment
        -> a checkpoint's weights (its EMA averages when the run kept them), through the plain forward
           program rebuilt from the checkpoint's own record (architecture, tasks, name map)

Every task type works with a checkpoint; with an exported model every exportable one (`mlm` and
`pretrain` have no inference model: evaluate their checkpoint). The metrics are printed as JSON
and written to `--eval_output` (default `OUT/<task>/eval_results.json`).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np

from ernie_mtl.config import ConfigError, TaskSpec


def evaluate_exported(model_dir: Path, eval_file: str, *, use_gpu: bool = False) -> Dict[str, Any]:
    from ernie_mtl.export import infer, load_task_from_manifest, read_manifest

    manifest = read_manifest(model_dir)
    task = load_task_from_manifest(manifest, model_dir, dev_file=eval_file)
    data = _labelled(task, eval_file)
    outputs = infer(model_dir, manifest, task, data, use_gpu=use_gpu, desc="evaluate")
    return _report(task, data, task.evaluate(data, outputs), source=str(model_dir), step=manifest.get("step"))


def evaluate_checkpoint(checkpoint: Path, task_name: str, eval_file: str) -> Dict[str, Any]:
    import paddle

    from ernie_mtl.build import build_forward_program
    from ernie_mtl.checkpoint import STATE_DIR, CheckpointError, unreadable_state_file, verified_state
    from ernie_mtl.export import float32_scope, merged_state
    from ernie_mtl.forward import make_feed
    from ernie_mtl.plugins import import_plugins
    from ernie_mtl.tasks.base import TaskContext, get_task_type

    try:  # the checks resume and the converter make: a damaged file is never evaluated
        raw = verified_state(checkpoint, use="evaluate")
    except CheckpointError as e:
        raise ConfigError([f"--checkpoint {checkpoint}: {e}, or the exported model (without --checkpoint)"]) from None
    config = raw.get("config", {})
    mtl = config.get("mtl", {})
    problems = import_plugins(mtl.get("plugins", []), where=f"{checkpoint}: the run's plugins")
    if problems:
        raise ConfigError(problems)
    records = raw.get("extra", {}).get("tasks", [])
    names = [r["name"] for r in records]
    if task_name not in names:
        raise ConfigError([f"--task {task_name}: checkpoint {checkpoint} holds the tasks {names}; pick one of them"])
    vocab = config.get("data", {}).get("tokenizer_name_or_path")
    vocab = str(Path(vocab) / "vocab.txt") if vocab and Path(vocab).is_dir() else vocab
    if not vocab or not Path(vocab).is_file():
        raise ConfigError([f"{checkpoint}: its run's vocabulary {vocab} no longer exists; restore it"])
    model_type = config.get("model", {}).get("model_type", "ernie")
    ctx = TaskContext(vocab_file=vocab, seed=config.get("train", {}).get("seed", 0), model_type=model_type,
                      log=lambda m: None)
    tasks = []
    for r in records:
        spec = dict(r["spec"])
        if r["name"] == task_name:
            spec.update(dev_file=str(Path(eval_file).resolve()) if Path(eval_file).exists() else eval_file)
        tasks.append(get_task_type(r["reader"])(TaskSpec(**spec), ctx))
    task = tasks[names.index(task_name)]
    data = _labelled(task, eval_file)
    arch = {k: v for k, v in raw["extra"]["arch"].items() if k != "model_type"}
    was_dynamic = paddle.in_dynamic_mode()
    paddle.enable_static()
    try:
        program, fwd = build_forward_program(model_type, arch, tasks, use_task_id=bool(mtl.get("use_task_id")))
        if fwd.name_map != raw["name_map"]:
            raise ConfigError([f"{checkpoint}: its name map does not match the network rebuilt from its own record "
                               "(written by another version?); evaluate its exported model instead"])
        exe = paddle.static.Executor(paddle.CPUPlace())
        try:
            state = merged_state(checkpoint / STATE_DIR)
        except Exception:  # noqa: BLE001  (a file that passed the checks but paddle cannot read)
            bad = next(filter(None, (unreadable_state_file(p.with_suffix("")) for p in
                                     sorted((checkpoint / STATE_DIR).glob("rank_*.pdparams")))), None)
            if bad is None:
                raise
            raise ConfigError([f"--checkpoint {checkpoint}: {bad[0]} is damaged ({bad[1]}), although its size and "
                               "SHA-1 are the ones recorded at save time: it was written damaged; evaluate another "
                               "checkpoint or the exported model (without --checkpoint)"]) from None
        scope = float32_scope(state, fwd.name_map, use_ema=bool(mtl.get("use_ema")), place=exe.place)
        preds = fwd.predictions[task_name]
        outputs: Dict[str, List[np.ndarray]] = {n: [] for n in preds}
        bs = task.spec.batch_size
        with paddle.static.scope_guard(scope):
            for start in range(0, len(data), bs):
                batch = task.collate([data.get(j) for j in range(start, min(start + bs, len(data)))])
                feed = make_feed(tasks, names.index(task_name), batch, use_task_id=bool(mtl.get("use_task_id")))
                feed = {k: v for k, v in feed.items() if program.global_block().has_var(k)}
                values = exe.run(program, feed=feed, fetch_list=[v.name for v in preds.values()])
                for n, v in zip(preds, values):
                    outputs[n].append(np.asarray(v))
    finally:
        if was_dynamic:
            paddle.disable_static()
    return _report(task, data, task.evaluate(data, outputs), source=str(checkpoint), step=raw.get("step"))


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


def run_eval(train_cfg, *, use_gpu: bool) -> Dict[str, Any]:
    """The `--do_eval` command: evaluate, print the JSON, write it; returns the report."""
    from ernie_mtl.export import export_dir, write_json

    t = train_cfg
    if t.checkpoint:
        report = evaluate_checkpoint(Path(t.checkpoint), t.task, t.eval_file)
    else:
        report = evaluate_exported(export_dir(t.output_dir, t.task), t.eval_file, use_gpu=use_gpu)
    output = Path(t.eval_output or Path(t.output_dir) / t.task / "eval_results.json")
    write_json(output, report)
    print(json.dumps(report, indent=1, ensure_ascii=False))
    return report
