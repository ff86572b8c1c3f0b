"""ERNIE pretraining and multi-task learning as fleet static programs (data parallel, sharding, AMP,
gradient accumulation, recompute), plus prediction with exported task models and a dry-run planner.

    python run_multitask_static.py --config tasks/global.yaml                 # multi-task (PALM-style YAML)
    python run_multitask_static.py --device cpu --input_dir DATA/corpus ...   # pretraining from flags
    python run_multitask_static.py --config tasks/global.yaml --dry_run       # print the plan, no training
    python run_multitask_static.py ... --prebuild_index                       # build index caches, no training
    python run_multitask_static.py --do_predict --task sentiment --pred_file F --output_dir OUT
    python -m paddle.distributed.launch --gpus 0,1,2,3 run_multitask_static.py ...        # GPUs
    python -m paddle.distributed.launch --nproc_per_node 2 run_multitask_static.py --device cpu ...   # CPU, gloo

See `--help` for every flag (PaddleNLP ERNIE 1.0 names) and docs/multitask_config.md for the YAML keys.
This file is a thin entry point over ernie_mtl.main (installed as the `ernie-mtl` command).
"""
import zlib  # noqa: F401  (before paddle: paddle 2.6.2 exports clashing zlib symbols)

import sys

from ernie_mtl.main import main

if __name__ == "__main__":
    sys.exit(main())
