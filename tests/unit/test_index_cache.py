"""The index cache: hash keys, atomic build-once, the builder/barrier protocol, validation."""
import contextlib
import json
import multiprocessing as mp
import os
import time
from pathlib import Path

import numpy as np
import pytest

from data_tools import index_cache
from data_tools.index_cache import (IndexCacheError, cache_folder, cache_key, is_index_builder,
                                    load_or_build)
from helpers import FileBarrier

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
    with pytest.raises(IndexCacheError, match="does not exist after the builder rank finished.*--prebuild_index"):
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


def _contending_job(cache_dir, marks, role):
    """One of two jobs building the same cache. The second announces when it reaches the build lock;
    the first builds until it has seen that, so the two provably overlap."""
    marks = Path(marks)
    if role == "second":
        locked = index_cache._locked

        @contextlib.contextmanager
        def announced(path):
            (marks / "second-at-lock").touch()
            with locked(path):
                yield

        index_cache._locked = announced  # this forked process only

    def build():
        (marks / f"built-{role}").touch()
        if role == "first":  # hold the lock until the other job is at it (a deadline only against a hang)
            deadline = time.monotonic() + 120
            while not (marks / "second-at-lock").exists() and time.monotonic() < deadline:
                time.sleep(0.01)
        return _arrays()

    arrays = load_or_build(cache_dir, "c", DESC, build, log=lambda m: None)
    np.save(marks / f"mapping-{role}.npy", arrays["mapping"])


def test_concurrent_jobs_build_once(tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    ctx = mp.get_context("fork")
    first = ctx.Process(target=_contending_job, args=(str(tmp_path / "cache"), str(marks), "first"))
    first.start()
    deadline = time.monotonic() + 120
    while not (marks / "built-first").exists() and first.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    second = ctx.Process(target=_contending_job, args=(str(tmp_path / "cache"), str(marks), "second"))
    second.start()  # the first job is building: the cache is not complete yet
    for p in (first, second):
        p.join(180)
        assert p.exitcode == 0
    assert (marks / "second-at-lock").exists()  # the second job reached the lock while the first was building
    assert sorted(m.name for m in marks.glob("built-*")) == ["built-first"]  # ... and waited instead of building
    for role in ("first", "second"):
        assert np.array_equal(np.load(marks / f"mapping-{role}.npy"), _arrays()["mapping"])


def _node_rank(rank, local_rank, share_folder, root, fail):
    """Rank `rank` of 2 nodes x 2 processes; each node has its own cache folder (no shared filesystem)."""
    cache = os.path.join(root, f"node{rank // 2}")

    def build():
        open(os.path.join(root, f"built-by-{rank}"), "w").close()
        if fail:
            raise RuntimeError("disk full while building")
        time.sleep(0.2)  # give the other ranks time to reach the barrier first
        return _arrays()

    try:
        arrays = load_or_build(cache, "c", DESC, build, is_builder=is_index_builder(rank, local_rank, share_folder),
                               barrier=FileBarrier(os.path.join(root, "barrier"), rank, 4), log=lambda m: None)
        result = {"mapping": arrays["mapping"].tolist()}
    except (IndexCacheError, RuntimeError) as e:
        result = {"error": f"{type(e).__name__}: {e}"}
    Path(root, f"rank{rank}.json").write_text(json.dumps(result))


def _two_nodes(tmp_path, share_folder, fail=False):
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_node_rank, args=(r, r % 2, share_folder, str(tmp_path), fail)) for r in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0  # nobody hung, nobody crashed
    built = sorted(int(x.name.rsplit("-", 1)[1]) for x in tmp_path.glob("built-by-*"))
    return built, [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]


def test_per_node_caches_local_rank_0_of_each_node_builds(tmp_path):
    built, results = _two_nodes(tmp_path, share_folder=False)
    assert built == [0, 2]  # local rank 0 of node 0 (rank 0) and of node 1 (rank 2)
    assert all(r == {"mapping": _arrays()["mapping"].tolist()} for r in results)
    for node in (0, 1):
        assert (cache_folder(tmp_path / f"node{node}", "c", DESC) / "description.json").is_file()


def test_shared_folder_mode_on_unshared_nodes_fails_clearly_without_hanging(tmp_path):
    built, results = _two_nodes(tmp_path, share_folder=True)
    assert built == [0]
    assert "mapping" in results[0] and "mapping" in results[1]
    for r in results[2:]:
        assert r["error"].startswith("IndexCacheError") and "--share_folder false" in r["error"]


def test_failed_builders_still_release_their_nodes(tmp_path):
    built, results = _two_nodes(tmp_path, share_folder=False, fail=True)
    assert built == [0, 2]
    for rank, r in enumerate(results):
        if rank % 2 == 0:  # the builders report their own failure
            assert r["error"] == "RuntimeError: disk full while building"
        else:  # the others are released by the barrier and point at the builder's log
            assert "does not exist after the builder rank finished" in r["error"] and "see its log" in r["error"]


def test_a_complete_cache_is_never_replaced_by_a_racing_builder(tmp_path):
    load_or_build(tmp_path, "c", DESC, _arrays, log=lambda m: None)
    folder = cache_folder(tmp_path, "c", DESC)
    before = {p.name: p.stat().st_ino for p in folder.iterdir()}
    racer = tmp_path / ".c.tmp-racer"  # what a second builder without the lock would publish
    racer.mkdir()
    np.save(racer / "mapping.npy", np.zeros(3))
    index_cache._publish(racer, folder)
    assert {p.name: p.stat().st_ino for p in folder.iterdir()} == before
    assert not racer.exists()
