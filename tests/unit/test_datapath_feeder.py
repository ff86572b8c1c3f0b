"""The background data path (ernie_mtl/engine/data_workers.py) against the in-process feeder, on the
multi-task test data (cls, seq_label, a pretraining corpus, a plugin task type, and an mlm task):
the same micro-batches in the same order, also when the schedule changes under it (a target
finished early) and from a resumed position; errors that name the task, file, sample and worker;
a killed worker named; no process left behind; bounded memory over many micro-batches.

The end-to-end side (a run's logs with and without workers, SIGKILL and resume, orphans after a
SIGKILL of the trainer) is in tests/e2e/test_datapath.py.
"""
import zlib  # noqa: F401  (before paddle)

import copy
import os
import pickle
import signal
from pathlib import Path

import numpy as np
import pytest

from helpers import global_yaml, proc_alive

MLM_ROWS = ["国家的东方", "了是国家", "东方的了", "是了的国家东"] * 10
FAILING = '''
class FailAt:
    """A TaskData transform that fails on one example (a corrupt sample), as a plugin file: data-loading
    workers import the run's plugins, so they can unpickle it."""

    def __init__(self, index, user_error=False):
        self.index, self.user_error = index, user_error

    def __call__(self, feature, index, epoch):
        if index == self.index:
            if self.user_error:
                from data_tools.cli_utils import UserError
                raise UserError(f"corpus bytes changed under the run at example {index}")
            raise ValueError(f"cannot decode example {index}")
        return feature
'''


@pytest.fixture(scope="module")
def run_plan(data, tmp_path_factory):
    """(cfg, plan, plugins) of a four-task run: sentiment (cls), wordseg (seq_label), corpus (pretrain),
    lm (mlm); plus a plugin file with a failing transform."""
    from ernie_mtl.dist.process import ProcessInfo
    from ernie_mtl.dist.topology import Topology
    from ernie_mtl.engine.plugins import import_plugins
    from ernie_mtl.engine.config_checks import parse
    from ernie_mtl.planning.plan import prepare

    root = tmp_path_factory.mktemp("datapath")
    (root / "mlm.tsv").write_text("text_a\n" + "\n".join(MLM_ROWS) + "\n", encoding="utf-8")
    (root / "lm.yaml").write_text(f"reader: mlm\ntrain_file: {root / 'mlm.tsv'}\n", encoding="utf-8")
    for name in ("sentiment", "wordseg", "corpus"):
        (root / f"{name}.yaml").write_text((data / "tasks" / f"{name}.yaml").read_text().replace(
            "../", str(data) + "/"), encoding="utf-8")
    failing = root / "failing.py"
    failing.write_text(FAILING, encoding="utf-8")
    plugins = [str(data / "plugins.py"), str(failing)]
    config = global_yaml(root, "global.yaml", task_instance="sentiment, wordseg, corpus, lm", target_tag="1, 1, 0, 0",
                         mix_ratio="1.0, 1.0, 0.5, 0.5", task_dir=str(root), batch_size=4, plugins=plugins,
                         vocab_path=str(data / "vocab.txt"))
    cfg = parse(["--config", str(config), "--global_batch_size", "8", "--micro_batch_size", "4",
                 "--output_dir", str(root / "out")])
    assert not import_plugins([str(failing)], where="test")
    topo = Topology.from_config(cfg.parallel, 1)
    plan = prepare(cfg, info=ProcessInfo(rank=0, world_size=1, local_rank=0), topo=topo,
                   barrier=lambda *a, **k: None, log=lambda m: None, load_dev=False)
    return cfg, topo, plan, plugins


def recipe_of(run_plan, **changes):
    from ernie_mtl.engine.step_feeds import FeedRecipe
    from ernie_mtl.program.idle_heads import FreezeGroup, FreezePlan

    cfg, topo, plan, _ = run_plan
    names = [t.spec.name for t in plan.tasks]
    freeze = FreezePlan(tasks=tuple(names), groups=[FreezeGroup(name=n, users=(n,), params=[]) for n in names])
    fields = dict(tasks=list(plan.tasks), train=dict(plan.train), streams=list(plan.streams), seed=cfg.train.seed,
                  data_rank=0, data_world=1, accumulate=topo.accumulate_steps, freeze=freeze, dropout_seeds=5)
    fields.update(changes)
    return FeedRecipe(**fields)


def background(run_plan, recipe=None, **kwargs):
    from ernie_mtl.engine.data_workers import BackgroundFeeder

    _, topo, _, plugins = run_plan
    return BackgroundFeeder(recipe or recipe_of(run_plan), plugins=plugins,
                            **{"num_workers": 2, "prefetch_factor": 2, **kwargs})


def as_arrays(feed):
    return {k: np.array(v) for k, v in feed.items()}


def assert_same(a, b):
    assert len(a) == len(b) and len(a) > 0
    for k, ((task_a, feed_a, tokens_a), (task_b, feed_b, tokens_b)) in enumerate(zip(a, b)):
        assert (task_a, tokens_a) == (task_b, tokens_b), k
        assert sorted(feed_a) == sorted(feed_b), k
        for name in feed_a:
            assert feed_a[name].dtype == feed_b[name].dtype and np.array_equal(feed_a[name], feed_b[name]), (k, name)


def in_process(run_plan, steps, start=0, schedule=None, at_step=None):
    from ernie_mtl.engine.step_feeds import Feeder

    schedule = schedule or copy.deepcopy(run_plan[2].schedule)
    feeder = Feeder(recipe_of(run_plan))
    feeder.start(start, schedule)
    return drive_from(feeder, schedule, steps, start, at_step)


def drive_from(feeder, schedule, steps, start, at_step=None, *, full=False):
    """The micro-batches `feeder` gives for `steps` steps from `start`, drawing a task per slot (all
    ranks') as the loop does: (task, feed, tokens), plus (slot, examples) when `full`."""
    out = []
    for step in range(start, start + steps):
        if schedule.done:
            break
        read = list(schedule.counts)
        drawn = [schedule.next_task() for _ in range(schedule.slots_per_step)]
        for micro in feeder.step(step, drawn, read):
            out.append((micro.task, as_arrays(micro.feed), micro.tokens)
                       + ((micro.slot, tuple(micro.examples)) if full else ()))
        if at_step and step in at_step:
            at_step[step](schedule)
    return out


def test_workers_build_the_micro_batches_the_training_process_builds(run_plan):
    steps = 40
    expected = in_process(run_plan, steps)
    assert {t for t, _, _ in expected} == {"sentiment", "wordseg", "corpus", "lm"}  # every task type drawn
    schedule = copy.deepcopy(run_plan[2].schedule)
    feeder = background(run_plan)
    try:
        feeder.open()
        feeder.start(0, schedule)
        got = drive_from(feeder, schedule, steps, 0)
        stats = feeder.stats()
    finally:
        feeder.close()
    assert_same(got, expected)
    assert stats["restarts"] == 0
    for hello in stats["workers"]:  # no Paddle in a worker, one math thread
        assert hello["paddle_imported"] is False
        assert hello["threads"] == {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


def test_workers_of_each_rank_build_its_slots(run_plan):
    """The same global batch (8 = 2 slots of 4) on 2 data-parallel ranks with accumulation 1 instead
    of 1 process with accumulation 2: each rank's workers build its own slots (micro-batch 0 of rank r
    is slot r), and the two ranks' micro-batches, interleaved in slot order, are the one process's
    feeds (examples, dropout seeds of the slot, idle flags), token counts aside (scaled by the data
    world). Resumed at step 4 from the schedule's state, the workers follow the slot rule too."""
    from ernie_mtl.engine.step_feeds import Feeder

    steps, resume_at = 12, 4
    one = in_process(run_plan, steps)
    one_full = drive_from(Feeder(recipe_of(run_plan)), copy.deepcopy(run_plan[2].schedule), steps, 0, full=True)
    assert [m[3] for m in one_full] == [0, 1] * steps
    per_rank = []
    for rank in (0, 1):
        recipe = recipe_of(run_plan, data_rank=rank, data_world=2, accumulate=1)
        got = []
        for start, count in ((0, resume_at), (resume_at, steps - resume_at)):  # a resume in between
            schedule = copy.deepcopy(run_plan[2].schedule)
            for _ in range(start * schedule.slots_per_step):
                schedule.next_task()
            resumed = copy.deepcopy(run_plan[2].schedule)
            resumed.load_state_dict(schedule.state_dict())
            feeder = background(run_plan, recipe)
            try:
                feeder.start(start, resumed)
                got += drive_from(feeder, resumed, count, start, full=True)
                assert feeder.restarts == 0
            finally:
                feeder.close()
        assert [m[3] for m in got] == [rank] * steps  # slot m * D + r with m = 0
        per_rank.append(got)
    interleaved = [per_rank[k % 2][k // 2] for k in range(2 * steps)]
    assert_same([(t, f, tokens * 2) for t, f, tokens in one], [(t, f, tokens) for t, f, tokens, _, _ in interleaved])
    assert [(m[3], m[4]) for m in interleaved] == [(m[3], m[4]) for m in one_full]
    assert len({m[0] for m in interleaved}) > 1  # the ranks train different tasks in some steps
    assert any(a[0] != b[0] for a, b in zip(per_rank[0], per_rank[1]))


@pytest.mark.parametrize("workers,prefetch", [(1, 1), (3, 2)])
def test_a_target_finished_early_restarts_the_plan_and_stays_exact(run_plan, workers, prefetch):
    """finish() changes the draws after step 5: planned micro-batches are dropped, the rest follows
    the real schedule."""
    finish = {5: lambda s: s.finish(s.names.index("sentiment"))}
    expected = in_process(run_plan, 20, at_step=finish)
    schedule = copy.deepcopy(run_plan[2].schedule)
    feeder = background(run_plan, num_workers=workers, prefetch_factor=prefetch)
    try:
        feeder.start(0, schedule)
        got = drive_from(feeder, schedule, 20, 0, at_step=finish)
        restarts = feeder.restarts
    finally:
        feeder.close()
    assert_same(got, expected)
    assert restarts == 1
    assert "sentiment" not in {t for t, _, _ in got[-20:]}


def test_a_resumed_position_is_planned_from_the_checkpointed_schedule(run_plan):
    """Start at step 7 from the schedule's state there (as a resume loads it): the same feeds as
    steps 7.. of an uninterrupted run; nothing is kept per worker."""
    schedule = copy.deepcopy(run_plan[2].schedule)
    uninterrupted = in_process(run_plan, 12, schedule=schedule)
    acc = schedule.slots_per_step  # one process: its micro-batches are the step's slots
    resumed_schedule = copy.deepcopy(run_plan[2].schedule)
    for _ in range(7 * acc):
        resumed_schedule.next_task()
    state = resumed_schedule.state_dict()
    fresh = copy.deepcopy(run_plan[2].schedule)
    fresh.load_state_dict(state)
    feeder = background(run_plan)
    try:
        feeder.start(7, fresh)
        got = drive_from(feeder, fresh, 5, 7)
    finally:
        feeder.close()
    assert_same(got, uninterrupted[7 * acc:])


@pytest.mark.parametrize("user_error", [False, True])
def test_a_failing_sample_names_the_task_file_sample_and_worker(run_plan, user_error):
    import importlib

    from ernie_mtl.engine.step_feeds import SampleError, SampleUserError
    from ernie_mtl.engine.plugins import module_name

    _, _, plan, plugins = run_plan
    fail_at = importlib.import_module(module_name(plugins[1])).FailAt
    data = copy.copy(plan.train["sentiment"])
    schedule = copy.deepcopy(plan.schedule)
    i = schedule.names.index("sentiment")
    bad = plan.streams[i].indices(2)[1][0]  # the 2nd example of the task's 3rd micro-batch
    data.transform = fail_at(bad, user_error)
    recipe = recipe_of(run_plan, train={**plan.train, "sentiment": data})
    kind = SampleUserError if user_error else SampleError
    messages = []
    for feeder in (background(run_plan, recipe), None):
        from ernie_mtl.engine.step_feeds import Feeder

        feeder = feeder or Feeder(recipe)
        s = copy.deepcopy(schedule)
        try:
            feeder.start(0, s)
            with pytest.raises(kind) as caught:
                drive_from(feeder, s, 50, 0)
        finally:
            feeder.close()
        messages.append(str(caught.value))
    worker, local = messages
    path = str(Path(plan.tasks[i].spec.train_file))
    for text in messages:
        assert "task sentiment: building micro-batch" in text and f"example {bad} of {path} (epoch 0)" in text, text
        assert ("corpus bytes changed under the run" if user_error else "ValueError: cannot decode example") in text
    assert "(in data-loading worker " in worker and ", pid " in worker
    assert worker.split(" (in data-loading worker")[0] == local.split("\n")[0]
    if not user_error:
        assert "Traceback" in worker  # a bug keeps the worker's traceback


def test_a_killed_worker_is_named_and_nothing_is_left_behind(run_plan):
    from ernie_mtl.engine.step_feeds import SampleError

    schedule = copy.deepcopy(run_plan[2].schedule)
    feeder = background(run_plan)
    try:
        feeder.start(0, schedule)
        drive_from(feeder, schedule, 2, 0)
        pids = [w.process.pid for w in feeder.workers]
        os.kill(pids[1], signal.SIGKILL)
        with pytest.raises(SampleError, match=r"data-loading worker 1 \(pid \d+\) was killed by signal SIGKILL"):
            drive_from(feeder, schedule, 30, 2)
    finally:
        feeder.close()
    assert not any(proc_alive(p) for p in pids)


def test_close_ends_every_worker(run_plan):
    schedule = copy.deepcopy(run_plan[2].schedule)
    feeder = background(run_plan, num_workers=3)
    feeder.start(0, schedule)
    drive_from(feeder, schedule, 3, 0)
    processes = [w.process for w in feeder.workers]
    assert all(proc_alive(p.pid) for p in processes)
    feeder.close()
    assert not any(proc_alive(p.pid) for p in processes)
    # each worker left by itself when its order pipe closed (status 0), none was killed after close's grace
    assert [p.returncode for p in processes] == [0, 0, 0]


def test_corpora_and_sample_indices_travel_as_file_names(run_plan):
    """The pretraining task's datasets pickle to a few KiB and map the same files again."""
    from data_tools.index_cache import MappedNpy

    _, _, plan, _ = run_plan
    corpus = plan.train["corpus"]
    blob = pickle.dumps(corpus, protocol=pickle.HIGHEST_PROTOCOL)
    state = corpus.features.__getstate__()
    assert isinstance(state["mapping"], MappedNpy)
    assert len(blob) < 64 * 1024 + corpus.features.vocab.is_continuation.nbytes * 4
    again = pickle.loads(blob)
    assert isinstance(again.features.mapping, np.memmap)
    assert str(again.features.mapping.filename) == str(corpus.features.mapping.filename)
    for k in (0, 5, len(corpus) - 1):
        for x, y in zip(again.get(k), corpus.get(k)):
            assert np.array_equal(x, y)


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def test_memory_stays_bounded_over_many_micro_batches(run_plan):
    """3,000 micro-batches through 2 workers (prefetch 2) with staging into tensors: after the first
    500, neither the workers nor this process grows by more than a few MiB (the queue is bounded)."""
    big = copy.deepcopy(run_plan[2].schedule)
    big.max_steps = None
    big.quotas = tuple(None if q is None else 10**9 for q in big.quotas)
    feeder = background(run_plan)
    samples = []
    try:
        feeder.start(0, big)
        step = 0
        while len(samples) < 7:
            read = list(big.counts)
            drawn = [big.next_task() for _ in range(big.slots_per_step)]
            for micro in feeder.step(step, drawn, read):
                pass
            step += 1
            if step % 250 == 0:  # 500 micro-batches
                samples.append([rss_mib(os.getpid())] + [rss_mib(w.process.pid) for w in feeder.workers])
        in_flight = feeder._next_j - feeder._pulled
    finally:
        feeder.close()
    assert in_flight <= feeder.capacity
    first, worst = np.array(samples[1]), np.max(samples[2:], axis=0)
    assert (worst - first <= 8).all(), samples
