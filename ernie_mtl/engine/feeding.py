"""The feeds of an optimizer step: for each of its micro-batches, this rank's slice of the drawn
task's global micro-batch (read from the task's stream at the task's position, collated by the task
type), the dropout seeds of (step, micro-batch, rank) and the idle-group flags of the step.

A feed depends only on (seed, step, micro-batch, the schedule's position, rank): the same step
builds the same feed in an uninterrupted and a resumed run, on any process that builds it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterator, List, Sequence

import numpy as np

from ernie_mtl.program.forward import make_feed
from ernie_mtl.program.randomness import DROPOUT_SEEDS, draw_dropout_seeds


@dataclass
class MicroBatch:
    task: str
    feed: Dict[str, np.ndarray]
    tokens: int  # non-pad tokens of all data-parallel ranks (this rank's times the data world size)


class Feeder:
    def __init__(self, session):
        s = session
        self.tasks, self.plan, self.programs = s.plan.tasks, s.plan, s.programs
        self.seed, self.data_rank, self.data_world = s.cfg.train.seed, s.data_rank, s.topo.data_world_size
        self.use_task_id = s.cfg.setup.mtl.use_task_id

    def step(self, step: int, drawn: Sequence[int], read: Sequence[int]) -> Iterator[MicroBatch]:
        """The micro-batches of optimizer step `step` whose tasks are `drawn` (indices), each task's
        stream starting at `read[i]` micro-batches."""
        position: List[int] = list(read)
        idle = self.programs.freeze.feed([self.tasks[i].spec.name for i in drawn])  # frozen on the device
        for m, i in enumerate(drawn):
            task = self.tasks[i]
            name = task.spec.name
            batch = task.collate([self.plan.train[name].get(idx, epoch)
                                  for idx, epoch in self.plan.streams[i].indices(position[i])])
            position[i] += 1
            feed = make_feed(self.tasks, i, batch, use_task_id=self.use_task_id)
            feed.update(idle)
            if self.programs.dropout_seeds:
                feed[DROPOUT_SEEDS] = draw_dropout_seeds(self.seed, step, m, self.data_rank,
                                                         self.programs.dropout_seeds)
            yield MicroBatch(name, feed, int((np.asarray(batch["input_mask"]) == 0).sum()) * self.data_world)
