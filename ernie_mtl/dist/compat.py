"""Shims that let Paddle 2.6.2's fleet collective programs be built and run on a CPU-only build.

Two uses (verified on Paddle 2.6.2; docs/platform.md records the facts and how they were checked):

* **Running on CPU** (gloo): `apply_cpu_collective_shim()` after `paddle.distributed.init_parallel_env()`,
  then `strip_gpu_sync_ops(main, startup)` before the first `exe.run`. Unmodified fleet fails on a
  CPU build because (a) `FLAGS_dynamic_static_unified_comm` exists only in CUDA/XPU builds and
  (b) `CollectiveHelper._init_communicator` has only CUDA/XPU branches. The CPU `c_*` kernels use
  the process-global gloo context that `init_parallel_env()` creates, so the communicator set-up
  can be skipped. They ignore `ring_id`: only whole-world groups work on CPU.
* **Starting several CPU processes quickly**: `install_quick_kv_server()` before
  `init_parallel_env()`. On a CPU build, rank 0 of `init_parallel_env()` serves gloo's rendezvous
  from a helper process that checks whether it may stop every 3 s (and whose HTTP server notices a
  shutdown every 0.5 s), then waits for it: about 3 s of idle start-up per launch. The same loop,
  checking every 20 ms, starts every process at once; nothing else changes.
* **Inspecting GPU programs on CPU**: `emulate_gpu_program(rank, world_size)` builds, without
  running anything, the program that rank `rank` of `world_size` would run on GPUs: a fake
  `UserDefinedRoleMaker`, the `c_gen_nccl_id`/`c_comm_init` ops a CUDA build writes, and the GPU
  fp16/bf16 op lists so that AMP inserts casts (a CPU build reads the lists from its own kernel
  registry, finds no GPU kernels and inserts none). Every monkeypatch is undone on exit.

The emulated op lists treat every registered op as having a low-precision GPU kernel, so cast
placement can differ slightly from a real GPU build; the collective structure is the real one.
"""
from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

import paddle
from paddle.base import core

from ernie_mtl.dist.console import fleet_log_level

_UNIFIED_COMM_FLAG = "FLAGS_dynamic_static_unified_comm"
# Stream-ordering ops: GPU-only kernels, no-ops for synchronous gloo collectives.
GPU_SYNC_OPS = ("c_sync_calc_stream", "c_sync_comm_stream", "c_wait_comm", "c_wait_compute")


def is_cpu_build() -> bool:
    """True when this paddle has neither CUDA nor XPU support (the gloo path applies)."""
    return not (core.is_compiled_with_cuda() or core.is_compiled_with_xpu())


class _Patches:
    """A stack of (object, attribute, original value) so patches can be undone in reverse order."""

    def __init__(self) -> None:
        self._undo: List[Tuple[Any, str, Any]] = []

    def set(self, obj: Any, name: str, value: Any) -> None:
        self._undo.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)

    def restore(self) -> None:
        while self._undo:
            obj, name, value = self._undo.pop()
            setattr(obj, name, value)


KV_SERVER_POLL_S = 0.02  # how often the rendezvous helper checks whether it may stop


def quick_kv_server(port: int, http_server_d: Any, size: dict) -> None:
    """`paddle.distributed.parallel._start_kv_server` (Paddle 2.6.2), polling every KV_SERVER_POLL_S:
    serve gloo's rendezvous keys until rank 0 says it is done and every rank has deleted its key."""
    from paddle.distributed.fleet.utils.http_server import KVServer

    server = KVServer(int(port), size=size)
    server.listen_thread = threading.Thread(
        target=lambda: server.http_server.serve_forever(poll_interval=KV_SERVER_POLL_S))
    server.listen_thread.start()
    while http_server_d.get("running", False) or not server.should_stop():
        time.sleep(KV_SERVER_POLL_S)
    server.stop()


def install_quick_kv_server() -> None:
    """Let `init_parallel_env()` on a CPU build use `quick_kv_server` (idempotent; the helper process
    is forked, so the replaced module attribute is what it runs)."""
    import paddle.distributed.parallel as parallel

    parallel._start_kv_server = quick_kv_server


def _get_flags_with_unified_comm(original: Callable) -> Callable:
    def get_flags(flags):
        try:
            return original(flags)
        except ValueError:
            names = [flags] if isinstance(flags, str) else list(flags)
            if names and all(n == _UNIFIED_COMM_FLAG for n in names):
                # True = "communicators are set up elsewhere": fleet then skips its TCP port waits.
                return {n: True for n in names}
            raise
    get_flags.__ernie_mtl_shim__ = True
    return get_flags


def _skip_communicator_init(self, program, current_endpoint, endpoints, rank, ring_id, wait_port,
                            global_ring_id=None, sync=True):
    """CPU build: gloo is already initialised process-wide by init_parallel_env(); nothing to add."""



def apply_cpu_collective_shim() -> bool:
    """Make fleet's static collective meta-optimizers usable on a CPU-only build (idempotent).

    Call after `paddle.enable_static()` and `paddle.distributed.init_parallel_env()`, before
    `fleet.distributed_optimizer(...).minimize`. Does nothing on CUDA/XPU builds. Returns whether
    the shim is active.
    """
    if not is_cpu_build():
        return False
    from paddle.distributed.fleet.meta_optimizers import common

    if not getattr(paddle.get_flags, "__ernie_mtl_shim__", False):
        paddle.get_flags = _get_flags_with_unified_comm(paddle.get_flags)
    common.CollectiveHelper._init_communicator = _skip_communicator_init
    return True


def strip_gpu_sync_ops(*programs: paddle.static.Program) -> int:
    """Remove stream-synchronisation ops (no CPU kernel) from `programs`; returns how many."""
    removed = 0
    for program in programs:
        for block in program.blocks:
            for idx in reversed(range(len(block.ops))):
                if block.ops[idx].type in GPU_SYNC_OPS:
                    block._remove_op(idx, sync=False)
                    removed += 1
            block._sync_with_cpp()
    return removed


def _emit_comm_init_ops(self, program, current_endpoint, endpoints, rank, ring_id, wait_port,
                        global_ring_id=None, sync=True):
    """What `CollectiveHelper._init_communicator` writes on a CUDA build, written as raw op
    descriptions because `c_gen_nccl_id`/`c_comm_init` are not registered in a CPU build."""
    from paddle.distributed.fleet.meta_optimizers.common import OP_ROLE_KEY, OpRole
    from paddle.utils import unique_name

    block = program.global_block()
    if current_endpoint is not None:
        others = [e for e in endpoints if e != current_endpoint]
        comm_id = block.create_var(name=unique_name.generate("comm_id"), persistable=True,
                                   type=core.VarDesc.VarType.RAW)
        for op_type, inputs, outputs, attrs in (
                ("c_gen_nccl_id", {}, {"Out": [comm_id.name]},
                 {"rank": rank, "endpoint": current_endpoint, "other_endpoints": others, "ring_id": ring_id}),
                ("c_comm_init", {"X": [comm_id.name]}, {},
                 {"nranks": len(endpoints), "rank": rank, "ring_id": ring_id, "endpoints": ",".join(endpoints)})):
            desc = block.desc.append_op()
            desc.set_type(op_type)
            for key, names in inputs.items():
                desc.set_input(key, names)
            for key, names in outputs.items():
                desc.set_output(key, names)
            for key, value in attrs.items():
                desc._set_attr(key, value)
            desc._set_attr(OP_ROLE_KEY, int(OpRole.Forward))
        block._sync_with_cpp()
        if not sync:
            return
    # the "sync by all-reduce" a GPU build appends (a registered op, so append it normally)
    sync_var = block.create_var(name=unique_name.generate("sync_var"), dtype=core.VarDesc.VarType.INT32,
                                persistable=False, stop_gradient=True)
    block.append_op(type="fill_constant", outputs={"Out": [sync_var]},
                    attrs={"shape": [1], "dtype": sync_var.dtype, "value": 1, "force_cpu": False,
                           OP_ROLE_KEY: OpRole.Forward})
    block.append_op(type="c_allreduce_sum", inputs={"X": [sync_var]}, outputs={"Out": [sync_var]},
                    attrs={"ring_id": global_ring_id, "use_calc_stream": True, OP_ROLE_KEY: OpRole.Forward})
    block.append_op(type="c_sync_calc_stream", inputs={"X": sync_var}, outputs={"Out": sync_var},
                    attrs={OP_ROLE_KEY: OpRole.Forward})


def _all_ops_have_gpu_kernels(dtype):
    """Stand-in for `fp16_lists._get_sys_unsupported_list` on a GPU build: nothing unsupported."""
    return "GPU", set(), set(core._get_all_register_op_kernels("all").keys())


@contextlib.contextmanager
def emulate_gpu_program(rank: int, world_size: int, *,
                        endpoints: Optional[Sequence[str]] = None) -> Iterator[None]:
    """Inside: fleet is initialised as rank `rank` of `world_size` GPU workers, and programs built
    with fleet get the communicator-init ops and AMP casts a CUDA build would give them.

    Build only: such programs cannot run on CPU (no NCCL, no fp16 kernels). On exit every patch is
    undone; fleet stays initialised with the fake role maker until the next `fleet.init`.
    """
    import paddle.distributed.fleet as fleet
    import paddle.static.amp.fp16_lists as fp16_lists
    from paddle.distributed.fleet.meta_optimizers import common

    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside 0..{world_size - 1}")
    endpoints = list(endpoints or [f"127.0.0.1:{6170 + i}" for i in range(world_size)])
    if len(endpoints) != world_size:
        raise ValueError(f"{len(endpoints)} endpoints given for {world_size} ranks")
    patches = _Patches()
    try:
        if not getattr(paddle.get_flags, "__ernie_mtl_shim__", False):
            patches.set(paddle, "get_flags", _get_flags_with_unified_comm(paddle.get_flags))
        patches.set(common.CollectiveHelper, "_init_communicator", _emit_comm_init_ops)
        # read by paddle.static.amp (fleet AMP and static.amp.decorate, fp16 and bf16 alike)
        patches.set(fp16_lists, "_get_sys_unsupported_list", _all_ops_have_gpu_kernels)
        role = fleet.UserDefinedRoleMaker(is_collective=True, current_id=rank, role=fleet.Role.WORKER,
                                          worker_num=world_size, worker_endpoints=endpoints)
        fleet.init(role_maker=role, is_collective=True, log_level=fleet_log_level())
        yield
    finally:
        patches.restore()


# MKL's service functions (the public MKL_CBWR_Set/Get are macros over them): values from mkl_service.h
_CBWR_AUTO, _CBWR_STRICT, _CBWR_ALL = 2, 0x10000, -1


def mkl_reproducible() -> Tuple[Optional[bool], str]:
    """(whether Paddle's MKL computes independently of the thread count, what was done): MKL_CBWR with
    STRICT was set before Paddle's first MKL call (ernie_mtl/dist/threads.plan_math), or is set now through
    MKL's service function when MKL has not computed yet in this process (a notebook or script that did
    not call `ernie_mtl.configure_process()`). None when this build has no MKL library."""
    import ctypes
    import os

    path = os.path.join(os.path.dirname(paddle.__file__), "libs", "libmklml_intel.so")
    if not os.path.exists(path):
        return None, "no MKL library in this Paddle build"
    try:
        lib = ctypes.CDLL(path)
        current = int(lib.mkl_serv_cbwr_get(_CBWR_ALL))
    except (OSError, AttributeError) as e:
        return None, f"MKL's reproducibility mode cannot be read ({e})"
    if current & _CBWR_STRICT:
        return True, "MKL in strict reproducibility mode"
    status = int(lib.mkl_serv_cbwr_set(_CBWR_AUTO | _CBWR_STRICT))
    if status == 0:
        return True, "MKL switched to strict reproducibility mode"
    return False, ("MKL already computed in this process without MKL_CBWR=AUTO,STRICT, so its results depend on the "
                   "thread count: a run continued with another number of threads per process is within float32 "
                   "rounding, not bitwise (call ernie_mtl.configure_process() before any Paddle computation)")


# -- the Paddle this project runs on --------------------------------------------------------------------------
SUPPORTED_PADDLE = ((2, 6), (2, 7))  # [2.6, 2.7): 2.6.2 is the tested release (CPU and the newest paddlepaddle-gpu)
ALLOW_ANY_PADDLE = "ERNIE_MTL_ALLOW_ANY_PADDLE"


def paddle_version_problem(version: str) -> Optional[str]:
    """Why Paddle `version` cannot run this project, or None for a supported one (module docstring's
    range; a development build's "0.0.0" is not one)."""
    import re

    m = re.match(r"^(\d+)\.(\d+)", str(version))
    found = tuple(int(x) for x in m.groups()) if m else None
    if found is not None and SUPPORTED_PADDLE[0] <= found < SUPPORTED_PADDLE[1]:
        return None
    why = ""
    if found is not None and found >= (3, 0):
        why = (" Paddle 3 builds static programs in PIR, where fleet's static minimize, gradient clipping and AMP's "
               "checks fail on the legacy programs this project builds and variables have no names, so training, "
               "conversion and the GPU dry run cannot work.")
    return (f"ernie-mtl runs on PaddlePaddle 2.6.x (2.6.2 is tested); this environment has paddlepaddle {version}."
            f"{why} Install the supported release in this environment: pip install 'paddlepaddle==2.6.2' (GPU "
            f"clusters: 'paddlepaddle-gpu==2.6.2'); or set {ALLOW_ANY_PADDLE}=1 to try this version anyway (unsupported)")


def require_supported_paddle() -> None:
    """Refuse (UserError) a Paddle outside the supported range, unless ERNIE_MTL_ALLOW_ANY_PADDLE=1."""
    import os

    from data_tools.cli_utils import UserError

    if os.environ.get(ALLOW_ANY_PADDLE, "").strip() in ("1", "true", "yes"):
        return
    problem = paddle_version_problem(paddle.__version__)
    if problem:
        raise UserError(problem)
