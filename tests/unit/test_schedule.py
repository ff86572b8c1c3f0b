"""Task sampling, quotas, the seeded task schedule and per-task example streams (pure numpy)."""
import zlib  # noqa: F401  (before paddle: paddle 2.6.2 exports clashing zlib symbols)

import json

import numpy as np
import pytest

from ernie_mtl.config import ConfigError
from ernie_mtl.planning.schedule import (TaskSchedule, TaskStream, sampling_probabilities, steps_per_epoch,
                                target_quotas)


def run(schedule):
    seq = []
    while not schedule.done:
        seq.append(schedule.next_task())
    return seq


# -- probabilities ------------------------------------------------------------------------------------
def test_probability_formulas():
    np.testing.assert_allclose(sampling_probabilities("palm", mix_ratio=[1.0, 0.5, 0.5]), [0.5, 0.25, 0.25])
    n = [100, 300, 600]
    np.testing.assert_allclose(sampling_probabilities("proportional", num_examples=n), [0.1, 0.3, 0.6])
    np.testing.assert_allclose(sampling_probabilities("proportional", num_examples=n, examples_cap=300),
                               [100 / 700, 300 / 700, 300 / 700])
    w = np.array([100, 300, 600]) ** 0.5
    np.testing.assert_allclose(sampling_probabilities("temperature", num_examples=n, temperature=2.0), w / w.sum())
    capped = np.array([100, 200, 200]) ** (1 / 3)
    np.testing.assert_allclose(sampling_probabilities("temperature", num_examples=n, temperature=3,
                                                      examples_cap=200), capped / capped.sum())
    np.testing.assert_allclose(sampling_probabilities("temperature", num_examples=n, temperature=1.0),
                               sampling_probabilities("proportional", num_examples=n))


@pytest.mark.parametrize("kwargs, message", [
    (dict(strategy="uniform", mix_ratio=[1]), "sampling 'uniform' is not one of"),
    (dict(strategy="palm", mix_ratio=[1, -1]), r"mix_ratio\[1\] = -1 must be a finite number >= 0"),
    (dict(strategy="palm", mix_ratio=[0, 0]), "mix_ratio .* sums to 0"),
    (dict(strategy="palm"), "mix_ratio is required"),
    (dict(strategy="temperature", num_examples=[1, 2], temperature=0), "temperature 0 must be a number > 0"),
    (dict(strategy="proportional", num_examples=[1, 2], examples_cap=0), "examples_cap 0 must be a positive"),
    (dict(strategy="proportional", num_examples=[1, float("nan")]), r"num_examples\[1\]"),
])
def test_probability_errors_name_the_key(kwargs, message):
    strategy = kwargs.pop("strategy")
    with pytest.raises(ValueError, match=message):
        sampling_probabilities(strategy, **kwargs)


# -- quotas -------------------------------------------------------------------------------------------
def test_palm_readme_example_quotas_and_total():
    """PALM v0.3 README demo2: mix_ratio 1, .5, .5, num_epochs 2, S_main 5000 -> q = 10000, 5000, 5000 and
    T_est = 20000; with every task a target our run is exactly T_est micro-batches long."""
    mix = [1.0, 0.5, 0.5]
    q = target_quotas(num_examples=[5000 * 4, 77, 99], batch_sizes=[4, 4, 4],
                      is_target=[True, True, True], num_epochs=2, task_num_epochs=[None] * 3, mix_ratio=mix)
    assert q == [10000, 5000, 5000]
    s = TaskSchedule(sampling_probabilities("palm", mix_ratio=mix), q, [True] * 3, seed=1, slots_per_step=1)
    plan = s.plan()
    assert plan.total_steps == 20000 and plan.micro_batches == (10000, 5000, 5000)
    # PALM only: the demo's real target_tag 1,0,0 gives the aux tasks no quota
    assert target_quotas(num_examples=[20000, 77, 99], batch_sizes=[4] * 3,
                         is_target=[True, False, False], num_epochs=2, task_num_epochs=[None] * 3,
                         mix_ratio=mix) == [10000, None, None]


def test_quotas_own_epochs_and_epoch_rule():
    assert steps_per_epoch(10, 4) == 3 and steps_per_epoch(16, 8) == 2 and steps_per_epoch(17, 8) == 3
    # task 1 has its own num_epochs: ceil(1.5 * ceil(100 / 8)) = ceil(1.5 * 13) = 20
    q = target_quotas(num_examples=[80, 100, 5], batch_sizes=[16, 8, 2], is_target=[1, 1, 0],
                      num_epochs=3, task_num_epochs=[None, 1.5, None], mix_ratio=[2.0, 1.0, 1.0])
    assert q == [30, 20, None]  # floor(3 * 2.0 * 5) for the main task
    q = target_quotas(num_examples=[80, 100], batch_sizes=[16, 8], is_target=[1, 1],
                      num_epochs=0.5, task_num_epochs=[None, None])
    assert q == [3, 7]  # ceil(0.5 * 5), ceil(0.5 * 13) without mix_ratio (proportional/temperature sampling)


# -- schedule -----------------------------------------------------------------------------------------
def make(seed=7, acc=1, max_steps=None, quotas=(300, 100, None), p=(0.5, 0.2, 0.3), targets=(True, True, False)):
    return TaskSchedule(list(p), list(quotas), list(targets), seed=seed, slots_per_step=acc, max_steps=max_steps)


def test_same_seed_same_sequence_other_seed_differs():
    a, b, c = run(make(seed=7, acc=3)), run(make(seed=7, acc=3)), run(make(seed=8, acc=3))
    assert a == b and a != c


def test_resume_from_state_dict_equals_uninterrupted():
    full = run(make(acc=4))
    first = make(acc=4)
    head = [first.next_task() for _ in range(237)]  # mid optimizer step, mid uniform block
    state = json.loads(json.dumps(first.state_dict()))
    resumed = make(acc=4)
    resumed.load_state_dict(state)
    assert resumed.position == 237 and resumed.counts == first.counts
    assert head + run(resumed) == full


def test_resume_keeps_early_finish():
    a = make()
    [a.next_task() for _ in range(50)]
    a.finish(0)
    b = make()
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert b.is_finished(0) and run(a) == run(b)


def test_load_state_dict_rejects_another_configuration():
    state = make(seed=7).state_dict()
    with pytest.raises(ConfigError, match=r"seed 7 but this run has 8"):
        make(seed=8).load_state_dict(state)
    with pytest.raises(ConfigError, match=r"probabilities .* but this run has"):
        make(p=(0.4, 0.3, 0.3)).load_state_dict(state)
    with pytest.raises(ConfigError, match=r"quotas \[300, 100, None\] but this run has \[300, 90, None\]"):
        make(quotas=(300, 90, None)).load_state_dict(state)
    make(max_steps=10_000).load_state_dict(state)  # a different cap is allowed


def test_realized_proportions_match_probabilities():
    p = (0.5, 0.2, 0.3)
    s = TaskSchedule(list(p), [None] * 3, [False] * 3, seed=3, max_steps=20_000)
    counts = np.bincount(run(s), minlength=3)
    assert counts.sum() == 20_000
    sd = np.sqrt(np.array(p) * (1 - np.array(p)) / 20_000)
    assert np.all(np.abs(counts / 20_000 - np.array(p)) < 4 * sd)  # 4 sigma: fails with ~1e-4 probability
    assert s.plan().micro_batches == tuple(counts)  # plan at the end = what happened


def test_targets_get_exact_quotas_and_are_not_drawn_after():
    s = make(acc=1)
    seq = run(s)
    assert s.counts[0] == 300 and s.counts[1] == 100
    last0 = max(i for i, t in enumerate(seq) if t == 0)
    last1 = max(i for i, t in enumerate(seq) if t == 1)
    assert len(seq) == max(last0, last1) + 1  # stops right after the last target's last micro-batch
    assert seq.count(2) == len(seq) - 400  # everything else went to the auxiliary task


def test_finished_target_is_not_drawn():
    s = make()
    [s.next_task() for _ in range(20)]
    s.finish(0)
    before = s.counts[0]
    rest = run(s)
    assert 0 not in rest and s.counts[0] == before and s.counts[1] == 100
    with pytest.raises(ValueError, match="auxiliary"):
        s.finish(2)


def test_stops_at_optimizer_step_boundary_with_aux_filling():
    s = make(acc=8)
    seq = run(s)
    assert len(seq) % 8 == 0 and s.step == len(seq) // 8
    assert s.counts[:2] == (300, 100)  # targets exact; the last step was completed with the aux task
    with pytest.raises(RuntimeError, match="done"):
        s.next_task()


def test_step_completed_with_targets_without_aux():
    s = TaskSchedule([0.5, 0.5], [5, 6], [True, True], seed=0, slots_per_step=4)
    seq = run(s)
    assert len(seq) == 12 and s.step == 3  # 11 quota micro-batches, completed to the step boundary
    assert sum(s.counts) == 12 and s.counts[0] >= 5 and s.counts[1] >= 6


def test_plan_equals_actual_run_and_does_not_change_state():
    for acc in (1, 3, 8):
        s = make(seed=11, acc=acc, quotas=(1500, 700, None))
        [s.next_task() for _ in range(333)]
        before = s.state_dict()
        plan = s.plan()
        assert s.state_dict() == before
        run(s)
        assert plan.total_steps == s.step and plan.micro_batches == s.counts
        assert plan.realized == pytest.approx(tuple(c / sum(s.counts) for c in s.counts))


def test_max_steps_caps_the_run():
    s = make(acc=2, max_steps=50)
    assert s.plan().total_steps == 50
    assert len(run(s)) == 100 and s.step == 50 and s.counts[0] < 300


def test_only_auxiliary_needs_max_steps_and_other_checks():
    with pytest.raises(ConfigError, match="no target task .* set max_steps"):
        TaskSchedule([1.0], [None], [False], seed=0)
    with pytest.raises(ConfigError, match="probability 0 and would never finish"):
        TaskSchedule([1.0, 0.0], [3, 3], [True, True], seed=0)
    with pytest.raises(ConfigError, match="a target needs an integer quota"):
        TaskSchedule([1.0], [None], [True], seed=0)
    assert TaskSchedule([1.0, 0.0], [3, 0], [True, True], seed=0).plan().micro_batches == (3, 0)


def test_summary_table():
    s = TaskSchedule([0.5, 0.5], [4, None], [True, False], seed=0, names=["sentiment", "mlm"],
                     steps_per_epoch=[2, 10])
    text = s.summary()
    lines = text.splitlines()
    assert lines[0].split() == ["task", "role", "p_i", "quota", "planned", "realized", "epochs"]
    plan = s.plan()
    assert lines[1].split()[:5] == ["sentiment", "target", "0.5000", "4", "4"] and lines[1].split()[-1] == "2.00"
    assert lines[2].split()[:4] == ["mlm", "aux", "0.5000", "-"]
    assert f"optimizer steps: {plan.total_steps}" in lines[-1]


# -- streams ------------------------------------------------------------------------------------------
def test_stream_epochs_are_permutations_and_span_boundaries():
    st = TaskStream(10, seed=1, task_index=0, batch_size=4)
    rows = [x for k in range(5) for x in st.indices(k)]  # 20 positions = 2 epochs; batch 2 spans 0 -> 1
    assert sorted(i for i, e in rows if e == 0) == list(range(10))
    assert sorted(i for i, e in rows if e == 1) == list(range(10))
    assert [e for _, e in st.indices(2)] == [0, 0, 1, 1] and st.epoch_of(2) == 0 and st.epoch_of(3) == 1
    assert [i for i, _ in rows[:10]] != [i for i, _ in rows[10:]]  # each epoch has its own order
    assert st.steps_per_epoch == 3 and st.epochs_done(5) == 2.0


def test_stream_slots_of_another_size_tile_the_same_sequence():
    """Slot k of size B covers positions [k*B, (k+1)*B) whoever computes it: slots of 2 read the
    same examples as slots of 6 cut in three (flag mode continued with another micro batch)."""
    six = TaskStream(23, seed=5, task_index=2, batch_size=6)
    two = TaskStream(23, seed=5, task_index=2, batch_size=2)
    for k in range(12):
        assert sum((two.indices(3 * k + j) for j in range(3)), []) == six.indices(k)


def test_stream_resume_and_independence():
    a = TaskStream(50, seed=9, task_index=1, batch_size=8)
    early = [a.indices(k) for k in range(30)]
    b = TaskStream(50, seed=9, task_index=1, batch_size=8)
    assert [b.indices(k) for k in range(17, 30)] == early[17:]  # a resumed reader starts at k = 17
    other = TaskStream(50, seed=9, task_index=0, batch_size=8)
    assert other.indices(0) != a.indices(0)
    plain = TaskStream(5, seed=9, task_index=1, batch_size=2, shuffle=False)
    assert [plain.indices(k) for k in range(3)] == [[(0, 0), (1, 0)], [(2, 0), (3, 0)], [(4, 0), (0, 1)]]
    with pytest.raises(ValueError, match="batch_size 0"):
        TaskStream(5, seed=0, task_index=0, batch_size=0)


# -- another global batch: regrouped states ---------------------------------------------------------------
def test_regrouped_state_keeps_the_slot_sequence_and_counts_steps_from_the_checkpoint():
    """--allow_batch_change in a multi-task run: 4 slots per step become 6 at step 5; the slot
    sequence (tasks and counts) goes on where it was, optimizer steps are counted from step 5."""
    from ernie_mtl.planning.schedule import regroup_state, state_step

    full = run(make(acc=4))
    a = make(acc=4)
    head = [a.next_task() for _ in range(20)]  # 5 steps of 4
    state = regroup_state(json.loads(json.dumps(a.state_dict())), slots_per_step=6)
    assert state_step(state) == 5 and state["base"] == [20, 5]
    b = make(acc=6)
    b.load_state_dict(state)
    assert b.step == 5 and b.position == 20
    b.next_task()
    assert b.step == 5  # inside step 6 (1-based) until 6 slots are drawn
    [b.next_task() for _ in range(5)]
    assert b.step == 6
    rest = run(b)
    seq = head + full[20:20 + 6] + rest
    n = len(seq)
    assert seq[:min(n, len(full))] == full[:min(n, len(full))]  # the same task per slot while both draw
    assert (n - 20) % 6 == 0 and b.step == 5 + (n - 20) // 6  # boundaries every 6 slots from the checkpoint
    assert b.counts[:2] == (300, 100)
    c = make(acc=6)
    c.load_state_dict(json.loads(json.dumps(b.state_dict())))  # a later resume keeps the base
    assert c.step == b.step and c.done


def test_regrouped_state_in_other_slot_sizes_must_come_out_whole():
    """Flag mode with another micro batch: the position is re-counted in slots of the new size."""
    from ernie_mtl.planning.schedule import regroup_state

    s = TaskSchedule([1.0], [40], [True], seed=0, slots_per_step=4, max_steps=10)
    [s.next_task() for _ in range(12)]  # 3 steps of 4 slots of (say) 8 samples = 96 samples
    state = regroup_state(s.state_dict(), slots_per_step=2, slot_scale=8, divide=16, quotas=[20])
    assert state["position"] == 6 and state["counts"] == [6] and state["base"] == [0, 0] and state["quotas"] == [20]
    state = regroup_state(s.state_dict(), slots_per_step=3, slot_scale=8, divide=16)  # another global batch too
    assert state["position"] == 6 and state["base"] == [6, 3]
    with pytest.raises(ValueError, match="not a whole number of slots"):
        regroup_state(s.state_dict(), slots_per_step=1, slot_scale=8, divide=40)
