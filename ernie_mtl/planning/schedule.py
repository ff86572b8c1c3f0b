"""Which task each micro-batch trains, how long training lasts, and which examples a task reads.

Everything here is a pure function of a seed and a few counters, so every rank computes the same
task sequence without communicating (collective programs need every rank on the same task), and
the whole state is a small JSON dict stored in checkpoints (exact resume).

Sampling (`sampling_probabilities`), with N_i the training examples of task i:
    palm          p_i = m_i / sum_j m_j                   (PALM's `mix_ratio` m_i)
    proportional  p_i ∝ min(N_i, K)                      (T5 examples-proportional mixing, cap K)
    temperature   p_i ∝ min(N_i, K) ** (1 / T)           (T5/mT5; T = 1 is proportional)

Quotas (`target_quotas`) are counted in micro-batches *of the task*; one micro-batch of task i is
B_i examples on each of D data-parallel ranks, so steps_per_epoch_i = ceil(N_i / (B_i * D)).
    a target with its own num_epochs E_i:     q_i = ceil(E_i * S_i)
    otherwise, with sampling palm (PALM v0.3): q_i = floor(E * m_i * S_main), main = the first
                                               target, E = the global num_epochs
    otherwise (proportional/temperature):     q_i = ceil(E * S_i)
Auxiliary tasks have no quota: they are sampled until training stops and never stop it.

Stopping (`TaskSchedule`): micro-batch j draws its task from the *active* tasks (unfinished
targets and all auxiliary tasks, probabilities renormalised) with a uniform number that depends
only on (seed, j). A target finishes when it has drawn its quota or is finished early
(`finish(i)`, early stopping) and is then no longer drawn, so every target trains on exactly its
quota (unlike PALM, whose finished targets kept training). Training stops at the first optimizer
step boundary (every `accumulate_steps` micro-batches) at which every target is finished, or after
`max_steps` optimizer steps. When the last target finishes inside an optimizer step, the step is
completed with auxiliary tasks; without any, with the (finished) targets, drawn with their
original probabilities: an update is always `accumulate_steps` micro-batches, so those targets
may exceed their quota by fewer than `accumulate_steps` micro-batches.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ernie_mtl.config import ConfigError

SAMPLING_STRATEGIES = ("palm", "proportional", "temperature")
_BLOCK = 1024  # uniforms are generated per block of micro-batches: u_j = block(seed, j // _BLOCK)[j % _BLOCK]
# Domain tags keep the schedule's and the streams' random numbers independent for the same seed.
_SCHEDULE_TAG = 0x5C4ED
_STREAM_TAG = 0x57EA3
_STATE_VERSION = 1


def sampling_probabilities(strategy: str, *, mix_ratio: Optional[Sequence[float]] = None,
                           num_examples: Optional[Sequence[int]] = None, temperature: float = 1.0,
                           examples_cap: Optional[int] = None) -> np.ndarray:
    """Probability of each task per micro-batch (see the module docstring for the formulas).

    `palm` needs `mix_ratio`; `proportional` and `temperature` need `num_examples` and take the
    optional cap K (`examples_cap`). Raises ValueError naming the bad key and value.
    """
    if strategy not in SAMPLING_STRATEGIES:
        raise ValueError(f"sampling {strategy!r} is not one of {list(SAMPLING_STRATEGIES)}")
    if strategy == "palm":
        weights = _nonnegative("mix_ratio", mix_ratio)
    else:
        if examples_cap is not None and (isinstance(examples_cap, bool) or int(examples_cap) != examples_cap
                                         or examples_cap < 1):
            raise ValueError(f"examples_cap {examples_cap!r} must be a positive integer (or unset for no cap)")
        if not (isinstance(temperature, (int, float)) and not isinstance(temperature, bool)
                and math.isfinite(temperature) and temperature > 0):
            raise ValueError(f"temperature {temperature!r} must be a number > 0 (1 = examples-proportional)")
        sizes = _nonnegative("num_examples", num_examples)
        if examples_cap is not None:
            sizes = np.minimum(sizes, float(examples_cap))
        exponent = 1.0 / temperature if strategy == "temperature" else 1.0
        weights = sizes ** exponent
    return weights / weights.sum()


def _nonnegative(key: str, values: Optional[Sequence[float]]) -> np.ndarray:
    if values is None or len(values) == 0:
        raise ValueError(f"{key} is required (one value per task)")
    arr = np.asarray(values, dtype=np.float64)
    bad = [i for i, v in enumerate(arr) if not (math.isfinite(v) and v >= 0)]
    if bad:
        raise ValueError(f"{key}[{bad[0]}] = {values[bad[0]]!r} must be a finite number >= 0")
    if arr.sum() <= 0:
        raise ValueError(f"{key} {list(values)} sums to 0: at least one task needs a positive value")
    return arr


def steps_per_epoch(num_examples: int, batch_size: int, data_parallel: int = 1) -> int:
    """Micro-batches of a task per epoch: ceil(N / (B * D)) (the last one may wrap into the next epoch)."""
    if batch_size < 1 or data_parallel < 1:
        raise ValueError(f"batch_size {batch_size} and data_parallel {data_parallel} must be >= 1")
    return -(-int(num_examples) // (batch_size * data_parallel))


def target_quotas(*, num_examples: Sequence[int], batch_sizes: Sequence[int], data_parallel: int,
                  is_target: Sequence[bool], num_epochs: float, task_num_epochs: Sequence[Optional[float]],
                  mix_ratio: Optional[Sequence[float]] = None) -> List[Optional[int]]:
    """Micro-batch quota of every target (None for auxiliary tasks); rules in the module docstring.

    `mix_ratio` given (sampling palm): targets without their own num_epochs follow PALM v0.3,
    q_i = floor(E * m_i * S_main); otherwise they get ceil(E * S_i) like a task-level num_epochs E.
    """
    n = len(num_examples)
    if not (len(batch_sizes) == len(is_target) == len(task_num_epochs) == n) or (
            mix_ratio is not None and len(mix_ratio) != n):
        raise ValueError("num_examples, batch_sizes, is_target, task_num_epochs and mix_ratio need one value per task")
    spe = [steps_per_epoch(num_examples[i], batch_sizes[i], data_parallel) for i in range(n)]
    main = next((i for i in range(n) if is_target[i]), None)
    quotas: List[Optional[int]] = []
    for i in range(n):
        if not is_target[i]:
            quotas.append(None)
        elif task_num_epochs[i] is not None:
            quotas.append(math.ceil(task_num_epochs[i] * spe[i]))
        elif mix_ratio is not None:
            quotas.append(math.floor(num_epochs * mix_ratio[i] * spe[main]))
        else:
            quotas.append(math.ceil(num_epochs * spe[i]))
    return quotas


@dataclass(frozen=True)
class Plan:
    """What the rest of a schedule will do if nothing is finished early (see TaskSchedule.plan)."""

    total_steps: int  # optimizer steps of the whole run: the LR schedule's horizon
    micro_batches: Tuple[int, ...]  # per task, over the whole run (already drawn included)
    expected: Tuple[float, ...]  # sampling probabilities p_i
    realized: Tuple[float, ...]  # micro_batches_i / all micro-batches
    epochs: Optional[Tuple[float, ...]]  # micro_batches_i / steps_per_epoch_i (None if not given)


class TaskSchedule:
    """The seeded task sequence of a multi-task run, with target quotas and stopping (module docstring).

    `probabilities` per task (sum > 0), `quotas` per task (an int >= 0 for targets, None for
    auxiliary tasks), `accumulate_steps` micro-batches per optimizer step, optional `max_steps`
    optimizer steps. `names` and `steps_per_epoch` only label `summary()` and `plan().epochs`.
    """

    def __init__(self, probabilities: Sequence[float], quotas: Sequence[Optional[int]], is_target: Sequence[bool],
                 seed: int, accumulate_steps: int = 1, max_steps: Optional[int] = None, *,
                 names: Optional[Sequence[str]] = None, steps_per_epoch: Optional[Sequence[int]] = None):
        p = np.asarray(probabilities, dtype=np.float64)
        n = len(p)
        if n == 0 or not (len(quotas) == len(is_target) == n):
            raise ValueError(f"probabilities ({n}), quotas ({len(quotas)}) and is_target ({len(is_target)}) need "
                             "one value per task (at least one task)")
        if not np.all(np.isfinite(p)) or np.any(p < 0) or p.sum() <= 0:
            raise ValueError(f"probabilities {p.tolist()} must be >= 0 with a positive sum")
        self.is_target = tuple(bool(t) for t in is_target)
        problems = []
        for i, (q, t) in enumerate(zip(quotas, self.is_target)):
            label = names[i] if names else f"task {i}"
            if t and (q is None or isinstance(q, bool) or int(q) != q or q < 0):
                problems.append(f"{label}: a target needs an integer quota >= 0, got {q!r}")
            elif not t and q is not None:
                problems.append(f"{label}: an auxiliary task has no quota (None), got {q!r}")
            elif t and q > 0 and p[i] == 0:
                problems.append(f"{label}: a target with quota {q} has sampling probability 0 and would never "
                                "finish; give it a positive mix_ratio")
        if not isinstance(seed, (int, np.integer)) or seed < 0:
            problems.append(f"seed {seed!r} must be an integer >= 0")
        if accumulate_steps < 1:
            problems.append(f"accumulate_steps {accumulate_steps} must be >= 1")
        if max_steps is not None and max_steps < 1:
            problems.append(f"max_steps {max_steps} must be >= 1 (or None for no cap)")
        if not any(self.is_target) and max_steps is None:
            problems.append("no target task (target_tag all 0): only auxiliary tasks, which never stop training; "
                            "set max_steps or mark a task as target")
        if not any(self.is_target) and max_steps is not None and p.sum() <= 0:
            problems.append("every task has probability 0")
        if problems:
            raise ConfigError(problems)
        self.probabilities = p / p.sum()
        self.quotas = tuple(None if q is None else int(q) for q in quotas)
        self.seed = int(seed)
        self.accumulate_steps = int(accumulate_steps)
        self.max_steps = None if max_steps is None else int(max_steps)
        self.names = tuple(names) if names else tuple(f"task{i}" for i in range(n))
        self.steps_per_epoch = tuple(steps_per_epoch) if steps_per_epoch else None
        self._position = 0
        self._counts = np.zeros(n, dtype=np.int64)
        self._early: set = set()
        self._block: Tuple[int, Optional[np.ndarray]] = (-1, None)

    # -- state ---------------------------------------------------------------------------------
    @property
    def position(self) -> int:
        """Micro-batches drawn so far."""
        return self._position

    @property
    def step(self) -> int:
        """Completed optimizer steps."""
        return self._position // self.accumulate_steps

    @property
    def counts(self) -> Tuple[int, ...]:
        """Micro-batches drawn per task."""
        return tuple(int(c) for c in self._counts)

    def is_finished(self, i: int) -> bool:
        """Whether target `i` has reached its quota or was finished early (always False for auxiliary tasks)."""
        return self._finished(i, self._counts, self._early)

    def _finished(self, i: int, counts: np.ndarray, early: set) -> bool:
        return self.is_target[i] and (i in early or counts[i] >= self.quotas[i])

    def _all_targets_finished(self, counts: np.ndarray, early: set) -> bool:
        targets = [i for i, t in enumerate(self.is_target) if t]
        return bool(targets) and all(self._finished(i, counts, early) for i in targets)

    def _is_done(self, position: int, counts: np.ndarray, early: set) -> bool:
        if position % self.accumulate_steps:
            return False
        if self.max_steps is not None and position // self.accumulate_steps >= self.max_steps:
            return True
        return self._all_targets_finished(counts, early)

    @property
    def done(self) -> bool:
        """True at an optimizer-step boundary once every target is finished or max_steps is reached."""
        return self._is_done(self._position, self._counts, self._early)

    def finish(self, i: int) -> None:
        """Finish target `i` now (early stopping): it is no longer drawn."""
        if not 0 <= i < len(self.is_target):
            raise IndexError(f"task index {i} out of range (0..{len(self.is_target) - 1})")
        if not self.is_target[i]:
            raise ValueError(f"{self.names[i]} is an auxiliary task; only targets can be finished")
        self._early.add(int(i))

    # -- drawing -------------------------------------------------------------------------------
    def _candidates(self, counts: np.ndarray, early: set) -> np.ndarray:
        """Tasks the next micro-batch may train, as indices with positive probability."""
        p = self.probabilities
        active = [i for i in range(len(p)) if p[i] > 0 and not self._finished(i, counts, early)]
        if not active:  # last target finished mid-step and no auxiliary task: complete the step with targets
            active = [i for i in range(len(p)) if p[i] > 0 and self.is_target[i]]
        return np.asarray(active, dtype=np.int64)

    def _uniforms(self, block: int) -> np.ndarray:
        if self._block[0] != block:
            rng = np.random.default_rng([self.seed, _SCHEDULE_TAG, block])
            self._block = (block, rng.random(_BLOCK))
        return self._block[1]

    def _choose(self, candidates: np.ndarray, u: np.ndarray) -> np.ndarray:
        cdf = np.cumsum(self.probabilities[candidates])
        picks = np.searchsorted(cdf, u * cdf[-1], side="right")
        return candidates[np.minimum(picks, len(candidates) - 1)]

    def next_task(self) -> int:
        """The task of the next micro-batch (advances the schedule). RuntimeError when done."""
        if self.done:
            raise RuntimeError(f"the task schedule is done (step {self.step}); check `done` before drawing")
        j = self._position
        u = self._uniforms(j // _BLOCK)[j % _BLOCK]
        task = int(self._choose(self._candidates(self._counts, self._early), np.array([u]))[0])
        self._counts[task] += 1
        self._position += 1
        return task

    def plan(self) -> Plan:
        """Simulate from the current state to the end (no further early stops) without changing it.

        Vectorised per block of uniforms: the candidate set is fixed until a target reaches its
        quota, so a whole run of draws is taken at once up to that event.
        """
        pos, counts, early = self._position, self._counts.copy(), set(self._early)
        acc = self.accumulate_steps
        while not self._is_done(pos, counts, early):
            limit = (pos // _BLOCK + 1) * _BLOCK  # end of this block of uniforms
            if self.max_steps is not None:
                limit = min(limit, self.max_steps * acc)
            if self._all_targets_finished(counts, early):  # only the rest of this step remains
                limit = min(limit, (pos // acc + 1) * acc)
            candidates = self._candidates(counts, early)
            u = self._uniforms(pos // _BLOCK)[pos % _BLOCK: pos % _BLOCK + (limit - pos)]
            picks = self._choose(candidates, u)
            take = len(picks)
            for i in candidates:  # stop right after the draw that completes a target's quota
                if self.is_target[i] and not self._finished(i, counts, early):
                    hits = np.flatnonzero(picks == i)
                    need = self.quotas[i] - counts[i]
                    if len(hits) >= need:
                        take = min(take, int(hits[need - 1]) + 1)
            counts += np.bincount(picks[:take], minlength=len(counts))
            pos += take
        total = int(counts.sum())
        return Plan(total_steps=pos // acc, micro_batches=tuple(int(c) for c in counts),
                    expected=tuple(float(x) for x in self.probabilities),
                    realized=tuple(float(c) / total if total else 0.0 for c in counts),
                    epochs=None if self.steps_per_epoch is None else tuple(
                        float(c) / s if s else 0.0 for c, s in zip(counts, self.steps_per_epoch)))

    def summary(self) -> str:
        """A table of the planned run (for the log and --dry_run)."""
        plan = self.plan()
        width = max(4, *(len(n) for n in self.names))
        lines = [f"{'task':<{width}}  role    p_i     quota       planned  realized  epochs"]
        for i, name in enumerate(self.names):
            quota = "-" if self.quotas[i] is None else str(self.quotas[i])
            epochs = "-" if plan.epochs is None else f"{plan.epochs[i]:.2f}"
            lines.append(f"{name:<{width}}  {'target' if self.is_target[i] else 'aux':<6}  "
                         f"{plan.expected[i]:.4f}  {quota:>9}  {plan.micro_batches[i]:>10}  "
                         f"{plan.realized[i]:.4f}  {epochs:>6}")
        cap = "" if self.max_steps is None else f" (max_steps {self.max_steps})"
        lines.append(f"optimizer steps: {plan.total_steps}{cap}, micro-batches per step: {self.accumulate_steps}, "
                     f"seed {self.seed}")
        return "\n".join(lines)

    # -- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        """JSON-safe state: the configuration it is valid for and the counters."""
        return {"version": _STATE_VERSION, "seed": self.seed, "probabilities": self.probabilities.tolist(),
                "quotas": list(self.quotas), "is_target": list(self.is_target),
                "accumulate_steps": self.accumulate_steps, "position": self._position,
                "counts": list(self.counts), "finished_early": sorted(self._early)}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continue from `state_dict()`; ConfigError if it was made for another schedule configuration.

        `max_steps` may differ (a run may be extended); everything that shapes the sequence may not.
        """
        problems = []
        if state.get("version") != _STATE_VERSION:
            problems.append(f"task schedule state version {state.get('version')!r}; this code reads {_STATE_VERSION}")
        mine = {"seed": self.seed, "quotas": list(self.quotas), "is_target": list(self.is_target),
                "accumulate_steps": self.accumulate_steps}
        for key, value in mine.items():
            if state.get(key) != value:
                problems.append(f"checkpoint task schedule has {key} {state.get(key)!r} but this run has {value!r}")
        theirs = state.get("probabilities")
        if theirs is None or len(theirs) != len(self.probabilities) or not np.allclose(
                theirs, self.probabilities, rtol=1e-12, atol=0):
            problems.append(f"checkpoint task schedule has probabilities {theirs!r} but this run has "
                            f"{self.probabilities.tolist()!r}")
        if problems:
            raise ConfigError(problems + ["the task mix changed since the checkpoint (seed, tasks, mix_ratio, "
                                          "sampling, data sizes, batch sizes, accumulation): restore the "
                                          "original configuration or start a new output_dir"])
        counts = np.asarray(state["counts"], dtype=np.int64)
        if len(counts) != len(self._counts) or int(counts.sum()) != int(state["position"]):
            raise ConfigError([f"checkpoint task schedule is inconsistent: counts {state['counts']} do not sum to "
                               f"position {state['position']}"])
        self._position = int(state["position"])
        self._counts = counts
        self._early = {int(i) for i in state["finished_early"]}


class TaskStream:
    """The order in which one task's training examples are read, across epochs and ranks.

    Epoch e is a permutation of range(N) drawn from (seed, task_index, e) (identity without
    shuffling). The task's micro-batch k covers stream positions [k*B*D, (k+1)*B*D), where B*D =
    `examples_per_micro` (a micro-batch may span an epoch boundary), and data rank r reads
    [k*B*D + r*B, k*B*D + (r+1)*B) with B = `micro_batch_size`. So the union over ranks is the
    one-rank stream with B*D, and resuming at micro-batch k reads exactly what the interrupted
    run would have read.
    """

    def __init__(self, num_examples: int, *, seed: int, task_index: int, examples_per_micro: int,
                 micro_batch_size: int, data_rank: int = 0, shuffle: bool = True):
        if num_examples < 1:
            raise ValueError(f"task {task_index}: no training examples (num_examples {num_examples})")
        if micro_batch_size < 1 or examples_per_micro % micro_batch_size:
            raise ValueError(f"examples_per_micro {examples_per_micro} must be a multiple of micro_batch_size "
                             f"{micro_batch_size} (one micro-batch per data-parallel rank)")
        ranks = examples_per_micro // micro_batch_size
        if not 0 <= data_rank < ranks:
            raise ValueError(f"data_rank {data_rank} must be within [0, {ranks})")
        self.num_examples = int(num_examples)
        self.seed, self.task_index = int(seed), int(task_index)
        self.examples_per_micro, self.micro_batch_size = int(examples_per_micro), int(micro_batch_size)
        self.data_rank, self.shuffle = int(data_rank), bool(shuffle)
        self._perms: Dict[int, np.ndarray] = {}

    @property
    def steps_per_epoch(self) -> int:
        """Micro-batches of this task per epoch, ceil(N / (B*D))."""
        return -(-self.num_examples // self.examples_per_micro)

    def permutation(self, epoch: int) -> np.ndarray:
        """The example order of `epoch` (the last two are cached: a batch spans at most two epochs
        unless B*D > N)."""
        perm = self._perms.get(epoch)
        if perm is None:
            rng = np.random.default_rng([self.seed, _STREAM_TAG, self.task_index, epoch])
            perm = rng.permutation(self.num_examples)
            self._perms = {e: p for e, p in self._perms.items() if e == epoch - 1}
            self._perms[epoch] = perm
        return perm

    def indices(self, k: int) -> List[Tuple[int, int]]:
        """(example index, epoch) pairs this rank reads in the task's micro-batch `k`."""
        start = k * self.examples_per_micro + self.data_rank * self.micro_batch_size
        out = []
        for pos in range(start, start + self.micro_batch_size):
            epoch, offset = divmod(pos, self.num_examples)
            index = int(self.permutation(epoch)[offset]) if self.shuffle else offset
            out.append((index, epoch))
        return out

    def epoch_of(self, k: int) -> int:
        """Epoch of the first example of micro-batch `k` (over all ranks, so the same on every rank)."""
        return (k * self.examples_per_micro) // self.num_examples

    def epochs_done(self, k: int) -> float:
        """Epochs consumed after `k` micro-batches."""
        return k * self.examples_per_micro / self.num_examples
