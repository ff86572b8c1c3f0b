#!/usr/bin/env bash
# Launch run_multitask_static.py on the GPUs of one node (one process per GPU), Paddle 2.6.2:
#   GPUS=0,1,2,3 CONFIG=my_run.yaml OUTPUT_DIR=output/run1 bash scripts/run_single_node.sh --max_steps 1000
#
# Settings (environment variable or script option; the option wins):
#   GPUS       --gpus        GPU ids, e.g. 0,1,2,3 (required)
#   CONFIG     --config      YAML file of training flags (required, unless SCRIPT)
#   SCRIPT     --script      a Python script every rank runs instead (ernie_mtl.train / ernie_mtl.palm),
#                            e.g. SCRIPT=examples/palm/classification/run.py; CONFIG/INPUT_DIR/OUTPUT_DIR not passed
#   OUTPUT_DIR --output_dir  checkpoints, VisualDL logs, metrics (default: output)
#   LOG_DIR    --log_dir     the launcher's per-process logs workerlog.N (default: OUTPUT_DIR/launch_log)
#   INPUT_DIR  --input_dir   corpus prefix (path without .bin/.idx); default: input_dir in CONFIG
#   PYTHON                   interpreter (default: .venv/bin/python of the repository, else python3)
#   DRY_RUN=1                print the command and exit without running it
# OMP_NUM_THREADS/MKL_NUM_THREADS: a value you set is kept; otherwise they are decided for this node
# by `python -m ernie_mtl.dist.threads` (host threads per GPU process) and printed before the command.
# PORT_RANGE: a value you set (LOW:HIGH, 1 <= LOW < HIGH <= 65535, at least processes + 2 ports) is
# checked and kept; otherwise the launcher's ports are taken above the kernel's range for outgoing
# connections (`python -m ernie_mtl.dist.ports`), printed before the command.
# Every other argument is passed to run_multitask_static.py unchanged (after `--`, everything is).
# The checks and the command are in scripts/run.sh (launch mode "single").
# `sh scripts/...` works too: re-run under bash (the checks use bash features).
if [ -z "${BASH_VERSION:-}" ]; then exec bash "$0" "$@"; fi
set -euo pipefail
ERNIE_LAUNCH_MODE=single ERNIE_LAUNCH_PROG=run_single_node.sh ERNIE_LAUNCH_DOC="${BASH_SOURCE[0]}" \
    exec bash "$(dirname "${BASH_SOURCE[0]}")/run.sh" "$@"
