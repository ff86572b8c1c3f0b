"""Per-task inference models: written when a target finishes (or at the end), from the best or the
last weights, with a manifest that says how to feed it and read its outputs.

Layout of an exported task (`<output_dir>/<task>/infer_model/`)::

    model.pdmodel, model.pdiparams   pruned inference program: backbone + this task's head (float32)
    manifest.json                    feeds, fetches, task spec, label map, arch, name map, metrics
    vocab.txt                        the tokenizer's vocabulary

`Exporter` decides what to export and from which weights (rank 0's choice, shared), gathers the
state when sharding splits it or AMP O2 keeps fp32 masters, and writes through `export_task_model`
(temporary folder, then swapped into place). Prediction with these models is
ernie_mtl/engine/saved_models.py.
"""
from __future__ import annotations

import functools
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional, Tuple

import numpy as np

from ernie_mtl.checkpoint.io import replace_dir, write_json_atomic
from ernie_mtl.checkpoint.layout import MANIFEST, MODEL_PREFIX, best_dir, export_dir, state_prefix
from ernie_mtl.checkpoint.store import merged_state, read_train_state_file
from ernie_mtl.config import ConfigError
from ernie_mtl.tasks.base import TaskType
from ernie_mtl.program.ema import averages_from_state

if TYPE_CHECKING:  # annotations only: no import at run time (no cycle)
    from ernie_mtl.engine.session import Session


class Exporter:
    """Exports targets of a running session: each once, when it finishes or at the end. It holds which
    were exported (its state, in every checkpoint); the loop evaluates a target that is due before
    exporting it. `best` is the run's best-checkpoint callback (its records go into the manifest)."""

    def __init__(self, session: Session, *, checkpointer, evaluator, best=None):
        self.session, self.checkpointer, self.evaluator, self.best = session, checkpointer, evaluator, best
        self.exported: Dict[str, int] = {}  # task -> step of its export

    def state_dict(self) -> Dict[str, int]:
        return dict(self.exported)

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        self.exported = dict(state)

    def due(self, final: bool) -> list:
        """Targets not yet exported that finished (or, at the end, every target)."""
        schedule = self.session.plan.schedule
        return [task for task in self.session.plan.tasks if task.spec.is_target and task.spec.name not in self.exported
                and (final or schedule.is_finished(task.spec.index))]

    def best_metric(self, name: str) -> Optional[Dict[str, Any]]:
        """The best-checkpoint callback's record of `name` (for the manifest), if any."""
        if self.best is None or name not in self.best.best:
            return None
        task = next(candidate for candidate in self.session.plan.tasks if candidate.spec.name == name)
        return {"name": task.main_metric, "value": self.best.best[name], "step": self.best.steps.get(name)}

    def export(self, task, step: int) -> Tuple[Path, str]:
        """Write `task`'s inference model from its best checkpoint (`export_from: best`, when there is
        one) or from the current weights at `step` (EMA averages when kept); rank 0 decides for every
        rank. Returns (folder, the line for the log)."""
        s, p = self.session, self.session.programs
        name = task.spec.name
        out = export_dir(s.cfg.train.output_dir, name)
        best = best_dir(s.cfg.train.output_dir, name)
        choice = task.spec.export_from or ("best" if task.spec.dev_file else "last")
        source = "best" if choice == "best" and self.checkpointer.is_complete(best) else "last"
        from_step = read_train_state_file(best)["step"] if source == "best" else step
        source, from_step = s.barrier.share("export source", [source, from_step])
        mtl = s.cfg.setup.mtl
        writer = functools.partial(export_task_model, out, program=p.forward, fwd=p.export_fwd, task=task, exe=s.exe,
                                   vocab_file=str(s.cfg.data.vocab_file), arch=p.arch,
                                   model_type=s.cfg.model.model_type, use_task_id=mtl.use_task_id,
                                   extra={"step": from_step, "export_from": source,
                                          "best_metric": self.best_metric(name), "ema": p.ema is not None,
                                          "exported_by": "ernie_mtl", "plugins": list(mtl.plugins)})
        sharded = s.topo.sharding_degree > 1
        if source == "best":
            s.barrier("export")  # every rank's files of the best checkpoint are complete
            if s.is_rank0:
                write_from_state(writer, merged_state(best), p.name_map, use_ema=p.ema is not None,
                                 place=s.exe.place)
        else:
            with self.evaluator.averaged_weights():
                if sharded or p.amp_level == "O2":
                    state = gather_program_state(p.main, s.cfg.train.output_dir, name, s.info, s.barrier,
                                                 sharded=sharded, scope=s.scope)
                    if s.is_rank0 and state is not None:
                        write_from_state(writer, state, p.name_map, use_ema=p.ema is not None, place=s.exe.place)
                elif s.is_rank0:
                    write_from_scope(writer, s.scope)
        s.barrier("export")
        self.exported[name] = step
        return out, f"exported task {name} ({source} weights, step {from_step}) to {out}"

    def skip(self, task, step: int) -> None:
        """A due target whose type has no inference model: recorded as done."""
        self.exported[task.spec.name] = step


def export_task_model(out_dir: Path, *, program, fwd, task: TaskType, exe, vocab_file: str, arch: Mapping[str, Any],
                      model_type: str, use_task_id: bool, extra: Optional[Mapping[str, Any]] = None) -> Path:
    """Save `task`'s pruned inference model from `program` (the plain forward; parameters read from
    the current global scope) and its manifest, atomically (temp folder, then rename)."""
    import paddle

    name = task.spec.name
    group = next(g.name for g in fwd.groups if name in g.tasks)
    block = program.global_block()
    fetch_names = list(fwd.predictions[name])
    fetch_vars = [block.var(fwd.predictions[name][n].name) for n in fetch_names]
    needed = _ancestors(block, [v.name for v in fetch_vars])  # a user-defined backbone may not read every feed
    feed_names = [n for n in fwd.backbone_feed_names if fwd.feed_vars[n].name in needed]
    feed_vars = [block.var(fwd.feed_vars[n].name) for n in feed_names]
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
    write_json_atomic(tmp / MANIFEST, manifest, sort_keys=False)
    replace_dir(tmp, out_dir)
    return out_dir


def _ancestors(block, names) -> set:
    """Variables of `block` that the variables `names` are computed from (themselves included)."""
    producers: Dict[str, Any] = {}
    for op in block.ops:
        for out in op.output_arg_names:
            producers.setdefault(out, []).append(op)
    seen, stack = set(), list(names)
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        for op in producers.get(name, ()):
            stack.extend(op.input_arg_names)
    return seen


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
        state_prefix(tmp, 0).parent.mkdir(parents=True, exist_ok=True)
    barrier("export dir")
    paddle.static.save(program, str(state_prefix(tmp, info.rank)))
    barrier("export states")
    if info.rank != 0:
        return None
    try:
        return merged_state(tmp, verify=False)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
