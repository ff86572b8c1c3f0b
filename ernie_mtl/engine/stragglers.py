"""Slow ranks named: every logging window, each rank's step time and its own host work per step
(the time outside `Executor.run`: building batches, callbacks, anything the process does besides the
program) are gathered on every rank; the log and VisualDL get min / median / max and the slowest
rank, and a warning names a rank whose own work exceeds the median by more than
`--slow_rank_factor` of a step over the other ranks' median for `--slow_rank_windows` windows running.

What can be measured. In synchronous data parallelism every rank's step takes the same wall time:
the fast ranks wait for the slow one inside the gradient all-reduce, which is inside `Executor.run`.
So a rank's step time cannot name the straggler, but its work outside the program can (work all
ranks do together, evaluation and checkpoints, is left out: rank 0 writes more of a checkpoint): a rank with
a slow disk, an overloaded host (a noisy neighbour), slow sample building or a slow callback has
more of it, and the others' `Executor.run` grows by the same amount. A throttled GPU makes the
device side slower, which a static-graph executor does not expose per rank (the collective wait and
the kernels are one `Executor.run` here); those show only as a slower step on every rank.
"""
from __future__ import annotations

import statistics
from typing import Dict, List, Optional, Sequence, Tuple


class StragglerWatch:
    def __init__(self, barrier, rank: int, world_size: int, *, factor: float, windows: int,
                 endpoints: Sequence[str] = ()):
        self.barrier, self.rank, self.world = barrier, rank, world_size
        self.factor, self.windows, self.endpoints = factor, windows, list(endpoints)
        self.running: Dict[int, int] = {}  # rank -> consecutive windows over the threshold

    @property
    def enabled(self) -> bool:
        return self.world > 1 and self.factor > 0

    def window(self, steps: int, elapsed: float, own_s: float) -> Tuple[Dict[str, float], Optional[str]]:
        """Every rank calls it at a logging step with its window's (steps, wall seconds without the work
        all ranks do together such as checkpoints, seconds of its own work: neither inside Executor.run
        nor shared);
        returns (scalars, warning or None), the same on every rank."""
        mine = (elapsed / max(steps, 1), own_s / max(steps, 1))
        stats: List[Tuple[float, float]] = self.barrier.gather("step times", mine)
        step_s = [s for s, _ in stats]
        own = [h for _, h in stats]
        slowest = max(range(len(own)), key=lambda rank: own[rank])
        median_step, median_own = statistics.median(step_s), statistics.median(own)
        scalars = {"perf/step_s_min": min(step_s), "perf/step_s_median": median_step, "perf/step_s_max": max(step_s),
                   "perf/host_s_min": min(own), "perf/host_s_median": median_own, "perf/host_s_max": max(own),
                   "perf/slowest_rank": float(slowest)}
        # each rank against the median of the others (with 2 ranks the median of all would be their midpoint)
        others = [statistics.median(own[:r] + own[r + 1:]) for r in range(len(own))]
        over = {r for r, h in enumerate(own) if median_step > 0 and (h - others[r]) / median_step > self.factor}
        self.running = {r: self.running.get(r, 0) + 1 for r in over}
        flagged = sorted(r for r, n in self.running.items() if n >= self.windows)
        if not flagged:
            return scalars, None
        parts = []
        for r in flagged:
            node = self.endpoints[r].rpartition(":")[0] if r < len(self.endpoints) else ""
            parts.append(f"rank {r}{f' (node {node})' if node else ''}: {own[r] * 1e3:.0f} ms of its own work per "
                         f"step against {others[r] * 1e3:.0f} ms on the other ranks, {self.running[r]} windows running")
        return scalars, ("slow rank: " + "; ".join(parts) + f" (step {median_step:.3f} s; the other ranks wait for it "
                         "in every collective: check its host, data path and disk)")
