#!/usr/bin/env bash
# Launch run_multitask_static.py as NPROC CPU processes on this machine (data parallel over gloo):
#   NPROC=2 CONFIG=scripts/demo_pretrain.yaml bash scripts/run_cpu.sh --global_batch_size 32
#
# Settings (environment variable or script option; the option wins):
#   NPROC      --nproc_per_node  number of processes (default: 2)
#   CONFIG     --config          YAML file of training flags (required)
#   OUTPUT_DIR --output_dir      checkpoints, VisualDL logs, metrics (default: output)
#   LOG_DIR    --log_dir         the launcher's per-process logs workerlog.N (default: OUTPUT_DIR/launch_log)
#   INPUT_DIR  --input_dir       corpus prefix (path without .bin/.idx); default: input_dir in CONFIG
#   PYTHON                       interpreter (default: .venv/bin/python of the repository, else python3)
#   DRY_RUN=1                    print the command and exit without running it
# Every other argument is passed to run_multitask_static.py unchanged (after `--`, everything is).
# GPUS is ignored: Paddle 2.6.2's launcher fails on CPU with --gpus/--devices ("substring not found").
# The checks and the command are in scripts/run.sh (launch mode "cpu").
# `sh scripts/...` works too: re-run under bash (the checks use bash features).
if [ -z "${BASH_VERSION:-}" ]; then exec bash "$0" "$@"; fi
set -euo pipefail
ERNIE_LAUNCH_MODE=cpu ERNIE_LAUNCH_PROG=run_cpu.sh ERNIE_LAUNCH_DOC="${BASH_SOURCE[0]}" \
    exec bash "$(dirname "${BASH_SOURCE[0]}")/run.sh" "$@"
