"""ernie_mtl.dist.threads: CPU budget from affinity and cgroup quota, division among the ranks of a
node, user values kept, and the variables really reaching paddle when set before its import."""
import zlib  # noqa: F401  (before paddle)

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ernie_mtl.dist.threads import (CpuBudget, cgroup_cpu_quota, configure_threads, cpu_budget, device_hint,
                               local_process_count, plan_threads, shell_exports)

ROOT = Path(__file__).resolve().parents[2]


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


# --- cgroup quota -----------------------------------------------------------------------------

def test_cgroup_v2_quota_is_read_along_the_path_and_the_smallest_wins(tmp_path):
    _write(tmp_path / "cpu.max", "max 100000")
    _write(tmp_path / "kubepods" / "cpu.max", "250000 100000")  # the parent: 2.5 CPUs
    _write(tmp_path / "kubepods" / "pod1" / "cpu.max", "300000 100000")  # the child alone: 3
    quota, source = cgroup_cpu_quota("0::/kubepods/pod1\n", tmp_path)
    assert quota == pytest.approx(2.5)
    assert source == str(tmp_path / "kubepods")


def test_cgroup_v2_max_means_no_limit(tmp_path):
    _write(tmp_path / "job" / "cpu.max", "max 100000")
    assert cgroup_cpu_quota("0::/job\n", tmp_path) == (None, "")


def test_cgroup_v1_quota_under_the_mount_root_when_the_listed_host_path_is_absent(tmp_path):
    # In a container /proc/self/cgroup may list the host's path; the container's group is the mount root.
    _write(tmp_path / "cpu,cpuacct" / "cpu.cfs_quota_us", "150000")
    _write(tmp_path / "cpu,cpuacct" / "cpu.cfs_period_us", "100000")
    text = "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/\n"
    quota, _ = cgroup_cpu_quota(text, tmp_path)
    assert quota == pytest.approx(1.5)


def test_cgroup_v1_minus_one_is_unlimited_and_other_controllers_are_ignored(tmp_path):
    _write(tmp_path / "cpu" / "cpu.cfs_quota_us", "-1")
    _write(tmp_path / "cpu" / "cpu.cfs_period_us", "100000")
    _write(tmp_path / "memory" / "cpu.cfs_quota_us", "100000")  # never read: not the cpu controller
    _write(tmp_path / "memory" / "cpu.cfs_period_us", "100000")
    assert cgroup_cpu_quota("5:cpu:/\n4:memory:/\n", tmp_path) == (None, "")


def test_cpu_budget_caps_affinity_by_quota_rounding_down(tmp_path):
    _write(tmp_path / "cpu.max", "150000 100000")
    budget = cpu_budget(affinity={0, 1, 2, 3}, proc_self_cgroup="0::/\n", cgroup_root=tmp_path)
    assert (budget.affinity, budget.quota, budget.cpus) == (4, 1.5, 1)  # 1.5 CPUs: 1 thread, not 2 throttled
    assert cpu_budget(affinity={0, 1, 2}, proc_self_cgroup="", cgroup_root=tmp_path).cpus == 3
    assert CpuBudget(affinity=2, quota=8.0).cpus == 2  # a quota above the mask does not add CPUs


# --- the decision -----------------------------------------------------------------------------

@pytest.mark.parametrize("cpus,ranks,expected", [(8, 1, 8), (8, 2, 4), (8, 3, 2), (2, 2, 1), (2, 4, 1)])
def test_cpu_threads_are_the_node_share_of_each_rank(cpus, ranks, expected):
    plan = plan_threads({"PADDLE_LOCAL_SIZE": str(ranks)}, CpuBudget(affinity=cpus))
    assert plan.threads == expected
    assert plan.to_set == {"OMP_NUM_THREADS": str(expected), "MKL_NUM_THREADS": str(expected)}
    assert f"{cpus} CPUs" in plan.description and "PADDLE_LOCAL_SIZE" in plan.description
    assert ("oversubscribe" in plan.description) == (cpus < ranks)


def test_local_process_count_reads_paddle_launch_then_mpi():
    assert (local_process_count({"PADDLE_LOCAL_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"})
            == (4, "PADDLE_LOCAL_SIZE"))
    assert local_process_count({"OMPI_COMM_WORLD_LOCAL_SIZE": "2"}) == (2, "OMPI_COMM_WORLD_LOCAL_SIZE")
    assert local_process_count({"PADDLE_LOCAL_SIZE": ""}) == (1, "")


def test_user_values_are_kept():
    plan = plan_threads({"OMP_NUM_THREADS": "3"}, CpuBudget(affinity=8))
    assert (plan.threads, plan.to_set) == (3, {})
    assert "OMP_NUM_THREADS=3" in plan.description and "kept" in plan.description
    # MKL alone set by the user: OMP is decided, MKL untouched
    plan = plan_threads({"MKL_NUM_THREADS": "1"}, CpuBudget(affinity=8))
    assert plan.to_set == {"OMP_NUM_THREADS": "8"}


def test_a_one_inherited_from_a_bare_launcher_is_kept_but_reported():
    env = {"OMP_NUM_THREADS": "1", "PADDLE_LOCAL_SIZE": "1"}
    plan = plan_threads(env, CpuBudget(affinity=4))
    assert plan.to_set == {} and plan.threads == 1
    assert "paddle.distributed.launch passes OMP_NUM_THREADS=1" in plan.description
    assert "OMP_NUM_THREADS=4" in plan.description
    # the launch script's own decision carries its origin and no warning
    env["ERNIE_MTL_THREADS_ORIGIN"] = "set per node by the launch script: 4 CPUs / 4 processes"
    plan = plan_threads(env, CpuBudget(affinity=4))
    assert "launch script" in plan.description and "note" not in plan.description


@pytest.mark.parametrize("cpus,ranks,expected", [(32, 4, 4), (16, 4, 2), (4, 4, 1), (96, 1, 4)])
def test_gpu_ranks_get_half_their_share_for_host_work_capped(cpus, ranks, expected):
    plan = plan_threads({}, CpuBudget(affinity=cpus), device="gpu", local_size=ranks)
    assert plan.threads == expected and "GPU" in plan.description


def test_configure_threads_sets_the_environment_and_refuses_after_paddle():
    env = {"PADDLE_LOCAL_SIZE": "2"}
    line = configure_threads(env, budget=CpuBudget(affinity=6), modules={})
    assert env["OMP_NUM_THREADS"] == "3" and env["MKL_NUM_THREADS"] == "3" and line.startswith("threads: ")
    assert env["MKL_CBWR"] == "AUTO,STRICT" and "MKL_CBWR=AUTO,STRICT (results independent of the thread count)" in line
    env = {"MKL_CBWR": "COMPATIBLE"}  # the user's value is kept, and what it costs is said
    line = configure_threads(env, budget=CpuBudget(affinity=6), modules={})
    assert env["MKL_CBWR"] == "COMPATIBLE" and "without STRICT" in line and "not bitwise" in line
    with pytest.raises(RuntimeError, match="before paddle is imported"):
        configure_threads({}, budget=CpuBudget(affinity=6), modules={"paddle": object()})


def test_device_hint_reads_argv_then_the_config_file_then_the_build(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("device: gpu\nmax_steps: 10\n")
    assert device_hint(["--device", "cpu", "--config", str(config)], gpu_build=True) == "cpu"  # the command line wins
    assert device_hint([f"--config={config}"], gpu_build=False) == "gpu"
    assert device_hint(["--config", str(tmp_path / "missing.yaml")], gpu_build=False) == "cpu"
    assert device_hint(["--device", "auto"], gpu_build=True) == "gpu"
    assert device_hint([]) == "cpu"  # this machine has the CPU wheel


def test_shell_exports_for_a_launch_script():
    line, _ = shell_exports({}, CpuBudget(affinity=8), device="cpu", nproc_per_node=2)
    assert line.startswith("export OMP_NUM_THREADS=4 MKL_NUM_THREADS=4 MKL_CBWR=AUTO,STRICT ERNIE_MTL_THREADS_ORIGIN=")
    assert shell_exports({"OMP_NUM_THREADS": "2"}, CpuBudget(affinity=8), device="cpu",
                         nproc_per_node=2)[0] == "export MKL_CBWR=AUTO,STRICT"
    assert shell_exports({"OMP_NUM_THREADS": "2", "MKL_CBWR": "AVX2,STRICT"}, CpuBudget(affinity=8), device="cpu",
                         nproc_per_node=2)[0] == ""


# --- the real processes -----------------------------------------------------------------------

def _env_without_threads():
    return {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                                               "ERNIE_MTL_THREADS_ORIGIN", "PADDLE_LOCAL_SIZE")}


def test_the_module_does_not_import_paddle():
    code = "import ernie_mtl.dist.threads, sys; assert 'paddle' not in sys.modules, 'paddle imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(ROOT))


def test_paddle_import_forces_one_thread_unless_configured_first():
    """The premise (paddle 2.6's bootstrap sets OMP_NUM_THREADS=1 when unset) and the fix: set
    before the import, the decided value survives it. Forced to 2 CPUs so it holds on any host."""
    code = ("import zlib, os, sys\n"
            "from ernie_mtl.dist.threads import CpuBudget, configure_threads\n"
            "if sys.argv[1] == 'configure': configure_threads(budget=CpuBudget(affinity=2))\n"
            "import paddle\n"
            "print(os.environ['OMP_NUM_THREADS'], os.environ.get('MKL_NUM_THREADS'))\n")
    out = {mode: subprocess.run([sys.executable, "-c", code, mode], check=True, capture_output=True, text=True,
                                cwd=str(ROOT), env=_env_without_threads()).stdout.split()
           for mode in ("plain", "configure")}
    assert out["plain"] == ["1", "None"]
    assert out["configure"] == ["2", "2"]


def test_cli_shell_line_evaluates_in_bash():
    script = (f"eval \"$({sys.executable} -m ernie_mtl.dist.threads --shell --nproc_per_node 1 2>/dev/null)\"; "
              "echo \"$OMP_NUM_THREADS|$MKL_NUM_THREADS|$ERNIE_MTL_THREADS_ORIGIN\"")
    out = subprocess.run(["bash", "-c", script], check=True, capture_output=True, text=True, cwd=str(ROOT),
                         env=_env_without_threads()).stdout.strip().split("|")
    n = str(cpu_budget().cpus)
    assert out[:2] == [n, n] and out[2].startswith("set per node by the launch script")


def test_the_predictor_thread_budget_follows_the_training_rule():
    """`process_threads` (Paddle Inference's predictor runs 1 thread unless told): a user's value other than
    1 is kept; a 1 may be paddle's own (its import writes it when unset), so the rule decides, as for
    training: this process's cores / the ranks on this node."""
    from ernie_mtl.dist.threads import process_threads

    assert (process_threads({"OMP_NUM_THREADS": "3"}, budget=CpuBudget(affinity=8))
            == (3, "OMP_NUM_THREADS=3 from the environment"))
    threads, why = process_threads({"OMP_NUM_THREADS": "1"}, budget=CpuBudget(affinity=8))
    assert threads == 8 and "8 CPUs in the affinity mask / 1 process" in why
    assert process_threads({"PADDLE_LOCAL_SIZE": "2"}, budget=CpuBudget(affinity=8))[0] == 4
    assert process_threads({}, budget=CpuBudget(affinity=2, quota=1.5))[0] == 1  # the cgroup quota, rounded down


def test_mkl_results_do_not_depend_on_the_thread_count_once_configured():
    """MKL_CBWR=AUTO,STRICT (set by configure_threads before paddle's import): a vector-matrix product (what
    the bias gradients by matmul compute) and a matrix product give the same bits on 1 and 2 threads, so
    a run continues bitwise on another number of processes. (Without it, MKL's GEMV split the reduction
    across threads on the developers' Intel machine: 1.6e-6 apart after 4 tiny training steps.)"""
    code = ("import zlib, hashlib, sys\n"
            "from ernie_mtl.dist.threads import CpuBudget, configure_threads\n"
            "configure_threads(budget=CpuBudget(affinity=2))\n"
            "import numpy as np, paddle\n"
            "from paddle.base import core\n"
            "paddle.enable_static()\n"
            "main = paddle.static.Program()\n"
            "with paddle.static.program_guard(main, paddle.static.Program()):\n"
            "    a = paddle.static.data('a', [1, 1024], 'float32')\n"
            "    b = paddle.static.data('b', [1024, 768], 'float32')\n"
            "    c = paddle.static.data('c', [256, 1024], 'float32')\n"
            "    outs = [paddle.matmul(a, b), paddle.matmul(c, b)]\n"
            "exe = paddle.static.Executor(paddle.CPUPlace())\n"
            "rng = np.random.RandomState(0)\n"
            "feed = {'a': np.ones((1, 1024), 'float32'), 'b': rng.randn(1024, 768).astype('float32'),\n"
            "        'c': rng.randn(256, 1024).astype('float32')}\n"
            "for threads in (1, 2, 1):\n"
            "    core.set_num_threads(threads)\n"
            "    got = exe.run(main, feed=feed, fetch_list=outs)\n"
            "    print(threads, *[hashlib.sha1(o.tobytes()).hexdigest() for o in got])\n")
    env = {k: v for k, v in _env_without_threads().items() if k != "MKL_CBWR"}
    lines = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=str(ROOT),
                           env=env).stdout.split("\n")
    rows = [line.split()[1:] for line in lines if line[:2] in ("1 ", "2 ")]
    assert len(rows) == 3 and rows[0] == rows[1] == rows[2], rows


def test_a_script_that_did_not_configure_the_process_gets_reproducible_mkl_or_a_warning():
    """The engine's start (dist/process.start_process) switches MKL to strict reproducibility itself when
    MKL has not computed yet (a user's script that imported paddle first); after a computation MKL cannot
    switch any more, and `mkl_reproducible` says so instead of pretending."""
    code = ("import zlib, sys\n"
            "import numpy as np, paddle\n"
            "from ernie_mtl.dist.compat import mkl_reproducible\n"
            "if sys.argv[1] == 'late':\n"
            "    paddle.matmul(paddle.ones([64, 64]), paddle.ones([64, 64])).numpy()\n"
            "print(mkl_reproducible())\n")
    env = {k: v for k, v in _env_without_threads().items() if k != "MKL_CBWR"}
    out = {when: subprocess.run([sys.executable, "-c", code, when], check=True, capture_output=True, text=True,
                                cwd=str(ROOT), env=env).stdout.strip().splitlines()[-1] for when in ("early", "late")}
    assert out["early"] == "(True, 'MKL switched to strict reproducibility mode')", out
    assert out["late"].startswith("(False, 'MKL already computed in this process without MKL_CBWR=AUTO,STRICT"), out
