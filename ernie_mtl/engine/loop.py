"""The training loop: one `Trainer` for flag-mode pretraining (one task, `pretrain`) and multi-task
runs alike. It reads like a table of contents; its collaborators get what they need, never the
trainer: evaluation (engine/evaluation.py), export (engine/exporter.py), the anomaly policy
(engine/anomaly.py), preemption and the one stop request both post (engine/stops.py), the reporter
(engine/reporting.py), the checkpointer, which decides when a save is due (checkpoint/store.py), and
the train state, which the stateful components give and take back (engine/state.py).

Per optimizer step the schedule draws the task of each of the step's `slots_per_step` slots (the
micro-batches of all ranks), identically on every rank; each rank feeds its own slots' examples
(engine/step_feeds.py, or the data-loading workers: engine/data_workers.py), the dropout seeds of (step, slot)
and the idle-group flags of the step; one `exe.run` per micro-batch, the update happening inside the
program on the last one (gradient merge, then the all-reduce). Logged losses are rank 0's (not
all-reduced); tokens/s counts rank 0's non-pad tokens times the data-parallel size. Nothing is fetched
per micro-batch: the losses are summed per task on the device and fetched once per logging step
(program/loss_sums.py).

Callbacks (engine/callbacks.py) receive the trainer and may read `step`, `schedule`, `tasks`,
`task(name)`, `plan`, `cfg`, `info`, `topo`, `is_rank0`, `programs`, `exe`, `scope`, `freeze`,
`evaluator`, `reporter`, `writer`, `feeder`, `consumed_samples`, `latest_eval`, and call `finish_task`,
`save_checkpoint`, `evaluate` and `print`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from ernie_mtl.checkpoint.layout import LAST
from ernie_mtl.dist.watchdog import job_endpoints
from ernie_mtl.engine.anomaly import AnomalyPolicy
from ernie_mtl.engine.callbacks import BestCheckpoint, Callback, built_in_callbacks
from ernie_mtl.engine.data_workers import open_feeder
from ernie_mtl.engine.elastic import batch_ratio
from ernie_mtl.engine.evaluation import Evaluator, final_test
from ernie_mtl.engine.exporter import Exporter
from ernie_mtl.engine.step_feeds import MicroBatch
from ernie_mtl.engine.metrics import MetricWriter, Window
from ernie_mtl.engine.reporting import consumed_samples, reporter_for
from ernie_mtl.engine.session import Session
from ernie_mtl.engine.state import LRState, ResumeState, Stateful, clear_previous_run, restore, train_state
from ernie_mtl.engine.stops import Preemption, StopRequests
from ernie_mtl.engine.stragglers import StragglerWatch


@dataclass
class PreparedStep:
    """An optimizer step drawn from the schedule, not yet trained: its tasks and micro-batches."""

    step: int  # optimizer steps completed before it
    drawn: List[int]  # task index of each slot (all ranks' micro-batches, ernie_mtl/program/randomness.slot_of)
    read: List[int]  # per task: slots read before this step
    micro: List[MicroBatch]  # this rank's micro-batches (its slots)


class Trainer:
    """The loop over optimizer steps of a `Session` (ernie_mtl/engine/session.py)."""

    def __init__(self, session: Session, *, callbacks: Sequence[Callback] = (), preempt_signals: Sequence[str] = ()):
        self.session = session
        cfg, info = session.cfg, session.info
        self.step = 0
        self.last_losses: Dict[str, float] = {}  # task -> its mean loss in the latest step (fetch_step_losses)
        self.fetch_step_losses = False  # fetch every micro-batch's loss (the stepped API): a sync per micro-batch
        self.evaluated_at: Dict[str, int] = {}  # task -> step of its latest evaluation
        self.latest_eval: Dict[str, Dict[str, float]] = {}  # task -> its latest dev metrics
        self.reporter = reporter_for(session)
        self.writer = MetricWriter(cfg.train.output_dir, enabled=session.is_rank0)
        self.window, self.bar = Window(), None
        self.checkpointer = session.checkpointer(log=self.print)
        self.callbacks = built_in_callbacks(cfg.setup.mtl, self.writer)
        self.callbacks.extend(callbacks)
        self.evaluator = Evaluator(session)
        self.exporter = Exporter(session, checkpointer=self.checkpointer, evaluator=self.evaluator,
                                 best=self.callbacks.find(BestCheckpoint))
        self.feeder = open_feeder(session, log=self.print)  # in-process, or --num_workers processes
        self.stops = StopRequests()
        self.anomaly = AnomalyPolicy(cfg.train, guard=session.programs.anomaly, scope=session.scope, stops=self.stops,
                                     say=self.print, warn=session.log.warning, output_dir=cfg.train.output_dir,
                                     rank=info.rank, grad_clip=cfg.optim.grad_clip)
        self.preemption = Preemption(preempt_signals, rank=info.rank, world_size=info.world_size,
                                     store=session.barrier.store, share=session.barrier.share)
        self.stragglers = StragglerWatch(session.barrier, info.rank, info.world_size, factor=cfg.train.slow_rank_factor,
                                         windows=cfg.train.slow_rank_windows, endpoints=job_endpoints())
        # what a checkpoint carries besides the program state, each part given and taken back by its owner
        self.stateful: Dict[str, Stateful] = {
            "sampler": session.plan.schedule, "lr_scheduler": LRState(session.programs.lr_scheduler),
            "exported": self.exporter, "callbacks": self.callbacks}

    # -- the run -----------------------------------------------------------------------------------
    def run(self) -> Dict:
        """Resume (or start), train, test; returns the test results."""
        try:
            self.feeder.open()  # workers start up while the checkpoint loads
            self.resume()
            self.train()
            return self.final_test()
        finally:
            self.close()

    def resume(self) -> Optional[ResumeState]:
        s = self.session
        state = restore(self.checkpointer, s.resume_from, s.topo, s.resume_checks, continuation=s.continuation,
                        sampler=s.plan.resume_sampler)
        if state is None:
            if s.cfg.train.resume == "none" and s.cfg.train.overwrite_output_dir:
                clear_previous_run(s.cfg.train.output_dir, is_rank0=s.is_rank0, barrier=s.barrier,
                                   writer=self.writer, log=self.print)
            self.print(self.reporter.new_run(s.cfg.train.output_dir))
            if s.warm_start:
                self.print(s.warm_start)
            return None
        self.step = state.step
        state.apply(self.stateful)
        if state.continuation is not None and state.continuation.kind == "batch_change":  # the LR re-planned by samples
            self.programs.lr_scheduler.rebase(self.step, batch_ratio(state.continuation, s.topo))
        self.print(self.reporter.resumed(self.step, state.ref.path))
        return state

    def train(self) -> None:
        self.start()
        while not self.schedule.done:
            self.advance()
        self.leave_loop()
        self.end()

    def start(self) -> None:
        """The start-up lines, hyperparameters and progress bar (rank 0), then on_train_begin."""
        if self.is_rank0:
            self.bar = self.reporter.start(self.step, self.writer)
        self.preemption.start()
        self.anomaly.start()
        self.emit("on_train_begin")
        self.feeder.start(self.step, self.schedule)  # a background feeder plans ahead from here
        self.programs.loss_sums.take(self.exe)  # a new window: its sums start at zero
        self.window.reset()

    def advance(self, prepared: Optional[PreparedStep] = None) -> List[str]:
        """One optimizer step (`prepared`: the one `prepare_step` drew; default: draw it now) and what
        is due after it: callbacks, logging, evaluation, exports, checkpoints, then a requested stop."""
        drawn = self.train_step(prepared)
        self.emit("on_step_end", self.step, drawn)
        if self.bar is not None:
            self.bar.update(1)
        if self.step % self.cfg.train.logging_freq == 0 or self.schedule.done:
            self.log_window()
        with self.window.shared():  # every rank together: not a rank's own work (engine/stragglers.py)
            if self.step % self.cfg.train.eval_freq == 0:
                self.evaluate()
            self.export_due()
            for name in self.checkpointer.due(self.step, done=self.schedule.done):
                self.save_checkpoint(name)
        if not self.schedule.done:
            stop = self.preemption.at_boundary(self.step)
            if stop is not None:
                self.stops.request(stop)
        self.stop_if_requested()
        return drawn

    def leave_loop(self) -> None:
        """The loop is over: preemption signals stop the process at once again (dist/preemption.py); one
        that came during the last step stops the run now, before the last evaluation, exports and test."""
        stop = self.preemption.after_loop()
        if stop is not None:
            self.stops.request(stop)
        self.stop_if_requested()

    def end(self) -> None:
        """After the last step: on_train_end, the last evaluation and the exports still due."""
        self.emit("on_train_end")
        if self.step % self.cfg.train.eval_freq:
            self.evaluate()
        self.export_due(final=True)
        for line in self.reporter.finished_lines(self.step) + [self.anomaly.summary()]:
            if line:
                self.print(line)

    def final_test(self) -> Dict[str, Any]:
        def report(prefix: str, task: str, step: int, metrics: Dict[str, float], what: str) -> None:
            line, scalars = self.reporter.metrics(prefix, task, step, metrics, what=what)
            self.print(line)
            self.writer.scalars(self.step, scalars)

        return final_test(self.session, self.evaluator, self.checkpointer, step=self.step, report=report)

    def close(self) -> None:
        self.feeder.close()  # the data-loading workers exit (also when the run stops on a signal)
        self.preemption.restore()
        if self.bar is not None:
            self.bar.close()
        self.writer.close()

    # -- one step ------------------------------------------------------------------------------------
    def prepare_step(self) -> PreparedStep:
        """Draw the next optimizer step from the schedule (a task for each of its `slots_per_step` slots,
        all ranks') and build this rank's `accumulate_steps` micro-batches of it (what `train_step` runs
        next). The schedule moves on: the step must be trained before another is drawn."""
        read = list(self.schedule.counts)  # per task: slots read before this step
        drawn = [self.schedule.next_task() for _ in range(self.topo.slots_per_step)]
        return PreparedStep(step=self.step, drawn=drawn, read=read,
                            micro=list(self.feeder.step(self.step, drawn, read)))

    def train_step(self, prepared: Optional[PreparedStep] = None) -> List[str]:
        """One optimizer step: the schedule's next `slots_per_step` slots, this rank's `accumulate_steps`
        of them computed here (`prepared`: drawn by `prepare_step` for this step). Nothing is fetched:
        the losses are summed on the device and read when logged, so on a GPU `exe.run` returns once the
        step is queued. With `fetch_step_losses` (the stepped API, engine/stepping.py) each micro-batch's
        loss is fetched and `last_losses` holds the mean loss of each task this rank computed."""
        prepared = prepared if prepared is not None else self.prepare_step()
        if prepared.step != self.step:
            raise ValueError(f"the micro-batches of step {prepared.step + 1} cannot train step {self.step + 1}: "
                             "train every prepared step once, in order")
        replay = self.anomaly.policy == "replay"
        before = self.programs.loss_sums.read(self.scope) if replay else None  # the device is idle here (after a step)
        records = self.run_micro_batches(prepared.micro)
        if self.anomaly.every_step:  # --on_anomaly stop / replay: a sync per step

            def rerun():  # the same feeds; the replay's losses replace the first attempt's in the window's sums
                self.programs.loss_sums.restore(self.scope, before, self.exe.place)
                return self.run_micro_batches(prepared.micro)

            with self.window.in_program():  # mostly waiting for the device's counter
                records = self.anomaly.after_step(self.step + 1, prepared.micro, rerun) or records
        losses: Dict[str, List[float]] = {}
        for task, tokens, loss in records:
            self.window.add_micro(task, tokens=tokens)
            if loss is not None:
                losses.setdefault(task, []).append(loss)
        self.last_losses = {task: float(np.mean(v)) for task, v in losses.items()}
        self.programs.lr_scheduler.step()
        if self.programs.ema is not None:
            self.programs.ema.update(self.exe, self.step)  # update number = steps completed before this one
        self.step += 1
        names = [self.tasks[i].spec.name for i in prepared.drawn]
        self.window.add_step(samples=sum(self.tasks[i].spec.batch_size for i in prepared.drawn), drawn=names)
        return names

    def run_micro_batches(self, micro_batches: Sequence[MicroBatch]) -> List:
        """Run this rank's micro-batches of the step; [(task, tokens, loss)] of each, the loss None
        unless `fetch_step_losses` (nothing is fetched then)."""
        records = []
        for micro in micro_batches:
            fetch = [self.programs.fwd.task_losses[micro.task]] if self.fetch_step_losses else None
            with self.window.in_program():
                values = self.exe.run(self.programs.main, feed=micro.feed, fetch_list=fetch)
            records.append((micro.task, micro.tokens, float(np.asarray(values[0]).reshape(-1)[0]) if fetch else None))
        return records

    def log_window(self) -> None:
        with self.window.in_program():
            taken = self.programs.loss_sums.take(self.exe)  # the window's one fetch: waits for the device
        w = self.window
        w.add_sums(taken.sums, self.programs.loss_sums.columns, lr=taken.lr, loss_scale=taken.loss_scale)
        lines, logs = self.reporter.window(self.step, w)
        logs.update(self.anomaly.window({task: w.mean_loss(task) for task in w.count}))
        if self.stragglers.enabled:  # every rank, at the same steps; a checkpoint is not a slow step
            scalars, warning = self.stragglers.window(w.steps, w.elapsed - w.shared_s, w.own_s)
            logs.update(scalars)
            if warning and self.is_rank0:
                self.session.log.warning(warning)
        for i, task in enumerate(self.tasks):  # e.g. samples read per corpus of a mixture
            logs.update(task.data_scalars(self.schedule.counts[i] * task.spec.batch_size))
        for line in lines:
            self.print(line)
        self.emit("on_log", self.step, logs)
        w.reset()

    # -- evaluation, exports, checkpoints, stops, finished targets -----------------------------------
    def evaluate(self, only: Optional[Sequence[str]] = None) -> Dict[str, Dict[str, float]]:
        """Tasks with a dev file (every task but finished targets, or the tasks `only`); rank 0's
        metrics on every rank, so callbacks decide identically everywhere."""
        tasks = [candidate for candidate in self.tasks if candidate.spec.name in self.plan.dev and
                 (candidate.spec.name in only if only is not None else
                  not (candidate.spec.is_target and self.schedule.is_finished(candidate.spec.index)))]
        results = self.evaluator.evaluate(tasks, self.plan.dev, "evaluation")
        for task in tasks:
            name = task.spec.name
            self.evaluated_at[name], self.latest_eval[name] = self.step, results[name]
            self.print(self.reporter.metrics("eval", name, self.step, results[name])[0])
            self.emit("on_evaluate", name, results[name])
        return results

    def export_due(self, final: bool = False) -> None:
        """Export every due target (finished, or every one at the end), after a last evaluation of those
        with a dev file that were not evaluated at this step."""
        due = self.exporter.due(final)
        last = [due_task.spec.name for due_task in due
                if due_task.spec.name in self.plan.dev and self.evaluated_at.get(due_task.spec.name) != self.step]
        if last:
            self.evaluate(only=last)
        for task in due:
            if not task.exportable:
                self.exporter.skip(task, self.step)
                note = self.reporter.note_unexportable(task, self.step)
                if note:
                    self.print(note)
                continue
            path, line = self.exporter.export(task, self.step)
            self.print(line)
            self.emit("on_save", str(path))

    def save_checkpoint(self, name: str, note: str = "") -> None:
        path = self.checkpointer.save(name, train_state(self.session, step=self.step, components=self.stateful))
        if note:
            self.print(f"{note}: {path}")
        self.emit("on_save", str(path))

    def stop_if_requested(self) -> None:
        """A stop the anomaly policy or preemption asked for (engine/stops.py): model_last of this step saved
        (unless it just was), the stop's line, its exception."""
        stop = self.stops.take()
        if stop is None:
            return
        if self.checkpointer.saved_at.get(LAST) != self.step:
            self.save_checkpoint(LAST)
        path = str(self.checkpointer.root / LAST)
        if stop.line is not None:
            self.print(stop.line(self.step, path))
        raise stop.error(self.step, path)

    def finish_task(self, name: str, reason: str) -> None:
        """End a target early (early stopping): it leaves the sampler, is no longer evaluated and is
        exported (its best weights). The run is then shorter than planned: unless --decay_steps was
        given, the LR decay is re-aimed at the new end (program/optim.WarmupLinearDecay.replan)."""
        self.schedule.finish(self.task(name).spec.index)
        self.print(f"task {name} finished at step {self.step}: {reason}")
        if self.cfg.optim.decay_steps is None:
            horizon = self.schedule.plan().total_steps
            if horizon != self.programs.lr_scheduler.decay_steps:
                self.programs.lr_scheduler.replan(horizon)
                self.print(f"the run now ends at step {horizon}: learning rate re-planned to reach "
                           f"{self.cfg.optim.min_lr:g} there")

    # -- what callbacks read (the session's, by the names they have always had) ----------------------
    @property
    def cfg(self):
        return self.session.cfg

    @property
    def setup(self):
        return self.session.cfg.setup

    @property
    def info(self):
        return self.session.info

    @property
    def topo(self):
        return self.session.topo

    @property
    def plan(self):
        return self.session.plan

    @property
    def tasks(self):
        return self.session.plan.tasks

    @property
    def schedule(self):
        return self.session.plan.schedule

    @property
    def programs(self):
        return self.session.programs

    @property
    def exe(self):
        return self.session.exe

    @property
    def scope(self):
        return self.session.scope

    @property
    def log(self):
        return self.session.log

    @property
    def is_rank0(self) -> bool:
        return self.session.is_rank0

    @property
    def freeze(self):
        return self.session.programs.freeze

    @property
    def consumed_samples(self) -> int:
        """Training samples read so far by all ranks."""
        return consumed_samples(self.session.plan)

    @property
    def exported(self) -> Dict[str, int]:
        return self.exporter.exported

    def task(self, name: str):
        return next(task for task in self.tasks if task.spec.name == name)

    def print(self, message: str) -> None:
        if self.session.is_rank0:
            self.session.log.info(message)

    _print = print  # callbacks written against the multi-task trainer call _print

    def emit(self, hook: str, *args) -> None:
        self.callbacks.emit(hook, self, *args)
