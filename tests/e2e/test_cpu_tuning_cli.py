"""The CPU kernel choice through the real CLI: a `--device cpu` run (`--cpu_kernels auto`, the default)
times the candidate kernels or reads the kernel cache, logs what it chose with the measured rates, and
records it in its checkpoints; `cpu_kernels: false` (here from a `--config` YAML, the old boolean) and
`FLAGS_new_executor_serial_run=0` give the programs and executor as Paddle ships them, within float32
rounding of the tuned run (docs/performance.md); a resumed run keeps the kernels its checkpoint recorded,
says so, and ends bitwise equal to the uninterrupted run.

Which kernels are faster on this machine is never asserted: the resume case records a choice `auto` can
never make (softmax is not an auto candidate), so it differs from this machine's on any CPU."""
import zlib  # noqa: F401  (before paddle)

import json
import os
import signal
from pathlib import Path

import numpy as np

from helpers import metrics, ok, rehash_checkpoint, state, tiny_args
from helpers import run_cli as train  # the executor and threads a process sets up are what it checks

STEPS = 4


def log_line(proc, prefix):
    text = proc.stdout + proc.stderr
    return next((line[line.index(prefix):] for line in text.splitlines() if prefix in line), None)


def test_a_cpu_run_chooses_logs_and_records_its_kernels_and_plain_runs_as_built(demo, tmp_path):
    flags = dict(max_steps=STEPS, micro_batch_size=4, logging_freq=1, eval_freq=1000, checkpoint_steps=STEPS,
                 save_steps=1000)
    tuned = ok(train(tiny_args(demo, tmp_path / "tuned", **flags), cwd=tmp_path))
    line = log_line(tuned, "CPU kernels:")
    assert line and line.startswith("CPU kernels: --cpu_kernels auto, "), line
    assert ("measured in" in line or "from the kernel cache" in line) and "oneDNN vs plain: " in line, line
    assert "matmul_v2 " in line and "GFLOP/s" in line and "16 bias gradients by matmul" in line, line
    assert "serial executor (FLAGS_new_executor_serial_run=1)" in line, line
    record = json.loads((tmp_path / "tuned/model_last/train_state.json").read_text())["extra"]["cpu_kernels"]
    assert record["mode"] == "auto" and record["bias_grads"] is True and "matmul_v2" in record["timings"]
    assert set(record["onednn"]) <= {"matmul_v2", "matmul_v2_grad", "elementwise_add", "scale", "sum", "transpose2",
                                     "transpose2_grad"}
    assert record["machine"]["cpu"] and record["machine"]["paddle"] and "threads" not in record["machine"]
    cache = Path(os.environ["XDG_CACHE_HOME"]) / "ernie_mtl" / "cpu_kernels.json"  # tests/conftest.py points it here
    assert json.loads(cache.read_text())["machines"]

    (tmp_path / "plain.yaml").write_text("cpu_kernels: false\n")
    plain = ok(train(tiny_args(demo, tmp_path / "plain", config=tmp_path / "plain.yaml", **flags), cwd=tmp_path,
                     env={"FLAGS_new_executor_serial_run": "0"}))
    line = log_line(plain, "CPU kernels:")
    assert line == "CPU kernels: as built (--cpu_kernels plain); threaded executor", line

    a, b = metrics(tmp_path / "tuned", "train/loss"), metrics(tmp_path / "plain", "train/loss")
    assert sorted(a) == sorted(b) == list(range(1, STEPS + 1))
    np.testing.assert_allclose([a[s] for s in sorted(a)], [b[s] for s in sorted(b)], rtol=1e-5)


def test_a_resumed_run_keeps_the_recorded_kernels_and_ends_bitwise_equal(demo, tmp_path):
    from ernie_mtl.checkpoint.store import CheckpointRef
    from ernie_mtl.engine.session import recorded_kernels

    listed = "matmul_v2,matmul_v2_grad,softmax"
    common = dict(micro_batch_size=4, max_steps=STEPS, max_lr=5e-3, min_lr=1e-4, warmup_rate=0.25, logging_freq=1,
                  eval_freq=1000, checkpoint_steps=2, save_steps=1000)
    ok(train(tiny_args(demo, tmp_path / "straight", cpu_kernels=listed, **common), cwd=tmp_path))
    killed = train(tiny_args(demo, tmp_path / "resumed", cpu_kernels=listed, **common), cwd=tmp_path,
                   env={"ERNIE_MTL_TEST_KILL_AT_STEP": "2"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    resumed = ok(train(tiny_args(demo, tmp_path / "resumed", cpu_kernels="auto", **common), cwd=tmp_path))
    text = resumed.stdout + resumed.stderr
    assert ("CPU kernels: resuming with the checkpoint's recorded kernels (oneDNN on matmul_v2, matmul_v2_grad, "
            "softmax, bias gradients by matmul on") in text, text[-3000:]
    assert "this machine would choose" in text
    line = log_line(resumed, "CPU kernels: recorded in the checkpoint: oneDNN on matmul_v2, matmul_v2_grad, softmax;")
    assert line and "(matmul_v2, matmul_v2_grad, softmax); 16 bias gradients by matmul" in line, text[-3000:]
    for tag in ("train/loss", "train/lr"):
        assert metrics(tmp_path / "straight", tag) == metrics(tmp_path / "resumed", tag), tag  # bitwise
    a, b = (state(tmp_path / f"{side}/model_last/state/rank_0") for side in ("straight", "resumed"))
    assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)
    record = json.loads((tmp_path / "resumed/model_last/train_state.json").read_text())["extra"]["cpu_kernels"]
    assert record["onednn"] == ["matmul_v2", "matmul_v2_grad", "softmax"]  # the next resume keeps them too

    # a checkpoint written before kernels were recorded: its boolean says what ran (true: the exact list)
    path = tmp_path / "resumed/model_last"
    raw = json.loads((path / "train_state.json").read_text())
    del raw["extra"]["cpu_kernels"]
    raw["config"]["train"]["cpu_kernels"] = True
    (path / "train_state.json").write_text(json.dumps(raw))
    rehash_checkpoint(path)
    legacy = recorded_kernels(CheckpointRef(path, raw["step"]))
    assert legacy.mode == "exact" and legacy.bias_grads and "transpose2" in legacy.onednn
