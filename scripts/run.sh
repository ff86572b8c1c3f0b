#!/usr/bin/env bash
# Launch run_multitask_static.py on several GPU nodes with paddle.distributed.launch (Paddle 2.6.2).
#
# Run the same command on every node:
#   IPS=10.0.0.1,10.0.0.2 GPUS=0,1,2,3 CONFIG=my_run.yaml OUTPUT_DIR=/shared/run1 \
#       bash scripts/run.sh --max_steps 100000
#
# Settings (environment variable or script option; the option wins):
#   IPS        --ips         node IPs, comma-separated, the same list and order on every node (required)
#   GPUS       --gpus        GPU ids on each node, e.g. 0,1,2,3 (required)
#   CONFIG     --config      YAML file of training flags (required)
#   OUTPUT_DIR --output_dir  checkpoints, VisualDL logs, metrics (default: output)
#   LOG_DIR    --log_dir     the launcher's per-process logs workerlog.N (default: OUTPUT_DIR/launch_log)
#   INPUT_DIR  --input_dir   corpus prefix (path without .bin/.idx); default: input_dir in CONFIG
#   HOST       --host        this node's IP as written in IPS, when the host name resolves to another
#                            address (otherwise the launcher silently numbers this node's ranks from 0)
#   START_PORT --start_port  first port of the processes on each node (launcher default: 6070)
#   PYTHON                   interpreter (default: .venv/bin/python of the repository, else python3)
#   DRY_RUN=1                print the command and exit without running it
# Every other argument is passed to run_multitask_static.py unchanged (after `--`, everything is).
#
# scripts/run_single_node.sh and scripts/run_cpu.sh run this file with another launch mode.
# `sh scripts/...` works too: re-run under bash (the checks use bash features).
if [ -z "${BASH_VERSION:-}" ]; then exec bash "$0" "$@"; fi
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODE="${ERNIE_LAUNCH_MODE:-multi}"  # set by the wrapper scripts: multi | single | cpu
PROG="${ERNIE_LAUNCH_PROG:-run.sh}"

die() {
    echo "$PROG: error: $*" >&2
    exit 2
}

usage() {
    sed -n '2,/^set -euo/p' "${ERNIE_LAUNCH_DOC:-${BASH_SOURCE[0]}}" | sed '$d' | sed 's/^# \{0,1\}//'
}

IPS="${IPS-}"
GPUS="${GPUS-}"
NPROC="${NPROC-2}"
CONFIG="${CONFIG-}"
OUTPUT_DIR="${OUTPUT_DIR:-output}"
LOG_DIR="${LOG_DIR-}"
INPUT_DIR="${INPUT_DIR-}"
HOST="${HOST-}"
START_PORT="${START_PORT-}"
train_args=()

# Script options are consumed; anything else is a training flag passed through verbatim.
need_value() { [[ $# -ge 2 ]] || die "$1 needs a value"; }
while [[ $# -gt 0 ]]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --) shift; train_args+=("$@"); break ;;
        --ips=*) IPS="${1#*=}" ;;
        --gpus=*) GPUS="${1#*=}" ;;
        --nproc_per_node=*) NPROC="${1#*=}" ;;
        --config=*) CONFIG="${1#*=}" ;;
        --output_dir=*) OUTPUT_DIR="${1#*=}" ;;
        --log_dir=*) LOG_DIR="${1#*=}" ;;
        --input_dir=*) INPUT_DIR="${1#*=}" ;;
        --host=*) HOST="${1#*=}" ;;
        --start_port=*) START_PORT="${1#*=}" ;;
        --ips|--gpus|--nproc_per_node|--config|--output_dir|--log_dir|--input_dir|--host|--start_port)
            need_value "$@"
            case "$1" in
                --ips) IPS="$2" ;; --gpus) GPUS="$2" ;; --nproc_per_node) NPROC="$2" ;;
                --config) CONFIG="$2" ;; --output_dir) OUTPUT_DIR="$2" ;; --log_dir) LOG_DIR="$2" ;;
                --input_dir) INPUT_DIR="$2" ;; --host) HOST="$2" ;; --start_port) START_PORT="$2" ;;
            esac
            shift ;;
        *) train_args+=("$1") ;;
    esac
    shift
done
LOG_DIR="${LOG_DIR:-$OUTPUT_DIR/launch_log}"

if [[ -z "${PYTHON-}" ]]; then
    if [[ -x "$ROOT/.venv/bin/python" ]]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi

# --- checks: fail before any node starts ---
case "$MODE" in
    multi)
        [[ -n "$IPS" ]] || die "IPS is unset or empty: set IPS=ip1,ip2,... (or --ips), the node IPs in the same order on every node"
        [[ "$IPS" =~ ^[^,[:space:]]+(,[^,[:space:]]+)*$ ]] \
            || die "IPS='$IPS' is malformed: give comma-separated IPs without spaces or empty items, e.g. 10.0.0.1,10.0.0.2"
        IFS=, read -r -a ip_list <<< "$IPS"
        if [[ $(printf '%s\n' "${ip_list[@]}" | sort | uniq -d | head -n1) != "" ]]; then
            die "IPS='$IPS' lists a node twice; give each node IP once"
        fi
        if [[ ${#ip_list[@]} -gt 1 && ",$IPS," =~ ,(127\.0\.0\.1|localhost), ]]; then
            die "IPS='$IPS': 127.0.0.1/localhost cannot be used with several nodes (other nodes cannot reach it); use each node's network IP"
        fi
        if [[ -n "$HOST" && ",$IPS," != *",$HOST,"* ]]; then
            die "HOST='$HOST' is not one of IPS='$IPS'; set HOST to this node's IP exactly as written in IPS"
        fi
        if [[ -n "$START_PORT" ]] && ! [[ "$START_PORT" =~ ^[1-9][0-9]*$ && "$START_PORT" -lt 65536 ]]; then
            die "START_PORT='$START_PORT' must be a port number 1..65535, e.g. 6070"
        fi ;;
    single|cpu) ;;
    *) die "internal: unknown launch mode '$MODE'" ;;
esac
if [[ "$MODE" == cpu ]]; then
    [[ "$NPROC" =~ ^[1-9][0-9]*$ ]] || die "NPROC='$NPROC' must be a positive integer (the number of CPU processes), e.g. NPROC=2"
else
    [[ -n "$GPUS" ]] || die "GPUS is unset or empty: set GPUS to this node's GPU ids (or --gpus), e.g. GPUS=0,1,2,3"
    [[ "$GPUS" =~ ^[0-9]+(,[0-9]+)*$ ]] || die "GPUS='$GPUS' is malformed: give comma-separated GPU ids without spaces, e.g. GPUS=0,1,2,3"
    if [[ $(tr , '\n' <<< "$GPUS" | sort | uniq -d | head -n1) != "" ]]; then
        die "GPUS='$GPUS' lists a GPU twice; give each GPU id once"
    fi
fi
[[ -n "$CONFIG" ]] || die "CONFIG is unset or empty: set CONFIG (or --config) to the YAML file of training flags"
[[ -f "$CONFIG" ]] || die "CONFIG='$CONFIG': no such file; give the YAML file of training flags"
# A multi-task config (task_instance:) names its data in the task files, which the trainer checks;
# a pretraining config needs the corpus.
if ! grep -q -E '^task_instance:' "$CONFIG"; then
    corpus="$INPUT_DIR"
    if [[ -z "$corpus" ]]; then  # a plain `input_dir: PATH` line of the YAML (as args.py reads it)
        corpus="$(sed -n -E 's/^input_dir:[[:space:]]*["'\'']?([^"'\''#]*[^"'\''#[:space:]])["'\'']?[[:space:]]*(#.*)?$/\1/p' "$CONFIG" | tail -n1)"
        [[ -n "$corpus" ]] || die "no corpus: CONFIG='$CONFIG' has no input_dir line; set INPUT_DIR (or --input_dir) to the corpus prefix (path without .bin/.idx)"
    fi
    for ext in .bin .idx; do
        [[ -f "$corpus$ext" ]] || die "corpus '$corpus' is missing $corpus$ext: INPUT_DIR / input_dir is the path of the tokenized corpus without .bin/.idx (python -m data_tools.create_pretraining_data writes it)"
    done
fi

# --- the command ---
launch=("$PYTHON" -m paddle.distributed.launch)
case "$MODE" in
    # --gpus is 2.6.2's alias of --devices; --ips starts every node from the fixed list (no master)
    multi)
        launch+=(--ips "$IPS" --gpus "$GPUS")
        [[ -z "$HOST" ]] || launch+=(--host "$HOST")
        [[ -z "$START_PORT" ]] || launch+=(--start_port "$START_PORT")
        device=gpu ;;
    single) launch+=(--gpus "$GPUS"); device=gpu ;;
    # never --devices/--gpus on CPU: 2.6.2's launcher fails with "substring not found"
    cpu) launch+=(--nproc_per_node "$NPROC"); device=cpu ;;
esac
cmd=("${launch[@]}" --log_dir "$LOG_DIR" "$ROOT/run_multitask_static.py" --config "$CONFIG" --output_dir "$OUTPUT_DIR")
[[ -z "$INPUT_DIR" ]] || cmd+=(--input_dir "$INPUT_DIR")
cmd+=(--device "$device" ${train_args[@]+"${train_args[@]}"})

# Printed so it can be pasted into a shell: arguments with unsafe characters in single quotes
quoted=()
for arg in "${cmd[@]}"; do
    if [[ "$arg" =~ ^[A-Za-z0-9_./:=,@%+-]+$ ]]; then quoted+=("$arg"); else quoted+=("'${arg//\'/\'\\\'\'}'"); fi
done
echo "+ ${quoted[*]}"
if [[ "${DRY_RUN:-0}" == 1 ]]; then
    exit 0
fi
exec "${cmd[@]}"
