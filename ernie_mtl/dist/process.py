"""Process and device set-up, in one place: who am I, static mode and the CPU/gloo path, fleet, the
executor, and a barrier that works everywhere.

`paddle.distributed.launch` describes the job in environment variables (PADDLE_TRAINER_ID,
PADDLE_TRAINERS_NUM, PADDLE_LOCAL_RANK, PADDLE_MASTER, ...). On a GPU build fleet sets up NCCL
from the program it builds; on a CPU-only build the collective ops run over gloo, which needs
`init_parallel_env()` after `enable_static()` plus the shim in ernie_mtl/dist/compat.py: unmodified
fleet fails on a CPU build (a GPU-only flag, and a communicator set-up with only CUDA/XPU
branches), and the CPU collective kernels use the process-global gloo context that
`init_parallel_env()` creates. That path gives real data parallelism, gradient merge, recompute
and sharding stage 1 across all ranks on CPU (the CPU kernels ignore ring ids: whole-world groups
only).

The barrier uses the job's TCP store (the rendezvous server `launch` already runs), not a
collective op: it works before any program exists, on CPU and GPU alike, and does not depend on
which communication rings a strategy happened to create.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable, Optional

SERIAL_RUN = "FLAGS_new_executor_serial_run"


def configure_executor(env=None, *, device: str, modules=None) -> str:
    """CPU runs: Paddle's serial executor (`FLAGS_new_executor_serial_run=1`: ops run in order on the
    calling thread instead of being handed to the executor's worker; bitwise equal, 1.02-1.2x faster
    per step on CPU: docs/performance.md). Paddle reads the flag from the environment at import, and
    serial and threaded executors cannot be mixed in one process, so the entry point calls this before
    anything imports paddle (RuntimeError otherwise), like `threads.configure_threads`. A value the
    user set is kept; GPU runs are left alone (there the threaded executor overlaps host work with the
    device). Returns what was decided, for the start-up log."""
    import sys

    env = os.environ if env is None else env
    modules = sys.modules if modules is None else modules
    if "paddle" in modules:
        raise RuntimeError("configure_executor() must run before paddle is imported (paddle reads "
                           f"{SERIAL_RUN} at import); call it at the top of the entry point")
    if device != "cpu":
        return "threaded executor (GPU run)"
    if env.get(SERIAL_RUN, "").strip():
        return f"{SERIAL_RUN}={env[SERIAL_RUN].strip()} (from the environment, kept)"
    env[SERIAL_RUN] = "1"
    return f"serial executor ({SERIAL_RUN}=1)"


def executor_mode() -> str:
    """Which executor paddle runs in this process (the flag as paddle holds it)."""
    import paddle

    serial = bool(paddle.get_flags([SERIAL_RUN])[SERIAL_RUN])
    return f"serial executor ({SERIAL_RUN}=1)" if serial else "threaded executor"


@dataclass(frozen=True)
class ProcessInfo:
    """This process's place in the job."""

    rank: int
    world_size: int
    local_rank: int

    @classmethod
    def from_env(cls) -> "ProcessInfo":
        rank = int(os.environ.get("PADDLE_TRAINER_ID", "0"))
        world = int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))
        local = int(os.environ.get("PADDLE_LOCAL_RANK", os.environ.get("PADDLE_RANK_IN_NODE", str(rank))))
        return cls(rank=rank, world_size=world, local_rank=local)


def init_distributed(info: ProcessInfo) -> None:
    """Static mode, and on a CPU-only build with several processes: gloo + the collective shim."""
    import paddle

    paddle.enable_static()
    from ernie_mtl.dist.compat import apply_cpu_collective_shim, install_quick_kv_server, is_cpu_build

    if info.world_size > 1 and is_cpu_build():
        from ernie_mtl.dist.console import captured_stderr

        install_quick_kv_server()
        with captured_stderr():  # its "Modified FLAGS detected" table: flags the entry point set on purpose
            paddle.distributed.init_parallel_env()  # initialises the process-global gloo context
        apply_cpu_collective_shim()


class StoreBarrier:
    """Blocks until every rank has called it the same number of times (TCP-store counter).

    `share(what, value)` hands rank 0's JSON-serialisable value to every rank (the others block
    until it is there): decisions that drive collectives or save barriers (best checkpoint, early
    stopping) are taken once, from one set of numbers, never from per-rank floats that may differ.
    """

    def __init__(self, info: ProcessInfo, *, timeout_s: float = 1800.0):
        self.info = info
        self.timeout_s = timeout_s
        self._count = 0
        self._shared = 0
        self._gathered = 0
        self._store = None
        if info.world_size > 1:
            from paddle.base import core

            self._store = core.create_or_get_global_tcp_store()

    @property
    def store(self):
        """The job's TCP store (None with one process)."""
        return self._store

    def __call__(self, what: str = "barrier") -> None:
        if self._store is None:
            return
        self._count += 1
        key = f"ernie_mtl/barrier/{self._count}"
        self._store.add(key, 1)
        deadline = time.monotonic() + self.timeout_s
        delay = 0.001
        while self._store.add(key, 0) < self.info.world_size:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"rank {self.info.rank}: other ranks did not reach {what} #{self._count} within "
                    f"{self.timeout_s:.0f}s; check the other workers' logs for an error")
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    def share(self, what: str, value):
        """Rank 0's `value` on every rank (JSON round trip on every rank, so all get equal objects)."""
        import json

        text = json.dumps(value, sort_keys=True)
        if self._store is None:
            return json.loads(text)
        self._shared += 1
        key = f"ernie_mtl/share/{self._shared}"
        if self.info.rank == 0:
            self._store.set(key, text)
            return json.loads(text)
        return json.loads(self._store.get(key).decode("utf-8"))


    def gather(self, what: str, value) -> list:
        """Every rank's `value` (any picklable object), in rank order, on every rank.

        Each rank's slot is overwritten by its next gather (the master store holds one gather at a
        time); the barrier at the end keeps a rank from overwriting a slot another is still reading."""
        import pickle

        if self._store is None:
            return [value]
        self._gathered += 1
        n = self._gathered
        self._store.set(f"ernie_mtl/gather/{self.info.rank}", pickle.dumps((n, value), protocol=4))
        self._store.add(f"ernie_mtl/gather/done/{n}", 1)
        deadline = time.monotonic() + self.timeout_s
        delay = 0.001
        while self._store.add(f"ernie_mtl/gather/done/{n}", 0) < self.info.world_size:
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank {self.info.rank}: other ranks did not reach {what} #{n} within "
                                   f"{self.timeout_s:.0f}s; check the other workers' logs for an error")
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        out = []
        for rank in range(self.info.world_size):
            got_n, got = pickle.loads(self._store.get(f"ernie_mtl/gather/{rank}"))
            if got_n != n:
                raise RuntimeError(f"rank {self.info.rank}: {what} #{n} read round {got_n} of rank {rank}")
            out.append(got)
        self(f"{what} #{n} read")
        return out


def resolve_device(device: str) -> str:
    """"cpu" or "gpu" for a --device value ("auto" = gpu when paddle is built with CUDA)."""
    if device != "auto":
        return device
    from paddle.base import core

    return "gpu" if core.is_compiled_with_cuda() else "cpu"


def start_process(cfg, *, on_distributed: Optional[Callable[[ProcessInfo], None]] = None):
    """(info, logger, topology): who this process is, static mode (+ gloo on CPU), the topology,
    the flags it needs and fleet, in that order (every run that trains starts so).
    `on_distributed(info)` runs right after the distributed set-up, when the job's store exists
    (the command line starts its peer watch there: ernie_mtl/dist/watchdog.py)."""
    import paddle

    from ernie_mtl.dist.console import get_logger
    from ernie_mtl.dist.topology import Topology, init_fleet, required_flags

    info = ProcessInfo.from_env()
    log = get_logger(info.rank)
    if resolve_device(cfg.train.device) == "cpu":
        from ernie_mtl.dist.compat import mkl_reproducible

        reproducible, why = mkl_reproducible()
        if reproducible is False and info.rank == 0:
            log.warning(why)
    init_distributed(info)
    if on_distributed is not None:
        on_distributed(info)
    topo = Topology.from_config(cfg.parallel, info.world_size)
    paddle.set_flags(required_flags(topo))
    init_fleet(topo)
    return info, log, topo
