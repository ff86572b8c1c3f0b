"""The multi-task run: set-up (`run_multitask`) and the loop (`MultiTaskTrainer`).

Per optimizer step the schedule (ernie_mtl/schedule.py) draws the task of each of the
`accumulate_steps` micro-batches, identically on every rank; each rank feeds its slice of that
task's global micro-batch (ernie_mtl/schedule.TaskStream); one `exe.run` per micro-batch; the
update happens inside the program on the last one. Heads whose task was not drawn in the step
receive a zero gradient, and are restored after the update (parameters and AdamW moments/beta
powers), so neither stale momentum nor weight decay moves them (see ernie_mtl/mtl_forward.py).

Everything a resume needs is derived from the schedule's state: the task sequence position, the
per-task micro-batch counts (hence reader positions and epochs) and finished targets; plus the
LR scheduler, callbacks' state (best metrics, early stopping) and the EMA.

Every rank evaluates the full dev sets (identical metrics everywhere, so early stopping and best
checkpoints are rank-independent without communication; under sharding the ranks must run the
evaluation program together anyway).
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ernie_mtl.callbacks import BestCheckpoint, Callback, EarlyStopping, VisualDLLogger, make_callbacks
from ernie_mtl.checkpoint import Checkpointer, TrainState
from ernie_mtl.config import ConfigError
from ernie_mtl.export import spec_json
from ernie_mtl.logging_utils import MetricWriter
from ernie_mtl.trainer import DUMP_DIR_ENV, KILL_AT_STEP_ENV


def run_multitask(cfg, setup) -> int:
    """Train the tasks of `setup` (mtl_config.MultiTaskSetup) as configured by `cfg` (args.RunConfig)."""
    import paddle

    from ernie_mtl.distributed import StoreBarrier
    from ernie_mtl.trainer import make_executor, start_process

    info, log, topo = start_process(cfg)
    barrier = StoreBarrier(info)
    plan = prepare(cfg, setup, info=info, topo=topo, barrier=barrier, log=log.info)
    programs = build_programs(cfg, setup, topo, plan)
    exe = make_executor(cfg, info, programs, log)
    trainer = MultiTaskTrainer(cfg, setup, info=info, topo=topo, plan=plan, programs=programs, exe=exe,
                               barrier=barrier, log=log)
    try:
        trainer.resume()
        trainer.train()
        if os.environ.get(DUMP_DIR_ENV):
            paddle.static.save(programs.main, os.path.join(os.environ[DUMP_DIR_ENV], f"rank_{info.rank}"))
    finally:
        trainer.close()
    log.info(f"checkpoints: {cfg.train.output_dir}/model_last, model_<step>, best_<task>; inference models: "
             f"{cfg.train.output_dir}/<task>/infer_model; VisualDL: visualdl --logdir {cfg.train.output_dir}/visualdl")
    return 0


class Plan:
    """Tasks with their data, the schedule and the planned length (computed identically on every rank)."""

    def __init__(self, tasks, train, dev, streams, schedule, planned, probabilities, quotas):
        self.tasks = tasks
        self.train = train
        self.dev = dev
        self.streams = streams
        self.schedule = schedule
        self.planned = planned
        self.probabilities = probabilities
        self.quotas = quotas


def prepare(cfg, setup, *, info, topo, barrier, log) -> Plan:
    """Task objects, their train/dev data, the schedule and its plan."""
    from ernie_mtl.schedule import (TaskSchedule, TaskStream, sampling_probabilities, steps_per_epoch,
                                    target_quotas)
    from ernie_mtl.tasks.base import TaskContext, get_task_type

    m = setup.mtl
    ctx = TaskContext(vocab_file=str(cfg.data.vocab_file), seed=cfg.train.seed, model_type=cfg.model.model_type,
                      rank=info.rank, world_size=info.world_size, barrier=barrier, log=log)
    tasks = [get_task_type(spec.reader)(spec, ctx) for spec in setup.tasks]
    train = {}
    for t in tasks:
        log(f"reading task {t.spec.name} ({t.name}): train {t.spec.train_file}")
        train[t.spec.name] = t.load("train")
    dev = {t.spec.name: t.load("dev") for t in tasks if t.spec.dev_file}
    empty = [f"task {name}: {split} file {getattr(t.spec, split + '_file')} has no examples; give a file with rows "
             f"after the header, or remove the key" for split, data in (("train", train), ("dev", dev))
             for t in tasks for name in [t.spec.name] if name in data and len(data[name]) == 0]
    if empty:
        raise ConfigError(empty)
    dw = topo.data_world_size
    sizes = [t.num_train_examples(train[t.spec.name]) for t in tasks]
    probabilities = sampling_probabilities(m.sampling, mix_ratio=[t.spec.mix_ratio for t in tasks], num_examples=sizes,
                                           temperature=m.temperature, examples_cap=m.examples_cap)
    quotas = target_quotas(num_examples=sizes, batch_sizes=[t.spec.batch_size for t in tasks], data_parallel=dw,
                           is_target=[t.spec.is_target for t in tasks], num_epochs=m.num_epochs,
                           task_num_epochs=[t.spec.num_epochs for t in tasks],
                           mix_ratio=[t.spec.mix_ratio for t in tasks] if m.sampling == "palm" else None)
    schedule = TaskSchedule(probabilities, quotas, [t.spec.is_target for t in tasks], cfg.train.seed,
                            accumulate_steps=topo.accumulate_steps, max_steps=cfg.optim.max_steps,
                            names=[t.spec.name for t in tasks],
                            steps_per_epoch=[steps_per_epoch(n, t.spec.batch_size, dw) for n, t in zip(sizes, tasks)])
    def stream(t):
        return TaskStream(len(train[t.spec.name]), seed=cfg.train.seed, task_index=t.spec.index,
                          examples_per_micro=t.spec.batch_size * dw, micro_batch_size=t.spec.batch_size,
                          data_rank=topo.data_rank(info.rank))

    streams = [stream(t) for t in tasks]
    planned = schedule.plan()
    for i, t in enumerate(tasks):  # generated samples (pretraining): exactly as many as the run will read,
        if t.sized_by_run:  # so no sample (and no mask) repeats
            need = planned.micro_batches[i] * t.spec.batch_size * dw
            if need > len(train[t.spec.name]):
                ctx.extra.setdefault("num_samples", {})["train"] = need
                train[t.spec.name] = t.load("train")
                streams[i] = stream(t)
                ctx.extra["num_samples"].pop("train")
    return Plan(tasks, train, dev, streams, schedule, planned, probabilities, quotas)


def build_programs(cfg, setup, topo, plan: Plan):
    """The multi-task programs, the LR horizon being the planned number of optimizer steps."""
    from ernie_mtl.mtl_model import build_multitask_programs
    from ernie_mtl.parallel import build_strategy

    optim = replace(cfg.optim, max_steps=plan.planned.total_steps)
    dump_dir = os.path.join(cfg.train.output_dir, "program_desc")
    os.makedirs(dump_dir, exist_ok=True)
    strategy = functools.partial(build_strategy, topo, cfg.parallel, cfg.amp)
    with contextlib.chdir(dump_dir):  # fleet's sharding dumps its programs into the cwd
        return build_multitask_programs(cfg.model, optim, strategy, topo, plan.tasks, seed=cfg.train.seed,
                                        amp_cfg=cfg.amp, use_task_id=setup.mtl.use_task_id,
                                        ema_decay=setup.mtl.ema_decay if setup.mtl.use_ema else None)


class _Window:
    """Per-task sums between two log lines."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.loss: Dict[str, float] = {}
        self.count: Dict[str, int] = {}
        self.micro = 0
        self.tokens = 0
        self.steps = 0
        self.lr = 0.0
        self.loss_scale: Optional[float] = None
        self.t0 = time.perf_counter()


class MultiTaskTrainer:
    """The loop over optimizer steps: step, log, evaluate, export finished targets, save."""

    def __init__(self, cfg, setup, *, info, topo, plan: Plan, programs, exe, barrier, log):
        import paddle

        self.cfg, self.setup, self.info, self.topo, self.plan = cfg, setup, info, topo, plan
        self.p, self.exe, self.barrier, self.log = programs, exe, barrier, log
        self.tasks = plan.tasks
        self.schedule = plan.schedule
        self.step = 0
        self.is_rank0 = info.rank == 0
        self.scope = paddle.static.global_scope()
        self.exported: Dict[str, int] = {}  # task -> step of its export
        self.evaluated_at: Dict[str, int] = {}  # task -> step of its latest evaluation
        self.window = _Window()
        self.bar = None
        self.writer = MetricWriter(cfg.train.output_dir, enabled=self.is_rank0)
        m = setup.mtl
        self.callbacks: List[Callback] = [VisualDLLogger(self.writer), BestCheckpoint()]
        if m.early_stopping_patience:
            self.callbacks.append(EarlyStopping(m.early_stopping_patience))
        self.callbacks += make_callbacks(m.callbacks)
        self.ema = programs.ema  # on the device (ernie_mtl/ema.py), or None
        self.freeze = programs.freeze  # idle parameter groups (ernie_mtl/idle_heads.py)
        self.data_rank = topo.data_rank(info.rank)
        self.checkpointer = Checkpointer(
            cfg.train.output_dir, rank=info.rank, world_size=info.world_size, per_rank_state=topo.sharding_degree > 1,
            keep_last=cfg.train.keep_last, barrier=barrier, log=self._print,
            save_program_state=self._save_state, load_program_state=self._load_state)
        self.group_of = {t: g.name for g in programs.groups for t in g.tasks}

    # -- small accessors ---------------------------------------------------------------------
    def task(self, name: str):
        return next(t for t in self.tasks if t.spec.name == name)

    def _print(self, message: str) -> None:
        if self.is_rank0:
            self.log.info(message)

    def _emit(self, hook: str, *args) -> None:
        for cb in self.callbacks:
            getattr(cb, hook)(self, *args)

    # -- state -------------------------------------------------------------------------------
    def _save_state(self, prefix: str) -> None:
        import paddle

        paddle.static.save(self.p.main, prefix)  # the EMA's averages are variables of main: saved too

    def _load_state(self, prefix: str) -> None:
        import paddle

        paddle.static.load(self.p.main, prefix, self.exe)

    def _resume_checks(self) -> Dict[str, Any]:
        if not hasattr(self, "_data_identity"):  # hashed once: checkpoints are written often
            self._data_identity = {t.spec.name: _content_identity(t.spec.train_file) for t in self.tasks}
        return {"seed": self.cfg.train.seed, "tasks": [spec_json(t.spec) for t in self.tasks],
                "data": self._data_identity, "total_steps": self.plan.planned.total_steps}

    def _train_state(self) -> TrainState:
        return TrainState(
            step=self.step, consumed_samples=int(sum(self.schedule.counts[i] * t.spec.batch_size
                                                     for i, t in enumerate(self.tasks)) * self.topo.data_world_size),
            lr_scheduler=self.p.lr_scheduler.state_dict(), rng={}, sampler=self.schedule.state_dict(),
            config={**self.cfg.to_dict(), "mtl": self.setup.mtl.to_dict()}, topology=self.topo.to_dict(),
            name_map=self.p.name_map,
            extra={"resume_checks": self._resume_checks(), "arch": dict(self.p.arch), "exported": self.exported,
                   "callbacks": {type(cb).__name__: cb.state_dict() for cb in self.callbacks},
                   "tasks": [{"name": t.spec.name, "reader": t.name, "group": self.group_of[t.spec.name],
                              "is_target": t.spec.is_target, "spec": spec_json(t.spec), "manifest": t.manifest()}
                             for t in self.tasks]})

    def resume(self) -> None:
        ref = self.checkpointer.resolve(self.cfg.train.resume)
        if ref is None:
            self._print(f"starting a new multi-task run in {self.cfg.train.output_dir}")
            return
        state = self.checkpointer.load(ref, topology=self.topo.to_dict(), check=self._resume_checks())
        self.step = state.step
        self.p.lr_scheduler.set_state_dict(state.lr_scheduler)
        self.schedule.load_state_dict(state.sampler)
        self.exported = dict(state.extra.get("exported", {}))
        saved = state.extra.get("callbacks", {})  # by class name: enabling a callback later still resumes
        for cb in self.callbacks:
            if type(cb).__name__ in saved:
                cb.load_state_dict(saved[type(cb).__name__])
        self._print(f"resumed from {ref.path} at step {self.step} (micro-batches per task: "
                    f"{dict(zip(self.schedule.names, self.schedule.counts))})")

    def save_checkpoint(self, name: str, note: str = "") -> None:
        path = self.checkpointer.save(name, self._train_state())
        if note:
            self._print(f"{note}: {path}")
        self._emit("on_save", str(path))

    # -- the loop ----------------------------------------------------------------------------
    def train(self) -> None:
        total = self.plan.planned.total_steps
        if self.is_rank0:
            self.log.info("task schedule:\n" + self.schedule.summary())
            self.writer.hparams({**self.cfg.to_dict(), "mtl": self.setup.mtl.to_dict()},
                                [f"eval/{t.spec.name}/{t.main_metric}" for t in self.tasks if t.spec.dev_file])
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=self.step, unit="step", dynamic_ncols=True, mininterval=1.0)
        kill_at = int(os.environ.get(KILL_AT_STEP_ENV, "0") or 0)
        t = self.cfg.train
        self.window.reset()
        while not self.schedule.done:
            drawn = self.train_step()
            self._emit("on_step_end", self.step, drawn)
            if self.bar is not None:
                self.bar.update(1)
            if self.step % t.logging_freq == 0 or self.schedule.done:
                self.log_window()
            if self.step % t.eval_freq == 0:
                self.evaluate()
            self.export_finished()
            if self.step % t.checkpoint_steps == 0 or self.schedule.done:
                self.save_checkpoint("model_last")
            if self.step % t.save_steps == 0:
                self.save_checkpoint(f"model_{self.step}")
            if self.step == kill_at:  # test hook: die like a crashed node, right after the checkpoint
                os.kill(os.getpid(), signal.SIGKILL)
        self._emit("on_train_end")
        if self.step % t.eval_freq:
            self.evaluate()
        self.export_finished(final=True)
        self._print(f"training finished at step {self.step}: micro-batches per task "
                    f"{dict(zip(self.schedule.names, self.schedule.counts))}")

    def train_step(self) -> List[str]:
        """One optimizer step: the schedule's next `accumulate_steps` micro-batches."""
        from ernie_mtl.mtl_forward import make_feed
        from ernie_mtl.randomness import DROPOUT_SEEDS, draw_dropout_seeds

        read = list(self.schedule.counts)  # per task: micro-batches read before this step
        drawn = [self.schedule.next_task() for _ in range(self.topo.accumulate_steps)]
        names = [self.tasks[i].spec.name for i in drawn]
        idle = self.freeze.feed(names)  # groups no drawn task uses: frozen by the update (on the device)
        fetch = [self.p.lr] + ([self.p.loss_scaling] if self.p.loss_scaling is not None else [])
        for m, i in enumerate(drawn):
            task = self.tasks[i]
            name = task.spec.name
            k = read[i]
            read[i] += 1
            features = [self.plan.train[name].get(idx, epoch) for idx, epoch in self.plan.streams[i].indices(k)]
            batch = task.collate(features)
            feed = make_feed(self.tasks, i, batch, use_task_id=self.setup.mtl.use_task_id)
            feed.update(idle)
            if self.p.dropout_seeds:
                feed[DROPOUT_SEEDS] = draw_dropout_seeds(self.cfg.train.seed, self.step, m, self.data_rank,
                                                         self.p.dropout_seeds)
            values = self.exe.run(self.p.main, feed=feed, fetch_list=[self.p.fwd.task_losses[name]] + fetch)
            w = self.window
            w.loss[name] = w.loss.get(name, 0.0) + float(np.asarray(values[0]).reshape(-1)[0])
            w.count[name] = w.count.get(name, 0) + 1
            w.micro += 1
            w.tokens += int((np.asarray(batch["input_mask"]) == 0).sum()) * self.topo.data_world_size
            w.lr = float(np.asarray(values[1]).reshape(-1)[0])
            if len(values) > 2:
                w.loss_scale = float(np.asarray(values[2]).reshape(-1)[0])
        self.p.lr_scheduler.step()
        if self.ema is not None:
            self.ema.update(self.exe, self.step)  # update number = steps completed before this one
        self.step += 1
        self.window.steps += 1
        return names

    def _ema_swapped_in(self):
        """Evaluation and export with the averaged weights when use_ema (swapped on the device)."""
        return self.ema.swapped_in(self.exe) if self.ema is not None else contextlib.nullcontext()

    def log_window(self) -> None:
        w = self.window
        elapsed = max(time.perf_counter() - w.t0, 1e-9)
        logs: Dict[str, float] = {"train/lr": w.lr, "perf/steps_per_s": w.steps / elapsed,
                                  "perf/tokens_per_s": w.tokens / elapsed}
        if w.loss_scale is not None:
            logs["amp/loss_scale"] = w.loss_scale
        lines = []
        for i, t in enumerate(self.tasks):
            name = t.spec.name
            logs[f"train/{name}/sampled"] = w.count.get(name, 0) / max(w.micro, 1)
            if name not in w.count:
                continue
            loss = w.loss[name] / w.count[name]
            logs[f"train/{name}/loss"] = loss
            stream = self.plan.streams[i]
            k = self.schedule.counts[i]
            per_epoch = stream.steps_per_epoch
            lines.append(f"global step: {self.step}, task: {name}, step {k - stream.epoch_of(k - 1) * per_epoch}/"
                         f"{per_epoch} (epoch {stream.epoch_of(k - 1)}), loss: {loss:.4f}, "
                         f"speed: {w.steps / elapsed:.2f} steps/s")
        if self.is_rank0:
            for line in lines:
                self.log.info(line)
        self._emit("on_log", self.step, logs)
        w.reset()

    # -- evaluation and export ---------------------------------------------------------------
    def evaluate(self, only: Optional[Sequence[str]] = None) -> Dict[str, Dict[str, float]]:
        """Tasks with a dev file through the evaluation program (EMA weights when enabled): every task
        but finished targets, or the tasks `only`. The metrics of rank 0 are handed to every rank
        (`StoreBarrier.share`), so best checkpoints and early stopping decide identically everywhere."""
        names = [t.spec.name for t in self.tasks if t.spec.name in self.plan.dev and
                 (t.spec.name in only if only is not None else
                  not (t.spec.is_target and self.schedule.is_finished(t.spec.index)))]
        local = {}
        with self._ema_swapped_in():
            for name in names:
                i = self.task(name).spec.index
                t = self.tasks[i]
                outputs = self.predict_split(i, self.plan.dev[name], limit=None if t.full_dev_eval else
                                             self.cfg.train.eval_iters)
                local[name] = {k: float(v) for k, v in t.evaluate(self.plan.dev[name], outputs).items()}
        results = self.barrier.share("evaluation", local)
        for name in names:
            self.evaluated_at[name] = self.step
            self._print(f"eval {name} at step {self.step}: " +
                        ", ".join(f"{k} {v:.4f}" for k, v in results[name].items()))
            self._emit("on_evaluate", name, results[name])
        return results

    def predict_split(self, i: int, data, limit: Optional[int] = None) -> Dict[str, List[np.ndarray]]:
        """Prediction variables of task i over `data` (in order; `limit` batches at most)."""
        from ernie_mtl.mtl_forward import make_feed

        t = self.tasks[i]
        preds = self.p.fwd.predictions[t.spec.name]
        names = list(preds)
        out: Dict[str, List[np.ndarray]] = {n: [] for n in names}
        bs = t.spec.batch_size
        starts = list(range(0, len(data), bs))[:limit]
        for start in starts:
            batch = t.collate([data.get(j) for j in range(start, min(start + bs, len(data)))])
            feed = make_feed(self.tasks, i, batch, use_task_id=self.setup.mtl.use_task_id)
            values = self.exe.run(self.p.test, feed=feed, fetch_list=[preds[n].name for n in names])
            for n, v in zip(names, values):
                out[n].append(np.asarray(v))
        return out

    def finish_task(self, name: str, reason: str) -> None:
        """End a target early (early stopping): it leaves the sampler, is no longer evaluated and is
        exported (its best weights). The run is then shorter than planned: unless --decay_steps was
        given, the LR decay is re-aimed at the new end (optim.WarmupLinearDecay.replan)."""
        self.schedule.finish(self.task(name).spec.index)
        self._print(f"task {name} finished at step {self.step}: {reason}")
        if self.cfg.optim.decay_steps is None:
            horizon = self.schedule.plan().total_steps
            if horizon != self.p.lr_scheduler.decay_steps:
                self.p.lr_scheduler.replan(horizon)
                self._print(f"the run now ends at step {horizon}: learning rate re-planned to reach "
                            f"{self.cfg.optim.min_lr:g} there")

    def export_finished(self, final: bool = False) -> None:
        """Export every target that finished (or, at the end, every target) not yet exported, after a
        last evaluation of it at this step if it has a dev file and was not just evaluated."""
        due = [t for t in self.tasks if t.spec.is_target and t.spec.name not in self.exported
               and (final or self.schedule.is_finished(t.spec.index))]
        last_eval = [t.spec.name for t in due if t.spec.name in self.plan.dev
                     and self.evaluated_at.get(t.spec.name) != self.step]
        if last_eval:
            self.evaluate(only=last_eval)
        for t in due:
            name = t.spec.name
            if t.exportable:
                self.export(t)
            else:
                self._print(f"task {name} ({t.name}) finished at step {self.step}; its type has no inference "
                            "model (predictions need more than the backbone inputs): see the checkpoints")
            self.exported[name] = self.step

    def export_source(self, task) -> Tuple[str, Optional[Path]]:
        """("best", best_<task> folder) or ("last", None): the task's `export_from` (default: best when
        it has a dev file); best falls back to last when no best checkpoint exists yet."""
        choice = task.spec.export_from or ("best" if task.spec.dev_file else "last")
        best = Path(self.cfg.train.output_dir) / f"best_{task.spec.name}"
        if choice == "best" and (best / "train_state.json").is_file():
            return "best", best
        return "last", None

    def export(self, task) -> Path:
        from ernie_mtl.export import export_dir

        out = export_dir(self.cfg.train.output_dir, task.spec.name)
        source, best = self.export_source(task)
        step = json.loads((best / "train_state.json").read_text(encoding="utf-8"))["step"] if best else self.step
        source, step = self.barrier.share("export source", [source, step])  # rank 0 decides for all
        name = task.spec.name
        metric = self._best_metric(name)
        best = Path(self.cfg.train.output_dir) / f"best_{name}"
        if source == "best":
            self.barrier("export")  # every rank's files of the best checkpoint are complete
            if self.is_rank0:
                values = _merged_state(best / "state")
                self._export_from(self._float32_scope(values), task, out, step=step, source=source, metric=metric)
        else:
            with self._ema_swapped_in():
                if self.topo.sharding_degree > 1:
                    self._export_sharded(task, out, metric)
                elif self.is_rank0 and self.p.amp_level == "O2":  # the scope holds float16 parameters
                    self._export_from(self._float32_scope(self._scope_values()), task, out, step=step,
                                      source=source, metric=metric)
                elif self.is_rank0:
                    self._export_from(self.scope, task, out, step=step, source=source, metric=metric)
        self.barrier("export")
        self._print(f"exported task {name} ({source} weights, step {step}) to {out}")
        self._emit("on_save", str(out))
        return out

    def _best_metric(self, name: str) -> Optional[Dict[str, Any]]:
        t = self.task(name)
        best = next((cb for cb in self.callbacks if isinstance(cb, BestCheckpoint)), None)
        if best is None or name not in best.best:
            return None
        return {"name": t.main_metric, "value": best.best[name], "step": best.steps.get(name)}

    def _export_from(self, scope, task, out: Path, *, step: int, source: str, metric) -> None:
        import paddle

        from ernie_mtl.export import export_task_model

        with paddle.static.scope_guard(scope):
            export_task_model(out, program=self.p.forward, fwd=self.p.export_fwd, task=task, exe=self.exe,
                              vocab_file=str(self.cfg.data.vocab_file), arch=self.p.arch,
                              model_type=self.cfg.model.model_type, use_task_id=self.setup.mtl.use_task_id,
                              extra={"step": step, "export_from": source, "best_metric": metric,
                                     "ema": self.ema is not None, "exported_by": "ernie_mtl",
                                     "plugins": list(self.setup.mtl.plugins)})

    def _export_sharded(self, task, out: Path, metric) -> None:
        """Sharded ranks hold only their parameters: each writes its state, rank 0 merges them into a
        fresh scope and exports from there (needs a file system all ranks share, as checkpoints do)."""
        import paddle

        tmp = Path(self.cfg.train.output_dir) / f".export-{task.spec.name}"
        if self.is_rank0:
            tmp.mkdir(parents=True, exist_ok=True)
        self.barrier("export dir")
        paddle.static.save(self.p.main, str(tmp / f"rank_{self.info.rank}"))
        self.barrier("export states")
        if self.is_rank0:
            self._export_from(self._float32_scope(_merged_state(tmp)), task, out, step=self.step, source="last",
                              metric=metric)
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)

    def _scope_values(self) -> Dict[str, np.ndarray]:
        names = {v.name for v in self.p.main.list_vars() if v.persistable}
        return {n: np.array(self.scope.find_var(n).get_tensor()) for n in names
                if self.scope.find_var(n) is not None and self.scope.find_var(n).get_tensor()._is_initialized()}

    def _float32_scope(self, values: Mapping[str, np.ndarray]):
        """A scope with every parameter of the (float32) export program: the EMA when enabled, else AMP
        O2's fp32 master copy where there is one, else the value cast to float32."""
        import paddle

        from ernie_mtl.ema import averages_from_state

        scope = paddle.static.Scope()
        averaged = averages_from_state(values) if self.ema is not None else {}  # float32 already
        for name in set(self.p.name_map.values()):
            value = averaged.get(name, values.get(name + "_fp32_master_0", values[name]))
            scope.var(name).get_tensor().set(np.asarray(value, dtype=np.float32), self.exe.place)
        return scope

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        self.writer.close()


def _merged_state(folder: Path) -> Dict[str, np.ndarray]:
    """Every rank's saved program state in `folder` (rank_<r>.pdparams and .pdopt: parameters, AMP O2
    master weights and EMA averages), merged by name (sharded ranks hold disjoint parts)."""
    import paddle

    merged: Dict[str, np.ndarray] = {}
    for path in sorted(folder.glob("rank_*.pdparams")) + sorted(folder.glob("rank_*.pdopt")):
        merged.update(paddle.load(str(path), return_numpy=True))
    return merged


def _content_identity(path: Optional[str]) -> Optional[List[Any]]:
    """Size and SHA-1 of a task's training data (a corpus: of its .idx, plus the .bin size): copying or
    touching the files keeps the identity, editing them does not."""
    if path is None:
        return None
    if os.path.exists(path + ".idx"):
        return [os.path.getsize(path + ".bin"), _sha1(path + ".idx")]
    return [os.path.getsize(path), _sha1(path)]


def _sha1(path: str) -> str:
    import hashlib

    digest = hashlib.sha1()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
