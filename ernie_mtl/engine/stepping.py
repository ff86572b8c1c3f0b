"""A training run driven one optimizer step at a time by its caller (PALM's `train_one_step` and
`get_one_batch`, a notebook): the same `Trainer` as `engine.run.train`, in the same order.

    run = SteppedRun(cfg)                 # open_session + Trainer + resume + start-up lines
    while not run.done:
        batch = run.next_batch()          # optional: look at the step's micro-batches first
        losses = run.step(batch)          # {task: mean loss}; logging, evaluation, checkpoints as due
    result = run.finish()                 # last evaluation, exports, final test -> RunResult

`engine.run.train(cfg)` is the same sequence (`Trainer.run`: resume, start, `advance` until the
schedule is done, `end`, final test, close), so a stepped run trains, saves and resumes exactly as
the command line does. Batches come from the run's seeded schedule (exact resume depends on it):
a drawn batch must be trained before the next is drawn, and only the batch drawn can be trained.
The loop's guards act as in `engine.run.train`: straggler windows, the anomaly policy (`AnomalyStop`
from `step`), and preemption when `preempt_signals` are given (`Preempted` from `step`; the caller's
handlers come back at `close`). A step that raises closes the run, as `Trainer.run` does.
Unlike `engine.run.train`, each micro-batch's loss is fetched (`step` returns the step's losses):
a device sync per micro-batch, which a notebook or a PALM script does not notice.

Between calls Paddle is left as the caller had it: each call enters static mode in the run's own
scope and restores the caller's mode; the flags the topology sets are restored by `finish`/`close`.
"""
from __future__ import annotations

import contextlib
from typing import Dict, Iterator, Optional, Sequence

from ernie_mtl.engine.run import RunResult, run_result


class SteppedRun:
    """A run of `cfg` (a validated RunConfig) opened for stepping; see the module docstring."""

    def __init__(self, cfg, *, callbacks: Sequence = (), on_distributed=None, preempt_signals: Sequence[str] = ()):
        import paddle

        from ernie_mtl.engine.callbacks import Callback
        from ernie_mtl.engine.loop import Trainer
        from ernie_mtl.engine.session import open_session

        for cb in callbacks:
            if not isinstance(cb, Callback):
                raise TypeError(f"callbacks: {cb!r} is not an ernie_mtl Callback instance")
        from ernie_mtl.dist.topology import RUN_FLAGS

        self._flags = paddle.get_flags(list(RUN_FLAGS))
        self.pending = None  # the PreparedStep drawn by next_batch and not trained yet
        self.result: Optional[RunResult] = None
        self.closed = False
        with self._active(scope=False):
            self.session = open_session(cfg, on_distributed=on_distributed)
        try:
            with self._active():
                self.trainer = Trainer(self.session, callbacks=callbacks, preempt_signals=preempt_signals)
                self.trainer.fetch_step_losses = True  # step() returns them: a fetch (sync) per micro-batch
                self.trainer.resume()
                self.trainer.start()
        except BaseException:
            self._release()
            raise

    # -- state ------------------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        """Whether the schedule is over (every target reached its quota, or max_steps)."""
        return self.trainer.schedule.done

    @property
    def steps(self) -> int:
        """Optimizer steps completed (a resumed run starts at its checkpoint's step)."""
        return self.trainer.step

    # -- stepping ---------------------------------------------------------------------------------
    def next_batch(self):
        """The next step's `PreparedStep` (tasks drawn, micro-batches built), drawn from the schedule.
        Asking again before it is trained returns the same step."""
        self._check_open()
        if self.pending is None:
            if self.done:
                raise RuntimeError(f"the run is over after {self.steps} steps: there is no next batch")
            with self._active():
                self.pending = self.trainer.prepare_step()
        return self.pending

    def step(self, prepared=None) -> Dict[str, float]:
        """Train one optimizer step (`prepared`: the batch `next_batch` returned; default: the next one)
        and do what is due after it (callbacks, logs, evaluation, exports, checkpoints). Returns the
        mean loss of each task drawn in the step, over this process's slots of it (on one process:
        all of them)."""
        self._check_open()
        if prepared is not None and prepared is not self.pending:
            raise ValueError("this batch is not the run's next one: train the batches next_batch() returns, each "
                             "once and in order (the run's seeded schedule decides them, so that resume is exact)")
        prepared = prepared if prepared is not None else self.next_batch()
        try:
            with self._active():
                self.trainer.advance(prepared)
        except BaseException:  # as Trainer.run: a step that raised (AnomalyStop, Preempted, an error) ends the run
            self.close()
            raise
        finally:
            self.pending = None
        return dict(self.trainer.last_losses)

    def finish(self) -> RunResult:
        """End the run: the last evaluation and exports, the final test, the closing line; the
        `RunResult` (the same as `engine.run.train` returns). Steps not taken stay untaken."""
        if self.result is not None:
            return self.result
        self._check_open()
        if self.pending is not None:
            raise RuntimeError(f"step {self.pending.step + 1} was drawn (next_batch) but not trained; train it first")
        try:
            with self._active():
                self.trainer.end()
                test = self.trainer.final_test()
        finally:
            self.close()
        self.session.log.info(self.trainer.reporter.closing(self.session.cfg.train.output_dir))
        self.result = run_result(self.trainer, test)
        return self.result

    def close(self) -> None:
        """Release the run without finishing it (logs closed, flags restored); idempotent."""
        if self.closed:
            return
        try:
            with self._active():
                self.trainer.close()
        finally:
            self._release()

    # -- helpers ----------------------------------------------------------------------------------
    def _release(self) -> None:
        import paddle

        self.closed = True
        paddle.set_flags(self._flags)

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("the run is closed")

    @contextlib.contextmanager
    def _active(self, scope: bool = True) -> Iterator[None]:
        """Static mode (and this run's scope) for the block; the caller's mode afterwards."""
        import paddle

        from ernie_mtl.engine.run import static_mode_restored

        with static_mode_restored():
            paddle.enable_static()
            if scope:
                with self.session.scope_guard():
                    yield
            else:
                yield
