"""Values that used to be accepted silently (or to fail later with a traceback) are refused by the parser,
in-process, with one message naming the flag, the value and the fix; the Python API refuses what is not a
configuration with a typed error."""
import zlib  # noqa: F401  (before paddle)

import pytest

from ernie_mtl.config import ConfigError
from ernie_mtl.engine.config_checks import parse
from helpers import tiny_args


def refused(demo, tmp_path, *flags):
    with pytest.raises(ConfigError) as e:
        parse(tiny_args(demo, tmp_path / "out") + [str(f) for f in flags])
    return str(e.value)


@pytest.mark.parametrize("value,message", [
    ("", "--preempt_signals '' is empty: give signal names (TERM, USR1, USR2, INT, HUP), or none"),
    ("TERM,none", "--preempt_signals 'TERM,none': none cannot be combined with signal names"),
    ("TERM,,USR1", "--preempt_signals 'TERM,,USR1' has an empty item"),
    ("KILL", "--preempt_signals 'KILL': ['KILL'] not among"),
])
def test_preempt_signals_that_meant_something_else_are_refused(demo, tmp_path, value, message):
    assert message in refused(demo, tmp_path, "--preempt_signals", value)


def test_preempt_signals_none_and_names_are_accepted(demo, tmp_path):
    from ernie_mtl.dist.preemption import parse_signals

    assert parse(tiny_args(demo, tmp_path / "out") + ["--preempt_signals", "none"]).train.preempt_signals == "none"
    assert parse_signals("none") == () and parse_signals("sigterm, USR1") == ("TERM", "USR1")


def test_a_worker_count_no_machine_has_is_refused(demo, tmp_path):
    assert "--num_workers 100000: at most 64 data-loading processes per rank" in refused(
        demo, tmp_path, "--num_workers", "100000")


def test_an_op_type_paddle_does_not_have_is_refused_with_the_nearest_one(demo, tmp_path):
    message = refused(demo, tmp_path, "--cpu_kernels", "matmul_v3")
    assert "--cpu_kernels matmul_v3: 'matmul_v3' is not an op type of Paddle 2.6" in message
    assert "(did you mean 'matmul_v2'?)" in message
    ok = parse(tiny_args(demo, tmp_path / "out") + ["--cpu_kernels", "matmul_v2,matmul_v2_grad,softmax"])
    assert ok.train.cpu_kernels == "matmul_v2,matmul_v2_grad,softmax"


def test_a_listed_op_type_the_program_does_not_run_is_said(build_programs):
    from ernie_mtl.config import ModelConfig, OptimConfig
    from ernie_mtl.program.cpu_kernels import tune_for_cpu

    p = build_programs(model=ModelConfig(model_name_or_path="ernie-tiny-test"), optim=OptimConfig(max_steps=10))
    line = tune_for_cpu(p.main, onednn_types=["matmul_v2", "conv2d"], bias_grads=False)
    assert "no op of this program has the type conv2d" in line and "(matmul_v2)" in line


def test_the_api_refuses_what_is_not_a_configuration_and_takes_config_by_keyword(demo, tmp_path):
    import ernie_mtl

    for bad, words in ((42, "the configuration 42 (int) is none of what train/plan/prebuild take"),
                       (3.5, "(float) is none of"),
                       ([{"a": 1}], "must hold command-line arguments (strings), not dict")):
        with pytest.raises(ernie_mtl.ConfigError, match=r".*") as e:
            ernie_mtl.load_config(bad)
        assert words in str(e.value)
    argv = tiny_args(demo, tmp_path / "out")
    mapping = {argv[i][2:]: argv[i + 1] for i in range(0, len(argv), 2)}
    cfg = ernie_mtl.load_config(config=mapping, max_steps=7)  # used to be read as a YAML path
    assert cfg.optim.max_steps == 7 and cfg.train.output_dir == str(tmp_path / "out")
    with pytest.raises(ernie_mtl.ConfigError, match="given twice"):
        ernie_mtl.load_config(mapping, config=mapping)


def test_a_truncated_ernie_parameter_file_is_refused_not_zero_filled(tmp_path):
    """Paddle's loader fills the missing bytes of a truncated tensor file with zeros; the directory
    reader checks each file's size against its header first."""
    import numpy as np

    from ernie_mtl.program.static_params import read_static_params, write_static_params

    params = write_static_params(tmp_path / "params", {"word_embedding": np.ones((6, 4), np.float32),
                                                        "pooled_fc.b_0": np.ones(4, np.float32)})
    assert set(read_static_params(params)) == {"word_embedding", "pooled_fc.b_0"}
    data = (params / "word_embedding").read_bytes()
    (params / "word_embedding").write_bytes(data[:-8])
    with pytest.raises(ConfigError) as e:
        read_static_params(params)
    assert f"{params / 'word_embedding'}: it is truncated: {len(data) - 8} bytes, its header declares a [6, 4] " \
           f"tensor that needs {len(data)}" in str(e.value)
    (params / "word_embedding").write_bytes(data + b"\0" * 4)
    with pytest.raises(ConfigError, match="not a Paddle parameter file \\(4 bytes after the \\[6, 4\\] tensor"):
        read_static_params(params)
    (params / "word_embedding").write_bytes(b"garbage!" * 3)
    with pytest.raises(ConfigError, match="header"):
        read_static_params(params)


def _fifo(path):
    import os

    os.mkfifo(path)
    return path


def test_special_or_oversized_configuration_files_are_refused_without_blocking(demo, tmp_path):
    """A FIFO where a YAML or the vocab should be used to block the start-up forever (open() waits for a
    writer); a configuration nested deeper than Python's parser goes raised RecursionError."""
    message = refused(demo, tmp_path, "--config", _fifo(tmp_path / "run.yaml"))
    assert f"--config {tmp_path / 'run.yaml'}: config {tmp_path / 'run.yaml'} is a FIFO (named pipe), not a regular " \
           "file; give a YAML file" in message
    (tmp_path / "deep.yaml").write_text("a: " + "[" * 50_000 + "]" * 50_000 + "\n")
    assert "nests too deeply to be read" in refused(demo, tmp_path, "--config", tmp_path / "deep.yaml")
    vocab = _fifo(tmp_path / "vocab.txt")
    message = refused(demo, tmp_path, "--tokenizer_name_or_path", vocab)
    assert f"--tokenizer_name_or_path vocab file {vocab} is a FIFO (named pipe), not a regular file" in message


@pytest.mark.parametrize("argv,words", [
    (["--backoff", "nan", "--", "true"], "--backoff nan must be a finite number >= 0"),
    (["--backoff", "inf", "--", "true"], "--backoff inf must be a finite number >= 0"),
    (["--max_backoff", "-1", "--", "true"], "--max_backoff -1.0 must be a finite number >= 0"),
    (["--", "/no/such/program", "--flag"], "the command '/no/such/program' is not found"),
    (["--max_restarts", "1"], "give the command after --"),
])
def test_the_supervisor_refuses_what_it_cannot_run_with_one_line(argv, words, capsys):
    """A missing command, --backoff nan or inf ended in tracebacks (or a restart loop that never sleeps)."""
    from ernie_mtl.dist.supervisor import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


def test_a_paddle_outside_the_supported_range_is_refused_up_front(tmp_path):
    """Paddle 3.3.1 (the newest on PyPI) failed deep inside Paddle or segfaulted in the converter. The check
    is a pure function of the version string; the entry points run it first (here with the version of the
    imported paddle replaced, since only 2.6.2 is installed)."""
    import subprocess
    import sys

    from ernie_mtl.dist.compat import paddle_version_problem
    from helpers import ROOT

    assert paddle_version_problem("2.6.2") is None and paddle_version_problem("2.6.0") is None
    for version in ("3.3.1", "3.0.0b2", "2.5.2", "0.0.0"):
        problem = paddle_version_problem(version)
        assert f"ernie-mtl runs on PaddlePaddle 2.6.x (2.6.2 is tested); this environment has paddlepaddle {version}" \
               in problem and "pip install 'paddlepaddle==2.6.2'" in problem
    assert "builds static programs in PIR" in paddle_version_problem("3.3.1")
    code = ("import zlib, sys, paddle\npaddle.__version__ = '3.3.1'\n"
            "from ernie_mtl.main import main\nsys.exit(main(['--device', 'cpu', '--dry_run']))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "run_multitask_static.py: error: ernie-mtl runs on PaddlePaddle 2.6.x" in proc.stderr
    code = ("import zlib, paddle\npaddle.__version__ = '3.3.1'\nimport ernie_mtl\n"
            "try:\n    ernie_mtl.load_config({})\nexcept ernie_mtl.ConfigError as e:\n    print('ConfigError:', e)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                         env={**__import__("os").environ, "PYTHONPATH": str(ROOT)}).stdout
    assert out.startswith("ConfigError: ernie-mtl runs on PaddlePaddle 2.6.x"), out


def test_the_dry_run_counts_the_newer_collective_op_names_too():
    """A Paddle 3 program holds `all_reduce`-style ops (in PIR as pd_op.all_reduce) where 2.6 writes
    c_allreduce_sum: the dry run reported "collectives: none" for a program full of them."""
    from ernie_mtl.planning.dryrun import collective_type

    assert collective_type("c_allreduce_sum") == "c_allreduce_sum"
    assert collective_type("pd_op.all_reduce") == "all_reduce" and collective_type("reduce_scatter") == "reduce_scatter"
    assert collective_type("pd_op.c_broadcast") == "c_broadcast" and collective_type("send_v2") == "send_v2"
    for not_one in ("c_gen_nccl_id", "c_comm_init", "c_sync_calc_stream", "matmul_v2", "pd_op.matmul", "cast"):
        assert collective_type(not_one) is None, not_one


@pytest.mark.slow
def test_the_gpu_dry_run_prints_only_its_own_lines(demo, tmp_path):
    """Paddle's recompute-segment and AMP cast INFO lines were most of a GPU dry run's console; they stay
    for --log_level debug only (the real command: the framework's loggers are quieted by its entry point)."""
    import os
    import subprocess
    import sys

    from helpers import ENTRY, ROOT

    argv = tiny_args(demo, tmp_path / "dry") + ["--device", "gpu", "--dry_run", "--use_recompute", "--use_amp",
                                                "--use_sharding", "--sharding_degree", "4", "--micro_batch_size", "4",
                                                "--global_batch_size", "64", "--max_steps", "10"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PADDLE_TRAINERS_NUM": "8"}
    quiet, debug = (subprocess.run([sys.executable, ENTRY] + argv + extra, cwd=tmp_path, capture_output=True,
                                   text=True, env=env) for extra in ([], ["--log_level", "debug"]))
    assert quiet.returncode == 0 and "collectives per ring (training program):" in quiet.stdout, quiet.stderr[-2000:]
    assert "INFO" not in quiet.stdout + quiet.stderr and "recompute segment" not in quiet.stdout + quiet.stderr
    assert "recompute segment" in debug.stdout + debug.stderr  # the lines are Paddle's, kept for debugging
