#!/usr/bin/env bash
# Launch run_multitask_static.py on several GPU nodes with paddle.distributed.launch (Paddle 2.6.2).
#
# Run the same command on every node, either with a rendezvous server (one address for all nodes):
#   MASTER=10.0.0.1:8090 NNODES=2 GPUS=0,1,2,3 CONFIG=my_run.yaml OUTPUT_DIR=/shared/run1 \
#       bash scripts/run.sh --max_steps 100000
# or with a fixed list of node IPs:
#   IPS=10.0.0.1,10.0.0.2 GPUS=0,1,2,3 CONFIG=my_run.yaml OUTPUT_DIR=/shared/run1 \
#       bash scripts/run.sh --max_steps 100000
#
# Settings (environment variable or script option; the option wins):
#   MASTER     --master      host:port of the rendezvous server, the same on every node; the node whose
#                            IP it names serves it (set MASTER and NNODES, or IPS)
#   NNODES     --nnodes      number of nodes (with MASTER)
#   NODE_RANK  --node_rank   this node's place 0..NNODES-1 (with MASTER; default: the master's node is
#                            0, the others in the order they join)
#   IPS        --ips         node IPs, comma-separated, the same list and order on every node (instead of
#                            MASTER)
#   GPUS       --gpus        GPU ids on each node, e.g. 0,1,2,3 (required)
#   CONFIG     --config      YAML file of training flags (required, unless SCRIPT)
#   SCRIPT     --script      a Python script to launch instead of run_multitask_static.py (every rank
#                            runs it: a script using ernie_mtl.train or ernie_mtl.palm); it reads its
#                            own configuration: CONFIG, INPUT_DIR and OUTPUT_DIR are not passed to it
#   OUTPUT_DIR --output_dir  checkpoints, VisualDL logs, metrics (default: output)
#   LOG_DIR    --log_dir     the launcher's per-process logs workerlog.N (default: OUTPUT_DIR/launch_log)
#   INPUT_DIR  --input_dir   corpus prefix (path without .bin/.idx); default: input_dir in CONFIG
#   HOST       --host        this node's IP (as written in IPS), when the host name resolves to another
#                            address (with IPS the launcher would silently number this node's ranks from 0)
#   START_PORT --start_port  first port of the processes on each node, IPS mode (launcher default: 6070)
#   PYTHON                   interpreter (default: .venv/bin/python of the repository, else python3)
#   MAX_RESTARTS             relaunch the command after a failure, at most this many times, resuming
#                            from the newest intact checkpoint (python -m ernie_mtl.dist.supervisor:
#                            doubling backoff, never after a user error or a preemption; default 0)
#   DRY_RUN=1                print the command and exit without running it
#   KEEP_ENV                 variables to pass to the processes although their names look secret, e.g.
#                            KEEP_ENV=WANDB_API_KEY,HF_TOKEN (see "Secrets" below)
# Secrets: paddle.distributed.launch writes the whole environment of every process into LOG_DIR
# (envlog.N, backup_env.N.json, default.*.log), often on shared storage. This script starts it without
# the variables whose names look secret (containing TOKEN, SECRET, PASSWORD, PASSWD, CREDENTIAL, AUTH,
# COOKIE, SESSION, PRIVATE or KEY outside the word TOKENIZER, except PADDLE_*, FLAGS_*, NCCL_*, CUDA_*,
# ERNIE_MTL_*, OMP_*, MKL_*),
# names what it left out, and creates LOG_DIR readable by you only.
# OMP_NUM_THREADS/MKL_NUM_THREADS: a value you set is kept; otherwise they are decided for this node
# by `python -m ernie_mtl.dist.threads` (cores / processes per node) and printed before the command.
# PORT_RANGE: a value you set (LOW:HIGH, 1 <= LOW < HIGH <= 65535, at least processes + 2 ports) is
# checked and kept; otherwise the launcher's ports are taken above the kernel's range for outgoing
# connections (`python -m ernie_mtl.dist.ports`), printed before the command.
# Every other argument is passed to run_multitask_static.py (or SCRIPT) unchanged (after `--`, everything is).
# If a node fails, run the same command again on every node: training resumes from OUTPUT_DIR/model_last.
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
MASTER="${MASTER-}"
NNODES="${NNODES-}"
NODE_RANK="${NODE_RANK-}"
GPUS="${GPUS-}"
NPROC="${NPROC-2}"
CONFIG="${CONFIG-}"
SCRIPT="${SCRIPT-}"
OUTPUT_DIR="${OUTPUT_DIR:-output}"
LOG_DIR="${LOG_DIR-}"
INPUT_DIR="${INPUT_DIR-}"
HOST="${HOST-}"
START_PORT="${START_PORT-}"
train_args=()

# Script options are consumed; anything else is a training flag passed through verbatim.
options="ips master nnodes node_rank gpus nproc_per_node config script output_dir log_dir input_dir host start_port"
set_option() {  # set_option NAME VALUE
    case "$1" in
        ips) IPS="$2" ;; master) MASTER="$2" ;; nnodes) NNODES="$2" ;; node_rank) NODE_RANK="$2" ;;
        gpus) GPUS="$2" ;; nproc_per_node) NPROC="$2" ;; config) CONFIG="$2" ;; script) SCRIPT="$2" ;; output_dir) OUTPUT_DIR="$2" ;;
        log_dir) LOG_DIR="$2" ;; input_dir) INPUT_DIR="$2" ;; host) HOST="$2" ;; start_port) START_PORT="$2" ;;
    esac
}
while [[ $# -gt 0 ]]; do
    name="${1#--}"
    name="${name%%=*}"
    if [[ "$1" == -h || "$1" == --help ]]; then
        usage; exit 0
    elif [[ "$1" == -- ]]; then
        shift; train_args+=("$@"); break
    elif [[ "$1" == --* && " $options " == *" $name "* ]]; then
        if [[ "$1" == *=* ]]; then
            set_option "$name" "${1#*=}"
        else
            [[ $# -ge 2 ]] || die "$1 needs a value"
            set_option "$name" "$2"
            shift
        fi
    else
        train_args+=("$1")
    fi
    shift
done
LOG_DIR="${LOG_DIR:-$OUTPUT_DIR/launch_log}"

if [[ -z "${PYTHON-}" ]]; then
    if [[ -x "$ROOT/.venv/bin/python" ]]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi

# --- checks: fail before any node starts ---
check_port() {  # check_port SETTING VALUE PORT
    [[ "$3" =~ ^[1-9][0-9]*$ && ${#3} -le 5 && "$3" -lt 65536 ]] || die "$1='$2': the port must be a number 1..65535, e.g. ${4:-8090}"
}
check_rendezvous() {  # MASTER / NNODES / NODE_RANK: the launcher's --master/--nnodes/--rank
    if [[ -z "$MASTER" ]]; then
        [[ -z "$NNODES" ]] || die "NNODES='$NNODES' needs MASTER: set MASTER=host:port (or --master), the rendezvous address, the same on every node"
        [[ -z "$NODE_RANK" ]] || die "NODE_RANK='$NODE_RANK' needs MASTER: set MASTER=host:port (or --master) and NNODES"
        return 0
    fi
    [[ "$MASTER" =~ ^([^:/[:space:]]+):([^:]*)$ ]] \
        || die "MASTER='$MASTER' is malformed: give host:port of the rendezvous server, the same on every node, e.g. MASTER=10.0.0.1:8090"
    local master_host="${BASH_REMATCH[1]}" master_port="${BASH_REMATCH[2]}"
    check_port MASTER "$MASTER" "$master_port" "MASTER=$master_host:8090"
    [[ -n "$NNODES" ]] || die "NNODES is unset: with MASTER set NNODES (or --nnodes) to the number of nodes, e.g. NNODES=2"
    [[ "$NNODES" =~ ^[1-9][0-9]*$ ]] || die "NNODES='$NNODES' must be a positive integer (the number of nodes), e.g. NNODES=2"
    if [[ -n "$NODE_RANK" ]]; then
        [[ "$NODE_RANK" =~ ^(0|[1-9][0-9]*)$ && "$NODE_RANK" -lt "$NNODES" ]] \
            || die "NODE_RANK='$NODE_RANK' must be 0..$((NNODES - 1)) (this node's place among NNODES=$NNODES), each node a different one"
    fi
    [[ -z "$START_PORT" ]] || die "START_PORT='$START_PORT' applies to IPS mode only: with MASTER the launcher picks free ports; unset START_PORT"
    if [[ "$NNODES" -gt 1 && "$master_host" =~ ^(127\.[0-9.]+|localhost)$ ]]; then
        echo "$PROG: warning: MASTER='$MASTER' is reachable from this machine only: all $NNODES nodes must run here; on several machines use the master node's network IP" >&2
    fi
}
case "$MODE" in
    multi)
        if [[ -n "$IPS" && -n "$MASTER" ]]; then
            die "IPS='$IPS' and MASTER='$MASTER' are both set: use either MASTER=host:port NNODES=N (a rendezvous server) or IPS=ip1,ip2,... (a fixed node list), not both"
        fi
        [[ -n "$IPS$MASTER" ]] \
            || die "IPS and MASTER are unset or empty: set MASTER=host:port NNODES=N (or --master/--nnodes), the rendezvous server, or IPS=ip1,ip2,... (or --ips), the node IPs in the same order on every node"
        check_rendezvous
        if [[ -n "$IPS" ]]; then
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
            [[ -z "$START_PORT" ]] || check_port START_PORT "$START_PORT" "$START_PORT" 6070
        fi ;;
    cpu) check_rendezvous ;;
    single) ;;
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
if [[ -n "$SCRIPT" ]]; then  # a Python script (ernie_mtl.train / ernie_mtl.palm) instead of the CLI
    [[ -z "$CONFIG" ]] || die "CONFIG='$CONFIG' and SCRIPT='$SCRIPT' are both set: SCRIPT reads its own configuration; unset CONFIG (or pass it to the script after --)"
    [[ -z "$INPUT_DIR" ]] || die "INPUT_DIR='$INPUT_DIR' applies to run_multitask_static.py, not to SCRIPT='$SCRIPT'; unset INPUT_DIR (or pass it to the script after --)"
    [[ -f "$SCRIPT" ]] || die "SCRIPT='$SCRIPT': no such file; give the Python script every rank runs"
else
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

fi

# --- the command ---
launch=("$PYTHON" -m paddle.distributed.launch)
rendezvous=()
if [[ -n "$MASTER" ]]; then  # a rendezvous server: every node gives the same --master and --nnodes
    rendezvous=(--master "$MASTER" --nnodes "$NNODES")
    [[ -z "$NODE_RANK" ]] || rendezvous+=(--rank "$NODE_RANK")
fi
case "$MODE" in
    # --gpus is 2.6.2's alias of --devices; --ips starts every node from the fixed list (no master)
    multi)
        if [[ -n "$MASTER" ]]; then launch+=("${rendezvous[@]}"); else launch+=(--ips "$IPS"); fi
        launch+=(--gpus "$GPUS")
        [[ -z "$HOST" ]] || launch+=(--host "$HOST")
        [[ -z "$START_PORT" ]] || launch+=(--start_port "$START_PORT")
        device=gpu; nproc_local=$(tr , '\n' <<< "$GPUS" | wc -l) ;;
    single) launch+=(--gpus "$GPUS"); device=gpu; nproc_local=$(tr , '\n' <<< "$GPUS" | wc -l) ;;
    # never --devices/--gpus on CPU: 2.6.2's launcher fails with "substring not found"
    cpu)
        launch+=(${rendezvous[@]+"${rendezvous[@]}"} --nproc_per_node "$NPROC")
        [[ -z "$HOST" ]] || launch+=(--host "$HOST")
        device=cpu; nproc_local=$NPROC ;;
esac
# A PORT_RANGE you set goes to the launcher as it is, which parses it with int() and picks ports by
# a bind test that loops forever when no port of the range can be bound: check it here.
if [[ -n "${PORT_RANGE+set}" && -z "$PORT_RANGE" ]]; then
    unset PORT_RANGE  # empty is unset (the launcher would fail on int('')); a range is chosen below
elif [[ -n "${PORT_RANGE-}" ]]; then
    port_fix="give LOW:HIGH with 1 <= LOW < HIGH <= 65535, e.g. PORT_RANGE=61000:65535, or unset PORT_RANGE (docs/launch.md, 'The launcher's ports')"
    [[ "$PORT_RANGE" =~ ^([0-9]{1,5}):([0-9]{1,5})$ ]] \
        || die "PORT_RANGE='$PORT_RANGE' is malformed: the launcher's port range is two port numbers joined by ':'; $port_fix"
    port_lo=$((10#${BASH_REMATCH[1]})) port_hi=$((10#${BASH_REMATCH[2]}))
    (( port_lo >= 1 && port_hi <= 65535 )) \
        || die "PORT_RANGE='$PORT_RANGE' lies outside the ports 1..65535 (the launcher would wait forever for a port it cannot bind); $port_fix"
    (( port_lo <= port_hi )) \
        || die "PORT_RANGE='$PORT_RANGE': LOW $port_lo is not below HIGH $port_hi; give the lower port first (PORT_RANGE=$port_hi:$port_lo), or unset PORT_RANGE"
    # the launcher takes one port for its rendezvous store, one for the pod and one per process
    port_need=$((nproc_local + 2))
    (( port_hi - port_lo + 1 >= port_need )) \
        || die "PORT_RANGE='$PORT_RANGE' holds $((port_hi - port_lo + 1)) port(s), but the launcher needs $port_need on this node ($nproc_local process(es) + its store + the pod); widen it, e.g. PORT_RANGE=$port_lo:$((port_lo + 999 > 65535 ? 65535 : port_lo + 999)), or unset PORT_RANGE"
fi

if [[ -n "$SCRIPT" ]]; then
    cmd=("${launch[@]}" --log_dir "$LOG_DIR" "$SCRIPT" ${train_args[@]+"${train_args[@]}"})
else
    cmd=("${launch[@]}" --log_dir "$LOG_DIR" "$ROOT/run_multitask_static.py" --config "$CONFIG" --output_dir "$OUTPUT_DIR")
    [[ -z "$INPUT_DIR" ]] || cmd+=(--input_dir "$INPUT_DIR")
    cmd+=(--device "$device" ${train_args[@]+"${train_args[@]}"})
fi

# --- threads per process, decided for this node before the launcher starts (it imports paddle,
# which sets OMP_NUM_THREADS=1 for every rank it starts). A value the user set is never changed:
# ernie_mtl.dist.threads prints nothing then. The decision is ernie_mtl/dist/threads.py's (stdlib only, so
# any python3 runs it); if it cannot run, the ranks report their thread count themselves.
threads_export=""
if [[ -z "${OMP_NUM_THREADS-}" ]]; then
    threads_export="$(cd "$ROOT" && "$PYTHON" -m ernie_mtl.dist.threads --shell --nproc_per_node "$nproc_local" \
        --device "$device" 2>/dev/null)" \
        || { threads_export=""; echo "$PROG: warning: python -m ernie_mtl.dist.threads failed; OMP_NUM_THREADS left unset" >&2; }
fi

# --- the launcher's ports, outside the kernel's range for outgoing connections (ernie_mtl/dist/ports.py:
# Paddle picks them in 35100:64000, which overlaps it, and an outgoing connection can take a chosen
# port before rank 0 binds it: "Bind network on IP_ANY:<port> failed"). A PORT_RANGE you set is kept.
# With IPS the launcher uses START_PORT onwards instead (6070 by default, below that range).
ports_export=""
if [[ -z "${PORT_RANGE-}" && ! ( "$MODE" == multi && -z "$MASTER" ) ]]; then
    ports_export="$(cd "$ROOT" && "$PYTHON" -m ernie_mtl.dist.ports --shell 2>/dev/null)" || ports_export=""
fi

if [[ -n "${MAX_RESTARTS:-}" && "${MAX_RESTARTS}" != 0 ]]; then
    [[ "$MAX_RESTARTS" =~ ^[0-9]+$ ]] || die "MAX_RESTARTS='$MAX_RESTARTS' must be a whole number of restarts, e.g. MAX_RESTARTS=3 (0: none)"
    cmd=("$PYTHON" -m ernie_mtl.dist.supervisor --max_restarts "$MAX_RESTARTS" -- "${cmd[@]}")
fi

# Printed so it can be pasted into a shell: arguments with unsafe characters in single quotes
quoted=()
for arg in "${cmd[@]}"; do
    if [[ "$arg" =~ ^[A-Za-z0-9_./:=,@%+-]+$ ]]; then quoted+=("$arg"); else quoted+=("'${arg//\'/\'\\\'\'}'"); fi
done
# --- secrets stay out of LOG_DIR (see "Secrets" above): names that look secret are not passed on
keep=",${KEEP_ENV:-},"
withheld=()
while IFS='=' read -r name _; do
    [[ "$name" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || continue
    [[ "$name" =~ ^(PADDLE_|FLAGS_|NCCL_|CUDA_|ERNIE_MTL_|OMP_|MKL_) ]] && continue
    upper="${name^^}"
    upper="${upper//TOKENIZER/}"  # TOKENIZERS_PARALLELISM and the like set a tokenizer, they hold no token
    [[ "$upper" =~ (TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH|COOKIE|SESSION|PRIVATE|KEY) ]] || continue
    [[ "$keep" == *",$name,"* ]] && continue
    withheld+=("$name")
done < <(env)

[[ -z "$threads_export" ]] || echo "+ $threads_export"
[[ -z "$ports_export" ]] || echo "+ $ports_export"
[[ ${#withheld[@]} -eq 0 ]] || echo "+ unset ${withheld[*]}   # secret-looking names: the launcher writes the environment into $LOG_DIR (KEEP_ENV=NAME,... passes one on)"
echo "+ ${quoted[*]}"
if [[ "${DRY_RUN:-0}" == 1 ]]; then
    exit 0
fi
[[ -z "$threads_export" ]] || eval "$threads_export"
[[ -z "$ports_export" ]] || eval "$ports_export"
for name in ${withheld[@]+"${withheld[@]}"}; do unset "$name"; done
(umask 077 && mkdir -p "$LOG_DIR") && chmod 700 "$LOG_DIR" 2>/dev/null || true
exec "${cmd[@]}"
