"""The training loop: one `Trainer` for flag-mode pretraining (one task, `pretrain`) and multi-task
runs alike. It reads like a table of contents; evaluation (ernie_mtl/engine/evaluation.py), export
(ernie_mtl/engine/exporter.py), checkpoints (ernie_mtl/checkpoint) and the train state
(ernie_mtl/engine/state.py) are components it calls.

Per optimizer step the schedule draws the task of each of the step's `slots_per_step` slots (the
micro-batches of all ranks), identically on every rank; each rank feeds its own slots' examples
(ernie_mtl/engine/feeding.py), the dropout seeds of (step, slot) and the idle-group flags of the
step; one `exe.run` per micro-batch, the update happening inside the program on the last one
(gradient merge, then the all-reduce). Logged
losses are rank 0's (not all-reduced); tokens/s counts rank 0's non-pad tokens times the
data-parallel size. Nothing is fetched per micro-batch: the losses are summed per task on the
device and fetched once per logging step (ernie_mtl/program/loss_sums.py).

Callbacks (ernie_mtl/engine/callbacks.py) receive the trainer and may read `step`, `schedule`,
`tasks`, `task(name)`, `plan`, `cfg`, `info`, `topo`, `is_rank0`, `p` (the programs), `scope`,
`freeze`, `evaluator`, `reporter`, `consumed_samples`, and call `finish_task`, `save_checkpoint`
and `print`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np

from ernie_mtl.checkpoint.layout import LAST, kept_name
from ernie_mtl.dist import preemption
from ernie_mtl.dist.watchdog import job_endpoints
from ernie_mtl.engine.anomaly import AnomalyPolicy
from ernie_mtl.engine.callbacks import Callback, built_in_callbacks
from ernie_mtl.engine.datapath import open_feeder
from ernie_mtl.engine.elastic import batch_ratio
from ernie_mtl.engine.feeding import MicroBatch
from ernie_mtl.engine.evaluation import Evaluator, final_test
from ernie_mtl.engine.exporter import Exporter
from ernie_mtl.engine.metrics import MetricWriter, Window
from ernie_mtl.engine.reporting import reporter_for
from ernie_mtl.engine.stragglers import StragglerWatch
from ernie_mtl.engine.state import ResumeState, clear_previous_run, restore, resume_checks, train_state


@dataclass
class PreparedStep:
    """An optimizer step drawn from the schedule, not yet trained: its tasks and micro-batches."""

    step: int  # optimizer steps completed before it
    drawn: List[int]  # task index of each slot (all ranks' micro-batches, ernie_mtl/program/randomness.slot_of)
    read: List[int]  # per task: slots read before this step
    micro: List[MicroBatch]  # this rank's micro-batches (its slots)


class Trainer:
    """The loop over optimizer steps of a `Session` (ernie_mtl/engine/session.py)."""

    def __init__(self, session, *, callbacks: Sequence[Callback] = (), preempt_signals: Sequence[str] = ()):
        s = self.session = session
        self.cfg, self.info, self.topo, self.plan = s.cfg, s.info, s.topo, s.plan
        self.p, self.exe, self.barrier, self.log, self.scope = s.programs, s.exe, s.barrier, s.log, s.scope
        self.setup, self.tasks, self.schedule = s.cfg.setup, s.plan.tasks, s.plan.schedule
        self.is_rank0, self.data_rank = s.is_rank0, s.data_rank
        self.freeze, self.ema = s.programs.freeze, s.programs.ema  # on the device (program/idle_heads.py, ema.py)
        self.group_of = {t: g.name for g in s.programs.groups for t in g.tasks}
        self.step = 0
        self.last_losses: Dict[str, float] = {}  # task -> its mean loss in the latest step (fetch_step_losses)
        self.fetch_step_losses = False  # fetch every micro-batch's loss (the stepped API): a sync per micro-batch
        self.evaluated_at: Dict[str, int] = {}  # task -> step of its latest evaluation
        self.latest_eval: Dict[str, Dict[str, float]] = {}  # task -> its latest dev metrics
        self.reporter = reporter_for(s.cfg)
        self.writer = MetricWriter(s.cfg.train.output_dir, enabled=self.is_rank0)
        self.window, self.bar = Window(), None
        self.evaluator, self.exporter = Evaluator(s), Exporter(self)
        self.feeder = open_feeder(s, log=self.print)  # in-process, or --num_workers processes (engine/datapath.py)
        self.callbacks: List[Callback] = built_in_callbacks(self.setup.mtl, self.writer) + list(callbacks)
        self.checkpointer = s.checkpointer(log=self.print)
        self.resume_checks = resume_checks(s.cfg, s.plan)
        self.signals, self.previous_handlers = tuple(preempt_signals), {}
        self.anomaly = AnomalyPolicy(self)
        t = s.cfg.train
        self.stragglers = StragglerWatch(s.barrier, s.info.rank, s.info.world_size, factor=t.slow_rank_factor,
                                         windows=t.slow_rank_windows, endpoints=job_endpoints())
        self.stop = preemption.StopAgreement(s.info.rank, s.info.world_size, s.barrier.store) if self.signals else None

    # -- the run -----------------------------------------------------------------------------------
    def run(self) -> Dict:
        """Resume (or start), train, test; returns the test results."""
        try:
            self.feeder.open()  # workers start up while the checkpoint loads
            self.resume()
            self.train()
            return final_test(self)
        finally:
            self.close()

    def resume(self) -> Optional[ResumeState]:
        state = restore(self.checkpointer, self.session.resume_from, self.topo, self.resume_checks,
                        continuation=self.session.continuation, sampler=self.plan.resume_sampler)
        if state is None:
            if self.cfg.train.resume == "none" and self.cfg.train.overwrite_output_dir:
                clear_previous_run(self.cfg.train.output_dir, is_rank0=self.is_rank0, barrier=self.barrier,
                                   writer=self.writer, log=self.print)
            self.print(self.reporter.new_run(self.cfg.train.output_dir))
            if self.session.warm_start:
                self.print(self.session.warm_start)
        else:
            self.continue_from(state)
            self.print(self.reporter.resumed(self, state.ref.path))
        return state

    def continue_from(self, state: ResumeState) -> None:
        self.step = state.step
        self.p.lr_scheduler.set_state_dict(state.lr_scheduler)
        if state.continuation is not None and state.continuation.kind == "batch_change":
            self.p.lr_scheduler.rebase(self.step, batch_ratio(state.continuation, self.topo))  # re-planned by samples
        self.schedule.load_state_dict(state.sampler)
        self.exporter.exported = dict(state.exported)
        for cb in self.callbacks:
            if type(cb).__name__ in state.callbacks:
                cb.load_state_dict(state.callbacks[type(cb).__name__])

    def train(self) -> None:
        self.start()
        while not self.schedule.done:
            self.advance()
        self.leave_loop()
        self.end()

    def leave_loop(self) -> None:
        """The loop is over: its preemption signals are no longer deferred to a step boundary (a signal
        from here on stops the process at once: ernie_mtl/dist/preemption.py). A request that came during
        the last step, on any rank, stops the run now with the final checkpoint saved (`Preempted`), before
        the last evaluation, exports and test."""
        preemption.restore(self.previous_handlers)
        self.previous_handlers = {}
        preemption.set_phase("the last evaluation, the exports and the final test (training is finished)")
        if self.stop is None:
            return
        pending = self.stop.pending()
        if self.info.world_size > 1:
            pending = self.barrier.share("preemption requested during the last step", pending)
        if pending:
            self.preempt(saved=True)

    def advance(self, prepared: Optional["PreparedStep"] = None) -> List[str]:
        """One optimizer step (`prepared`: the one `prepare_step` drew; default: draw it now) and what
        follows it: callbacks, logging, evaluation, exports and checkpoints that are due, then a stop
        the anomaly guard or a preemption signal asks for (`AnomalyStop`, `Preempted`)."""
        t = self.cfg.train
        drawn = self.train_step(prepared)
        self.emit("on_step_end", self.step, drawn)
        if self.bar is not None:
            self.bar.update(1)
        if self.step % t.logging_freq == 0 or self.schedule.done:
            self.log_window()
        with self.window.shared():  # every rank together: not a rank's own work (engine/stragglers.py)
            if self.step % t.eval_freq == 0:
                self.evaluate()
            self.exporter.export_due()
            if self.step % t.checkpoint_steps == 0 or self.schedule.done:
                self.save_checkpoint(LAST)
            if self.step % t.save_steps == 0:
                self.save_checkpoint(kept_name(self.step))
        self.anomaly.stop_now(saved=self.step % t.checkpoint_steps == 0 or self.schedule.done)
        if self.stop is not None and not self.schedule.done and self.stop.at_boundary(self.step):
            self.preempt(saved=self.step % t.checkpoint_steps == 0)
        return drawn

    def end(self) -> None:
        """After the last step: on_train_end, the last evaluation and the exports still due."""
        self.emit("on_train_end")
        if self.step % self.cfg.train.eval_freq:
            self.evaluate()
        self.exporter.export_due(final=True)
        for line in self.reporter.finished_lines(self) + [self.anomaly.summary()]:
            if line:
                self.print(line)

    def start(self) -> None:
        """The start-up lines, hyperparameters and progress bar (rank 0), then on_train_begin."""
        if self.is_rank0:
            self.bar = self.reporter.start(self)
        self.previous_handlers = preemption.install(self.signals)
        preemption.set_phase("training")
        self.anomaly.start()
        self.emit("on_train_begin")
        self.feeder.start(self.step, self.schedule)  # a background feeder plans ahead from here
        self.p.loss_sums.take(self.exe)  # a new window: its sums start at zero
        self.window.reset()

    # -- one step ------------------------------------------------------------------------------------
    def prepare_step(self) -> "PreparedStep":
        """Draw the next optimizer step from the schedule (a task for each of its `slots_per_step`
        slots, all ranks') and build this rank's `accumulate_steps` micro-batches of it (what
        `train_step` runs next). The schedule moves on: the step must be trained before another is drawn."""
        read = list(self.schedule.counts)  # per task: slots read before this step
        drawn = [self.schedule.next_task() for _ in range(self.topo.slots_per_step)]
        return PreparedStep(step=self.step, drawn=drawn, read=read,
                            micro=list(self.feeder.step(self.step, drawn, read)))

    def train_step(self, prepared: Optional["PreparedStep"] = None) -> List[str]:
        """One optimizer step: the schedule's next `slots_per_step` slots, this rank's
        `accumulate_steps` of them computed here (`prepared`: drawn by `prepare_step` for this step).
        Nothing is fetched: the losses are summed on the device (program/loss_sums.py) and read when
        logged, so on a GPU `exe.run` returns once the step is queued and the next feed is prepared
        meanwhile. With `fetch_step_losses` (the stepped API, engine/stepping.py) each micro-batch's
        loss is fetched too and `last_losses` holds the mean loss of each task this rank computed (a
        sync per micro-batch)."""
        prepared = prepared if prepared is not None else self.prepare_step()
        if prepared.step != self.step:
            raise ValueError(f"the micro-batches of step {prepared.step + 1} cannot train step {self.step + 1}: "
                             "train every prepared step once, in order")
        drawn = prepared.drawn
        replay = self.anomaly.policy == "replay"
        before = self.p.loss_sums.read(self.scope) if replay else None  # the device is idle here (after_step)
        records = self.run_micro_batches(prepared.micro)
        if self.anomaly.every_step:  # --on_anomaly stop / replay (engine/anomaly.py): a sync per step

            def rerun():  # the same feeds; the replay's losses replace the first attempt's in the window's sums
                self.p.loss_sums.restore(self.scope, before, self.exe.place)
                return self.run_micro_batches(prepared.micro)

            started, inside = time.perf_counter(), self.window.run_s
            records = self.anomaly.after_step(drawn, prepared.read, rerun) or records
            self.window.run_s = inside + time.perf_counter() - started  # waiting for the device's counter
        losses: Dict[str, List[float]] = {}
        for task, tokens, loss in records:
            self.window.add_micro(task, tokens=tokens)
            if loss is not None:
                losses.setdefault(task, []).append(loss)
        self.last_losses = {task: float(np.mean(v)) for task, v in losses.items()}
        self.p.lr_scheduler.step()
        if self.ema is not None:
            self.ema.update(self.exe, self.step)  # update number = steps completed before this one
        self.step += 1
        names = [self.tasks[i].spec.name for i in drawn]
        self.window.add_step(samples=sum(self.tasks[i].spec.batch_size for i in drawn), drawn=names)
        return names

    def run_micro_batches(self, micro_batches: Sequence[MicroBatch]) -> List:
        """Run this rank's micro-batches of the step; [(task, tokens, loss)] of each, the loss None
        unless `fetch_step_losses` (nothing is fetched then)."""
        records = []
        for micro in micro_batches:
            fetch = [self.p.fwd.task_losses[micro.task]] if self.fetch_step_losses else None
            started = time.perf_counter()
            values = self.exe.run(self.p.main, feed=micro.feed, fetch_list=fetch)
            self.window.run_s += time.perf_counter() - started
            records.append((micro.task, micro.tokens, float(np.asarray(values[0]).reshape(-1)[0]) if fetch else None))
        return records

    def log_window(self) -> None:
        started = time.perf_counter()
        taken = self.p.loss_sums.take(self.exe)  # the window's one fetch: waits for the device (program time)
        self.window.run_s += time.perf_counter() - started
        self.window.add_sums(taken.sums, self.p.loss_sums.columns, lr=taken.lr, loss_scale=taken.loss_scale)
        lines, logs = self.reporter.window(self, self.window)
        logs.update(self.anomaly.window({task: self.window.mean_loss(task) for task in self.window.count}))
        if self.stragglers.enabled:  # every rank, at the same steps
            w = self.window  # step times without the shared work (a checkpoint is not a slow step)
            scalars, warning = self.stragglers.window(w.steps, w.elapsed - w.shared_s, w.own_s)
            logs.update(scalars)
            if warning and self.is_rank0:
                self.log.warning(warning)
        for i, task in enumerate(self.tasks):  # e.g. samples read per corpus of a mixture
            logs.update(task.data_scalars(self.schedule.counts[i] * task.spec.batch_size))
        for line in lines:
            self.print(line)
        self.emit("on_log", self.step, logs)
        self.window.reset()

    # -- evaluation, checkpoints, finished targets ---------------------------------------------------
    def evaluate(self, only: Optional[Sequence[str]] = None) -> Dict[str, Dict[str, float]]:
        """Tasks with a dev file (every task but finished targets, or the tasks `only`); rank 0's
        metrics on every rank, so callbacks decide identically everywhere."""
        tasks = [t for t in self.tasks if t.spec.name in self.plan.dev and
                 (t.spec.name in only if only is not None else
                  not (t.spec.is_target and self.schedule.is_finished(t.spec.index)))]
        results = self.evaluator.evaluate(tasks, self.plan.dev, "evaluation")
        for t in tasks:
            name = t.spec.name
            self.evaluated_at[name], self.latest_eval[name] = self.step, results[name]
            self.print(self.reporter.metrics("eval", name, self.step, results[name])[0])
            self.emit("on_evaluate", name, results[name])
        return results

    def save_checkpoint(self, name: str, note: str = "") -> None:
        path = self.checkpointer.save(name, train_state(self))
        if note:
            self.print(f"{note}: {path}")
        self.emit("on_save", str(path))

    def preempt(self, *, saved: bool) -> None:
        """A preemption signal (ernie_mtl/dist/preemption.py): save model_last at this step on every rank
        (unless it was just saved), then stop the run with `Preempted`."""
        if not saved:
            self.save_checkpoint(LAST)
        path = str(self.checkpointer.root / LAST)
        signal_name = preemption.requested() or "TERM (on another rank)"
        self.print(f"preempted (SIG{signal_name}): stopped at step {self.step} with {path} saved; run the same "
                   "command again to resume")
        raise preemption.Preempted(self.step, signal_name, path)

    def finish_task(self, name: str, reason: str) -> None:
        """End a target early (early stopping): it leaves the sampler, is no longer evaluated and is
        exported (its best weights). The run is then shorter than planned: unless --decay_steps was
        given, the LR decay is re-aimed at the new end (program/optim.WarmupLinearDecay.replan)."""
        self.schedule.finish(self.task(name).spec.index)
        self.print(f"task {name} finished at step {self.step}: {reason}")
        if self.cfg.optim.decay_steps is None:
            horizon = self.schedule.plan().total_steps
            if horizon != self.p.lr_scheduler.decay_steps:
                self.p.lr_scheduler.replan(horizon)
                self.print(f"the run now ends at step {horizon}: learning rate re-planned to reach "
                           f"{self.cfg.optim.min_lr:g} there")

    # -- small accessors ---------------------------------------------------------------------------
    def task(self, name: str):
        return next(t for t in self.tasks if t.spec.name == name)

    @property
    def consumed_samples(self) -> int:
        """Training samples read so far by all ranks."""
        return int(sum(c * t.spec.batch_size for c, t in zip(self.schedule.counts, self.tasks)))

    @property
    def exported(self) -> Dict[str, int]:
        return self.exporter.exported

    def print(self, message: str) -> None:
        if self.is_rank0:
            self.log.info(message)

    _print = print  # callbacks written against the multi-task trainer call _print

    def emit(self, hook: str, *args) -> None:
        for cb in self.callbacks:
            getattr(cb, hook)(self, *args)

    def close(self) -> None:
        self.feeder.close()  # the data-loading workers exit (also when the run stops on a preemption signal)
        preemption.restore(self.previous_handlers)
        if self.bar is not None:
            self.bar.close()
        self.writer.close()
