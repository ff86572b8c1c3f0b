"""The index cache: hash keys, atomic build-once, the builder/barrier protocol, validation."""
import multiprocessing as mp
import os
import time

import numpy as np
import pytest

from data_tools.index_cache import (IndexCacheError, cache_folder, cache_key, is_index_builder,
                                    load_or_build)

DESC = {"data": {"bin_size": 10, "idx_mtime_ns": 5}, "split": "949,50,1", "seed": 1, "helper_version": "1"}


def _arrays():
    return {"mapping": np.arange(12, dtype=np.int32).reshape(4, 3), "order": np.array([3, 1, 2, 0], dtype=np.int64)}


def test_build_then_reuse_memory_mapped(tmp_path):
    calls = []
    build = lambda: calls.append(1) or _arrays()  # noqa: E731
    first = load_or_build(tmp_path, "c", DESC, build, log=lambda m: None)
    second = load_or_build(tmp_path, "c", DESC, build, log=lambda m: None)
    assert len(calls) == 1
    for arrays in (first, second):
        assert isinstance(arrays["mapping"], np.memmap)
        np.testing.assert_array_equal(arrays["mapping"], _arrays()["mapping"])
        assert arrays["order"].dtype == np.int64
    folder = cache_folder(tmp_path, "c", DESC)
    assert sorted(p.name for p in folder.iterdir()) == ["description.json", "mapping.npy", "order.npy"]
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


def test_any_change_in_the_description_changes_the_key(tmp_path):
    keys = {cache_key(DESC)}
    for field, value in [("split", "98,1,1"), ("seed", 2), ("helper_version", "2")]:
        keys.add(cache_key({**DESC, field: value}))
    keys.add(cache_key({**DESC, "data": {"bin_size": 11, "idx_mtime_ns": 5}}))
    assert len(keys) == 5
    assert cache_key(dict(reversed(list(DESC.items())))) == cache_key(DESC)  # order-independent


def test_failed_build_leaves_nothing_and_still_meets_the_barrier(tmp_path):
    met = []

    def broken():
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        load_or_build(tmp_path, "c", DESC, broken, barrier=lambda: met.append(1), log=lambda m: None)
    assert met == [1]
    assert not cache_folder(tmp_path, "c", DESC).exists()
    assert not [p for p in tmp_path.iterdir() if p.is_dir()]


def test_non_builder_without_cache_gets_a_clear_error(tmp_path):
    met = []
    with pytest.raises(IndexCacheError, match="does not exist after the builder rank finished.*prebuild_index"):
        load_or_build(tmp_path, "c", DESC, _arrays, is_builder=False, barrier=lambda: met.append(1))
    assert met == [1]


def test_incomplete_leftover_folder_is_rebuilt(tmp_path):
    folder = cache_folder(tmp_path, "c", DESC)
    folder.mkdir(parents=True)
    (folder / "mapping.npy").write_bytes(b"garbage")  # a crash before description.json was written
    arrays = load_or_build(tmp_path, "c", DESC, _arrays, log=lambda m: None)
    np.testing.assert_array_equal(arrays["mapping"], _arrays()["mapping"])


def test_inconsistent_array_is_reported_with_the_fix(tmp_path):
    load_or_build(tmp_path, "c", DESC, _arrays, log=lambda m: None)
    folder = cache_folder(tmp_path, "c", DESC)
    np.save(folder / "order.npy", np.zeros(5, dtype=np.int64))
    with pytest.raises(IndexCacheError, match=r"order.npy has shape \(5,\).*delete .* to rebuild"):
        load_or_build(tmp_path, "c", DESC, _arrays, log=lambda m: None)


def test_builder_rank_rule():
    assert is_index_builder(0, 0, shared_filesystem=True)
    assert not is_index_builder(8, 0, shared_filesystem=True)
    assert is_index_builder(8, 0, shared_filesystem=False)
    assert not is_index_builder(9, 1, shared_filesystem=False)


def _concurrent_job(cache_dir, counter_dir):
    def build():
        # record that a build ran, and take long enough for the other job to contend
        open(os.path.join(counter_dir, f"built-{os.getpid()}"), "w").close()
        time.sleep(0.5)
        return _arrays()

    load_or_build(cache_dir, "c", DESC, build, log=lambda m: None)


def test_concurrent_jobs_build_once(tmp_path):
    counter = tmp_path / "counter"
    counter.mkdir()
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_concurrent_job, args=(str(tmp_path / "cache"), str(counter))) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert len(list(counter.iterdir())) == 1
