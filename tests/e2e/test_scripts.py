"""Launch scripts: the exact command each prints in DRY_RUN mode (IPS and MASTER/NNODES rendezvous
modes), input checks (message, exit status 2, nothing launched), the per-node thread settings, syntax,
a real launch's log folder without secrets. Real two-process and two-node runs through scripts/run_cpu.sh:
tests/e2e/test_multinode.py."""
import zlib  # noqa: F401  (before paddle)

import os
import subprocess
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = {name: ROOT / "scripts" / f"{name}.sh" for name in ("run", "run_single_node", "run_cpu")}
ENTRY = str(ROOT / "run_multitask_static.py")
LAUNCH = "python3 -m paddle.distributed.launch"


def run(name, env=None, *args, timeout=30, cwd=None):
    """The script with a clean environment (no IPS/GPUS/... inherited from the caller's shell).
    OMP_NUM_THREADS and PORT_RANGE are set (user values: the script exports neither) unless `env` says
    otherwise; test_thread_settings_per_node and test_single_node_command cover the decisions."""
    full_env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"), "OMP_NUM_THREADS": "1",
                "PORT_RANGE": os.environ.get("PORT_RANGE", "61000:65535"), **(env or {})}
    full_env = {k: v for k, v in full_env.items() if v is not None}
    return subprocess.run(["bash", str(SCRIPTS[name]), *args], env=full_env, capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


@pytest.fixture
def config(tmp_path):
    """A YAML config naming an (empty, but present) corpus prefix."""
    corpus = tmp_path / "data" / "corpus"
    corpus.parent.mkdir()
    for ext in (".bin", ".idx"):
        (tmp_path / "data" / f"corpus{ext}").write_bytes(b"")
    path = tmp_path / "run.yaml"
    path.write_text(f"model_name_or_path: ernie-tiny-test\ninput_dir: \"{corpus}\"   # the corpus prefix\n")
    return path


def dry(name, env, *args):
    proc = run(name, {"DRY_RUN": "1", "PYTHON": "python3", **env}, *args)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    return proc.stdout


def test_multi_node_command(config):
    out = dry("run",
              {"IPS": "10.0.0.1,10.0.0.2", "GPUS": "0,1,2,3", "CONFIG": str(config), "OUTPUT_DIR": "/shared/run1",
                      "LOG_DIR": "/shared/logs"}, "--max_steps", "100", "--use_amp")
    assert out == (f"+ {LAUNCH} --ips 10.0.0.1,10.0.0.2 --gpus 0,1,2,3 --log_dir /shared/logs {ENTRY} "
                   f"--config {config} --output_dir /shared/run1 --device gpu --max_steps 100 --use_amp\n")


def test_options_win_over_environment_and_defaults(config, tmp_path):
    corpus = tmp_path / "data" / "corpus"
    out = dry("run", {"IPS": "10.0.0.9", "GPUS": "7", "CONFIG": "/nonexistent.yaml", "HOST": "10.0.0.2",
                      "START_PORT": "7000"},
              "--ips=10.0.0.1,10.0.0.2", "--gpus", "0,1", "--config", str(config), "--input_dir", str(corpus),
              "--", "--output_dir", "x y")
    # LOG_DIR defaults to OUTPUT_DIR/launch_log; after `--` every argument is a training flag
    assert out == (f"+ {LAUNCH} --ips 10.0.0.1,10.0.0.2 --gpus 0,1 --host 10.0.0.2 --start_port 7000 "
                   f"--log_dir output/launch_log {ENTRY} --config {config} --output_dir output --input_dir {corpus} "
                   "--device gpu "
                   "--output_dir 'x y'\n")


def test_rendezvous_command(config):
    """MASTER/NNODES: the launcher's rendezvous mode, the same command on every node; NODE_RANK fixes
    this node's place; the GPU and the CPU scripts share it."""
    out = dry("run", {"MASTER": "10.0.0.1:8090", "NNODES": "2", "GPUS": "0,1,2,3", "CONFIG": str(config),
                      "OUTPUT_DIR": "/shared/run1"}, "--max_steps", "100")
    assert out == (f"+ {LAUNCH} --master 10.0.0.1:8090 --nnodes 2 --gpus 0,1,2,3 --log_dir /shared/run1/launch_log "
                   f"{ENTRY} --config {config} --output_dir /shared/run1 --device gpu --max_steps 100\n")
    out = dry("run", {"GPUS": "0", "CONFIG": str(config), "HOST": "10.0.0.2"},
              "--master=10.0.0.1:8090", "--nnodes", "4", "--node_rank", "3")
    assert out == (f"+ {LAUNCH} --master 10.0.0.1:8090 --nnodes 4 --rank 3 --gpus 0 --host 10.0.0.2 "
                   f"--log_dir output/launch_log {ENTRY} --config {config} --output_dir output --device gpu\n")
    out = dry("run_cpu", {"MASTER": "10.0.0.1:8090", "NNODES": "2", "NPROC": "1", "CONFIG": str(config)})
    assert out == (f"+ {LAUNCH} --master 10.0.0.1:8090 --nnodes 2 --nproc_per_node 1 --log_dir output/launch_log "
                   f"{ENTRY} --config {config} --output_dir output --device cpu\n")


def test_loopback_master_warns_that_all_nodes_must_run_here(config):
    proc = run("run_cpu", {"DRY_RUN": "1", "PYTHON": "python3", "MASTER": "127.0.0.1:8090", "NNODES": "2",
                           "CONFIG": str(config)})
    assert proc.returncode == 0
    assert proc.stderr == ("run_cpu.sh: warning: MASTER='127.0.0.1:8090' is reachable from this machine only: all 2 "
                           "nodes must run here; on several machines use the master node's network IP\n")
    proc = run("run_cpu", {"DRY_RUN": "1", "PYTHON": "python3", "MASTER": "localhost:8090", "NNODES": "1",
                           "CONFIG": str(config)})
    assert proc.returncode == 0 and proc.stderr == ""  # one node: nothing to reach


def test_thread_settings_per_node(config):
    """Without OMP_NUM_THREADS the script exports the per-node decision of ernie_mtl.dist.threads (cores
    divided among this node's processes) before the command; a value the user set is kept."""
    from ernie_mtl.dist.threads import cpu_budget

    cores = cpu_budget().cpus
    proc = run("run_cpu", {"DRY_RUN": "1", "PYTHON": "python3", "CONFIG": str(config), "OMP_NUM_THREADS": None,
                           "NPROC": "2"})
    assert proc.returncode == 0, proc.stderr
    first, command = proc.stdout.splitlines()
    n = max(1, cores // 2)
    assert first.startswith(f"+ export OMP_NUM_THREADS={n} MKL_NUM_THREADS={n} MKL_CBWR=AUTO,STRICT "
                            "ERNIE_MTL_THREADS_ORIGIN=")
    assert "/ 2 processes on this node" in first
    assert command.startswith(f"+ {LAUNCH} --nproc_per_node 2 ")
    proc = run("run_cpu", {"DRY_RUN": "1", "PYTHON": "python3", "CONFIG": str(config), "OMP_NUM_THREADS": "3"})
    assert proc.stdout.startswith(f"+ {LAUNCH} ")  # the user's value: nothing exported


def test_single_node_command(config):
    out = dry("run_single_node", {"GPUS": "0,1", "CONFIG": str(config)}, "--output_dir", "out/a")
    assert out == (f"+ {LAUNCH} --gpus 0,1 --log_dir out/a/launch_log {ENTRY} --config {config} "
                   "--output_dir out/a --device gpu\n")


def test_cpu_command_never_passes_devices(config):
    out = dry("run_cpu", {"CONFIG": str(config), "GPUS": "0,1"}, "--nproc_per_node", "4", "--max_steps", "2")
    assert out == (f"+ {LAUNCH} --nproc_per_node 4 --log_dir output/launch_log {ENTRY} --config {config} "
                   "--output_dir output --device cpu --max_steps 2\n")
    assert dry("run_cpu", {"CONFIG": str(config)}).startswith(f"+ {LAUNCH} --nproc_per_node 2 ")


def test_max_restarts_runs_the_launch_under_the_supervisor(config):
    out = dry("run_cpu", {"CONFIG": str(config), "MAX_RESTARTS": "3"}, "--max_steps", "2")
    assert out == (f"+ python3 -m ernie_mtl.dist.supervisor --max_restarts 3 -- {LAUNCH} --nproc_per_node 2 "
                   f"--log_dir output/launch_log {ENTRY} --config {config} --output_dir output --device cpu "
                   "--max_steps 2\n")
    assert dry("run_cpu", {"CONFIG": str(config), "MAX_RESTARTS": "0"}).startswith(f"+ {LAUNCH} ")


def test_a_python_script_is_launched_instead_of_the_command_line(tmp_path):
    """SCRIPT (--script): every rank runs the user's script (ernie_mtl.train / ernie_mtl.palm), with the
    arguments after the script options, no CONFIG needed and nothing of the CLI's added."""
    script = tmp_path / "train.py"
    script.write_text("")
    out = dry("run_cpu", {"SCRIPT": str(script), "MAX_RESTARTS": "2"}, "--nproc_per_node", "2", "--", "--lr", "1e-4")
    assert out == (f"+ python3 -m ernie_mtl.dist.supervisor --max_restarts 2 -- {LAUNCH} --nproc_per_node 2 "
                   f"--log_dir output/launch_log {script} --lr 1e-4\n")
    out = dry("run", {"MASTER": "10.0.0.1:8090", "NNODES": "2", "GPUS": "0,1"}, "--script", str(script),
              "--log_dir", "/shared/logs")
    assert out == f"+ {LAUNCH} --master 10.0.0.1:8090 --nnodes 2 --gpus 0,1 --log_dir /shared/logs {script}\n"


def test_default_interpreter(config):
    proc = run("run_cpu", {"DRY_RUN": "1", "CONFIG": str(config)})
    venv = ROOT / ".venv" / "bin" / "python"
    expected = str(venv) if os.access(venv, os.X_OK) else "python3"
    assert proc.stdout.startswith(f"+ {expected} -m paddle.distributed.launch ")


@pytest.mark.parametrize("name,env,args,message", [
    ("run", {"GPUS": "0"}, [], "run.sh: error: IPS and MASTER are unset or empty: set MASTER=host:port NNODES=N "
     "(or --master/--nnodes), the rendezvous server, or IPS=ip1,ip2,... (or --ips)"),
    ("run", {"IPS": "", "GPUS": "0"}, [], "run.sh: error: IPS and MASTER are unset or empty"),
    ("run", {"IPS": "10.0.0.1", "MASTER": "10.0.0.1:8090", "NNODES": "2", "GPUS": "0"}, [],
     "IPS='10.0.0.1' and MASTER='10.0.0.1:8090' are both set: use either MASTER=host:port NNODES=N"),
    ("run", {"MASTER": "10.0.0.1", "NNODES": "2", "GPUS": "0"}, [],
     "MASTER='10.0.0.1' is malformed: give host:port of the rendezvous server, the same on every node"),
    ("run", {"MASTER": "10.0.0.1:8090:1", "NNODES": "2", "GPUS": "0"}, [], "MASTER='10.0.0.1:8090:1' is malformed"),
    ("run", {"MASTER": "10.0.0.1:70000", "NNODES": "2", "GPUS": "0"}, [],
     "MASTER='10.0.0.1:70000': the port must be a number 1..65535, e.g. MASTER=10.0.0.1:8090"),
    ("run", {"MASTER": "10.0.0.1:8090", "GPUS": "0"}, [],
     "run.sh: error: NNODES is unset: with MASTER set NNODES (or --nnodes) to the number of nodes, e.g. NNODES=2"),
    ("run", {"MASTER": "10.0.0.1:8090", "NNODES": "0", "GPUS": "0"}, [], "NNODES='0' must be a positive integer"),
    ("run", {"MASTER": "10.0.0.1:8090", "NNODES": "2", "NODE_RANK": "2", "GPUS": "0"}, [],
     "NODE_RANK='2' must be 0..1 (this node's place among NNODES=2), each node a different one"),
    ("run", {"MASTER": "10.0.0.1:8090", "NNODES": "2", "START_PORT": "6070", "GPUS": "0"}, [],
     "START_PORT='6070' applies to IPS mode only: with MASTER the launcher picks free ports; unset START_PORT"),
    ("run", {"IPS": "10.0.0.1", "NNODES": "2", "GPUS": "0"}, [], "NNODES='2' needs MASTER: set MASTER=host:port"),
    ("run_cpu", {"NODE_RANK": "0"}, [], "run_cpu.sh: error: NODE_RANK='0' needs MASTER"),
    ("run_cpu", {}, ["--master", "10.0.0.1:8090", "--nnodes", "two"], "run_cpu.sh: error: NNODES='two' must be"),
    ("run", {"IPS": "10.0.0.1,,10.0.0.2", "GPUS": "0"}, [], "IPS='10.0.0.1,,10.0.0.2' is malformed"),
    ("run", {"IPS": "10.0.0.1, 10.0.0.2", "GPUS": "0"}, [], "IPS='10.0.0.1, 10.0.0.2' is malformed"),
    ("run", {"IPS": "10.0.0.1,10.0.0.1", "GPUS": "0"}, [], "lists a node twice"),
    ("run", {"IPS": "127.0.0.1,10.0.0.2", "GPUS": "0"}, [], "127.0.0.1/localhost cannot be used with several nodes"),
    ("run", {"IPS": "10.0.0.1,10.0.0.2", "GPUS": "0", "HOST": "10.0.0.3"}, [],
     "HOST='10.0.0.3' is not one of IPS='10.0.0.1,10.0.0.2'"),
    ("run", {"IPS": "10.0.0.1", "GPUS": "0", "START_PORT": "70000"}, [],
     "START_PORT='70000': the port must be a number 1..65535, e.g. 6070"),
    ("run", {"IPS": "10.0.0.1"}, [], "run.sh: error: GPUS is unset or empty"),
    ("run", {"IPS": "10.0.0.1", "GPUS": "0;1"}, [], "GPUS='0;1' is malformed: give comma-separated GPU ids"),
    ("run_single_node", {"GPUS": "gpu0"}, [], "run_single_node.sh: error: GPUS='gpu0' is malformed"),
    ("run_single_node", {"GPUS": "0,1,"}, [], "GPUS='0,1,' is malformed"),
    ("run_single_node", {"GPUS": "1,1"}, [], "GPUS='1,1' lists a GPU twice"),
    ("run_single_node", {"GPUS": "0"}, ["--gpus"], "--gpus needs a value"),
    ("run_cpu", {"NPROC": "two"}, [], "run_cpu.sh: error: NPROC='two' must be a positive integer"),
    ("run_cpu", {"MAX_RESTARTS": "three"}, [], "run_cpu.sh: error: MAX_RESTARTS='three' must be a whole number"),
    ("run_cpu", {"CONFIG": ""}, [], "run_cpu.sh: error: CONFIG is unset or empty"),
    ("run_cpu", {"CONFIG": "/nonexistent/run.yaml"}, [], "CONFIG='/nonexistent/run.yaml': no such file"),
    ("run_cpu", {"SCRIPT": "/nonexistent/train.py", "CONFIG": ""}, [],
     "run_cpu.sh: error: SCRIPT='/nonexistent/train.py': no such file; give the Python script every rank runs"),
    ("run_cpu", {"SCRIPT": __file__}, [],
     "and SCRIPT='%s' are both set: SCRIPT reads its own configuration" % __file__),
    ("run_single_node", {"GPUS": "0", "CONFIG": "", "INPUT_DIR": "data/corpus"}, ["--script", __file__],
     "INPUT_DIR='data/corpus' applies to run_multitask_static.py, not to SCRIPT="),
])
def test_bad_input_is_refused(config, name, env, args, message):
    env = {"CONFIG": str(config), "PYTHON": "python3", **env}
    proc = run(name, env, *args)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert proc.stdout == ""  # no command printed, nothing launched


def test_an_empty_port_range_counts_as_unset(config, tmp_path):
    """PORT_RANGE= (empty) reached Paddle's launcher, which died on int(''): the script drops it."""
    fake = tmp_path / "python"  # reports what the launcher would see, runs nothing else
    fake.write_text('#!/bin/sh\nif [ "$2" = paddle.distributed.launch ]; then echo "launcher sees PORT_RANGE='
                    '${PORT_RANGE-unset}"; exit 0; fi\nexec python3 "$@"\n')
    fake.chmod(0o755)
    proc = run("run", {"CONFIG": str(config), "PYTHON": str(fake), "PORT_RANGE": "", "IPS": "10.0.0.1", "GPUS": "0"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "launcher sees PORT_RANGE=unset"


def test_missing_corpus_is_refused(tmp_path, config):
    no_input = tmp_path / "no_input.yaml"
    no_input.write_text("max_steps: 3\n")
    proc = run("run_cpu", {"CONFIG": str(no_input)})
    assert proc.returncode == 2 and "has no input_dir line; set INPUT_DIR (or --input_dir)" in proc.stderr
    proc = run("run_cpu", {"CONFIG": str(config), "INPUT_DIR": str(tmp_path / "missing")})
    assert proc.returncode == 2
    assert f"corpus '{tmp_path}/missing' is missing {tmp_path}/missing.bin" in proc.stderr
    (tmp_path / "data" / "corpus.idx").unlink()
    proc = run("run_single_node", {"CONFIG": str(config), "GPUS": "0"})
    assert proc.returncode == 2 and f"is missing {tmp_path}/data/corpus.idx" in proc.stderr


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_syntax_and_help(name):
    assert subprocess.run(["bash", "-n", str(SCRIPTS[name])], capture_output=True).returncode == 0
    proc = run(name, {}, "--help")
    assert proc.returncode == 0
    assert proc.stdout.startswith("Launch run_multitask_static.py ")
    assert f"bash scripts/{name}.sh" in proc.stdout


def test_sh_invocation_and_multitask_config_without_corpus(tmp_path):
    """`sh scripts/run.sh` (dash) re-runs itself under bash; a multi-task config (task_instance:)
    names its data in task files, so no corpus is required."""
    cfg = tmp_path / "global.yaml"
    cfg.write_text('task_instance: "a, b"\n')
    env = {"PATH": os.environ["PATH"], "HOME": "/tmp", "DRY_RUN": "1", "PYTHON": "python3", "IPS": "10.0.0.1,10.0.0.2",
           "GPUS": "0,1", "CONFIG": str(cfg), "OUTPUT_DIR": "/shared/run", "OMP_NUM_THREADS": "2"}
    proc = subprocess.run(["sh", str(SCRIPTS["run"]), "--max_steps", "5"], env=env, capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (f"+ {LAUNCH} --ips 10.0.0.1,10.0.0.2 --gpus 0,1 --log_dir /shared/run/launch_log {ENTRY} "
                           f"--config {cfg} --output_dir /shared/run --device gpu --max_steps 5\n")


def test_secret_looking_variables_stay_out_of_the_launchers_log_folder(tmp_path):
    """paddle.distributed.launch writes every process's whole environment into the log folder (envlog.N,
    backup_env.N.json, default.*.log): the script starts it without secret-looking names (KEEP_ENV passes one
    on), says which, and makes the folder private. A real one-process launch of a tiny script."""
    script = tmp_path / "hi.py"
    script.write_text("print('hi')\n")
    log_dir = tmp_path / "logs"
    proc = run("run_cpu", {"SCRIPT": str(script), "NPROC": "1", "LOG_DIR": str(log_dir), "MY_API_TOKEN": "hunter2",
                           "AWS_SECRET_ACCESS_KEY": "s3cr3t", "HF_TOKEN": "keepme", "KEEP_ENV": "HF_TOKEN",
                           "PADDLE_XCCL_BACKEND_KEY": "not-a-secret", "TOKENIZERS_PARALLELISM": "false"}, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "+ unset MY_API_TOKEN AWS_SECRET_ACCESS_KEY   # secret-looking names" in proc.stdout
    written = "".join(p.read_text(errors="replace") for p in log_dir.iterdir() if p.is_file())
    assert "envlog.0" in {p.name for p in log_dir.iterdir()}  # the launcher did write the environment...
    assert "hunter2" not in written and "s3cr3t" not in written  # ...without the secrets
    assert "keepme" in written and "not-a-secret" in written
    assert "TOKENIZERS_PARALLELISM=false" in written  # a tokenizer setting, not a token
    assert (log_dir.stat().st_mode & 0o077) == 0
