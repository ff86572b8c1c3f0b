"""Global-order batch sampling: rank slices, resume offsets, equivalence with one process."""
import pytest

from ernie_mtl.data.sampler import ConsumedSamplesBatchSampler


def _batches(**kw):
    return list(ConsumedSamplesBatchSampler(**kw))


def test_ranks_partition_each_micro_step_and_match_one_process():
    ranks = [_batches(num_samples=40, micro_batch_size=2, data_rank=r, data_world_size=2) for r in (0, 1)]
    single = _batches(num_samples=40, micro_batch_size=4, data_rank=0, data_world_size=1)
    assert len(ranks[0]) == len(ranks[1]) == len(single) == 10
    for m, whole in enumerate(single):
        assert ranks[0][m] + ranks[1][m] == whole
    assert single[0] == [0, 1, 2, 3] and ranks[1][1] == [6, 7]


def test_resume_continues_exactly_and_drops_a_partial_tail():
    full = _batches(num_samples=23, micro_batch_size=2, data_rank=1, data_world_size=2)
    resumed = _batches(num_samples=23, micro_batch_size=2, data_rank=1, data_world_size=2, consumed_samples=8)
    assert resumed == full[2:]
    assert full[-1] == [18, 19]  # the last whole stride is samples 16..19; 20..22 are dropped
    assert len(ConsumedSamplesBatchSampler(23, micro_batch_size=2, data_rank=0, data_world_size=2)) == 5


def test_refuses_a_consumed_count_from_another_topology():
    with pytest.raises(ValueError, match="not a multiple of micro batch x data world size"):
        ConsumedSamplesBatchSampler(100, micro_batch_size=4, data_rank=0, data_world_size=2, consumed_samples=12)
    with pytest.raises(ValueError, match="data rank 2"):
        ConsumedSamplesBatchSampler(100, micro_batch_size=4, data_rank=2, data_world_size=2)
