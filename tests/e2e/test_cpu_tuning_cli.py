"""The CPU tuning through the real CLI: a `--device cpu` run logs the oneDNN ops, the bias gradients by
matmul and the serial executor it runs with; `cpu_kernels: false` (here from a `--config` YAML, as
run-wide flags are accepted) and `FLAGS_new_executor_serial_run=0` give the programs and executor as
Paddle ships them, and the two runs' losses agree to float32 rounding (docs/performance.md, section 5)."""
import zlib  # noqa: F401  (before paddle)

import numpy as np

from helpers import metrics, ok, tiny_args, train

STEPS = 4


def log_line(proc, prefix):
    text = proc.stdout + proc.stderr
    return next((line[line.index(prefix):] for line in text.splitlines() if prefix in line), None)


def test_a_cpu_run_is_tuned_and_cpu_kernels_false_runs_as_built(demo, tmp_path):
    flags = dict(max_steps=STEPS, micro_batch_size=4, logging_freq=1, eval_freq=1000, checkpoint_steps=1000,
                 save_steps=1000)
    tuned = ok(train(tiny_args(demo, tmp_path / "tuned", **flags), cwd=tmp_path))
    line = log_line(tuned, "CPU kernels:")
    assert line and "oneDNN kernels on" in line and "16 bias gradients by matmul" in line, line
    assert "serial executor (FLAGS_new_executor_serial_run=1)" in line, line

    (tmp_path / "plain.yaml").write_text("cpu_kernels: false\n")
    plain = ok(train(tiny_args(demo, tmp_path / "plain", config=tmp_path / "plain.yaml", **flags), cwd=tmp_path,
                     env={"FLAGS_new_executor_serial_run": "0"}))
    line = log_line(plain, "CPU kernels:")
    assert line == "CPU kernels: as built (--cpu_kernels false); threaded executor", line

    a, b = metrics(tmp_path / "tuned", "train/loss"), metrics(tmp_path / "plain", "train/loss")
    assert sorted(a) == sorted(b) == list(range(1, STEPS + 1))
    np.testing.assert_allclose([a[s] for s in sorted(a)], [b[s] for s in sorted(b)], rtol=1e-5)
