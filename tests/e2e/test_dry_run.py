"""`--dry_run` through the real command line: a GPU job planned on this CPU build (rank 0's GPU
program built, never run, and described next to today's arithmetic plan), `--device gpu` refused
without `--dry_run` (the message names it), and the plan's warnings -- a corpus read more than
REPEAT_WARN_EPOCHS times, a task smaller than one global batch -- with their numbers, in the dry
run and in a real run's start-up log, and silent for a sensible plan."""
import zlib  # noqa: F401  (before paddle)

import re

import pytest

from helpers import VOCAB, global_yaml, ok, run_here, tiny_args


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


def number(text: str) -> float:
    return float(text.replace(",", ""))


@needs_cpu_build
def test_a_gpu_job_is_planned_on_a_cpu_build_with_its_gpu_program(demo, tmp_path):
    out = tmp_path / "out"
    proc = ok(run_here(tiny_args(demo, out, device="gpu", dry_run="true", **GPU_JOB), cwd=tmp_path, env=FOUR))
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
    cpu = ok(run_here(tiny_args(demo, out, dry_run="true", **GPU_JOB), cwd=tmp_path, env=FOUR))
    assert "== GPU program" not in cpu.stdout
    assert cpu.stdout.split("== data ==")[0] == text.split("== data ==")[0]


@needs_cpu_build
def test_device_gpu_without_dry_run_is_refused_and_points_to_dry_run(demo, tmp_path):
    out = tmp_path / "out"
    proc = run_here(tiny_args(demo, out, device="gpu", **GPU_JOB), cwd=tmp_path, env=FOUR)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "--device gpu but this paddle is a CPU build" in proc.stderr
    assert "--dry_run to plan the GPU job on this machine" in proc.stderr
    assert not out.exists()


def test_the_plan_warns_when_a_corpus_repeats_or_is_smaller_than_a_global_batch(demo, tmp_path):
    out = tmp_path / "out"
    # 20,000 steps of 4 samples = 80,000 samples of the demo corpus's train split
    text = ok(run_here(tiny_args(demo, out, dry_run="true", micro_batch_size=4, max_steps=20_000),
                      cwd=tmp_path)).stdout
    data = re.search(r"train: [\d,]+ docs, ([\d,]+) samples planned \(([\d.]+) epochs\)", text)
    warning = re.search(r"^warning: --input_dir: the plan reads corpus 'corpus' ([\d,.]+) times \(([\d,]+) train "
                        r"samples planned, ([\d,]+) per epoch\), more than 10 epochs.*--max_steps ([\d,]+) reads it "
                        r"10 times$", text, re.M)
    assert data and warning, text[-3000:]
    planned, per_epoch = number(warning.group(2)), number(warning.group(3))
    assert planned == number(data.group(1)) == 80_000
    assert number(warning.group(1)) == number(data.group(2)) == round(planned / per_epoch, 2) > 10
    assert number(warning.group(4)) == int(20_000 * 10 / (planned / per_epoch))
    assert "fewer than one global batch" not in text
    # one step of a global batch larger than an epoch of the corpus: the other warning, alone
    big = ok(run_here(tiny_args(demo, out, dry_run="true", micro_batch_size=4, global_batch_size=4096, max_steps=1),
                     cwd=tmp_path)).stdout
    small = line_with(big, "warning:")
    assert re.fullmatch(rf"warning: --input_dir: its train split gives {per_epoch:,.0f} samples per epoch, fewer than "
                        r"one global batch \(4,096\): .* --global_batch_size", small), small
    # a sensible plan: no warning
    fine = ok(run_here(tiny_args(demo, out, dry_run="true", micro_batch_size=4, max_steps=20), cwd=tmp_path)).stdout
    assert "warning" not in fine and "== warnings ==" not in fine
    assert not out.exists()


def test_a_multitask_plan_warns_about_a_task_smaller_than_a_global_batch(data, tmp_path):
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    rows = (data / "cls_train.tsv").read_text(encoding="utf-8").splitlines()
    (tmp_path / "tiny_train.tsv").write_text("\n".join(rows[:11]) + "\n", encoding="utf-8")  # header + 10 rows
    (tasks / "tiny.yaml").write_text(f"reader: cls\nparadigm: cls\ntrain_file: {tmp_path / 'tiny_train.tsv'}\n"
                                     "n_classes: 2\n")
    (tasks / "sentiment.yaml").write_text(f"reader: cls\nparadigm: cls\ntrain_file: {data / 'cls_train.tsv'}\n"
                                          "n_classes: 2\n")
    # 2 ranks, batch_size 8, global batch 32: one global batch of a task is 8 x 2 x 2 = 32 examples
    cfg = global_yaml(data, "g_dry_run_tiny.yaml", task_instance="sentiment, tiny", target_tag="1, 0",
                      mix_ratio="1.0, 1.0", task_dir=str(tasks), save_path=str(tmp_path / "run"), micro_batch_size=8,
                      global_batch_size=32, num_epochs=3)
    text = ok(run_here(["--config", cfg, "--dry_run"], cwd=tmp_path, env={"PADDLE_TRAINERS_NUM": "2"})).stdout
    assert line_with(text, "warning: task tiny: its train data") == (
        "warning: task tiny: its train data has 10 examples, fewer than one global batch of the task (8 per rank x 2 "
        "data-parallel ranks x 2 micro-batches per step = 32): a step that draws only this task reads examples more "
        "than once. Give it more data or a smaller batch_size")
    # the auxiliary task is also read far more than 10 times: the same numbers as the schedule table
    row = line_with(text, "tiny ", " aux ").split()
    repeat = re.search(r"^warning: task tiny \(auxiliary\): the plan reads its 10 training examples ([\d,.]+) times "
                       r"\(([\d,]+) micro-batches of 8\)", text, re.M)
    assert repeat, text[-3000:]
    assert (number(repeat.group(2)), number(repeat.group(1))) == (number(row[4]), number(row[6]))
    assert number(row[6]) > 10
    assert "sentiment" not in "".join(line for line in text.splitlines() if line.startswith("warning"))
    # the usual three tasks for 3 epochs: no warning
    sensible = global_yaml(data, "g_dry_run_fine.yaml", save_path=str(tmp_path / "run"), micro_batch_size=8,
                           global_batch_size=32, num_epochs=3)
    fine = ok(run_here(["--config", sensible, "--dry_run"], cwd=tmp_path, env={"PADDLE_TRAINERS_NUM": "2"})).stdout
    assert "task schedule" in fine and "warning" not in fine
    assert not (tmp_path / "run").exists()


def test_a_run_logs_the_plan_warnings_at_start(data, tmp_path):
    """The trainer plans with the same code: a tiny corpus read 15 times logs both warnings (and trains)."""
    out = tmp_path / "run"
    argv = ["--device", "cpu", "--model_name_or_path", "ernie-tiny-test", "--vocab_size", len(VOCAB),
            "--max_seq_len", 32, "--num_workers", 0, "--split", "80,10,10", "--input_dir", data / "corpus",
            "--tokenizer_name_or_path", data / "vocab.txt", "--data_cache", tmp_path / "cache", "--output_dir", out,
            "--micro_batch_size", 16, "--global_batch_size", 64, "--max_steps", 8, "--eval_iters", 1]
    proc = ok(run_here(argv, cwd=tmp_path))
    log = proc.stdout + proc.stderr
    repeat = re.search(r"warning: --input_dir: the plan reads corpus 'corpus' ([\d,.]+) times \(512 train samples "
                       r"planned, (\d+) per epoch\)", log)
    assert repeat and number(repeat.group(1)) == round(512 / int(repeat.group(2)), 2) > 10, log[-3000:]
    assert f"its train split gives {repeat.group(2)} samples per epoch, fewer than one global batch (64)" in log
    assert (out / "model_last" / "train_state.json").is_file()  # warnings, not errors
