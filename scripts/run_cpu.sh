#!/usr/bin/env bash
# Launch run_multitask_static.py as NPROC CPU processes on this machine (data parallel over gloo):
#   NPROC=2 CONFIG=scripts/demo_pretrain.yaml bash scripts/run_cpu.sh --global_batch_size 32
# or as one node of several, with a rendezvous server (run the same command on every node):
#   MASTER=10.0.0.1:8090 NNODES=2 NPROC=1 CONFIG=scripts/demo_pretrain.yaml bash scripts/run_cpu.sh
#
# Settings (environment variable or script option; the option wins):
#   NPROC      --nproc_per_node  number of processes on this node (default: 2)
#   CONFIG     --config          YAML file of training flags (required, unless SCRIPT)
#   SCRIPT     --script          a Python script every rank runs instead (ernie_mtl.train / ernie_mtl.palm),
#                                e.g. SCRIPT=examples/palm/classification/run.py; CONFIG/INPUT_DIR/OUTPUT_DIR not passed
#   OUTPUT_DIR --output_dir      checkpoints, VisualDL logs, metrics (default: output)
#   LOG_DIR    --log_dir         the launcher's per-process logs workerlog.N (default: OUTPUT_DIR/launch_log)
#   INPUT_DIR  --input_dir       corpus prefix (path without .bin/.idx); default: input_dir in CONFIG
#   MASTER     --master          host:port of the rendezvous server, the same on every node (several nodes)
#   NNODES     --nnodes          number of nodes (with MASTER)
#   NODE_RANK  --node_rank       this node's place 0..NNODES-1 (with MASTER; default: master's node first)
#   HOST       --host            this node's IP, when the host name resolves to another address
#   PYTHON                       interpreter (default: .venv/bin/python of the repository, else python3)
#   DRY_RUN=1                    print the command and exit without running it
# OMP_NUM_THREADS/MKL_NUM_THREADS: a value you set is kept; otherwise they are decided for this node
# by `python -m ernie_mtl.dist.threads` (cores / NPROC) and printed before the command.
# PORT_RANGE: a value you set (LOW:HIGH, 1 <= LOW < HIGH <= 65535, at least processes + 2 ports) is
# checked and kept; otherwise the launcher's ports are taken above the kernel's range for outgoing
# connections (`python -m ernie_mtl.dist.ports`), printed before the command.
# Every other argument is passed to run_multitask_static.py unchanged (after `--`, everything is).
# GPUS is ignored: Paddle 2.6.2's launcher fails on CPU with --gpus/--devices ("substring not found").
# The checks and the command are in scripts/run.sh (launch mode "cpu").
# `sh scripts/...` works too: re-run under bash (the checks use bash features).
if [ -z "${BASH_VERSION:-}" ]; then exec bash "$0" "$@"; fi
set -euo pipefail
ERNIE_LAUNCH_MODE=cpu ERNIE_LAUNCH_PROG=run_cpu.sh ERNIE_LAUNCH_DOC="${BASH_SOURCE[0]}" \
    exec bash "$(dirname "${BASH_SOURCE[0]}")/run.sh" "$@"
