"""ERNIE pretraining and multi-task learning as fleet static programs (data parallel, sharding, AMP,
gradient accumulation, recompute), plus prediction with exported task models and a dry-run planner.

    python run_multitask_static.py --config tasks/global.yaml                 # multi-task (PALM-style YAML)
    python run_multitask_static.py --device cpu --input_dir DATA/corpus ...   # pretraining from flags
    python run_multitask_static.py --config tasks/global.yaml --dry_run       # print the plan, no training
    python run_multitask_static.py --do_predict --task sentiment --pred_file F --output_dir OUT
    python -m paddle.distributed.launch --gpus 0,1,2,3 run_multitask_static.py ...        # GPUs
    python -m paddle.distributed.launch --nproc_per_node 2 run_multitask_static.py --device cpu ...   # CPU, gloo

See `--help` for every flag (PaddleNLP ERNIE 1.0 names) and docs/multitask_config.md for the YAML keys.
"""
import zlib  # noqa: F401  (before paddle: paddle 2.6.2 exports clashing zlib symbols)

import sys
from typing import Optional, Sequence

from args import parse_config
from ernie_mtl.config import ConfigError


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Parse and validate (exit status 2 listing every problem), then predict, plan or train. A
    checkpoint that cannot be resumed exactly is also reported with exit status 2."""
    try:
        cfg = parse_config(argv)
    except ConfigError as e:
        sys.stderr.write(f"run_multitask_static.py: {e}\n")
        return 2
    from ernie_mtl.checkpoint import CheckpointError

    try:
        if cfg.train.do_predict:
            return _predict(cfg)
        if cfg.train.dry_run:
            from ernie_mtl.planner import dry_run

            print(dry_run(cfg))
            return 0
        if cfg.is_multitask:
            from ernie_mtl.mtl_trainer import run_multitask

            return run_multitask(cfg, cfg.multitask)
        from ernie_mtl.trainer import run

        return run(cfg)
    except (CheckpointError, ConfigError) as e:  # e.g. resuming with another topology: a user error, not a crash
        sys.stderr.write(f"run_multitask_static.py: {e}\n")
        return 2


def _predict(cfg) -> int:
    import os

    from ernie_mtl.export import export_dir, predict

    t = cfg.train
    output = t.predict_output or os.path.join(t.output_dir, t.task, "predictions.json")
    from ernie_mtl.trainer import resolve_device

    predict(export_dir(t.output_dir, t.task), t.pred_file, output, use_gpu=resolve_device(t.device) == "gpu")
    return 0


if __name__ == "__main__":
    sys.exit(main())
