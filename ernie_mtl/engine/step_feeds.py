"""The feeds of an optimizer step: for each micro-batch this rank computes, the slot it fills in
the step's global batch (`slot_of`: micro-batch m of data rank r is slot m * D + r), that slot's
task's next micro-batch of examples (read from the task's stream, collated by the task type), the
dropout seeds of (step, slot) and the idle-group flags of the step.

A feed depends only on (seed, step, slot, the schedule's draws, each task's position): the same
slot gets the same feed in an uninterrupted and a resumed run, on any process that builds it and on
any topology with the same global batch (ernie_mtl/planning/schedule.py, "Slots"). `FeedRecipe` is
everything else a feed depends on, as one picklable object: `Feeder` builds the feeds with it in the
training process (`--num_workers 0`), the workers of ernie_mtl/engine/data_workers.py with a copy of it
in their own processes. One function builds a micro-batch either way, so both give the same bytes.

A failure while building (a corpus whose bytes changed under the run, a task type's `collate` that
raises) is reported as a `SampleError` naming the task, the example (file, sample index, epoch),
the micro-batch, its slot and the step: a `SampleUserError` (exit status 2, the message alone) when
the cause is one the user fixes (a data or I/O error), otherwise a bug with its traceback.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from data_tools.cli_utils import UserError
from ernie_mtl.program.forward import make_feed
from ernie_mtl.program.idle_heads import IDLE_GROUPS
from ernie_mtl.program.randomness import DROPOUT_SEEDS, draw_dropout_seeds, slot_of

# Feeds the program consumes on the CPU (split there into scalars, program/randomness.py and
# program/idle_heads.py). Fed as numpy, the executor would put them on the run's device and the
# program would copy them back: on a GPU a device-to-host copy that waits for the stream (for 64 KiB
# or less, phi's memcpy_d2h), once per micro-batch. As CPU tensors they stay where they are read.
CPU_FEEDS = frozenset({DROPOUT_SEEDS, IDLE_GROUPS})


def to_tensors(feed: Dict[str, Any], place, *, only_cpu_feeds: bool = False) -> Dict[str, Any]:
    """`feed` with its arrays as tensors where the program reads them: CPU_FEEDS on the CPU, the others
    on `place` (None: the CPU). `only_cpu_feeds`: convert those alone and leave the rest to the executor."""
    from paddle.base import core

    cpu, out = core.CPUPlace(), {}
    for name, value in feed.items():
        if name in CPU_FEEDS or not only_cpu_feeds:
            tensor = core.LoDTensor()
            tensor.set(value, cpu if name in CPU_FEEDS or place is None else place)
            value = tensor
        out[name] = value
    return out


@dataclass
class MicroBatch:
    task: str
    feed: Dict[str, Any]  # numpy arrays (or, staged by a background feeder, tensors on the device)
    tokens: int  # non-pad tokens of all data-parallel ranks (this rank's times the data world size)
    slot: int = 0  # its place in the step's global batch (ernie_mtl/program/randomness.slot_of)
    examples: List[Tuple[int, int]] = field(default_factory=list)  # (example index, epoch) of the task's stream


class SampleError(RuntimeError):
    """Building a training micro-batch failed (a bug: the message names where, the cause follows)."""


class DataWorkerLost(SampleError):
    """A data-loading worker died, stopped or stopped answering (not the data's fault): the message names
    the worker, what it was building and what to do. The command line exits with EXIT_WORKER_LOST (a run
    that may succeed again: the supervisor restarts it)."""


EXIT_WORKER_LOST = 74  # documented in docs/launch.md: a data-loading worker was lost; run the same command again


class SampleUserError(UserError):
    """Building a training micro-batch failed for a reason the user fixes (data, I/O)."""


def sample_error(message: str, cause: BaseException, *, detail: str = "") -> Exception:
    """The error to raise for `cause`: a SampleUserError for a user error or an I/O fault, else a
    SampleError; `detail` (a worker's traceback) is appended to a bug's message."""
    text = f"{message}: {type(cause).__name__}: {cause}"
    if isinstance(cause, (UserError, OSError)):
        return SampleUserError(text)
    return SampleError(text + (f"\n{detail}" if detail else ""))


def position_of(drawn: Sequence[int], read: Sequence[int], slot: int) -> int:
    """The stream position (slots of its task read before it) of slot `slot` of a step whose slots'
    tasks are `drawn`, each task's stream at `read[i]` when the step began: a task's slots read its
    stream in slot order, whichever rank computes them."""
    task = drawn[slot]
    return int(read[task]) + sum(1 for i in drawn[:slot] if i == task)


@dataclass
class FeedRecipe:
    """What the feeds of a run depend on besides (step, micro-batch, draws, positions): picklable,
    so that data-loading worker processes build exactly what the training process would."""

    tasks: List[Any]  # TaskType instances, in task_instance order
    train: Dict[str, Any]  # task -> TaskData of its training split
    streams: List[Any]  # this rank's TaskStream per task
    seed: int
    data_rank: int
    data_world: int
    accumulate: int = 1  # micro-batches of this rank per optimizer step
    use_task_id: bool = False
    freeze: Optional[Any] = None  # FreezePlan of the idle parameter groups
    dropout_seeds: int = 0  # length of the dropout_seeds feed (0: none)

    @classmethod
    def from_session(cls, session) -> "FeedRecipe":
        s = session
        return cls(tasks=list(s.plan.tasks), train=dict(s.plan.train), streams=list(s.plan.streams),
                   seed=s.cfg.train.seed, data_rank=s.data_rank, data_world=s.topo.data_world_size,
                   accumulate=s.topo.accumulate_steps, use_task_id=s.cfg.setup.mtl.use_task_id,
                   freeze=s.programs.freeze, dropout_seeds=s.programs.dropout_seeds)

    def idle_flags(self, drawn: Sequence[int]) -> Dict[str, np.ndarray]:
        """The idle-group feed of a step whose slots' tasks are `drawn` (frozen on the device)."""
        if self.freeze is None:
            return {}
        return self.freeze.feed([self.tasks[i].spec.name for i in drawn])

    def micro(self, step: int, micro: int, drawn: Sequence[int], read: Sequence[int],
              idle: Optional[Dict[str, np.ndarray]] = None) -> MicroBatch:
        """This rank's micro-batch `micro` of optimizer step `step`: slot `slot_of(micro, data_rank,
        data_world)` of the step, whose slots (all ranks') drew the tasks `drawn`, each task's stream
        at `read[i]` slots when the step began. `idle`: the step's idle flags, if already computed."""
        slot = slot_of(micro, self.data_rank, self.data_world)
        if len(drawn) != self.accumulate * self.data_world:
            raise ValueError(f"step {step + 1} drew {len(drawn)} slots; this run's global batch is "
                             f"{self.accumulate * self.data_world} ({self.accumulate} micro-batches x "
                             f"{self.data_world} data-parallel ranks)")
        i = drawn[slot]
        task = self.tasks[i]
        name = task.spec.name
        where = f"task {name}: building micro-batch {micro} (slot {slot}) of step {step + 1}"
        examples = self.streams[i].indices(position_of(drawn, read, slot))
        features = []
        for index, epoch in examples:
            try:
                features.append(self.train[name].get(index, epoch))
            except Exception as e:  # noqa: BLE001  (named and re-raised)
                raise sample_error(f"{where}: {task.example_source(index)} (epoch {epoch})", e) from e
        try:
            batch = task.collate(features)
            feed = make_feed(self.tasks, i, batch, use_task_id=self.use_task_id)
        except Exception as e:  # noqa: BLE001
            (first, epoch), (last, _) = examples[0], examples[-1]
            raise sample_error(f"{where}: collating examples {first}..{last} (epoch {epoch}) of "
                               f"{task.spec.train_file}", e) from e
        feed.update(self.idle_flags(drawn) if idle is None else idle)
        if self.dropout_seeds:
            feed[DROPOUT_SEEDS] = draw_dropout_seeds(self.seed, step, slot, self.dropout_seeds)
        tokens = int((np.asarray(batch["input_mask"]) == 0).sum()) * self.data_world
        return MicroBatch(name, feed, tokens, slot=slot, examples=[(int(a), int(b)) for a, b in examples])

    def describe(self, step: int, micro: int, drawn: Sequence[int], read: Sequence[int]) -> str:
        """What building this rank's micro-batch `micro` of step `step` reads, for messages: the task, its
        file and the examples (stream positions, the same as `micro` takes)."""
        slot = slot_of(micro, self.data_rank, self.data_world)
        if slot >= len(drawn):
            return f"micro-batch {micro} of step {step + 1}"
        i = drawn[slot]
        task = self.tasks[i]
        try:
            examples = self.streams[i].indices(position_of(drawn, read, slot))
            span = f"examples {examples[0][0]}..{examples[-1][0]} (epoch {examples[0][1]}) of " if examples else ""
        except Exception:  # noqa: BLE001  (a description must not fail)
            span = ""
        return (f"micro-batch {micro} of step {step + 1} (slot {slot}): task {task.spec.name}, {span}"
                f"{task.spec.train_file}")

    def step(self, step: int, drawn: Sequence[int], read: Sequence[int]) -> Iterator[MicroBatch]:
        """This rank's `accumulate` micro-batches of optimizer step `step`, one at a time."""
        idle = self.idle_flags(drawn)
        for m in range(self.accumulate):
            yield self.micro(step, m, drawn, read, idle)


class Feeder:
    """Builds each micro-batch in the training process when the loop asks for it (`--num_workers 0`).
    On a device other than the CPU the CPU_FEEDS are handed over as CPU tensors; on the CPU the feed
    stays numpy, as the executor takes it."""

    def __init__(self, recipe: FeedRecipe, place=None):
        self.recipe = recipe
        self.cpu_tensors = place is not None and not _is_cpu(place)
        self.place = place

    def open(self) -> None:
        """Nothing to start (the background feeder starts its workers here)."""

    def start(self, step: int, schedule) -> None:
        """Training begins (or resumes) at `step` with the schedule in its state there."""

    def step(self, step: int, drawn: Sequence[int], read: Sequence[int]) -> Iterator[MicroBatch]:
        """This rank's micro-batches of optimizer step `step`, whose slots (all ranks') drew the tasks
        `drawn` (indices), each task's stream starting at `read[i]` slots."""
        for micro in self.recipe.step(step, drawn, read):
            if self.cpu_tensors:
                micro.feed = to_tensors(micro.feed, self.place, only_cpu_feeds=True)
            yield micro

    def close(self) -> None:
        pass


def _is_cpu(place) -> bool:
    from paddle.base import core

    return isinstance(place, core.CPUPlace) or (hasattr(place, "is_cpu_place") and place.is_cpu_place())
