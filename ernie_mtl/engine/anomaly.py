"""What the loop does about non-finite steps and loss spikes (`--on_anomaly`, `--loss_spike_factor`).

The program skips a step whose global gradient norm is not finite, on the device, and counts it
(ernie_mtl/program/anomaly.py): parameters and optimizer state stay bitwise as they were. On top:

- `skip` (default): the counter is read when the window is logged (no other host sync): the log
  line, `train/skipped_steps` in VisualDL and the final summary say how many steps were skipped.
- `stop`: the counter is read after every step; on the first skip, model_last is saved (the last
  good state: the bad update was skipped) and the run stops with `AnomalyStop` (exit status 77).
- `replay`: the counter is read after every step; a skipped step is run again from the same state
  with the same inputs and dropout masks (they are pure functions of the seed, the step and the
  micro-batch's slot). Skipped again: the data or the numerics are at fault: the step's sample ids and
  batches are written to `<output_dir>/anomalies/step_<n>_rank<r>.{json,npz}`, named in the log, and
  the step stays skipped. Finite the second time: a transient fault (hardware), logged as such; the
  replayed update is kept.

Loss spikes are reported, not acted on: a task's mean loss over a logging window above
`--loss_spike_factor` times its median over the previous windows (up to 20) gets a warning and
`train/<task>/loss_spike` = 1 in VisualDL.
"""
from __future__ import annotations

import statistics
from collections import deque
from pathlib import Path
from typing import Callable, Dict, List, Optional

import numpy as np

from ernie_mtl.program.anomaly import skipped_steps

EXIT_ANOMALY = 77  # documented in docs/launch.md: a non-finite step with --on_anomaly stop; the last good state saved
SPIKE_HISTORY = 20


class AnomalyStop(Exception):
    def __init__(self, step: int, path: str):
        super().__init__(f"step {step} was not finite (--on_anomaly stop): the last good state is saved in {path}; "
                         f"see the log above (exit status {EXIT_ANOMALY})")
        self.step, self.path = step, path


class AnomalyPolicy:
    def __init__(self, trainer):
        cfg = trainer.cfg.train
        self.t = trainer
        self.policy = cfg.on_anomaly if trainer.p.anomaly is not None else "none"
        self.spike_factor = cfg.loss_spike_factor
        self.seen = 0.0  # the counter as last read
        self.logged = 0.0  # the counter at the last logging step
        self.replayed: Dict[str, int] = {"transient": 0, "reproducible": 0}
        self.history: Dict[str, deque] = {}
        self.stop_at: Optional[int] = None  # --on_anomaly stop: the skipped step that ends the run

    def stop_now(self, saved: bool) -> None:
        """At the step boundary after a non-finite step under `stop`: save (the skipped update left the
        last good state) and stop."""
        if self.stop_at is None:
            return
        if not saved:
            self.t.save_checkpoint("model_last")
        raise AnomalyStop(self.stop_at, str(self.t.checkpointer.root / "model_last"))

    @property
    def every_step(self) -> bool:
        return self.policy in ("stop", "replay")

    def start(self) -> None:
        """At the start of the loop (after a resume): the counter the checkpoint carried."""
        self.seen = self.logged = skipped_steps(self.t.scope)
        if self.policy != "none" and self.t.cfg.optim.grad_clip <= 0:
            self.t.print(f"--grad_clip 0: no clipping; the global gradient norm is still computed for the anomaly "
                         f"guard (--on_anomaly {self.policy}; --on_anomaly none drops it)")

    def after_step(self, drawn: List[int], read: List[int], rerun: Callable[[], List]) -> Optional[List]:
        """Called after the step's micro-batches ran, before the step is counted (stop and replay only);
        returns the replay's records when the step was run again."""
        count = skipped_steps(self.t.scope)
        if count <= self.seen:
            return None
        t, step = self.t, self.t.step + 1
        if self.policy == "stop":
            self.seen, self.stop_at = count, step
            t.print(f"step {step} is not finite (global gradient norm NaN or infinite): its update was skipped; "
                    "--on_anomaly stop saves the last good state and stops")
            return None
        records = rerun()
        again = skipped_steps(t.scope)
        if again > count:
            self.seen = again
            self.replayed["reproducible"] += 1
            path = self.dump(step, drawn, read)
            t.log.warning(f"step {step} is not finite, and again when replayed from the same state with the same "
                          f"inputs: the data or the numerics are at fault; the step is skipped and its batches are in "
                          f"{path}")
        else:
            self.seen = count  # the first attempt's skip stays counted; the replay's update is kept
            self.replayed["transient"] += 1
            t.log.warning(f"step {step} was not finite but its replay from the same state with the same inputs is: "
                          "a transient fault (hardware?); the replayed update is kept")
        return records

    def dump(self, step: int, drawn: List[int], read: List[int]) -> Path:
        """The step's micro-batches on this rank: sample ids (stream positions and epochs) and the feeds."""
        t = self.t
        folder = Path(t.cfg.train.output_dir) / "anomalies"
        folder.mkdir(parents=True, exist_ok=True)
        micro, arrays = [], {}
        for m, mb in enumerate(t.feeder.step(t.step, drawn, read)):  # `drawn` is every rank's slots: this rank's
            micro.append({"task": mb.task, "slot": mb.slot, "samples": [list(map(int, p)) for p in mb.examples]})
            arrays.update({f"micro{m}.{k}": np.asarray(v) for k, v in mb.feed.items()})
        rank = t.info.rank
        np.savez(folder / f"step_{step}_rank{rank}.npz", **arrays)
        from ernie_mtl.checkpoint.io import write_json_atomic

        return write_json_atomic(folder / f"step_{step}_rank{rank}.json",
                                 {"step": step, "rank": rank, "micro_batches": micro,
                                  "feeds": f"step_{step}_rank{rank}.npz"})

    def window(self, losses: Dict[str, float]) -> Dict[str, float]:
        """At a logging step (every rank): the scalars, and the lines for the log (rank 0 prints)."""
        scalars: Dict[str, float] = {}
        t = self.t
        if self.policy != "none":
            count = skipped_steps(t.scope)
            scalars["train/skipped_steps"] = count
            if count > self.logged:
                t.print(f"skipped {count - self.logged:g} non-finite step(s) in this window ({count:g} in all; "
                        "parameters and optimizer state untouched by them)")
            self.logged = self.seen = max(self.seen, count)
        for task, loss in losses.items():
            past = self.history.setdefault(task, deque(maxlen=SPIKE_HISTORY))
            if self.spike_factor and len(past) >= 3 and np.isfinite(loss):
                median = statistics.median(past)
                spike = median > 0 and loss > self.spike_factor * median
                scalars[f"train/{task}/loss_spike"] = float(spike)
                if spike:
                    t.print(f"warning: loss spike in task {task}: {loss:.4f} over this window, {loss / median:.1f}x "
                            f"its median {median:.4f} over the previous {len(past)} windows")
            if np.isfinite(loss):
                past.append(loss)
        return scalars

    def summary(self) -> Optional[str]:
        if self.policy == "none":
            return None
        count = skipped_steps(self.t.scope)
        text = f"anomaly guard ({self.policy}): {count:g} non-finite step(s) skipped"
        if self.policy == "replay":
            text += (f"; replayed {self.replayed['transient'] + self.replayed['reproducible']}: "
                     f"{self.replayed['transient']} transient, {self.replayed['reproducible']} reproducible")
        return text
