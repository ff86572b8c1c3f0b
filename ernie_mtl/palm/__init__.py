"""The PaddlePALM face: PALM's Python API over the one engine, so a PALM script ports by changing
`import paddlepalm as palm` to `from ernie_mtl import palm` (docs/palm.md maps every call).

Component layer: `palm.reader`, `palm.backbone`, `palm.head`, `palm.optimizer`, `palm.lr_sched`;
trainer layer: `palm.Trainer`; high-level trainer layer: `palm.MultiHeadTrainer`; PALM 1.x:
`palm.Controller`. Every call collects configuration; `train()` runs the engine (the programs,
schedule, checkpoints and exports of `run_multitask_static.py`) and returns its result. A user's own
head, reader or backbone (subclasses of `palm.head.Head`, `palm.reader.Reader`, `palm.backbone.Backbone`
with PALM's methods) is built and run by the engine too (ernie_mtl/palm/adaptor.py,
docs/palm_extending.md).
"""
from ernie_mtl.palm import backbone, distribute, downloader, head, lr_sched, optimizer, reader  # noqa: F401
from ernie_mtl.palm import adaptor  # noqa: F401  (registers the task type `palm`: user-defined heads, readers, backbones)
from ernie_mtl.palm.controller import Controller
from ernie_mtl.palm.multihead_trainer import MultiHeadTrainer
from ernie_mtl.palm.trainer import Trainer

__all__ = ["Controller", "MultiHeadTrainer", "Trainer", "backbone", "distribute", "downloader", "head", "lr_sched",
           "optimizer", "reader"]
