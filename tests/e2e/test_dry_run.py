"""`--dry_run` through the real command line: a GPU job planned on this CPU build (rank 0's GPU
program built, never run, and described next to today's arithmetic plan), and `--device gpu`
refused without `--dry_run` (the message names it)."""
import zlib  # noqa: F401  (before paddle)

import re

import pytest

from helpers import ok, run_cli, tiny_args


def cpu_build() -> bool:
    from paddle.base import core

    return not core.is_compiled_with_cuda()


needs_cpu_build = pytest.mark.skipif(not cpu_build(), reason="checks what a CPU build of paddle does with --device gpu")

# 4 GPUs = sharding 2 x dp 2, AMP O1, global batch 32 = micro batch 2 x 4 ranks x 4 accumulation steps
GPU_JOB = dict(use_amp="true", use_sharding="true", sharding_degree=2, micro_batch_size=2, global_batch_size=32,
               max_steps=20)
FOUR = {"PADDLE_TRAINERS_NUM": "4"}


def line_with(text: str, *parts: str) -> str:
    found = [line for line in text.splitlines() if all(p in line for p in parts)]
    assert len(found) == 1, (parts, text[-3000:])
    return found[0]


@needs_cpu_build
def test_a_gpu_job_is_planned_on_a_cpu_build_with_its_gpu_program(demo, tmp_path):
    out = tmp_path / "out"
    proc = ok(run_cli(tiny_args(demo, out, device="gpu", dry_run="true", **GPU_JOB), cwd=tmp_path, env=FOUR))
    text = proc.stdout
    # today's plan is kept
    assert "world size 4 = dp 2 x sharding 2" in text
    assert "global batch 32 = micro batch 2 x data-parallel world 4 x accumulate steps 4" in text
    assert "== memory per rank ==" in text and "== data ==" in text
    # and rank 0's GPU program is described
    assert "== GPU program (rank 0 of 4" in text
    amp = re.search(r"^amp float16 O1: (\d+) cast ops \((\d+) to float16, (\d+) back from it", text, re.M)
    assert amp and int(amp.group(2)) > 0 and int(amp.group(3)) > 0, text[-3000:]
    sharding = line_with(text, "rank 0's sharding group")
    assert sharding.startswith("  ring 1 (ranks 0,1:")
    assert int(re.search(r"c_broadcast (\d+)", sharding).group(1)) > 0
    assert int(re.search(r"c_reduce_sum (\d+)", sharding).group(1)) > 0
    dp = line_with(text, "rank 0's data-parallel group")
    assert dp.startswith("  ring 2 (ranks 0,2:") and int(re.search(r"c_allreduce_sum (\d+)", dp).group(1)) > 0
    assert "gradient merge: 1 conditional_block (the update runs once every 4 micro-batches)" in text
    kept = re.search(r"persistable tensors of rank 0's training program: ([\d.]+) MiB \(the memory table's "
                     r"persistent row, for the most loaded rank: ([\d.]+) MiB\)", text)
    assert kept and abs(float(kept.group(1)) - float(kept.group(2))) <= 0.1, text[-2000:]
    assert not out.exists()  # a plan: nothing written
    # the same job on CPU ranks: the same arithmetic, no GPU program
    cpu = ok(run_cli(tiny_args(demo, out, dry_run="true", **GPU_JOB), cwd=tmp_path, env=FOUR))
    assert "== GPU program" not in cpu.stdout
    assert cpu.stdout.split("== data ==")[0] == text.split("== data ==")[0]


@needs_cpu_build
def test_device_gpu_without_dry_run_is_refused_and_points_to_dry_run(demo, tmp_path):
    out = tmp_path / "out"
    proc = run_cli(tiny_args(demo, out, device="gpu", **GPU_JOB), cwd=tmp_path, env=FOUR)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "--device gpu but this paddle is a CPU build" in proc.stderr
    assert "--dry_run to plan the GPU job on this machine" in proc.stderr
    assert not out.exists()
