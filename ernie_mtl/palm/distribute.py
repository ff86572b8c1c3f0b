"""PaddlePALM's `palm.distribute` device counts, for scripts that import them
(`from paddlepalm.distribute import gpu_dev_count` becomes `from ernie_mtl.palm.distribute import gpu_dev_count`).

The engine does not split batches per device as PALM did: one process drives one device, and several
devices are several processes (`python -m paddle.distributed.launch`, docs/launch.md). `gpu_dev_count`
(and `dev_count`) ask Paddle on first use, so importing the PALM face does not import Paddle (the
engine's data-loading workers unpickle its task type without it).
"""
from __future__ import annotations

import multiprocessing
import os

cpu_dev_count = int(os.environ.get("CPU_NUM", multiprocessing.cpu_count()))


def _gpu_count() -> int:
    try:
        import paddle

        return int(paddle.device.cuda.device_count()) if paddle.is_compiled_with_cuda() else 0
    except Exception:  # noqa: BLE001  (no driver: no GPU)
        return 0


def __getattr__(name):
    if name == "gpu_dev_count":
        return _gpu_count()
    if name == "dev_count":
        gpus = _gpu_count()
        return gpus if gpus > 0 else cpu_dev_count
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["gpu_dev_count", "cpu_dev_count", "dev_count"]  # noqa: F822  (gpu_dev_count, dev_count: __getattr__)
