"""The one training engine: set-up (`run`) and the loop (`Trainer`), for flag-mode pretraining (one
task, `pretrain`) and multi-task runs alike.

`run(cfg)`: process info + static mode (+ gloo on CPU), topology, fleet, the run plan (tasks, data,
schedule: ernie_mtl/plan.py), the programs (built once: ernie_mtl/build.py), executor and
initialisation, resume, the loop, the final test evaluation, and a closing line saying where the
outputs are. `--prebuild_index` stops after the plan (every index cache built, nothing trained);
`--dry_run` is ernie_mtl/planner.py.

Per optimizer step the schedule draws the task of each of the `accumulate_steps` micro-batches,
identically on every rank; each rank feeds its slice of that task's global micro-batch, the
dropout seeds of (step, micro-batch, rank) and the idle-group flags of the step; one `exe.run` per
micro-batch, the update happening inside the program on the last one (gradient merge). Logged
losses are rank 0's (not all-reduced); tokens/s counts rank 0's non-pad tokens times the
data-parallel size.

Evaluation is split across the data-parallel ranks (batch j of a split on rank j mod D) and the
prediction outputs are gathered, so every rank computes the metrics of the whole split, bit for
bit what one process computes; rank 0's metrics are then handed to every rank, so the decisions
they drive (best checkpoints, early stopping) agree everywhere.
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np

from ernie_mtl.callbacks import BestCheckpoint, Callback, EarlyStopping, VisualDLLogger, make_callbacks
from ernie_mtl.checkpoint import Checkpointer
from ernie_mtl.logging_utils import MetricWriter, Window
from ernie_mtl.reporting import reporter_for
from ernie_mtl.resume import UNRESOLVED

TEST_RESULTS = "test_results.json"


def run(cfg) -> int:
    """Train as configured by a validated RunConfig; returns the exit status."""
    from ernie_mtl.plan import prepare
    from ernie_mtl.runtime import StoreBarrier, make_executor, start_process

    if cfg.train.prebuild_index:
        return prebuild(cfg)
    info, log, topo = start_process(cfg)
    for line in cfg.setup.reports:
        log.info(line)
    barrier = StoreBarrier(info)
    resume_from = resolve_resume(cfg, info, log)  # a damaged checkpoint is refused before any data or program work
    plan = prepare(cfg, info=info, topo=topo, barrier=barrier, log=log.info)
    programs = build_programs(cfg, topo, plan)
    exe = make_executor(cfg, info, programs, log)
    trainer = Trainer(cfg, info=info, topo=topo, plan=plan, programs=programs, exe=exe, barrier=barrier, log=log)
    trainer.resume_from = resume_from
    try:
        trainer.resume()
        trainer.train()
        trainer.test()
    finally:
        trainer.close()
    log.info(trainer.reporter.closing(cfg.train.output_dir))
    from ernie_mtl import watchdog

    watchdog.finish()  # this rank completed: its peers stop watching it
    return 0


def resolve_resume(cfg, info, log):
    """The checkpoint `--resume` designates (None: a new run), found and verified -- every file's
    size and SHA-1, train_state.json field by field -- first thing, so a damaged or inconsistent
    checkpoint stops the run within seconds instead of after index caches and programs are built.
    Whether the run can continue from it exactly (topology, data, seed) is checked when it is loaded."""
    from ernie_mtl.checkpoint import Checkpointer

    def unused(prefix: str) -> None:
        raise AssertionError("resolve_resume reads no program state")

    finder = Checkpointer(cfg.train.output_dir, rank=info.rank, world_size=info.world_size, per_rank_state=False,
                          save_program_state=unused, load_program_state=unused, keep_last=cfg.train.keep_last,
                          log=log.info if info.rank == 0 else (lambda message: None))
    return finder.resolve(cfg.train.resume, overwrite=cfg.train.overwrite_output_dir)


def prebuild(cfg) -> int:
    """`--prebuild_index`: plan the run exactly as training would (same flags, same parser, world
    size from PADDLE_TRAINERS_NUM) and build every index cache it reads -- train, dev and the final
    test split -- then exit. No process group, no program."""
    from ernie_mtl.logging_utils import get_logger
    from ernie_mtl.parallel import Topology
    from ernie_mtl.plan import load_eval_split, prepare
    from ernie_mtl.runtime import ProcessInfo

    world = int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))
    info = ProcessInfo(rank=0, world_size=world, local_rank=0)
    log = get_logger(0)
    topo = Topology.from_config(cfg.parallel, world)
    plan = prepare(cfg, info=info, topo=topo, barrier=lambda *a, **k: None, log=log.info, is_builder=True)
    for t in plan.tasks:  # the targets' test splits are in the plan; an auxiliary corpus's too, if it has one
        if t.spec.test_file and t.sized_by_run and t.spec.name not in plan.test:
            load_eval_split(t, "test", plan.eval_batches)
    log.info(f"index caches ready for {plan.planned.total_steps} optimizer steps of {len(plan.tasks)} task(s) "
             f"(world size {world}); the run with the same flags reuses them")
    return 0


def build_programs(cfg, topo, plan):
    """The run's programs, the LR horizon being the planned number of optimizer steps. Built with
    the working directory set to `<output_dir>/program_desc`: fleet's sharding dumps its programs
    into the cwd."""
    import contextlib as _contextlib

    from ernie_mtl.build import build_run_programs

    dump_dir = os.path.join(cfg.train.output_dir, "program_desc")
    os.makedirs(dump_dir, exist_ok=True)
    with _contextlib.chdir(dump_dir):
        return build_run_programs(cfg, topo, plan.tasks, total_steps=plan.planned.total_steps)


class Trainer:
    """The loop over optimizer steps: step, log, evaluate, export finished targets, save."""

    def __init__(self, cfg, *, info, topo, plan, programs, exe, barrier, log):
        import paddle

        self.cfg, self.info, self.topo, self.plan = cfg, info, topo, plan
        self.p, self.exe, self.barrier, self.log = programs, exe, barrier, log
        self.setup = cfg.setup
        self.tasks = plan.tasks
        self.schedule = plan.schedule
        self.step = 0
        self.is_rank0 = info.rank == 0
        self.data_rank = topo.data_rank(info.rank)
        self.scope = paddle.static.global_scope()
        self.reporter = reporter_for(cfg)
        self.exported: Dict[str, int] = {}  # task -> step of its export
        self.evaluated_at: Dict[str, int] = {}  # task -> step of its latest evaluation
        self.window = Window()
        self.bar = None
        self.writer = MetricWriter(cfg.train.output_dir, enabled=self.is_rank0)
        m = self.setup.mtl
        self.callbacks: List[Callback] = [VisualDLLogger(self.writer), BestCheckpoint()]
        if m.early_stopping_patience:
            self.callbacks.append(EarlyStopping(m.early_stopping_patience))
        self.callbacks += make_callbacks(m.callbacks)
        self.ema = programs.ema  # on the device (ernie_mtl/ema.py), or None
        self.freeze = programs.freeze  # idle parameter groups (ernie_mtl/idle_heads.py)
        self.group_of = {t: g.name for g in programs.groups for t in g.tasks}
        self.checkpointer = Checkpointer(
            cfg.train.output_dir, rank=info.rank, world_size=info.world_size, per_rank_state=topo.sharding_degree > 1,
            keep_last=cfg.train.keep_last, barrier=barrier, log=self.print,
            save_program_state=lambda prefix: paddle.static.save(self.p.main, prefix),
            load_program_state=lambda prefix: paddle.static.load(self.p.main, prefix, self.exe))
        self._resume_checks = None
        self.resume_from: Any = UNRESOLVED  # run() resolves --resume before the plan (resolve_resume)

    # -- small accessors ---------------------------------------------------------------------
    def task(self, name: str):
        return next(t for t in self.tasks if t.spec.name == name)

    def print(self, message: str) -> None:
        if self.is_rank0:
            self.log.info(message)

    _print = print  # callbacks written against the multi-task trainer call _print

    def _emit(self, hook: str, *args) -> None:
        for cb in self.callbacks:
            getattr(cb, hook)(self, *args)

    @property
    def consumed_samples(self) -> int:
        """Training samples read so far by all ranks."""
        return int(sum(c * t.spec.batch_size for c, t in zip(self.schedule.counts, self.tasks))
                   * self.topo.data_world_size)

    # -- state -------------------------------------------------------------------------------
    def resume(self) -> None:
        from ernie_mtl.resume import resume

        resume(self)

    def save_checkpoint(self, name: str, note: str = "") -> None:
        from ernie_mtl.resume import train_state

        path = self.checkpointer.save(name, train_state(self))
        if note:
            self.print(f"{note}: {path}")
        self._emit("on_save", str(path))

    # -- the loop ----------------------------------------------------------------------------
    def train(self) -> None:
        total = self.plan.planned.total_steps
        if self.is_rank0:
            for line in self.reporter.start_lines(self):
                self.log.info(line)
            for task in self.tasks:
                for line in task.describe_data():
                    self.log.info(line)
            from ernie_mtl.plan import plan_warnings

            for line in plan_warnings(self.plan, self.topo, flag_mode=self.setup.flag_mode,
                                      max_steps=self.cfg.optim.max_steps):
                self.log.warning(line)
            self.writer.hparams(self.cfg.to_dict(), self.reporter.hparam_metrics(self))
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=self.step, unit="step", dynamic_ncols=True, mininterval=1.0,
                            disable=None)  # a bar on a terminal only: log files get the log lines
        t = self.cfg.train
        self._emit("on_train_begin")
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
        self._emit("on_train_end")
        if self.step % t.eval_freq:
            self.evaluate()
        self.export_finished(final=True)
        for line in self.reporter.finished_lines(self):
            self.print(line)

    def train_step(self) -> List[str]:
        """One optimizer step: the schedule's next `accumulate_steps` micro-batches."""
        from ernie_mtl.forward import make_feed
        from ernie_mtl.randomness import DROPOUT_SEEDS, draw_dropout_seeds

        read = list(self.schedule.counts)  # per task: micro-batches read before this step
        drawn = [self.schedule.next_task() for _ in range(self.topo.accumulate_steps)]
        names = [self.tasks[i].spec.name for i in drawn]
        idle = self.freeze.feed(names)  # groups no drawn task uses: frozen by the update (on the device)
        extra = [self.p.lr] + ([self.p.loss_scaling] if self.p.loss_scaling is not None else [])
        w = self.window
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
            scalars = self.p.fwd.task_scalars[name]
            values = self.exe.run(self.p.main, feed=feed,
                                  fetch_list=[self.p.fwd.task_losses[name], *scalars.values(), *extra])
            values = [float(np.asarray(v).reshape(-1)[0]) for v in values]
            w.add_micro(name, values[0], dict(zip(scalars, values[1:1 + len(scalars)])),
                        tokens=int((np.asarray(batch["input_mask"]) == 0).sum()) * self.topo.data_world_size)
            lr_and_scale = values[1 + len(scalars):]
        self.p.lr_scheduler.step()
        if self.ema is not None:
            self.ema.update(self.exe, self.step)  # update number = steps completed before this one
        self.step += 1
        w.add_step(samples=sum(self.tasks[i].spec.batch_size for i in drawn) * self.topo.data_world_size,
                   lr=lr_and_scale[0], loss_scale=lr_and_scale[1] if len(lr_and_scale) > 1 else None)
        return names

    def log_window(self) -> None:
        lines, logs = self.reporter.window(self, self.window)
        for i, task in enumerate(self.tasks):  # e.g. samples read per corpus of a mixture
            logs.update(task.data_scalars(self.schedule.counts[i] * task.spec.batch_size * self.topo.data_world_size))
        for line in lines:
            self.print(line)
        self._emit("on_log", self.step, logs)
        self.window.reset()

    def _ema_swapped_in(self):
        """Evaluation and export with the averaged weights when use_ema (swapped on the device)."""
        return self.ema.swapped_in(self.exe) if self.ema is not None else contextlib.nullcontext()

    # -- evaluation ----------------------------------------------------------------------------
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
                t = self.task(name)
                local[name] = self.evaluate_split(t, self.plan.dev[name])
        results = self.barrier.share("evaluation", local)
        for name in names:
            self.evaluated_at[name] = self.step
            line, _ = self.reporter.metrics("eval", name, self.step, results[name])
            self.print(line)
            self._emit("on_evaluate", name, results[name])
        return results

    def evaluate_split(self, task, data) -> Dict[str, float]:
        """`task`'s metrics on `data` (all of it, or the first `eval_batches` batches of a corpus)."""
        limit = None if task.full_dev_eval else self.plan.eval_batches
        outputs = self.predict_split(task, data, limit=limit)
        used = data if limit is None else _Prefix(data, min(len(data), limit * task.spec.batch_size))
        return {k: float(v) for k, v in task.evaluate(used, outputs).items()}

    def predict_split(self, task, data, limit: Optional[int] = None) -> Dict[str, List[np.ndarray]]:
        """Prediction variables of `task` over `data` in order, per batch of its batch size (`limit`
        batches at most). Batch j runs on data rank j mod D; every rank runs the same number of
        batches (a rank without one re-runs batch 0 and drops it: under sharding all ranks must run
        the evaluation program together) and the outputs are gathered, so every rank returns all of
        them, each computed exactly as one process computes it."""
        from ernie_mtl.forward import make_feed

        preds = self.p.fwd.predictions[task.spec.name]
        names = list(preds)
        bs = task.spec.batch_size
        n_batches = -(-len(data) // bs)
        if limit is not None:
            n_batches = min(n_batches, limit)
        world = self.topo.data_world_size
        mine: Dict[int, Dict[str, np.ndarray]] = {}
        for round_ in range(-(-n_batches // world)):
            j = round_ * world + self.data_rank
            run_j = j if j < n_batches else 0
            batch = task.collate([data.get(x) for x in range(run_j * bs, min(run_j * bs + bs, len(data)))])
            feed = make_feed(self.tasks, task.spec.index, batch, use_task_id=self.setup.mtl.use_task_id)
            values = self.exe.run(self.p.test, feed=feed, fetch_list=[preds[n].name for n in names])
            if j < n_batches:
                mine[j] = {n: np.asarray(v) for n, v in zip(names, values)}
        gathered: Dict[int, Dict[str, np.ndarray]] = {}
        for part in self.barrier.gather("predictions", mine):
            gathered.update(part)
        return {n: [gathered[j][n] for j in range(n_batches)] for n in names}

    def test(self) -> Dict[str, Any]:
        """The final test evaluation: every target with a test split, with the final weights and with
        its best checkpoint's weights (when it has one); logged, written to VisualDL (`test/...`,
        `test_best/...`) and to `<output_dir>/test_results.json`."""
        tasks = [t for t in self.tasks if t.spec.name in self.plan.test]
        if not tasks:
            return {}
        data = self.plan.test  # read and checked before training (ernie_mtl/plan.py)
        results: Dict[str, Any] = {t.spec.name: {} for t in tasks}
        with self._ema_swapped_in():
            final = {t.spec.name: self.evaluate_split(t, data[t.spec.name]) for t in tasks}
        final = self.barrier.share("test", final)
        for t in tasks:
            results[t.spec.name]["last"] = {"step": self.step, "metrics": final[t.spec.name]}
        best = self._best_test(tasks, data)
        for name, entry in best.items():
            results[name]["best"] = entry
        for t in tasks:
            name = t.spec.name
            for which, prefix in (("last", "test"), ("best", "test_best")):
                if which not in results[name]:
                    continue
                entry = results[name][which]
                line, scalars = self.reporter.metrics(prefix, name, entry["step"], entry["metrics"],
                                                      what=f" ({which} weights, {len(data[name])} examples)")
                self.print(line)
                self.writer.scalars(self.step, scalars)
        if self.is_rank0:
            _write_json(Path(self.cfg.train.output_dir) / TEST_RESULTS, results)
        return results

    def _best_test(self, tasks, data) -> Dict[str, Any]:
        """Each task's test metrics with its best checkpoint's weights (loaded into the scope: the
        run is over, its last state is in model_last)."""
        import paddle

        out = {}
        for t in tasks:
            name = t.spec.name
            folder = Path(self.cfg.train.output_dir) / f"best_{name}"
            found = self.barrier.share("best exists", (folder / "train_state.json").is_file())
            if not found:
                continue
            step = json.loads((folder / "train_state.json").read_text(encoding="utf-8"))["step"]
            source = self.info.rank if self.topo.sharding_degree > 1 else 0
            paddle.static.load(self.p.main, str(folder / "state" / f"rank_{source}"), self.exe)
            with self._ema_swapped_in():
                metrics = self.evaluate_split(t, data[name])
            out[name] = {"step": step, "metrics": self.barrier.share("best test", metrics)}
        return out

    # -- finishing targets and exporting -----------------------------------------------------------
    def finish_task(self, name: str, reason: str) -> None:
        """End a target early (early stopping): it leaves the sampler, is no longer evaluated and is
        exported (its best weights). The run is then shorter than planned: unless --decay_steps was
        given, the LR decay is re-aimed at the new end (optim.WarmupLinearDecay.replan)."""
        self.schedule.finish(self.task(name).spec.index)
        self.print(f"task {name} finished at step {self.step}: {reason}")
        if self.cfg.optim.decay_steps is None:
            horizon = self.schedule.plan().total_steps
            if horizon != self.p.lr_scheduler.decay_steps:
                self.p.lr_scheduler.replan(horizon)
                self.print(f"the run now ends at step {horizon}: learning rate re-planned to reach "
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
            if t.exportable:
                self.export(t)
            else:
                note = self.reporter.note_unexportable(t, self.step)
                if note:
                    self.print(note)
            self.exported[t.spec.name] = self.step

    def export(self, task) -> Path:
        from ernie_mtl import export

        name = task.spec.name
        out = export.export_dir(self.cfg.train.output_dir, name)
        best = Path(self.cfg.train.output_dir) / f"best_{name}"
        choice = task.spec.export_from or ("best" if task.spec.dev_file else "last")
        source = "best" if choice == "best" and (best / "train_state.json").is_file() else "last"
        step = json.loads((best / "train_state.json").read_text(encoding="utf-8"))["step"] if source == "best" \
            else self.step
        source, step = self.barrier.share("export source", [source, step])  # rank 0 decides for all
        writer = functools.partial(export.export_task_model, out, program=self.p.forward, fwd=self.p.export_fwd,
                                   task=task, exe=self.exe, vocab_file=str(self.cfg.data.vocab_file),
                                   arch=self.p.arch, model_type=self.cfg.model.model_type,
                                   use_task_id=self.setup.mtl.use_task_id,
                                   extra={"step": step, "export_from": source, "best_metric": self._best_metric(name),
                                          "ema": self.ema is not None, "exported_by": "ernie_mtl",
                                          "plugins": list(self.setup.mtl.plugins)})
        if source == "best":
            self.barrier("export")  # every rank's files of the best checkpoint are complete
            if self.is_rank0:
                from ernie_mtl.checkpoint import verify_files

                verify_files(best)
                export.write_from_state(writer, export.merged_state(best / "state"), self.p.name_map,
                                        use_ema=self.ema is not None, place=self.exe.place)
        else:
            with self._ema_swapped_in():
                if self.topo.sharding_degree > 1 or self.p.amp_level == "O2":
                    state = export.gather_program_state(self.p.main, self.cfg.train.output_dir, name, self.info,
                                                        self.barrier, sharded=self.topo.sharding_degree > 1,
                                                        scope=self.scope)
                    if self.is_rank0:
                        export.write_from_state(writer, state, self.p.name_map, use_ema=self.ema is not None,
                                                place=self.exe.place)
                elif self.is_rank0:
                    export.write_from_scope(writer, self.scope)
        self.barrier("export")
        self.print(f"exported task {name} ({source} weights, step {step}) to {out}")
        self._emit("on_save", str(out))
        return out

    def _best_metric(self, name: str) -> Optional[Dict[str, Any]]:
        t = self.task(name)
        best = next((cb for cb in self.callbacks if isinstance(cb, BestCheckpoint)), None)
        if best is None or name not in best.best:
            return None
        return {"name": t.main_metric, "value": best.best[name], "step": best.steps.get(name)}

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        self.writer.close()


class _Prefix:
    """The first `n` examples of a TaskData (what an evaluation limited to some batches read)."""

    def __init__(self, data, n: int):
        self._data, self._n = data, n
        self.split, self.examples, self.has_labels = data.split, data.examples, data.has_labels
        self.features = _Head(data.features, n)

    def __len__(self) -> int:
        return self._n

    def get(self, index: int, epoch: int = 0):
        return self._data.get(index, epoch)


class _Head:
    def __init__(self, seq, n):
        self._seq, self._n = seq, n

    def __len__(self):
        return self._n

    def __getitem__(self, i):
        if not 0 <= i < self._n:
            raise IndexError(i)
        return self._seq[i]


def _write_json(path: Path, data: Mapping) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=True)
    os.replace(tmp, path)
