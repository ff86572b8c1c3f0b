"""Batch sampling in global sample order, resumable from a sample count.

Global step s consumes samples [s*G, (s+1)*G) of the (already shuffled) dataset order, G the
global batch. Within it, accumulation micro-step m covers [s*G + m*M*W, s*G + (m+1)*M*W) with
M the micro batch and W the data-parallel world size (dp x sharding), and data rank r takes the
contiguous slice r of that. So one process with micro batch M*W sees exactly the union of what
W ranks see, and a resume only needs `consumed_samples`.
"""
from __future__ import annotations

from typing import Iterator, List

try:  # a plain class when paddle is absent keeps the data tools importable without the framework
    from paddle.io import BatchSampler as _Base
except ImportError:  # pragma: no cover
    _Base = object


class ConsumedSamplesBatchSampler(_Base):
    """Yields this rank's micro-batches (lists of dataset indices), starting after `consumed_samples`."""

    def __init__(self, num_samples: int, *, micro_batch_size: int, data_rank: int, data_world_size: int,
                 consumed_samples: int = 0):
        if not 0 <= data_rank < data_world_size:
            raise ValueError(f"data rank {data_rank} must be within [0, {data_world_size})")
        if consumed_samples % (micro_batch_size * data_world_size):
            raise ValueError(f"consumed_samples {consumed_samples} is not a multiple of micro batch x data world size "
                             f"({micro_batch_size} x {data_world_size}): the checkpoint was written by another topology")
        self.num_samples = int(num_samples)
        self.micro_batch_size = micro_batch_size
        self.data_rank = data_rank
        self.data_world_size = data_world_size
        self.consumed_samples = int(consumed_samples)

    @property
    def _stride(self) -> int:
        return self.micro_batch_size * self.data_world_size

    def __iter__(self) -> Iterator[List[int]]:
        start = self.consumed_samples
        offset = self.data_rank * self.micro_batch_size
        while start + self._stride <= self.num_samples:
            yield list(range(start + offset, start + offset + self.micro_batch_size))
            start += self._stride

    def __len__(self) -> int:
        return max(0, (self.num_samples - self.consumed_samples) // self._stride)
