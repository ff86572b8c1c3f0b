"""The feeds of an optimizer step: for each micro-batch this rank computes, the slot it fills in
the step's global batch (`slot_of`: micro-batch m of data rank r is slot m * D + r), that slot's
task's next micro-batch of examples (read from the task's stream, collated by the task type), the
dropout seeds of (step, slot) and the idle-group flags of the step.

A feed depends only on (seed, step, slot, the schedule's position): the same slot gets the same
feed in an uninterrupted and a resumed run, on any process and on any topology with the same
global batch (ernie_mtl/planning/schedule.py, "Slots").
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Sequence, Tuple

import numpy as np

from ernie_mtl.program.forward import make_feed
from ernie_mtl.program.randomness import DROPOUT_SEEDS, draw_dropout_seeds, slot_of


@dataclass
class MicroBatch:
    task: str
    feed: Dict[str, np.ndarray]
    tokens: int  # non-pad tokens of all data-parallel ranks (this rank's times the data world size)
    slot: int = 0  # its place in the step's global batch (ernie_mtl/program/randomness.slot_of)
    examples: List[Tuple[int, int]] = field(default_factory=list)  # (example index, epoch) of the task's stream


class Feeder:
    def __init__(self, session):
        s = session
        self.tasks, self.plan, self.programs = s.plan.tasks, s.plan, s.programs
        self.seed, self.data_rank, self.data_world = s.cfg.train.seed, s.data_rank, s.topo.data_world_size
        self.accumulate = s.topo.accumulate_steps
        self.use_task_id = s.cfg.setup.mtl.use_task_id

    def step(self, step: int, drawn: Sequence[int], read: Sequence[int]) -> Iterator[MicroBatch]:
        """This rank's micro-batches of optimizer step `step`, whose slots (all ranks') drew the tasks
        `drawn` (indices), each task's stream at `read[i]` slots when the step began."""
        idle = self.programs.freeze.feed([self.tasks[i].spec.name for i in drawn])  # frozen on the device
        for m in range(self.accumulate):
            slot = slot_of(m, self.data_rank, self.data_world)
            i = drawn[slot]
            task = self.tasks[i]
            name = task.spec.name
            examples = self.plan.streams[i].indices(read[i] + sum(1 for j in drawn[:slot] if j == i))
            batch = task.collate([self.plan.train[name].get(idx, epoch) for idx, epoch in examples])
            feed = make_feed(self.tasks, i, batch, use_task_id=self.use_task_id)
            feed.update(idle)
            if self.programs.dropout_seeds:
                feed[DROPOUT_SEEDS] = draw_dropout_seeds(self.seed, step, slot, self.programs.dropout_seeds)
            yield MicroBatch(name, feed, int((np.asarray(batch["input_mask"]) == 0).sum()) * self.data_world,
                             slot=slot, examples=examples)
