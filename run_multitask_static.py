"""ERNIE pretraining as fleet static programs (data parallel, sharding, AMP, gradient accumulation).

    python run_multitask_static.py --device cpu --input_dir DATA/corpus --tokenizer_name_or_path DATA/vocab.txt ...
    python -m paddle.distributed.launch --gpus 0,1,2,3 run_multitask_static.py ...        # GPUs
    python -m paddle.distributed.launch --nproc_per_node 2 run_multitask_static.py --device cpu ...   # CPU, gloo

See `--help` for every flag (PaddleNLP ERNIE 1.0 names); `--config FILE.yaml` supplies them from a file.
"""
import zlib  # noqa: F401  (before paddle: paddle 2.6.2 exports clashing zlib symbols)

import sys
from typing import Optional, Sequence

from args import parse_config
from ernie_mtl.config import ConfigError


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Parse and validate (exit status 2 listing every problem), then train. A checkpoint that
    cannot be resumed exactly is also reported with exit status 2."""
    try:
        cfg = parse_config(argv)
    except ConfigError as e:
        sys.stderr.write(f"run_multitask_static.py: {e}\n")
        return 2
    from ernie_mtl.checkpoint import CheckpointError
    from ernie_mtl.trainer import run

    try:
        return run(cfg)
    except CheckpointError as e:  # e.g. resuming with another topology: a user error, not a crash
        sys.stderr.write(f"run_multitask_static.py: {e}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
