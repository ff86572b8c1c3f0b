"""How many threads each training process gets, decided and set before Paddle is imported.

Why this exists. `import paddle` sets `OMP_NUM_THREADS=1` when it is unset (paddle/base/__init__.py,
`__bootstrap__`), so every OpenMP-parallel CPU kernel of a default run uses one core, whatever the
machine has (measured by a user on 2 cores at ERNIE-base size: 6.1 s/step as shipped, 4.6 with
`OMP_NUM_THREADS=2` set before the import). The value must therefore be in the environment before
the first `import paddle`, and only entry points can guarantee that. Two traps:

- **Several ranks on one node share its cores.** Two ranks with two threads each on two cores
  oversubscribe; each rank gets `cores // ranks_on_this_node`.
- **`paddle.distributed.launch` imports paddle itself**, so its own environment already holds
  `OMP_NUM_THREADS=1` and every rank it starts inherits that value (checked on 2.6.2: a rank sees
  `OMP_NUM_THREADS=1` although the user set nothing). A rank cannot tell that 1 from a user's 1,
  so the launch scripts decide per node *before* starting the launcher
  (`eval "$(python -m ernie_mtl.dist.threads --shell --nproc_per_node N --device cpu)"`), and mark the
  decision in `ERNIE_MTL_THREADS_ORIGIN`; a rank that sees 1 from a bare launcher says so in its
  start-up line instead of silently running single-threaded.

Cores available to this process = the CPU affinity mask (`os.sched_getaffinity`, which also
reflects cpusets) capped by the cgroup CPU quota (v2 `cpu.max`, v1 `cpu.cfs_quota_us` /
`cpu.cfs_period_us`, the smallest along the process's cgroup path), rounded down: a quota of 1.5
CPUs gives 1 thread, not 2 that would be throttled. Ranks on this node: `PADDLE_LOCAL_SIZE`
(set by Paddle 2.6's `paddle.distributed.launch` together with `PADDLE_LOCAL_RANK` and its older
alias `PADDLE_RANK_IN_NODE`), else Open MPI's `OMPI_COMM_WORLD_LOCAL_SIZE`, else 1.

Variables the user set are never changed. `MKL_NUM_THREADS` is set to the same value only when
`OMP_NUM_THREADS` is decided here; with a user-set `OMP_NUM_THREADS` MKL follows it by itself.

GPU nodes: the GPU does the model's work; OpenMP threads serve host-side work only (CPU-only
kernels such as the CRF's, feeding, metric code), next to the rank's Python thread that launches
CUDA kernels and its data-loading workers (`--num_workers`, one thread each: `worker_environment`).
Each rank gets half of its share of the cores, at least 1 and at most 4 (more spinning OpenMP
threads would take cores from the workers). This is a judgement, not a measurement: there is no
GPU here; the workers' CPU per sample is measured (docs/performance.md, "Feeding a GPU").

This module must not import paddle (tests check it).
"""
from __future__ import annotations

import argparse
import math
import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Mapping, MutableMapping, Optional, Sequence, Tuple

OMP = "OMP_NUM_THREADS"
MKL = "MKL_NUM_THREADS"
# MKL's conditional numerical reproducibility: with STRICT, ?gemm gives the same bits whatever the number of
# threads (Intel's MKL documentation; measured with Paddle 2.6.2's MKL: a [1,1024]x[1024,768] product and
# 4 training steps of tiny ERNIE bitwise equal on 1 and 2 threads, 1.6e-6 apart without it). AUTO keeps the
# code path this CPU would take anyway. So a run of 1 process x 2 threads continues bitwise on 2 processes
# x 1 thread (README, "Changing the cluster").
CBWR = "MKL_CBWR"
CBWR_VALUE = "AUTO,STRICT"
ORIGIN = "ERNIE_MTL_THREADS_ORIGIN"  # set by the launch scripts next to the values they decided
GPU_HOST_THREADS_MAX = 4


@dataclass(frozen=True)
class CpuBudget:
    """CPUs this process may use: its affinity mask capped by the cgroup quota (in CPUs)."""

    affinity: int
    quota: Optional[float] = None  # None: no cgroup CPU limit found
    quota_source: str = ""

    @property
    def cpus(self) -> int:
        limit = float(self.affinity) if self.quota is None else min(float(self.affinity), self.quota)
        return max(1, math.floor(limit + 1e-9))

    def describe(self) -> str:
        if self.quota is None or self.quota >= self.affinity:
            return f"{self.affinity} CPUs in the affinity mask"
        return f"cgroup quota {self.quota:g} CPUs ({self.quota_source}) of {self.affinity} in the affinity mask"


def _read(path: Path) -> Optional[str]:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _ancestors(base: Path, rel: str) -> List[Path]:
    """`base/rel`, then its parents up to `base` itself (a limit on a parent group applies too)."""
    parts = [p for p in rel.strip("/").split("/") if p and p not in (".", "..")]
    return [base.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)]


def _v2_quota(directory: Path) -> Optional[float]:
    text = _read(directory / "cpu.max")
    if not text:
        return None
    fields = text.split()
    if fields[0] == "max":
        return None
    try:
        quota, period = int(fields[0]), int(fields[1]) if len(fields) > 1 else 100000
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _v1_quota(directory: Path) -> Optional[float]:
    quota, period = _read(directory / "cpu.cfs_quota_us"), _read(directory / "cpu.cfs_period_us")
    try:
        q, p = int(quota), int(period)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return q / p if q > 0 and p > 0 else None  # -1: unlimited


def cgroup_cpu_quota(proc_self_cgroup: str, cgroup_root: Path) -> Tuple[Optional[float], str]:
    """(smallest CPU quota in CPUs along this process's cgroup path, the file it came from), or
    (None, "") when no limit is set. `proc_self_cgroup` is the text of /proc/self/cgroup; v1
    (`N:cpu,cpuacct:/path`) and v2 (`0::/path`) lines are both read (hybrid hosts have both).
    Inside a container the listed path may be the host's and not exist under the mount; the
    mount's own directory (the container's group) is then read."""
    best: Tuple[Optional[float], str] = (None, "")
    for line in proc_self_cgroup.splitlines():
        pieces = line.strip().split(":", 2)
        if len(pieces) != 3:
            continue
        _, controllers, rel = pieces
        if controllers == "":  # cgroup v2
            candidates = [(d, _v2_quota) for d in _ancestors(cgroup_root, rel)]
        elif "cpu" in controllers.split(","):
            mounts = dict.fromkeys([controllers, "cpu", "cpu,cpuacct", "cpuacct,cpu"])
            candidates = [(d, _v1_quota) for m in mounts for d in _ancestors(cgroup_root / m, rel)]
        else:
            continue
        for directory, reader in candidates:
            quota = reader(directory)
            if quota is not None and (best[0] is None or quota < best[0]):
                best = (quota, str(directory))
    return best


def cpu_budget(*, affinity: Optional[Iterable[int]] = None, proc_self_cgroup: Optional[str] = None,
               cgroup_root: Path = Path("/sys/fs/cgroup")) -> CpuBudget:
    """The CPU budget of this process; every input can be given (tests) or is read from the system."""
    if affinity is None:
        try:
            affinity = os.sched_getaffinity(0)
        except (AttributeError, OSError):  # not Linux
            affinity = range(os.cpu_count() or 1)
    if proc_self_cgroup is None:
        proc_self_cgroup = _read(Path("/proc/self/cgroup")) or ""
    quota, source = cgroup_cpu_quota(proc_self_cgroup, Path(cgroup_root))
    return CpuBudget(affinity=max(1, len(list(affinity))), quota=quota, quota_source=source)


def local_process_count(env: Mapping[str, str]) -> Tuple[int, str]:
    """(training processes on this node, the variable it came from)."""
    for name in ("PADDLE_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"):
        value = env.get(name, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value), name
    return 1, ""


@dataclass
class ThreadPlan:
    """What `plan_threads` decided: the variables to set (only unset ones) and a log line."""

    threads: int  # the OpenMP thread count this process will run with
    to_set: Dict[str, str] = field(default_factory=dict)
    description: str = ""
    basis: str = ""  # why `threads` (or the value that would have been chosen)


def plan_threads(env: Mapping[str, str], budget: CpuBudget, *, device: str = "cpu",
                 local_size: Optional[int] = None) -> ThreadPlan:
    """Decide OMP/MKL threads for one process of `local_size` on this node (default: from `env`).

    A pure function of its inputs. CPU: `budget.cpus // local_size` (at least 1). GPU: half of
    that, between 1 and GPU_HOST_THREADS_MAX, for host-side work (module docstring)."""
    if device not in ("cpu", "gpu"):
        raise ValueError(f"device must be 'cpu' or 'gpu', got {device!r}")
    if local_size is not None:
        ranks, ranks_from = int(local_size), "given"
    else:
        ranks, ranks_from = local_process_count(env)
    if ranks < 1:
        raise ValueError(f"local_size must be >= 1, got {ranks}")
    share = max(1, budget.cpus // ranks)
    decided = share if device == "cpu" else max(1, min(GPU_HOST_THREADS_MAX, share // 2))
    basis = f"{budget.describe()} / {ranks} process{'es' if ranks > 1 else ''} on this node"
    if ranks_from and ranks_from != "given":
        basis += f" ({ranks_from})"
    if budget.cpus < ranks:
        basis += f"; {ranks} processes on {budget.cpus} CPUs oversubscribe"
    if device == "gpu":
        basis += f"; GPU run: host-side work only, half the share, at most {GPU_HOST_THREADS_MAX}"

    user_omp = env.get(OMP, "").strip()
    if user_omp:
        origin = env.get(ORIGIN, "").strip()
        try:
            threads = max(1, int(user_omp))
        except ValueError:
            threads = 1  # what paddle's bootstrap does with a non-integer value
        mkl = env.get(MKL, "").strip()
        mkl_text = f"{MKL}={mkl}" if mkl else f"{MKL} unset (MKL follows {OMP})"
        text = f"{OMP}={user_omp}, {mkl_text} ({origin or 'from the environment, kept'})"
        if not origin and user_omp == "1" and env.get("PADDLE_LOCAL_SIZE") and decided > 1:
            text += (f"; note: paddle.distributed.launch passes {OMP}=1 to its ranks when it was unset, so this "
                     f"process may be using 1 of the {decided} threads it could have ({basis}): launch with "
                     f"scripts/run.sh or run_cpu.sh, or set {OMP}={decided} yourself")
        return ThreadPlan(threads=threads, to_set={}, description="threads: " + text, basis=basis)

    to_set = {OMP: str(decided)}
    if not env.get(MKL, "").strip():
        to_set[MKL] = str(decided)
        mkl_text = f"{MKL}={decided}"
    else:
        mkl_text = f"{MKL}={env[MKL].strip()} (from the environment, kept)"
    return ThreadPlan(threads=decided, to_set=to_set,
                      description=f"threads: {OMP}={decided}, {mkl_text} ({basis})", basis=basis)


def plan_math(env: Mapping[str, str]) -> Tuple[Dict[str, str], str]:
    """({variable: value} to set, a log fragment): MKL_CBWR=AUTO,STRICT unless the user set MKL_CBWR."""
    user = env.get(CBWR, "").strip()
    if not user:
        return {CBWR: CBWR_VALUE}, f"{CBWR}={CBWR_VALUE} (results independent of the thread count)"
    if "STRICT" in user.upper():
        return {}, f"{CBWR}={user} (from the environment, kept)"
    return {}, (f"{CBWR}={user} (from the environment, kept; without STRICT MKL's results depend on the thread "
                "count, so a run continued on another number of processes is within float32 rounding, not bitwise)")


# Every math library's thread variable a data-loading worker pins to 1 (numpy uses OpenBLAS here)
WORKER_THREAD_VARS = (OMP, MKL, "OPENBLAS_NUM_THREADS")


def worker_environment(env: Mapping[str, str]) -> Dict[str, str]:
    """The environment of a data-loading worker process (ernie_mtl/engine/data_workers.py): the
    training process's, with every math library at one thread. A worker builds samples in Python
    and NumPy (small arrays, no large kernels), so more threads would only take cores from the
    training process's own OpenMP threads; the cores a rank's workers need come out of the rank's
    share on top of its thread count (docs/performance.md, "Feeding a GPU")."""
    out = dict(env)
    out.update({name: "1" for name in WORKER_THREAD_VARS})
    return out


def device_hint(argv: Sequence[str], *, gpu_build: Optional[bool] = None) -> str:
    """"cpu" or "gpu" for the run that `argv` (an entry point's arguments) describes, without
    importing paddle: `--device X` on the command line, else `device:` in the `--config` YAML, else
    "auto"; "auto" means gpu when the installed paddle is a GPU build (`paddlepaddle-gpu`, read from
    the package metadata; `gpu_build` overrides it for tests). Unreadable inputs fall back to auto."""
    device = None
    for i, arg in enumerate(argv):
        if arg == "--device" and i + 1 < len(argv):
            device = argv[i + 1]
        elif arg.startswith("--device="):
            device = arg.split("=", 1)[1]
    if device is None:
        config = next((argv[i + 1] for i, a in enumerate(argv) if a == "--config" and i + 1 < len(argv)),
                      next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), None))
        if config:
            try:
                import yaml

                with open(config, encoding="utf-8") as f:
                    loaded = yaml.safe_load(f)
                if isinstance(loaded, dict) and loaded.get("device") is not None:
                    device = str(loaded["device"])
            except Exception:  # the entry point reports a bad config file properly later
                device = None
    if device in ("cpu", "gpu"):
        return device
    if gpu_build is None:
        from importlib import metadata

        try:
            metadata.version("paddlepaddle-gpu")
            gpu_build = True
        except metadata.PackageNotFoundError:
            gpu_build = False
    return "gpu" if gpu_build else "cpu"


_DECIDED: List[int] = []  # the thread count configure_threads decided in this process (at most one entry)


def process_threads(env: Optional[Mapping[str, str]] = None, *, budget: Optional[CpuBudget] = None) -> Tuple[int, str]:
    """(threads, why) for this process's CPU work that does not read OMP_NUM_THREADS itself -- Paddle
    Inference's predictor runs its math library on 1 thread unless told (`set_cpu_math_library_num_threads`).
    The same rule as training: the number `configure_threads` decided at start-up (the entry points call
    it), else a value the user set (paddle's import writes `OMP_NUM_THREADS=1` when it was unset, so a 1
    cannot be told from paddle's own and is not taken as the user's), else this process's share of the
    cores (`plan_threads`)."""
    if env is None and _DECIDED:
        return _DECIDED[-1], "the thread budget decided at start-up"
    env = os.environ if env is None else env
    user = env.get(OMP, "").strip()
    if user and user != "1":
        try:
            return max(1, int(user)), f"{OMP}={user} from the environment"
        except ValueError:
            pass
    plan = plan_threads({k: v for k, v in env.items() if k not in (OMP, MKL)}, budget or cpu_budget())
    return plan.threads, plan.basis


def configure_threads(env: Optional[MutableMapping[str, str]] = None, *, device: str = "cpu",
                      local_size: Optional[int] = None, budget: Optional[CpuBudget] = None,
                      modules: Optional[Mapping[str, object]] = None) -> str:
    """Decide and set the thread variables in `env` (default `os.environ`); return the start-up
    log line. Call it first thing in an entry point, before anything imports paddle: after
    `import paddle` the environment already holds paddle's `OMP_NUM_THREADS=1`, and this raises
    RuntimeError rather than report a decision that was never applied."""
    env = os.environ if env is None else env
    modules = sys.modules if modules is None else modules
    if "paddle" in modules:
        raise RuntimeError("configure_threads() must run before paddle is imported: paddle's import has "
                           f"already set {OMP}={env.get(OMP)}; call it at the top of the entry point")
    plan = plan_threads(env, budget or cpu_budget(), device=device, local_size=local_size)
    math_vars, math_text = plan_math(env)
    env.update(plan.to_set)
    env.update(math_vars)
    if env is os.environ:
        _DECIDED[:] = [plan.threads]
    return f"{plan.description}; {math_text}"


def shell_exports(env: Mapping[str, str], budget: CpuBudget, *, device: str, nproc_per_node: int) -> Tuple[str, str]:
    """(`export ...` line for a launch script, description). Exports nothing the user set; marks
    the decision in ERNIE_MTL_THREADS_ORIGIN so each rank's start-up line says where it came from."""
    plan = plan_threads(env, budget, device=device, local_size=nproc_per_node)
    math_vars, _ = plan_math(env)
    if not plan.to_set:
        return ("export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in math_vars.items()) if math_vars else ""), \
            plan.description
    origin = f"set per node by the launch script: {plan.basis}"
    exports = dict(plan.to_set, **math_vars, **{ORIGIN: origin})
    return "export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in exports.items()), plan.description


def main(argv: Optional[List[str]] = None, *, budget_fn: Callable[[], CpuBudget] = cpu_budget) -> int:
    p = argparse.ArgumentParser(
        prog="python -m ernie_mtl.dist.threads",
        description="Print the thread settings for the training processes of this node. With --shell, print an "
                    "`export` line for a launch script (eval it before starting paddle.distributed.launch).")
    p.add_argument("--nproc_per_node", type=int, default=None,
                   help="training processes on this node (default: PADDLE_LOCAL_SIZE, else 1)")
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    p.add_argument("--shell", action="store_true", help="print `export VAR=value ...` (nothing if the user set them)")
    args = p.parse_args(argv)
    if args.nproc_per_node is not None and args.nproc_per_node < 1:
        p.error(f"--nproc_per_node must be >= 1, got {args.nproc_per_node}")
    budget = budget_fn()
    if args.shell:
        nproc = args.nproc_per_node or local_process_count(os.environ)[0]
        line, description = shell_exports(os.environ, budget, device=args.device, nproc_per_node=nproc)
        print(line)
        print(description, file=sys.stderr)
    else:
        print(plan_threads(os.environ, budget, device=args.device, local_size=args.nproc_per_node).description)
    return 0


if __name__ == "__main__":
    sys.exit(main())
