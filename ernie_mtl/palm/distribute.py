"""PaddlePALM's `palm.distribute` device counts, for scripts that import them
(`from paddlepalm.distribute import gpu_dev_count` becomes `from ernie_mtl.palm.distribute import gpu_dev_count`).

The engine does not split batches per device as PALM did: one process drives one device, and several
devices are several processes (`python -m paddle.distributed.launch`, docs/launch.md).
"""
from __future__ import annotations

import multiprocessing
import os


def _gpu_count() -> int:
    try:
        import paddle

        return int(paddle.device.cuda.device_count()) if paddle.is_compiled_with_cuda() else 0
    except Exception:  # noqa: BLE001  (no driver: no GPU)
        return 0


gpu_dev_count = _gpu_count()
cpu_dev_count = int(os.environ.get("CPU_NUM", multiprocessing.cpu_count()))
dev_count = gpu_dev_count if gpu_dev_count > 0 else cpu_dev_count

__all__ = ["gpu_dev_count", "cpu_dev_count", "dev_count"]
