"""A quiet console: during a run, every line the user reads is ours -- a timestamped `[rank N]` log
line or a table we print -- and none of the framework's chatter (glog `I...` lines, fleet's INFO
lines and meta-optimizer prints, Paddle's OMP_NUM_THREADS warning, the distutils warning), which
`--log_level debug` brings back. Output that is not a terminal (a log file) gets no progress bars."""
import zlib  # noqa: F401  (before paddle)

import re

import pytest

from helpers import global_yaml, ok, run_cli

OURS = re.compile(r"^\d\d:\d\d:\d\d \[rank \d+\] ")
# the continuation lines of our multi-line records: the task schedule table
TABLE = re.compile(r"^(task +role +p_i .*|\S+ +(target|aux) +\d\.\d{4} .*|optimizer steps: \d+ .*)$")
CHATTER = ("valid_optimizer_list", "meta_optimizer=", "graph_optimizer", "OMP_NUM_THREADS set to",
           "distutils", "distributed strategy initialized", "It is recommended to use DistributedStrategy")


def foreign_lines(text):
    """Lines that are neither our log lines nor continuation lines of our tables."""
    return [line for line in text.splitlines() if line.strip() and not OURS.match(line) and not TABLE.match(line)]


@pytest.mark.slow
def test_every_console_line_of_a_run_is_ours_and_debug_brings_the_framework_back(data, tmp_path):
    cfg = global_yaml(data, "quiet.yaml", save_path=str(tmp_path / "run"), num_epochs=1, eval_freq=20)
    proc = ok(run_cli(["--config", cfg], cwd=tmp_path))
    text = proc.stdout + proc.stderr
    assert foreign_lines(text) == []
    assert "\r" not in text  # no progress bar redrawn into a captured stream
    assert sum(bool(OURS.match(line)) for line in text.splitlines()) > 10  # it did log
    loud = ok(run_cli(["--config", cfg, "--log_level", "debug", "--resume", "none", "--overwrite_output_dir"],
                      cwd=tmp_path))
    noise = foreign_lines(loud.stdout + loud.stderr)
    assert any(marker in line for line in noise for marker in CHATTER), noise[:5]  # negative control


def test_a_bad_log_level_is_refused(data, tmp_path):
    proc = run_cli(["--config", global_yaml(data, "badlog.yaml", save_path=str(tmp_path / "run")),
                    "--log_level", "verbose"], cwd=tmp_path)
    assert proc.returncode == 2
    assert "--log_level 'verbose' is not supported; use one of ['info', 'debug']" in proc.stderr
