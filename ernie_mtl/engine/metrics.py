"""The metrics window and the metric sinks (VisualDL + a JSON-lines file) of rank 0.

Metric names are namespaced (`train/loss`, `perf/tokens_per_s`, `amp/loss_scale`, `eval/mlm_loss`);
units are in the names where they are not obvious. Every sink is rank 0's only: other ranks get a
`MetricWriter` that writes nothing.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import time
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence

from ernie_mtl.checkpoint.layout import METRICS_FILE  # noqa: F401  (re-exported)


class Window:
    """What happened since the last log line: per task this rank's micro-batches, summed loss and extra
    scalars (e.g. mlm_loss, nsp_loss), and the slots drawn for it (all ranks); optimizer steps,
    non-pad tokens (all ranks), samples (all ranks), time; the learning rate and the loss scale as
    their latest values.

    The loop counts micro-batches, tokens, samples and drawn slots as they run (`add_micro`,
    `add_step`); the losses, lr and loss scale stay on the device and arrive once per window
    (`add_sums`: the sums of ernie_mtl/program/loss_sums.py, the same float64 running sums this class
    kept on the host when every micro-batch was fetched)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.steps = 0
        self.micro = 0
        self.count: Dict[str, int] = {}
        self.drawn: Dict[str, int] = {}  # slots of all ranks, per task
        self.loss: Dict[str, float] = {}
        self.scalars: Dict[str, Dict[str, float]] = {}
        self.tokens = 0
        self.samples = 0
        self.lr = 0.0
        self.loss_scale: Optional[float] = None
        self.run_s = 0.0  # seconds inside Executor.run
        self.shared_s = 0.0  # seconds in work every rank does together (evaluation, checkpoints, exports)
        self.started = time.perf_counter()

    @property
    def own_s(self) -> float:
        """This process's own work in the window: what is neither the program nor shared work."""
        return max(self.elapsed - self.run_s - self.shared_s, 0.0)

    @contextlib.contextmanager
    def in_program(self):
        """Time the block as program time (Executor.run, or waiting for the device's results)."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.run_s += time.perf_counter() - started

    @contextlib.contextmanager
    def shared(self):
        """Time the block as shared work (not counted as this rank's own)."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.shared_s += time.perf_counter() - started

    def add_micro(self, task: str, *, tokens: int) -> None:
        """One micro-batch of `task` (`tokens`: non-pad tokens of all ranks)."""
        self.micro += 1
        self.count[task] = self.count.get(task, 0) + 1
        self.tokens += tokens

    def add_step(self, *, samples: int, drawn: Sequence[str] = ()) -> None:
        """One optimizer step: `samples` of all ranks, the tasks `drawn` for its slots."""
        self.steps += 1
        for task in drawn:
            self.drawn[task] = self.drawn.get(task, 0) + 1
        self.samples += samples

    def add_sums(self, sums: Mapping[str, Sequence[float]], columns: Mapping[str, Sequence[str]], *, lr: float,
                 loss_scale: Optional[float]) -> None:
        """This rank's sums over the window's micro-batches, per task `[loss, *scalars]` named by
        `columns[task]` (`("loss", "mlm_loss", ...)`), and the latest lr and loss scale."""
        for task in self.count:
            values = sums[task]
            self.loss[task] = float(values[0])
            self.scalars[task] = {k: float(v) for k, v in zip(columns[task][1:], values[1:])}
        self.lr = float(lr)
        if loss_scale is not None:
            self.loss_scale = float(loss_scale)

    def mean_loss(self, task: str) -> float:
        return self.loss[task] / self.count[task]

    def mean_scalars(self, task: str) -> Dict[str, float]:
        return {k: v / self.count[task] for k, v in self.scalars.get(task, {}).items()}

    @property
    def elapsed(self) -> float:
        return max(time.perf_counter() - self.started, 1e-9)

    def rates(self) -> Dict[str, float]:
        """perf/steps_per_s, perf/tokens_per_s, perf/samples_per_s over the window."""
        e = self.elapsed
        return {"perf/steps_per_s": self.steps / e, "perf/tokens_per_s": self.tokens / e,
                "perf/samples_per_s": self.samples / e}


def format_eta(seconds: float) -> str:
    """'1h02m03s' style."""
    if not math.isfinite(seconds):
        return "?"
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


class MetricWriter:
    """Scalars to VisualDL (`<output_dir>/visualdl`) and to `<output_dir>/train_metrics.jsonl`
    (full-precision floats, one JSON object per logged step). No-op unless `enabled`.

    The files are opened on the first write, not here: a run refused after the writer exists (a
    damaged checkpoint found by resume) leaves no new VisualDL record or metrics file behind, so
    "nothing was changed" holds."""

    def __init__(self, output_dir: str, *, enabled: bool):
        self.enabled = enabled
        self.output_dir = output_dir
        self.logdir = str(Path(output_dir) / "visualdl")
        self._vdl: Any = None  # visualdl.LogWriter, opened on first use
        self._jsonl: Any = None  # the train_metrics.jsonl file
        self._jsonl_mode = "a"

    def _open(self) -> None:
        if self._vdl is None:
            from visualdl import LogWriter

            self._vdl = LogWriter(logdir=self.logdir)
            os.makedirs(self.output_dir, exist_ok=True)
            self._jsonl = open(Path(self.output_dir) / METRICS_FILE, self._jsonl_mode, encoding="utf-8")

    def restart_file(self) -> None:
        """Start train_metrics.jsonl anew (a run replacing a previous one in the same folder)."""
        if self._jsonl is not None:
            path = self._jsonl.name
            self._jsonl.close()
            self._jsonl = open(path, "w", encoding="utf-8")
        else:
            self._jsonl_mode = "w"

    def scalars(self, step: int, values: Mapping[str, Optional[float]]) -> None:
        """Write `{tag: value}` at `step` (None values are skipped)."""
        if not self.enabled:
            return
        self._open()
        clean = {k: float(v) for k, v in values.items() if v is not None}
        for tag, value in clean.items():
            self._vdl.add_scalar(tag=tag, value=value, step=step)
        self._jsonl.write(json.dumps({"step": step, **clean}) + "\n")
        self._jsonl.flush()

    def hparams(self, config: Mapping[str, Mapping[str, Any]], metrics: list) -> None:
        """The resolved configuration: as VisualDL hyperparameters (scalars and strings) and as text."""
        if not self.enabled:
            return
        self._open()
        flat = {f"{s}.{k}": (v if isinstance(v, (int, float, str)) and not isinstance(v, bool) else str(v))
                for s, fields_ in config.items() for k, v in fields_.items()}
        self._vdl.add_hparams(hparams_dict=flat, metrics_list=list(metrics))
        self._vdl.add_text(tag="config", text_string=json.dumps(config, indent=2, default=str), step=0)

    def close(self) -> None:
        if self._vdl is not None:
            self._vdl.close()
        if self._jsonl is not None:
            self._jsonl.close()
