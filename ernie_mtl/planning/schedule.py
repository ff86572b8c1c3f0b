"""Which task each micro-batch trains, how long training lasts, and which examples a task reads.

Everything here is a pure function of a seed and a few counters, so every rank computes the same
task sequence without communicating, and the whole state is a small JSON dict stored in
checkpoints (exact resume).

Slots. An optimizer step's global batch is `slots_per_step` micro-batches, "slots", whichever
processes compute them (D data-parallel ranks x A micro-batches each: slot m*D + r is micro-batch
m of data rank r, ernie_mtl/program/randomness.slot_of). The schedule draws a task per slot, and
a slot of task i reads the task's next B_i examples (`TaskStream`). Nothing here depends on D or
A, only on their product: so a run continues on another topology with the same global batch and
sees the same examples in the same optimizer steps. Ranks may train different tasks in the same
executor run; that is collective-safe because every micro-batch runs every head (the loss is
gated by the task), and the update averages the slots as gradient accumulation does.

Sampling (`sampling_probabilities`), with N_i the training examples of task i:
    palm          p_i = m_i / sum_j m_j                   (PALM's `mix_ratio` m_i)
    proportional  p_i ∝ min(N_i, K)                      (T5 examples-proportional mixing, cap K)
    temperature   p_i ∝ min(N_i, K) ** (1 / T)           (T5/mT5; T = 1 is proportional)

Annealed sampling (`temperature_end`, Stickland and Murray 2019; MT-DNN's annealed sampling): the
exponent moves linearly from 1/T to 1/T_end over the first `anneal_slots` slots of the run, so slot j
draws with p_i(j) ∝ min(N_i, K) ** ((1 - a_j) / T + a_j / T_end), a_j = min(1, j / anneal_slots):
examples-proportional (T = 1) at the start, uniform (T_end = inf) at the end, and the end of training
is not dominated by the largest task. The horizon is planned up front: the slots the run would take
with its starting probabilities (`anneal_horizon`), so the sequence stays a pure function of (seed, j).

Quotas (`target_quotas`) are counted in slots *of the task*; one slot of task i is B_i examples,
so steps_per_epoch_i = ceil(N_i / B_i).
    a target with its own num_epochs E_i:     q_i = ceil(E_i * S_i)
    otherwise, with sampling palm (PALM v0.3): q_i = floor(E * m_i * S_main), main = the first
                                               target, E = the global num_epochs
    otherwise (proportional/temperature):     q_i = ceil(E * S_i)
Auxiliary tasks have no quota: they are sampled until training stops and never stop it.

Stopping (`TaskSchedule`): slot j draws its task from the *active* tasks (unfinished
targets and all auxiliary tasks, probabilities renormalised) with a uniform number that depends
only on (seed, j). A target finishes when it has drawn its quota or is finished early
(`finish(i)`, early stopping) and is then no longer drawn, so every target trains on exactly its
quota (unlike PALM, whose finished targets kept training). Training stops at the first optimizer
step boundary (every `slots_per_step` slots) at which every target is finished, or after
`max_steps` optimizer steps. When the last target finishes inside an optimizer step, the step is
completed with auxiliary tasks; without any, with the (finished) targets, drawn with their
original probabilities: an update is always `slots_per_step` slots, so those targets may exceed
their quota by fewer than `slots_per_step` slots.

A change of global batch (`--allow_batch_change`, `regroup_state`) keeps the slot sequence and
re-counts steps from the checkpoint: optimizer step boundaries fall every `slots_per_step` slots
from the position the new batch started at (the state's `base`).
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
_STATE_VERSION = 2  # 1: one task per micro-batch of all data-parallel ranks (`accumulate_steps` draws per step)


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


def end_probabilities(num_examples: Sequence[int], temperature_end: float,
                      examples_cap: Optional[int] = None) -> np.ndarray:
    """Where annealed sampling ends: p_i ∝ min(N_i, K) ** (1 / T_end); T_end = inf is uniform over the
    tasks with examples."""
    sizes = _nonnegative("num_examples", num_examples)
    if examples_cap is not None:
        sizes = np.minimum(sizes, float(examples_cap))
    if not (isinstance(temperature_end, (int, float)) and temperature_end > 0):
        raise ValueError(f"temperature_end {temperature_end!r} must be a number > 0 or inf")
    exponent = 0.0 if math.isinf(temperature_end) else 1.0 / temperature_end
    weights = np.where(sizes > 0, sizes ** exponent, 0.0)
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


def steps_per_epoch(num_examples: int, batch_size: int) -> int:
    """Slots of a task per epoch: ceil(N / B) (the last one may wrap into the next epoch)."""
    if batch_size < 1:
        raise ValueError(f"batch_size {batch_size} must be >= 1")
    return -(-int(num_examples) // batch_size)


def target_quotas(*, num_examples: Sequence[int], batch_sizes: Sequence[int],
                  is_target: Sequence[bool], num_epochs: float, task_num_epochs: Sequence[Optional[float]],
                  mix_ratio: Optional[Sequence[float]] = None) -> List[Optional[int]]:
    """Slot quota of every target (None for auxiliary tasks); rules in the module docstring.

    `mix_ratio` given (sampling palm): targets without their own num_epochs follow PALM v0.3,
    q_i = floor(E * m_i * S_main); otherwise they get ceil(E * S_i) like a task-level num_epochs E.
    """
    n = len(num_examples)
    if not (len(batch_sizes) == len(is_target) == len(task_num_epochs) == n) or (
            mix_ratio is not None and len(mix_ratio) != n):
        raise ValueError("num_examples, batch_sizes, is_target, task_num_epochs and mix_ratio need one value per task")
    spe = [steps_per_epoch(num_examples[i], batch_sizes[i]) for i in range(n)]
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
    micro_batches: Tuple[int, ...]  # slots per task, over the whole run (already drawn included)
    expected: Tuple[float, ...]  # sampling probabilities p_i
    realized: Tuple[float, ...]  # micro_batches_i / all slots
    epochs: Optional[Tuple[float, ...]]  # micro_batches_i / steps_per_epoch_i (None if not given)


class TaskSchedule:
    """The seeded task sequence of a multi-task run, with target quotas and stopping (module docstring).

    `probabilities` per task (sum > 0), `quotas` per task (an int >= 0 for targets, None for
    auxiliary tasks), `slots_per_step` slots (micro-batches of all ranks) per optimizer step,
    optional `max_steps` optimizer steps. `names` and `steps_per_epoch` only label `summary()` and
    `plan().epochs`.
    """

    def __init__(self, probabilities: Sequence[float], quotas: Sequence[Optional[int]], is_target: Sequence[bool],
                 seed: int, slots_per_step: int = 1, max_steps: Optional[int] = None, *,
                 names: Optional[Sequence[str]] = None, steps_per_epoch: Optional[Sequence[int]] = None,
                 end_probabilities: Optional[Sequence[float]] = None, anneal_slots: Optional[int] = None):
        p = np.asarray(probabilities, dtype=np.float64)
        n = len(p)
        if n == 0 or not (len(quotas) == len(is_target) == n):
            raise ValueError(f"probabilities ({n}), quotas ({len(quotas)}) and is_target ({len(is_target)}) need "
                             "one value per task (at least one task)")
        if not np.all(np.isfinite(p)) or np.any(p < 0) or p.sum() <= 0:
            raise ValueError(f"probabilities {p.tolist()} must be >= 0 with a positive sum")
        self.is_target = tuple(bool(flag) for flag in is_target)
        problems = []
        for i, (q, target) in enumerate(zip(quotas, self.is_target)):
            label = names[i] if names else f"task {i}"
            if target and (q is None or isinstance(q, bool) or int(q) != q or q < 0):
                problems.append(f"{label}: a target needs an integer quota >= 0, got {q!r}")
            elif not target and q is not None:
                problems.append(f"{label}: an auxiliary task has no quota (None), got {q!r}")
            elif target and q > 0 and p[i] == 0:
                problems.append(f"{label}: a target with quota {q} has sampling probability 0 and would never "
                                "finish; give it a positive mix_ratio")
        if not isinstance(seed, (int, np.integer)) or seed < 0:
            problems.append(f"seed {seed!r} must be an integer >= 0")
        if slots_per_step < 1:
            problems.append(f"slots_per_step {slots_per_step} must be >= 1")
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
        self.end_probabilities: Optional[np.ndarray] = None
        self.anneal_slots = 0
        if end_probabilities is not None:
            end = np.asarray(end_probabilities, dtype=np.float64)
            if end.shape != p.shape or not np.all(np.isfinite(end)) or np.any(end < 0) or end.sum() <= 0 or \
                    np.any((end > 0) != (p > 0)):
                raise ValueError(f"end_probabilities {end.tolist()} must be >= 0, one per task, positive where the "
                                 "starting probabilities are")
            if anneal_slots is None or anneal_slots < 1:
                raise ValueError(f"anneal_slots {anneal_slots!r} must be >= 1 with end_probabilities")
            self.end_probabilities = end / end.sum()
            self.anneal_slots = int(anneal_slots)
        self.quotas = tuple(None if q is None else int(q) for q in quotas)
        self.seed = int(seed)
        self.slots_per_step = int(slots_per_step)
        self.max_steps = None if max_steps is None else int(max_steps)
        self.names = tuple(names) if names else tuple(f"task{i}" for i in range(n))
        self.steps_per_epoch = tuple(steps_per_epoch) if steps_per_epoch else None
        self._position = 0
        self._counts = np.zeros(n, dtype=np.int64)
        self._early: set = set()
        self._base = (0, 0)  # (position, step) where the current slots_per_step began (a batch change)
        self._block: Tuple[int, Optional[np.ndarray]] = (-1, None)

    # -- state ---------------------------------------------------------------------------------
    @property
    def position(self) -> int:
        """Slots drawn so far."""
        return self._position

    @property
    def step(self) -> int:
        """Completed optimizer steps."""
        return self._step_at(self._position)

    def _step_at(self, position: int) -> int:
        return self._base[1] + (position - self._base[0]) // self.slots_per_step

    @property
    def counts(self) -> Tuple[int, ...]:
        """Slots drawn per task."""
        return tuple(int(c) for c in self._counts)

    def is_finished(self, i: int) -> bool:
        """Whether target `i` has reached its quota or was finished early (always False for auxiliary tasks)."""
        return self._finished(i, self._counts, self._early)

    def _finished(self, i: int, counts: np.ndarray, early: set) -> bool:
        return self.is_target[i] and (i in early or counts[i] >= self.quotas[i])

    def _all_targets_finished(self, counts: np.ndarray, early: set) -> bool:
        targets = [i for i, target in enumerate(self.is_target) if target]
        return bool(targets) and all(self._finished(i, counts, early) for i in targets)

    def _is_done(self, position: int, counts: np.ndarray, early: set) -> bool:
        if (position - self._base[0]) % self.slots_per_step:
            return False
        if self.max_steps is not None and self._step_at(position) >= self.max_steps:
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
        """Tasks the next slot may train, as indices with positive probability."""
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

    def probabilities_at(self, positions: np.ndarray) -> np.ndarray:
        """[len(positions), tasks]: the sampling probabilities of the slots at `positions` (module docstring:
        geometric interpolation from the starting to the end probabilities over `anneal_slots`)."""
        positions = np.asarray(positions, dtype=np.float64)
        if self.end_probabilities is None:
            return np.broadcast_to(self.probabilities, (len(positions), len(self.probabilities)))
        a = np.clip(positions / self.anneal_slots, 0.0, 1.0)[:, None]
        support = self.probabilities > 0
        logp0 = np.where(support, np.log(np.where(support, self.probabilities, 1.0)), 0.0)
        logp1 = np.where(support, np.log(np.where(support, self.end_probabilities, 1.0)), 0.0)
        logw = (1.0 - a) * logp0 + a * logp1
        w = np.where(support, np.exp(logw - logw.max(axis=1, keepdims=True)), 0.0)
        return w / w.sum(axis=1, keepdims=True)

    def _choose(self, candidates: np.ndarray, uniforms: np.ndarray, start: int) -> np.ndarray:
        """The tasks of the slots `start`, `start + 1`, ... drawn with the uniforms `uniforms` among `candidates`."""
        if self.end_probabilities is None:
            cdf = np.cumsum(self.probabilities[candidates])
            picks = np.searchsorted(cdf, uniforms * cdf[-1], side="right")
            return candidates[np.minimum(picks, len(candidates) - 1)]
        p = self.probabilities_at(np.arange(start, start + len(uniforms)))[:, candidates]
        cdf = np.cumsum(p, axis=1)
        picks = (cdf <= (uniforms * cdf[:, -1])[:, None]).sum(axis=1)
        return candidates[np.minimum(picks, len(candidates) - 1)]

    def next_task(self) -> int:
        """The task of the next slot (advances the schedule). RuntimeError when done."""
        if self.done:
            raise RuntimeError(f"the task schedule is done (step {self.step}); check `done` before drawing")
        j = self._position
        u = self._uniforms(j // _BLOCK)[j % _BLOCK]
        task = int(self._choose(self._candidates(self._counts, self._early), np.array([u]), j)[0])
        self._counts[task] += 1
        self._position += 1
        return task

    def plan(self) -> Plan:
        """Simulate from the current state to the end (no further early stops) without changing it.

        Vectorised per block of uniforms: the candidate set is fixed until a target reaches its
        quota, so a whole run of draws is taken at once up to that event.
        """
        pos, counts, early = self._position, self._counts.copy(), set(self._early)
        per_step, (base_pos, base_step) = self.slots_per_step, self._base
        while not self._is_done(pos, counts, early):
            limit = (pos // _BLOCK + 1) * _BLOCK  # end of this block of uniforms
            if self.max_steps is not None:
                limit = min(limit, base_pos + (self.max_steps - base_step) * per_step)
            if self._all_targets_finished(counts, early):  # only the rest of this step remains
                limit = min(limit, base_pos + ((pos - base_pos) // per_step + 1) * per_step)
            candidates = self._candidates(counts, early)
            u = self._uniforms(pos // _BLOCK)[pos % _BLOCK: pos % _BLOCK + (limit - pos)]
            picks = self._choose(candidates, u, pos)
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
        return Plan(total_steps=self._step_at(pos), micro_batches=tuple(int(c) for c in counts),
                    expected=tuple(float(x) for x in self.probabilities),
                    realized=tuple(float(c) / total if total else 0.0 for c in counts),
                    epochs=None if self.steps_per_epoch is None else tuple(
                        float(c) / s if s else 0.0 for c, s in zip(counts, self.steps_per_epoch)))

    def summary(self) -> str:
        """A table of the planned run (for the log and --dry_run)."""
        plan = self.plan()
        width = max(4, *(len(n) for n in self.names))
        annealed = self.end_probabilities is not None
        head = "p_i -> end       " if annealed else "p_i   "
        lines = [f"{'task':<{width}}  role    {head}  quota       planned  realized  epochs"]
        for i, name in enumerate(self.names):
            quota = "-" if self.quotas[i] is None else str(self.quotas[i])
            epochs = "-" if plan.epochs is None else f"{plan.epochs[i]:.2f}"
            p = f"{plan.expected[i]:.4f} -> {self.end_probabilities[i]:.4f}" if annealed else f"{plan.expected[i]:.4f}"
            lines.append(f"{name:<{width}}  {'target' if self.is_target[i] else 'aux':<6}  "
                         f"{p}  {quota:>9}  {plan.micro_batches[i]:>10}  "
                         f"{plan.realized[i]:.4f}  {epochs:>6}")
        cap = "" if self.max_steps is None else f" (max_steps {self.max_steps})"
        lines.append(f"optimizer steps: {plan.total_steps}{cap}, micro-batches per step (all ranks): "
                     f"{self.slots_per_step}, seed {self.seed}")
        if annealed:
            lines.append(f"sampling annealed over the first {self.anneal_slots} micro-batches "
                         f"({self.anneal_slots / self.slots_per_step:g} optimizer steps), then at the end "
                         "probabilities")
        return "\n".join(lines)

    # -- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        """JSON-safe state: the configuration it is valid for and the counters."""
        annealing = {} if self.end_probabilities is None else {
            "end_probabilities": self.end_probabilities.tolist(), "anneal_slots": self.anneal_slots}
        return {"version": _STATE_VERSION, "seed": self.seed, "probabilities": self.probabilities.tolist(),
                **annealing, "quotas": list(self.quotas), "is_target": list(self.is_target),
                "slots_per_step": self.slots_per_step, "position": self._position,
                "counts": list(self.counts), "finished_early": sorted(self._early), "base": list(self._base)}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continue from `state_dict()`; ConfigError if it was made for another schedule configuration.

        `max_steps` may differ (a run may be extended); everything that shapes the sequence may not.
        """
        problems = []
        if state.get("version") != _STATE_VERSION:
            problems.append(f"task schedule state version {state.get('version')!r}; this code reads {_STATE_VERSION}"
                            + (" (version 1 drew one task for the micro-batch of all data-parallel ranks; this "
                               "version draws one per rank's micro-batch, so the sequence cannot continue)"
                               if state.get("version") == 1 else ""))
        mine = {"seed": self.seed, "quotas": list(self.quotas), "is_target": list(self.is_target),
                "slots_per_step": self.slots_per_step, "anneal_slots": self.anneal_slots or None}
        for key, value in mine.items():
            if state.get(key) != value:
                problems.append(f"checkpoint task schedule has {key} {state.get(key)!r} but this run has {value!r}")
        for key, ours in (("probabilities", self.probabilities), ("end_probabilities", self.end_probabilities)):
            theirs = state.get(key)
            if ours is None and theirs is None:
                continue
            if ours is None or theirs is None or len(theirs) != len(ours) or not np.allclose(theirs, ours, rtol=1e-12,
                                                                                           atol=0):
                problems.append(f"checkpoint task schedule has {key} {theirs!r} but this run has "
                                f"{None if ours is None else ours.tolist()!r}")
        if problems:
            raise ConfigError(problems + ["the task mix changed since the checkpoint (seed, tasks, mix_ratio, "
                                          "sampling, data sizes, batch sizes, global batch): restore the "
                                          "original configuration or start a new output_dir"])
        counts = np.asarray(state["counts"], dtype=np.int64)
        if len(counts) != len(self._counts) or int(counts.sum()) != int(state["position"]):
            raise ConfigError([f"checkpoint task schedule is inconsistent: counts {state['counts']} do not sum to "
                               f"position {state['position']}"])
        base = state.get("base", [0, 0])
        self._position = int(state["position"])
        self._counts = counts
        self._early = {int(i) for i in state["finished_early"]}
        self._base = (int(base[0]), int(base[1]))


def state_step(state: Dict[str, Any]) -> int:
    """The optimizer steps completed at a schedule state (`TaskSchedule.state_dict()`)."""
    base_pos, base_step = state.get("base", [0, 0])
    return int(base_step) + (int(state["position"]) - int(base_pos)) // int(state["slots_per_step"])


def regroup_state(state: Dict[str, Any], *, slots_per_step: int, slot_scale: int = 1, quotas=None,
                  divide: int = 1) -> Dict[str, Any]:
    """A schedule state re-expressed for a run that continues it with another slot size or global batch.

    The slot size changes by the factor `slot_scale / divide` (flag mode with another micro batch:
    the one task's position and counts are re-counted in slots of the new size; they must come out
    whole); `slots_per_step` is the new global batch in slots; `quotas` the new run's (None: kept).
    Optimizer steps go on from the state's step: the new `base` is (its position, its step), so
    boundaries fall every `slots_per_step` slots from there. ValueError when a count does not divide.
    """
    def rescale(value: int, what: str) -> int:
        scaled = int(value) * slot_scale
        if scaled % divide:
            raise ValueError(f"{what} {value} slots of the checkpoint's micro-batch are not a whole number of slots "
                             f"of the new one (x {slot_scale}/{divide})")
        return scaled // divide

    step = state_step(state)
    position = rescale(state["position"], "position")
    # boundaries every slots_per_step slots from 0 (the same global batch) need no base
    base = [0, 0] if position == step * int(slots_per_step) else [position, step]
    out = dict(state, position=position, counts=[rescale(c, "count") for c in state["counts"]],
               slots_per_step=int(slots_per_step), base=base)
    if state.get("anneal_slots"):  # the annealing horizon was planned up front, in slots
        out["anneal_slots"] = rescale(state["anneal_slots"], "anneal_slots")
    if quotas is not None:
        out["quotas"] = list(quotas)
    return out


class TaskStream:
    """The order in which one task's training examples are read, across epochs.

    Epoch e is a permutation of range(N) drawn from (seed, task_index, e) (identity without
    shuffling). The task's k-th slot (micro-batch) covers stream positions [k*B, (k+1)*B) with B =
    `batch_size` (a slot may span an epoch boundary). Which rank computes a slot does not matter: the
    schedule numbers the slots of all ranks (module docstring), so resuming at slot k, on any
    topology, reads exactly what the interrupted run would have read.
    """

    def __init__(self, num_examples: int, *, seed: int, task_index: int, batch_size: int, shuffle: bool = True,
                 idle: bool = False):
        if num_examples < 1 and not (idle and num_examples == 0):
            raise ValueError(f"task {task_index}: no training examples (num_examples {num_examples})")
        if batch_size < 1:
            raise ValueError(f"batch_size {batch_size} must be >= 1")
        self.num_examples = int(num_examples)
        self.seed, self.task_index = int(seed), int(task_index)
        self.batch_size, self.shuffle = int(batch_size), bool(shuffle)
        self._perms: Dict[int, np.ndarray] = {}

    @property
    def steps_per_epoch(self) -> int:
        """Slots of this task per epoch, ceil(N / B)."""
        return -(-self.num_examples // self.batch_size)

    def permutation(self, epoch: int) -> np.ndarray:
        """The example order of `epoch` (the last two are cached: a batch spans at most two epochs
        unless B > N)."""
        perm = self._perms.get(epoch)
        if perm is None:
            rng = np.random.default_rng([self.seed, _STREAM_TAG, self.task_index, epoch])
            perm = rng.permutation(self.num_examples)
            self._perms = {e: p for e, p in self._perms.items() if e == epoch - 1}
            self._perms[epoch] = perm
        return perm

    def indices(self, k: int) -> List[Tuple[int, int]]:
        """(example index, epoch) pairs of the task's slot `k`."""
        if self.num_examples == 0:
            raise RuntimeError(f"task {self.task_index} is never drawn (mix_ratio 0) and its data was not read")
        start = k * self.batch_size
        out = []
        for pos in range(start, start + self.batch_size):
            epoch, offset = divmod(pos, self.num_examples)
            index = int(self.permutation(epoch)[offset]) if self.shuffle else offset
            out.append((index, epoch))
        return out

    def epoch_of(self, k: int) -> int:
        """Epoch of the first example of slot `k`."""
        return (k * self.batch_size) // self.num_examples if self.num_examples else 0

    def epochs_done(self, k: int) -> float:
        """Epochs consumed after `k` slots."""
        return k * self.batch_size / self.num_examples if self.num_examples else 0.0
