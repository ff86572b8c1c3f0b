"""Values that used to be accepted silently (or to fail later with a traceback) are refused by the parser,
in-process, with one message naming the flag, the value and the fix; the Python API refuses what is not a
configuration with a typed error."""
import zlib  # noqa: F401  (before paddle)

import pytest

from ernie_mtl.config import ConfigError
from ernie_mtl.engine.validate import parse
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
