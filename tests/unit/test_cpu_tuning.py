"""The CPU kernel choice is wired into the training engine: `engine.session.decide_cpu_kernels` times the
candidates on the built program (`--cpu_kernels auto`) or takes a fixed mode, the kernel cache is written,
read and keyed per machine, a resumed run keeps the checkpoint's recorded kernels and says so, and
`make_executor` (the trainer's path from the built programs to the first run) rewrites a CPU run's
programs with the choice and logs it; the entry point's `configure_executor` chooses Paddle's serial
executor for CPU runs only, before paddle is imported.

No test here depends on which kernel is faster on this machine: the timing function is injected
(`FakeTimer`), and the fake decides."""
import zlib  # noqa: F401  (before paddle)

import json
from types import SimpleNamespace

import pytest

from ernie_mtl.config import AmpConfig, ModelConfig, OptimConfig, TrainConfig
from ernie_mtl.dist.process import SERIAL_RUN, ProcessInfo, configure_executor
from ernie_mtl.engine.session import cpu_kernel_choice, decide_cpu_kernels, make_executor
from ernie_mtl.program.cpu_kernels import EXACT_ONEDNN_OPS
from ernie_mtl.program.kernel_choice import (AUTO_CANDIDATES, KernelCache, KernelChoice, cache_file, describe_machine,
                                             machine_identity,
                                             reconcile)

pytestmark = pytest.mark.usefixtures("static_mode")

FAST = {"matmul_v2", "matmul_v2_grad", "elementwise_add"}  # what the fake timer makes oneDNN win at


class Log:
    def __init__(self):
        self.lines = []

    def info(self, message):
        self.lines.append(message)

    warning = info


class FakeTimer:
    """A `measure` function: oneDNN 4x faster for the types in `fast`, 2x slower otherwise; counts calls."""

    def __init__(self, fast=FAST):
        self.fast = set(fast)
        self.calls = []

    def __call__(self, op, signature, budget_s):
        self.calls.append(signature.op_type)
        return (4e-3, 1e-3) if signature.op_type in self.fast else (1e-3, 2e-3)


def onednn_ops(program):
    return [op.type for b in program.blocks for op in b.ops if op.desc.has_attr("use_mkldnn") and op.attr("use_mkldnn")]


def bias_grad_matmuls(program):
    """matmul_v2 ops writing a bias gradient (`cpu_kernels.bias_grads_by_matmul`'s ones x dOut)."""
    return [op for op in program.global_block().ops
            if op.type == "matmul_v2" and any(n.endswith("@bias_ones") for n in op.input("X"))]


def tiny(build_programs):
    return build_programs(model=ModelConfig(model_name_or_path="ernie-tiny-test"), optim=OptimConfig(max_steps=100))


PLAN = SimpleNamespace(tasks=[SimpleNamespace(spec=SimpleNamespace(batch_size=4, max_seq_len=16))])


def decide(p, tmp_path, mode="auto", timer=None, resume_from=None):
    cfg = SimpleNamespace(train=TrainConfig(cpu_kernels=mode))
    return decide_cpu_kernels(cfg, p.programs, PLAN, resume_from, measure=timer or FakeTimer(),
                              cache_path=tmp_path / "cache" / "cpu_kernels.json")


def executor_for(p, kernels, **train):
    cfg = SimpleNamespace(train=TrainConfig(**train), amp=AmpConfig())
    log = Log()
    make_executor(cfg, ProcessInfo(rank=0, world_size=1, local_rank=0), p.programs, log, kernels=kernels)
    return log.lines


def test_auto_times_the_candidates_and_the_run_uses_the_faster_kernels(build_programs, tmp_path):
    p = tiny(build_programs)
    timer = FakeTimer()
    kernels, note = decide(p, tmp_path, timer=timer)
    assert note is None and kernels.mode == "auto" and kernels.source == "measured"
    assert set(kernels.onednn) == FAST and kernels.bias_grads
    assert set(timer.calls) == set(AUTO_CANDIDATES)  # every candidate type in the program was timed
    lines = executor_for(p, kernels, device="cpu")
    assert set(onednn_ops(p.main)) == FAST  # the training program runs what was chosen
    assert set(onednn_ops(p.test)) == {"matmul_v2", "elementwise_add"}  # evaluation: the forward part
    assert not onednn_ops(p.forward)  # the export program stays device-neutral
    assert len(bias_grad_matmuls(p.main)) == 2 * 6 + 4  # q, k, v, out, ffn in/out per layer; 4 head biases
    line = next(x for x in lines if x.startswith("CPU kernels:"))
    assert "--cpu_kernels auto, measured in" in line and "matmul_v2 oneDNN (" in line and "GFLOP/s" in line, line
    assert "transpose2 plain (" in line and "16 bias gradients by matmul" in line and "executor" in line, line


@pytest.mark.slow
def test_the_oneDNN_matmul_gradients_of_linear_layers_get_2d_views(build_programs, tmp_path):
    p = tiny(build_programs)
    executor_for(p, KernelChoice.fixed("list", ["matmul_v2_grad"]), device="cpu")
    block = p.main.global_block()
    grads = [op for op in block.ops if op.type == "matmul_v2_grad"]
    linear = [op for op in grads if len(block.var(op.input("Y")[0]).shape) == 2]
    attention = [op for op in grads if len(block.var(op.input("Y")[0]).shape) == 4]
    assert linear and attention and all(op.attr("use_mkldnn") for op in grads)
    assert all(len(block.var(op.input("X")[0]).shape) == 2 for op in linear)  # [b*s, k], not [b, s, k]
    assert all(len(block.var(op.input("X")[0]).shape) == 4 for op in attention)  # batched products as they were


@pytest.mark.slow
def test_the_choice_is_cached_per_machine_and_reused(build_programs, tmp_path):
    p = tiny(build_programs)
    first, second = FakeTimer(), FakeTimer(fast=())  # the second timer would choose differently...
    a, _ = decide(p, tmp_path, timer=first)
    b, _ = decide(tiny(build_programs), tmp_path, timer=second)
    assert first.calls and not second.calls  # ...but is never asked: the cache answers
    assert b.source == "cached" and b.onednn == a.onednn
    data = json.loads((tmp_path / "cache" / "cpu_kernels.json").read_text())
    (slot,) = data["machines"].values()
    assert slot["machine"] == machine_identity()
    assert len(slot["signatures"]) == len(first.calls)
    assert all(e["plain_s"] > 0 and e["onednn_s"] > 0 and e["op"] for e in slot["signatures"].values())


def test_another_machine_measures_again_and_a_damaged_cache_is_measured_over(tmp_path, monkeypatch):
    path = tmp_path / "cpu_kernels.json"
    here, there = machine_identity(threads=1), machine_identity(threads=2)  # threads are part of the identity
    cache = KernelCache(path, machine=here)
    cache.put("sig", "matmul_v2 X4x16x32", 2.0, 1.0)
    cache.save()
    assert KernelCache(path, machine=here).get("sig") == (2.0, 1.0)
    assert KernelCache(path, machine=there).get("sig") is None
    cache = KernelCache(path, machine=there)
    cache.put("sig", "matmul_v2 X4x16x32", 1.0, 3.0)
    cache.save()
    assert len(json.loads(path.read_text())["machines"]) == 2
    assert KernelCache(path, machine=here).get("sig") == (2.0, 1.0)  # each machine keeps its own numbers
    cache = KernelCache(path, machine=here)
    cache.put("sig", "matmul_v2 X4x16x32", 9.0, 9.0)  # a second measurement of the same signature...
    cache.save()
    assert KernelCache(path, machine=here).get("sig") == (2.0, 1.0)  # ...never replaces the first
    path.write_text("{not json")
    damaged = KernelCache(path, machine=here)
    assert damaged.get("sig") is None and "ignored" in damaged.notes[0]
    damaged.put("sig", "matmul_v2 X4x16x32", 2.0, 1.0)
    damaged.save()
    assert KernelCache(path, machine=here).get("sig") == (2.0, 1.0)  # rewritten
    assert not list(tmp_path.glob(".*tmp*"))  # written atomically: no temporary left behind


def test_the_cache_folder_follows_xdg_cache_home():
    assert str(cache_file({"XDG_CACHE_HOME": "/x/cache", "HOME": "/home/u"})) == "/x/cache/ernie_mtl/cpu_kernels.json"
    assert str(cache_file({"HOME": "/home/u"})) == "/home/u/.cache/ernie_mtl/cpu_kernels.json"
    assert str(cache_file({"XDG_CACHE_HOME": "relative", "HOME": "/home/u"})) == \
        "/home/u/.cache/ernie_mtl/cpu_kernels.json"  # the spec: a relative XDG path is ignored


def test_an_unwritable_cache_is_a_note_and_the_run_decides_from_its_own_measurement(build_programs, tmp_path):
    blocker = tmp_path / "cache"
    blocker.write_text("a file where the cache folder should be")
    kernels, _ = decide(tiny(build_programs), tmp_path)
    assert set(kernels.onednn) == FAST
    assert any("not written" in n for n in kernels.notes), kernels.notes


@pytest.mark.slow
def test_fixed_modes_measure_nothing(build_programs, tmp_path):
    for mode, expected, bias in (("plain", set(), False), ("exact", set(EXACT_ONEDNN_OPS), True),
                                 ("true", FAST, True), ("false", set(), False),
                                 ("matmul_v2,softmax", {"matmul_v2", "softmax"}, True)):
        timer = FakeTimer()
        kernels, _ = decide(tiny(build_programs), tmp_path / mode, mode=mode, timer=timer)
        assert set(kernels.onednn) == expected and kernels.bias_grads == bias, mode
        assert bool(timer.calls) == (mode == "true"), mode  # true is auto
    p = tiny(build_programs)
    lines = executor_for(p, KernelChoice.fixed("plain"), device="cpu")
    assert not onednn_ops(p.main) and not onednn_ops(p.test) and not bias_grad_matmuls(p.main)
    assert any(x.startswith("CPU kernels: as built (--cpu_kernels plain)") for x in lines), lines


def test_a_known_bad_pair_is_never_switched_together(build_programs, tmp_path):
    kernels = KernelChoice.fixed("list", ["matmul_v2_grad", "transpose2_grad"])
    assert kernels.onednn == ("matmul_v2_grad",) and "transpose2_grad left plain" in kernels.notes[0]
    auto, _ = decide(tiny(build_programs), tmp_path, timer=FakeTimer(fast={"matmul_v2_grad", "transpose2_grad"}))
    assert auto.onednn == ("matmul_v2_grad",) and any("transpose2_grad left plain" in n for n in auto.notes)
    p = tiny(build_programs)
    lines = executor_for(p, kernels, device="cpu")
    assert "transpose2_grad" not in onednn_ops(p.main)
    assert "transpose2_grad left plain" in next(x for x in lines if x.startswith("CPU kernels:"))


def test_a_resumed_run_keeps_the_recorded_kernels_and_says_so():
    recorded = KernelChoice.fixed("list", ["matmul_v2", "softmax"]).with_(source="checkpoint",
                                                                           machine=machine_identity())
    auto = KernelChoice(mode="auto", onednn=("matmul_v2",), bias_grads=True, source="measured")
    used, note = reconcile(auto, recorded)
    assert used.kernels() == recorded.kernels() and used.source == "checkpoint"
    assert "resuming with the checkpoint's recorded kernels" in note and "would choose oneDNN on matmul_v2" in note
    same, note = reconcile(auto, auto.with_(source="checkpoint"))
    assert same is auto and note is None  # nothing to say when the choice agrees
    explicit = KernelChoice.fixed("plain")
    used, note = reconcile(explicit, recorded)  # an explicit mode is obeyed, with a warning
    assert used is explicit and "not bitwise" in note
    assert reconcile(auto, None) == (auto, None)  # a new run


def test_a_recorded_choice_round_trips_through_json():
    choice = KernelChoice(mode="auto", onednn=("matmul_v2", "matmul_v2_grad"), bias_grads=True, source="measured",
                          timings={"matmul_v2": {"plain_s": 2.0, "onednn_s": 1.0, "flops": 4e10, "ops": 8}},
                          machine=machine_identity(), notes=("n",), seconds=1.5)
    again = KernelChoice.from_json(json.loads(json.dumps(choice.to_json())))
    assert again == choice
    assert "matmul_v2 oneDNN (40 vs 20 GFLOP/s)" in again.describe()


@pytest.mark.slow
def test_gpu_runs_time_nothing(build_programs):
    timer = FakeTimer()
    cfg = SimpleNamespace(train=TrainConfig(device="gpu"))
    assert cpu_kernel_choice(cfg, ProcessInfo(rank=0, world_size=1, local_rank=0), None, tiny(build_programs).programs,
                             PLAN, None, Log(), measure=timer) is None
    assert not timer.calls


@pytest.mark.slow
def test_make_executor_needs_a_measured_choice_for_auto(build_programs):
    with pytest.raises(ValueError, match="auto needs the run's measured KernelChoice"):
        executor_for(tiny(build_programs), None, device="cpu")


def test_the_serial_executor_is_chosen_for_cpu_runs_only():
    env = {}
    assert configure_executor(env, device="cpu", modules={}) == f"serial executor ({SERIAL_RUN}=1)"
    assert env == {SERIAL_RUN: "1"}
    env = {SERIAL_RUN: "0"}  # the user's choice is kept
    assert "from the environment, kept" in configure_executor(env, device="cpu", modules={})
    assert env == {SERIAL_RUN: "0"}
    env = {}
    configure_executor(env, device="gpu", modules={})
    assert env == {}  # GPU: the threaded executor overlaps host work with the device
    with pytest.raises(RuntimeError, match="before paddle is imported"):
        configure_executor({}, device="cpu", modules={"paddle": object()})


# -- a choice that does not depend on the topology, the threads or the machine's load ------------------------

class DictTimer(FakeTimer):
    """A `measure` returning what ProgramTimer returns: times plus how they were taken."""

    def __init__(self, fast=FAST, **extra):
        super().__init__(fast)
        self.extra = extra

    def __call__(self, op, signature, budget_s):
        plain, onednn = super().__call__(op, signature, budget_s)
        ratio = onednn / plain
        return {"plain_s": plain, "onednn_s": onednn, "rounds": 5, "ratio_low": ratio, "ratio_high": ratio,
                "threads": 1, "check_threads": 2, "plain_thread_stable": True, "onednn_thread_stable": True,
                "same_bits": False, "others_cores": 0.0, **{k: v(signature) if callable(v) else v
                                                             for k, v in self.extra.items()}}


def test_the_machine_identity_of_training_kernels_leaves_out_threads_and_cpus(monkeypatch):
    """1 process x 2 threads and 2 processes x 1 thread on one machine read and write the same cache entries
    (every measurement runs on 1 thread: ProgramTimer), so they choose the same kernels."""
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    two = machine_identity()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    one = machine_identity()
    assert one == two and "threads" not in one and "logical_cpus" not in one
    assert machine_identity(threads=4)["threads"] == 4  # a predictor's throughput does depend on them


def test_the_timer_measures_on_one_thread_whatever_the_process_runs_with(build_programs, monkeypatch):
    from paddle.base import core

    from ernie_mtl.program.kernel_choice import ProgramTimer, op_signatures

    calls = []
    real = core.set_num_threads
    monkeypatch.setattr(core, "set_num_threads", lambda n: (calls.append(n), real(n))[1])
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # as a 1-process run on 2 cores
    p = tiny(build_programs)
    (sig, _, op), *_ = [s for s in op_signatures(p.main, ["elementwise_add"], batch=2, seq=16)]
    result = ProgramTimer(min_rounds=3, max_rounds=3)(op, sig, budget_s=0.0)
    assert calls[0] == 1 and calls[-1] == 2  # timed on 1 thread, then back to the process's 2
    assert 2 in calls[1:-1]  # the thread-count check ran on 2
    assert result["threads"] == 1 and result["check_threads"] == 2 and result["rounds"] == 3
    assert result["plain_s"] > 0 and result["onednn_s"] > 0 and result["ratio_low"] <= result["ratio_high"]
    assert result["plain_thread_stable"] is True  # an add has one correctly rounded answer on any thread count
    assert result["onednn_thread_stable"] is True and result["same_bits"] is True
    assert result["others_cores"] is None or result["others_cores"] >= 0


@pytest.mark.slow
def test_a_disturbed_measurement_decides_every_later_run_until_it_is_reset(build_programs, tmp_path, capsys):
    """Two fresh runs on one machine choose the same kernels whatever the load when each started: the first
    measurement filed decides for good, disturbed or not. (A clean later measurement used to replace a
    disturbed one, and a fresh run and a preempted-and-resumed run of one configuration then ended a float32
    ulp apart: tests/e2e/test_resilience.py's signal test failed in make test.) `reset --disturbed` is the
    way to measure again."""
    from ernie_mtl.program.kernel_choice import main

    busy = DictTimer(others_cores=1.7)  # another process used 1.7 cores meanwhile
    first, _ = decide(tiny(build_programs), tmp_path, timer=busy)
    assert set(first.onednn) == FAST and any("reset --disturbed" in n for n in first.notes), first.notes
    path = tmp_path / "cache" / "cpu_kernels.json"
    entries = json.loads(path.read_text())["machines"]
    assert all(e["disturbed"] and e["others_cores"] == 1.7 for slot in entries.values()
               for e in slot["signatures"].values())
    quiet = DictTimer(fast={"matmul_v2"})  # a quiet machine's numbers would choose otherwise...
    second, _ = decide(tiny(build_programs), tmp_path, timer=quiet)
    assert not quiet.calls and second.onednn == first.onednn  # ...but nothing is measured: the first decides
    assert second.source == "cached" and any("was disturbed" in n for n in second.notes)

    assert main(["reset", "--disturbed", "--cache", str(path)]) == 0
    assert "deleted" in capsys.readouterr().out
    third, _ = decide(tiny(build_programs), tmp_path, timer=quiet)
    assert quiet.calls and set(third.onednn) == {"matmul_v2"}  # measured again, on the user's word
    assert not any("was disturbed" in n for n in third.notes)
    later = DictTimer(fast=())
    fourth, _ = decide(tiny(build_programs), tmp_path, timer=later)
    assert not later.calls and fourth.onednn == third.onednn
    assert main(["reset", "--disturbed", "--cache", str(path)]) == 0  # a clean entry is not disturbed: stays
    assert "nothing to delete" in capsys.readouterr().out and json.loads(path.read_text())["machines"]
    with pytest.raises(SystemExit) as refused:
        main(["show", "--disturbed", "--cache", str(path)])
    assert refused.value.code == 2 and "--disturbed goes with reset" in capsys.readouterr().err


def test_reset_disturbed_keeps_clean_entries_of_every_machine(tmp_path):
    path = tmp_path / "cpu_kernels.json"
    for machine in (machine_identity(), {**machine_identity(), "cpu": "another CPU"}):
        cache = KernelCache(path, machine=machine)
        cache.put("clean", "matmul_v2 X8x128x768 Y768x768", 2e-3, 1e-3, disturbed=False)
        cache.put("busy", "scale X8x12x128x64", 1e-4, 2e-4, disturbed=True)
        cache.save()
    assert KernelCache(path, machine=machine_identity()).reset(disturbed_only=True) == 2
    for machine in (machine_identity(), {**machine_identity(), "cpu": "another CPU"}):
        cache = KernelCache(path, machine=machine)
        assert cache.get("clean") == (2e-3, 1e-3) and cache.get("busy") is None and cache.needs_measuring("busy")
    assert KernelCache(path, machine=machine_identity()).reset(disturbed_only=True) == 0
    assert KernelCache(tmp_path / "missing.json", machine=machine_identity()).reset(disturbed_only=True) == 0


def test_rounds_that_straddle_the_threshold_are_disturbed():
    from ernie_mtl.program.kernel_choice import MARGIN, is_disturbed

    assert not is_disturbed({"ratio_low": 0.5, "ratio_high": 0.6, "others_cores": 0.1})
    assert not is_disturbed({"ratio_low": 0.95, "ratio_high": 1.3})  # plain on every round: clear
    assert is_disturbed({"ratio_low": 1 - MARGIN - 0.05, "ratio_high": 1 - MARGIN + 0.05})  # noise could decide
    assert is_disturbed({"ratio_low": 0.2, "ratio_high": 0.3, "others_cores": 0.9})
    assert not is_disturbed({})  # an injected (plain, oneDNN) pair says nothing about how it was taken


def test_a_oneDNN_kernel_whose_result_depends_on_the_threads_is_never_chosen(build_programs, tmp_path):
    timer = DictTimer(onednn_thread_stable=lambda sig: sig.op_type != "matmul_v2_grad",
                      plain_thread_stable=lambda sig: sig.op_type != "scale")
    kernels, _ = decide(tiny(build_programs), tmp_path, timer=timer)
    assert set(kernels.onednn) == FAST - {"matmul_v2_grad"}
    assert any(n.startswith("matmul_v2_grad left plain: its oneDNN result changes with the thread count")
               for n in kernels.notes), kernels.notes
    assert any("the plain kernels of scale change their results with the thread count" in n for n in kernels.notes)


def _with_timeout(fn, seconds=20):
    import threading

    out = {}
    worker = threading.Thread(target=lambda: out.setdefault("value", fn()), daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"{fn} blocked for {seconds} s"
    return out["value"]


def test_the_cache_file_is_read_with_bounds(tmp_path):
    import os
    import stat

    here = machine_identity()
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    cache = _with_timeout(lambda: KernelCache(fifo, machine=here))  # opening a FIFO would block forever
    assert cache.get("sig") is None and "is a FIFO (named pipe), not a regular file" in cache.notes[0]
    cache.put("sig", "matmul_v2 X1", 2.0, 1.0)
    _with_timeout(cache.save)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and cache.get("sig") == (2.0, 1.0)  # never replaced; still decides

    nested = tmp_path / "nested.json"
    nested.write_text("[" * 200_000 + "]" * 200_000)
    cache = KernelCache(nested, machine=here)
    assert "nested too deeply" in cache.notes[0]
    cache.put("sig", "matmul_v2 X1", 2.0, 1.0)
    cache.save()
    assert KernelCache(nested, machine=here).get("sig") == (2.0, 1.0)  # rewritten as a healthy file

    huge = tmp_path / "huge.json"
    with open(huge, "wb") as f:
        f.truncate(64 << 20)  # sparse: no disk used
    assert "more than" in KernelCache(huge, machine=here).notes[0]

    folder = tmp_path / "folder.json"
    folder.mkdir()
    assert "is a folder" in KernelCache(folder, machine=here).notes[0]


def test_the_kernels_command_shows_and_resets_the_cache(tmp_path, capsys):
    from ernie_mtl.program.kernel_choice import main

    path = tmp_path / "cpu_kernels.json"
    cache = KernelCache(path, machine=machine_identity())
    cache.put("a", "matmul_v2 X8x128x768 Y768x768", 2e-3, 1e-3, rounds=5, threads=1, others_cores=0.02,
              disturbed=False)
    cache.put("b", "scale X8x12x128x64", 1e-4, 2e-4, rounds=7, threads=1, others_cores=1.2, disturbed=True)
    cache.save()
    assert main(["show", "--cache", str(path)]) == 0
    shown = capsys.readouterr().out
    assert str(path) in shown and describe_machine(machine_identity()) in shown
    assert "matmul_v2 X8x128x768 Y768x768" in shown and "ratio  0.50" in shown and "5 rounds on 1 thread(s)" in shown
    assert "DISTURBED: decides until `ernie-mtl-kernels reset --disturbed`" in shown and "others 1.20 cores" in shown
    assert main(["reset", "--cache", str(path)]) == 0
    assert not path.exists() and f"deleted {path}" in capsys.readouterr().out
    assert main(["show", "--cache", str(path)]) == 0 and "(empty" in capsys.readouterr().out
