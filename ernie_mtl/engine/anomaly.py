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
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from ernie_mtl.engine.stops import Stop
from ernie_mtl.program.anomaly import skipped_steps

EXIT_ANOMALY = 77  # documented in docs/launch.md: a non-finite step with --on_anomaly stop; the last good state saved
SPIKE_HISTORY = 20


class AnomalyStop(Exception):
    def __init__(self, step: int, path: str):
        super().__init__(f"step {step} was not finite (--on_anomaly stop): the last good state is saved in {path}; "
                         f"see the log above (exit status {EXIT_ANOMALY})")
        self.step, self.path = step, path


class AnomalyPolicy:
    """The loop's side of the anomaly guard (module docstring). It reads the program's counter from
    `scope`, logs through `say` (rank 0's lines) and `warn`, posts a `Stop` to `stops` under `stop`, and
    writes a reproducible bad step's batches under `output_dir/anomalies/`."""

    def __init__(self, train_cfg, *, guard, scope, stops, say: Callable[[str], None], warn: Callable[[str], None],
                 output_dir: str, rank: int, grad_clip: float):
        self.policy = train_cfg.on_anomaly if guard is not None else "none"
        self.spike_factor = train_cfg.loss_spike_factor
        self.scope, self.stops, self.say, self.warn = scope, stops, say, warn
        self.output_dir, self.rank, self.grad_clip = output_dir, rank, grad_clip
        self.seen = 0.0  # the counter as last read
        self.logged = 0.0  # the counter at the last logging step
        self.replayed: Dict[str, int] = {"transient": 0, "reproducible": 0}
        self.history: Dict[str, deque] = {}

    @property
    def every_step(self) -> bool:
        return self.policy in ("stop", "replay")

    def start(self) -> None:
        """At the start of the loop (after a resume): the counter the checkpoint carried."""
        self.seen = self.logged = skipped_steps(self.scope)
        if self.policy != "none" and self.grad_clip <= 0:
            self.say(f"--grad_clip 0: no clipping; the global gradient norm is still computed for the anomaly "
                     f"guard (--on_anomaly {self.policy}; --on_anomaly none drops it)")

    def after_step(self, step: int, micro: Sequence, rerun: Callable[[], List]) -> Optional[List]:
        """Called after optimizer step `step`'s micro-batches `micro` ran (stop and replay only); returns the
        replay's records when the step was run again."""
        count = skipped_steps(self.scope)
        if count <= self.seen:
            return None
        if self.policy == "stop":
            self.seen = count
            self.say(f"step {step} is not finite (global gradient norm NaN or infinite): its update was skipped; "
                     "--on_anomaly stop saves the last good state and stops")
            self.stops.request(Stop("anomaly", error=lambda _, path: AnomalyStop(step, path)))
            return None
        records = rerun()
        again = skipped_steps(self.scope)
        if again > count:
            self.seen = again
            self.replayed["reproducible"] += 1
            path = self.dump(step, micro)
            self.warn(f"step {step} is not finite, and again when replayed from the same state with the same "
                      f"inputs: the data or the numerics are at fault; the step is skipped and its batches are in "
                      f"{path}")
        else:
            self.seen = count  # the first attempt's skip stays counted; the replay's update is kept
            self.replayed["transient"] += 1
            self.warn(f"step {step} was not finite but its replay from the same state with the same inputs is: "
                      "a transient fault (hardware?); the replayed update is kept")
        return records

    def dump(self, step: int, micro: Sequence) -> Path:
        """The step's micro-batches on this rank: sample ids (stream positions and epochs) and the feeds."""
        folder = Path(self.output_dir) / "anomalies"
        folder.mkdir(parents=True, exist_ok=True)
        batches, arrays = [], {}
        for m, mb in enumerate(micro):
            batches.append({"task": mb.task, "slot": mb.slot, "samples": [list(map(int, p)) for p in mb.examples]})
            arrays.update({f"micro{m}.{k}": np.asarray(v) for k, v in mb.feed.items()})
        np.savez(folder / f"step_{step}_rank{self.rank}.npz", **arrays)
        from ernie_mtl.checkpoint.io import write_json_atomic

        return write_json_atomic(folder / f"step_{step}_rank{self.rank}.json",
                                 {"step": step, "rank": self.rank, "micro_batches": batches,
                                  "feeds": f"step_{step}_rank{self.rank}.npz"})

    def window(self, losses: Dict[str, float]) -> Dict[str, float]:
        """At a logging step (every rank): the scalars; the lines go to `say`."""
        scalars: Dict[str, float] = {}
        if self.policy != "none":
            count = skipped_steps(self.scope)
            scalars["train/skipped_steps"] = count
            if count > self.logged:
                self.say(f"skipped {count - self.logged:g} non-finite step(s) in this window ({count:g} in all; "
                         "parameters and optimizer state untouched by them)")
            self.logged = self.seen = max(self.seen, count)
        for task, loss in losses.items():
            past = self.history.setdefault(task, deque(maxlen=SPIKE_HISTORY))
            if self.spike_factor and len(past) >= 3 and np.isfinite(loss):
                median = statistics.median(past)
                spike = median > 0 and loss > self.spike_factor * median
                scalars[f"train/{task}/loss_spike"] = float(spike)
                if spike:
                    self.say(f"warning: loss spike in task {task}: {loss:.4f} over this window, "
                             f"{loss / median:.1f}x its median {median:.4f} over the previous {len(past)} windows")
            if np.isfinite(loss):
                past.append(loss)
        return scalars

    def summary(self) -> Optional[str]:
        if self.policy == "none":
            return None
        count = skipped_steps(self.scope)
        text = f"anomaly guard ({self.policy}): {count:g} non-finite step(s) skipped"
        if self.policy == "replay":
            text += (f"; replayed {self.replayed['transient'] + self.replayed['reproducible']}: "
                     f"{self.replayed['transient']} transient, {self.replayed['reproducible']} reproducible")
        return text
