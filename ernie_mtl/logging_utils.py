"""Console logging, the metrics window and the metric sinks (VisualDL + a JSON-lines file) of rank 0.

Metric names are namespaced (`train/loss`, `perf/tokens_per_s`, `amp/loss_scale`, `eval/mlm_loss`);
units are in the names where they are not obvious. Every sink is rank 0's only: other ranks get a
`MetricWriter` that writes nothing.
"""
from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, Mapping, Optional

METRICS_FILE = "train_metrics.jsonl"


class _TqdmHandler(logging.StreamHandler):
    """Writes through tqdm so that log lines do not tear the progress bar."""

    def emit(self, record: logging.LogRecord) -> None:
        from tqdm import tqdm

        try:
            tqdm.write(self.format(record), file=self.stream)
        except Exception:  # logging must never kill training
            self.handleError(record)


def get_logger(rank: int) -> logging.Logger:
    """`ernie_mtl` logger: INFO on rank 0, WARNING elsewhere (errors still show on every rank)."""
    logger = logging.getLogger("ernie_mtl")
    if not logger.handlers:
        handler = _TqdmHandler(sys.stdout)
        handler.setFormatter(logging.Formatter(f"%(asctime)s [rank {rank}] %(message)s", "%H:%M:%S"))
        logger.addHandler(handler)
        logger.propagate = False
    logger.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    return logger


class Window:
    """Sums over the steps since the last log line: losses (mean per step), tokens, samples, time.
    The learning rate and the loss scale are reported as their latest values, not means."""

    LATEST = ("lr", "loss_scaling")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.steps = 0
        self.sums: Dict[str, float] = {}
        self.latest: Dict[str, float] = {}
        self.tokens = 0
        self.samples = 0
        self.started = time.perf_counter()

    def add(self, losses: Mapping[str, float], *, tokens: int, samples: int) -> None:
        """One global step: its fetched values (losses, lr, ...), non-pad tokens and samples consumed."""
        self.steps += 1
        for k, v in losses.items():
            if k in self.LATEST:
                self.latest[k] = float(v)
            else:
                self.sums[k] = self.sums.get(k, 0.0) + float(v)
        self.tokens += tokens
        self.samples += samples

    def summary(self) -> Dict[str, float]:
        """Means of the losses and rates per second over the window."""
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        out = {k: v / max(self.steps, 1) for k, v in self.sums.items()}
        out.update(self.latest)
        out.update(steps_per_s=self.steps / elapsed, tokens_per_s=self.tokens / elapsed,
                   samples_per_s=self.samples / elapsed)
        return out


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
    (full-precision floats, one JSON object per logged step). No-op unless `enabled`."""

    def __init__(self, output_dir: str, *, enabled: bool):
        self.enabled = enabled
        self._vdl = None
        self._jsonl = None
        if enabled:
            from visualdl import LogWriter

            self.logdir = str(Path(output_dir) / "visualdl")
            self._vdl = LogWriter(logdir=self.logdir)
            os.makedirs(output_dir, exist_ok=True)
            self._jsonl = open(Path(output_dir) / METRICS_FILE, "a", encoding="utf-8")

    def scalars(self, step: int, values: Mapping[str, Optional[float]]) -> None:
        """Write `{tag: value}` at `step` (None values are skipped)."""
        if not self.enabled:
            return
        clean = {k: float(v) for k, v in values.items() if v is not None}
        for tag, value in clean.items():
            self._vdl.add_scalar(tag=tag, value=value, step=step)
        self._jsonl.write(json.dumps({"step": step, **clean}) + "\n")
        self._jsonl.flush()

    def hparams(self, config: Mapping[str, Mapping[str, Any]], metrics: list) -> None:
        """The resolved configuration: as VisualDL hyperparameters (scalars and strings) and as text."""
        if not self.enabled:
            return
        flat = {f"{s}.{k}": (v if isinstance(v, (int, float, str)) and not isinstance(v, bool) else str(v))
                for s, fields_ in config.items() for k, v in fields_.items()}
        self._vdl.add_hparams(hparams_dict=flat, metrics_list=list(metrics))
        self._vdl.add_text(tag="config", text_string=json.dumps(config, indent=2, default=str), step=0)

    def close(self) -> None:
        if self._vdl is not None:
            self._vdl.close()
        if self._jsonl is not None:
            self._jsonl.close()
