"""Hostile but realistic input against every entry point: each case runs its command in a fresh copy
of a prepared workspace and asserts exit status 2, one message naming the culprit (file, line, flag or
key) and none of the fragments that would name a wrong cause (ABSENT), no traceback, that every file
that existed before is byte-identical afterwards (no checkpoint, corpus or vocabulary is ever damaged
by a refused run), and that the run's folders (WATCHED) gained no file (no VisualDL record, no
checkpoint, no half-trained output).

Where a case runs. Most run in this process, through the function the command runs once its
process is set up (`ernie_mtl.main.run_command`, the data tools', converter's and resharder's `main`),
so the same parsing, checks and error reporting (`data_tools.cli_utils.run_cli`) decide: the
refusals the parser decides (flags, config and task files, vocabularies, corpora named), which must
come before any engine function runs (a case not in ENGINE that reaches the engine fails), and those
that need the engine (ENGINE: checkpoints found damaged when a run opens, data read when a run
plans, warm starts, prediction and evaluation). The launch scripts, the cases that need a process of
their own (a file-size limit, Paddle Inference) and a sample of the others (END_TO_END) run the real
command in a fresh process, for the path from the command line to the message.

Workspace (built once): a vocab, a tokenized corpus, classification and MRC task files, a trained
flag-mode run with checkpoints model_3, model_6 and model_last (step 6), and a multi-task run with
an exported `topic` model and its best_topic checkpoint. The checkpoints record the workspace's
absolute data paths, which resume compares: cases that edit a checkpoint and must reach the resume
itself pass those paths (`run_data`). A full disk is simulated without root by a file-size limit
(RLIMIT_FSIZE, SIGXFSZ ignored: writes past it fail with EFBIG as they fail with ENOSPC); launch
script cases use DRY_RUN=1 (the checks come before the command is printed).
"""
import zlib  # noqa: F401  (before paddle)

import contextlib
import importlib
import io
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN = [sys.executable, str(ROOT / "run_multitask_static.py")]
S2D = [sys.executable, str(ROOT / "static_to_dynamic.py")]
SPECIALS = ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"]
CHARS = list("的了是在我有他这中大国人民日天北上东西南家们主本下京海方边好坏")


def dt(module):
    return [sys.executable, "-m", f"data_tools.{module}"]


def sh(cmd, cwd, *, limit=None, env=None, timeout=300):
    def preexec():
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    return subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          preexec_fn=preexec, env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
                                                   **(env or {})})


# -- the workspace ----------------------------------------------------------------------------------------
FLAG = ["--device", "cpu", "--model_name_or_path", "ernie-tiny-test", "--vocab_size", str(len(SPECIALS) + len(CHARS)),
        "--tokenizer_name_or_path", "vocab.txt", "--input_dir", "corpus", "--split", "80,10,10", "--max_seq_len", "32",
        "--micro_batch_size", "4", "--max_steps", "6", "--save_steps", "3", "--checkpoint_steps", "3",
        "--eval_freq", "3", "--eval_iters", "1", "--num_workers", "0", "--output_dir", "out"]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    rng = np.random.default_rng(0)
    (root / "vocab.txt").write_text("\n".join(SPECIALS + CHARS) + "\n", encoding="utf-8")
    docs = ["\n".join("".join(rng.choice(CHARS, 10)) + "。" for _ in range(4)) for _ in range(40)]
    (root / "docs.txt").write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    assert sh(dt("create_pretraining_data") + ["--input", "docs.txt", "--vocab_file", "vocab.txt", "--output_prefix",
                                               "corpus", "--workers", "1"], root).returncode == 0
    rows = ["label\ttext_a"] + [f"{i % 2}\t{''.join(rng.choice(CHARS, 8))}" for i in range(24)]
    (root / "cls.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    (root / "tasks").mkdir()
    (root / "tasks" / "topic.yaml").write_text("reader: cls\ntrain_file: ../cls.tsv\ndev_file: ../cls.tsv\n"
                                               "n_classes: 2\n")
    (root / "global.yaml").write_text("task_instance: topic\ntask_dir: tasks\nbatch_size: 4\nmax_seq_len: 32\n"
                                      "num_epochs: 1\n")
    proc = sh(RUN + FLAG, root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = sh(RUN + ["--config", "global.yaml"] + FLAG[:8] + ["--num_workers", "0", "--output_dir", "mtl"], root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (root / "mtl" / "topic" / "infer_model" / "manifest.json").is_file()
    return root


def snapshot(root: Path):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# -- the cases: (id, setup(ws) -> command, fragments the one message must contain) ------------------------
def write(path: Path, data, mode="w"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data) if isinstance(data, bytes) else path.write_text(data, encoding="utf-8")
    return path


def flag(*extra, drop=()):
    out = list(FLAG)
    for name in drop:
        i = out.index(name)
        del out[i:i + 2]
    return RUN + out + list(extra)


def damage_state(ws, how):
    for name in ("model_last", "model_3"):
        f = ws / "out" / name / "train_state.json"
        if how == "garbage":
            f.write_text("garbage{{{")
        elif how == "truncated":
            f.write_bytes(f.read_bytes()[:50])
        elif how == "deleted":
            f.unlink()
        elif how == "step_string":
            raw = json.loads(f.read_text())
            raw["step"] = str(raw["step"])
            f.write_text(json.dumps(raw))
    return flag()


def damage_file(ws, rel, how):
    f = ws / "out" / "model_last" / rel
    if how == "truncate":
        f.write_bytes(f.read_bytes()[:-11])
    else:
        f.unlink()
    return flag()


def mt_yaml(ws, global_text, task_text=None, name="g.yaml"):
    write(ws / name, global_text)
    if task_text is not None:
        write(ws / "tasks" / "topic.yaml", task_text)
    return RUN + ["--config", name, "--device", "cpu", "--model_name_or_path", "ernie-tiny-test", "--vocab_size",
                  str(len(SPECIALS) + len(CHARS)), "--tokenizer_name_or_path", "vocab.txt", "--num_workers", "0",
                  "--output_dir", "mtl2"]


def run_data(ws):
    """The flags that place the run's data where the checkpoints recorded it (the prepared
    workspace's absolute paths, which resume compares), with the index caches in the copy: a case
    that edits a checkpoint then reaches the resume itself."""
    data = json.loads((ws / "out" / "model_last" / "train_state.json").read_text())["config"]["data"]
    return ["--input_dir", data["input_dir"], "--tokenizer_name_or_path", data["tokenizer_name_or_path"],
            "--data_cache", str(ws / "cache")]


def edit_state(ws, folder, change, *, root="out"):
    """Edit checkpoint `folder`'s train_state.json by hand (`change(raw)`), as a user or a tool might."""
    f = ws / root / folder / "train_state.json"
    raw = json.loads(f.read_text())
    change(raw)
    f.write_text(json.dumps(raw))


def resume_edited(folder, change):
    """Resume `--resume out/<folder>` after `change` edited its train_state.json."""
    def make(ws):
        edit_state(ws, folder, change)
        return flag("--resume", f"out/{folder}", *run_data(ws))
    return make


def written_damaged(ws, folder, ext, *, root="out"):
    """A state file damaged before its checksums were recorded (so its size and SHA-1 match): its
    end cut off, then train_state.json's `files` and the rank's .sha1 rewritten to fit."""
    from helpers import rehash_checkpoint

    f = ws / root / folder / "state" / f"rank_0{ext}"
    f.write_bytes(f.read_bytes()[:-11])
    rehash_checkpoint(ws / root / folder)


def truncate(path: Path):
    path.write_bytes(path.read_bytes()[:-11])


def truncate_to(path: Path, size: int):
    path.write_bytes(path.read_bytes()[:size])


def flip_byte(path: Path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, different content
    path.write_bytes(bytes(data))


def with_test_file(ws, rows, *, name="t.tsv"):
    """The topic task with a test file `rows` (a target: tested at the end of the run)."""
    write(ws / name, rows)
    return mt_yaml(ws, "task_instance: topic\ntask_dir: tasks\n", "reader: cls\ntrain_file: ../cls.tsv\n"
                   f"dev_file: ../cls.tsv\ntest_file: ../{name}\nn_classes: 2\n")


def seq_label_task(ws, test_rows):
    """A seq_label target whose test file is `test_rows` (characters and tags joined by \\x02)."""
    rows = ["text_a\tlabel"] + ["\x02".join(CHARS[i:i + 4]) + "\tB\x02I\x02O\x02O" for i in range(12)]
    write(ws / "seg.tsv", "\n".join(rows) + "\n")
    write(ws / "seg_test.tsv", test_rows)
    write(ws / "tags.json", json.dumps({"B": 0, "I": 1, "O": 2}))
    return mt_yaml(ws, "task_instance: topic\ntask_dir: tasks\n", "reader: seq_label\ntrain_file: ../seg.tsv\n"
                   "dev_file: ../seg.tsv\ntest_file: ../seg_test.tsv\nlabel_map: ../tags.json\n")


def corpora_folder(ws, *copies):
    """--input_dir a folder of corpora: the workspace's corpus, plus `copies` (source, name in the folder)."""
    folder = ws / "corp"
    folder.mkdir()
    for ext in (".bin", ".idx", ".json"):
        shutil.copy(ws / f"corpus{ext}", folder / f"corpus{ext}")
    for source, name in copies:
        shutil.copy(ws / source, folder / name)
    return flag("--input_dir", "corp")


RESHARD = [sys.executable, "-m", "ernie_mtl.convert.reshard_cli"]


def paddlenlp_dir(ws):
    """A PaddleNLP model directory whose weights hold one of the model's parameters only."""
    import pickle

    write(ws / "pnlp" / "config.json", json.dumps({"model_type": "ernie"}))
    with open(ws / "pnlp" / "model_state.pdparams", "wb") as f:
        pickle.dump({"ernie.pooler.dense.bias": np.zeros(32, "float32")}, f, protocol=2)


EVAL = RUN + ["--do_eval", "--task", "topic", "--eval_file", "cls.tsv", "--output_dir", "mtl"]
EVAL_CKPT = EVAL + ["--checkpoint", "mtl/best_topic"]


def _set(key, value):
    return lambda raw: raw.__setitem__(key, value)


CASES = [
    # flags: every problem at once, each named
    ("flag_not_a_number", lambda ws: flag("--max_lr", "abc"), ["--max_lr 'abc'", "not a number"]),
    ("flag_not_a_boolean", lambda ws: flag("--use_amp", "maybe"), ["--use_amp 'maybe'", "true or false"]),
    ("flag_unknown", lambda ws: flag("--lerning_rate", "0.1"), ["--lerning_rate", "did you mean"]),
    ("flag_mp_degree", lambda ws: flag("--mp_degree", "2"), ["--mp_degree '2'", "tensor (model) parallelism is not "
                                                             "supported", "--use_sharding"]),
    ("flag_pp_degree", lambda ws: flag("--pp_degree=4"), ["--pp_degree '4'", "pipeline parallelism"]),
    ("flag_two_problems_in_one_slice", lambda ws: flag("--warmup_rate", "5", "--decay_steps", "-1"),
     ["--warmup_rate 5.0", "--decay_steps -1"]),
    ("flag_batch_not_divisible", lambda ws: flag("--global_batch_size", "6"), ["--global_batch_size", "6"]),
    ("flag_sharding_without_switch", lambda ws: flag("--sharding_degree", "2"), ["--sharding_degree 2 needs "
                                                                                  "--use_sharding"]),
    ("flag_gpu_on_cpu_build", lambda ws: flag("--device", "gpu"), ["--device gpu", "CPU build"]),
    ("flag_bf16_on_cpu", lambda ws: flag("--use_amp", "--amp_dtype", "bfloat16"), ["bfloat16", "CPU"]),
    ("flag_unknown_model_name", lambda ws: flag("--model_name_or_path", "ernie-3.0-xbase"),
     ["'ernie-3.0-xbase'", "never downloaded"]),
    ("flag_seq_longer_than_positions", lambda ws: flag("--max_seq_len", "4096"), ["--max_seq_len 4096",
                                                                                   "max_position_embeddings"]),
    ("flag_mask_prob_zero", lambda ws: flag("--masked_lm_prob", "0"), ["--masked_lm_prob 0.0"]),
    ("flag_eval_iters_zero", lambda ws: flag("--eval_iters", "0"), ["--eval_iters 0 must be >= 1"]),
    ("flag_resume_not_a_checkpoint", lambda ws: flag("--resume", "docs.txt"), ["--resume", "not a complete "
                                                                                "checkpoint"]),
    # data and vocabulary
    ("corpus_missing", lambda ws: flag("--input_dir", "nowhere"), ["--input_dir", "nowhere.bin", "not found"]),
    ("corpus_truncated_bin", lambda ws: (write(ws / "corpus.bin", (ws / "corpus.bin").read_bytes()[:-3]),
                                         flag())[1], ["corpus.bin"]),
    ("mixture_bad_weight", lambda ws: flag("--input_dir", "5.0 corpus abc corpus"), ["--input_dir", "abc"]),
    ("mixture_odd_items", lambda ws: flag("--input_dir", "5.0 corpus 7.0"), ["--input_dir", "odd number"]),
    ("mixture_empty_folder", lambda ws: ((ws / "empty_dir").mkdir(), flag("--input_dir", "empty_dir"))[1],
     ["--input_dir", "empty_dir"]),
    ("corpus_other_vocab_sidecar", lambda ws: (write(ws / "corpus.json", json.dumps(
        {**json.loads((ws / "corpus.json").read_text()), "vocab_sha1": "1" * 40})), flag())[1],
     ["corpus", "tokenized with", "sha1"]),
    ("corpus_without_sidecar_other_vocab", lambda ws: ((ws / "corpus.json").unlink(),
                                                       write(ws / "v2.txt", "\n".join(SPECIALS + ["x"]) + "\n"),
                                                       flag("--tokenizer_name_or_path", "v2.txt"))[2],
     ["corpus", "corpus.json is missing", "another vocabulary"]),
    ("vocab_missing", lambda ws: flag("--tokenizer_name_or_path", "nope.txt"), ["--tokenizer_name_or_path",
                                                                                 "nope.txt", "not found"]),
    ("vocab_empty", lambda ws: (write(ws / "empty.txt", ""), flag("--tokenizer_name_or_path", "empty.txt"))[1],
     ["empty.txt is empty"]),
    ("vocab_without_mask",
     lambda ws: (write(ws / "nomask.txt", "\n".join(["[PAD]", "[CLS]", "[SEP]", "[UNK]"] + CHARS)),
                                       flag("--tokenizer_name_or_path", "nomask.txt"))[1], ["nomask.txt", "[MASK]"]),
    ("vocab_not_utf8", lambda ws: (write(ws / "bad.txt", b"[PAD]\n\xff\xfe\n"),
                                   flag("--tokenizer_name_or_path", "bad.txt"))[1], ["bad.txt", "not UTF-8"]),
    # messages that once named the wrong cause or no fix
    ("vocab_with_bom", lambda ws: (write(ws / "bom.txt", b"\xef\xbb\xbf" + (ws / "vocab.txt").read_bytes()),
                                   flag("--tokenizer_name_or_path", "bom.txt"))[1],
     ["--tokenizer_name_or_path", "bom.txt starts with a UTF-8 byte-order mark (BOM)", "without BOM"]),
    ("tool_vocab_with_bom", lambda ws: (write(ws / "bom.txt", b"\xef\xbb\xbf" + (ws / "vocab.txt").read_bytes()),
                                        dt("create_pretraining_data") + ["--input", "docs.txt", "--vocab_file",
                                                                         "bom.txt", "--output_prefix", "c2"])[1],
     ["--vocab_file bom.txt", "byte-order mark (BOM)"]),
    ("data_cache_is_a_file", lambda ws: (write(ws / "afile", "x"), flag("--data_cache", "afile"))[1],
     ["--data_cache", "afile is a file, not a folder"]),
    ("data_cache_under_a_file", lambda ws: (write(ws / "afile", "x"), flag("--data_cache", "afile/cache"))[1],
     ["--data_cache", "afile/cache", "afile is a file, not a folder"]),
    ("data_cache_not_writable", lambda ws: flag("--data_cache", "/sys/ernie_mtl_cache"),
     ["--data_cache /sys/ernie_mtl_cache"]),  # root gets EPERM from mkdir, others os.access's answer
    ("mixture_folder_orphan_bin", lambda ws: corpora_folder(ws, ("corpus.bin", "other.bin")),
     ["--input_dir", "corp/other.bin has no other.idx beside it", "move other.bin out of the folder"]),
    ("mixture_folder_orphan_idx", lambda ws: corpora_folder(ws, ("corpus.idx", "b.idx")),
     ["corp/b.idx has no b.bin beside it"]),
    ("output_dir_is_a_file", lambda ws: (write(ws / "afile", "x"), flag("--output_dir", "afile"))[1],
     ["--output_dir", "afile", "is a file"]),
    ("output_dir_under_a_file", lambda ws: (write(ws / "afile", "x"), flag("--output_dir", "afile/run"))[1],
     ["--output_dir", "afile", "not a folder"]),
    # --config YAML
    ("config_missing", lambda ws: RUN + ["--config", "nope.yaml"], ["--config nope.yaml", "cannot read"]),
    ("config_not_yaml", lambda ws: (write(ws / "b.yaml", "a: [1, 2\n"), RUN + ["--config", "b.yaml"])[1],
     ["b.yaml", "not valid YAML"]),
    ("config_not_a_mapping", lambda ws: (write(ws / "b.yaml", "- 1\n- 2\n"), RUN + ["--config", "b.yaml"])[1],
     ["b.yaml", "mapping"]),
    ("config_unknown_key", lambda ws: (write(ws / "b.yaml", "max_lrr: 1\n"), RUN + ["--config", "b.yaml"])[1],
     ["unknown key 'max_lrr'", "did you mean 'max_lr'"]),
    # a key given twice is refused (YAML keeps the last value), a syntax error reported alone, an
    # empty file named
    ("config_duplicate_key", lambda ws: (write(ws / "b.yaml", "max_lr: 1e-3\nmax_steps: 6\nmax_lr: 0.5\n"),
                                         flag("--config", "b.yaml"))[1],
     ["--config b.yaml:3:", "key 'max_lr' twice (lines 1 and 3)", "delete one"]),
    ("config_syntax_error_alone", lambda ws: (write(ws / "b.yaml", "max_steps: 6\na: [1, 2\n"),
                                              RUN + ["--config", "b.yaml"])[1],
     ["--config b.yaml:3:1: the config is not valid YAML", "started on line 2"]),
    ("config_empty", lambda ws: (write(ws / "b.yaml", ""), RUN + ["--config", "b.yaml"])[1],
     ["--config b.yaml: the config is empty", "drop --config"]),
    ("config_only_comments", lambda ws: (write(ws / "b.yaml", "# max_steps: 6\n"), flag("--config", "b.yaml"))[1],
     ["--config b.yaml: the config is empty"]),
    ("mtl_global_duplicate_key", lambda ws: mt_yaml(ws, "task_instance: topic\ntask_dir: tasks\nbatch_size: 4\n"
                                                        "num_epochs: 1\nbatch_size: 8\n"),
     ["g.yaml:5:", "key 'batch_size' twice (lines 3 and 5)"]),
    ("mtl_task_duplicate_key", lambda ws: mt_yaml(ws, "task_instance: topic\ntask_dir: tasks\n",
                                                  "reader: cls\ntrain_file: ../cls.tsv\nn_classes: 2\n"
                                                  "dev_file: ../cls.tsv\nn_classes: 3\n"),
     ["tasks/topic.yaml:5: the task config gives key 'n_classes' twice (lines 3 and 5)"]),
    ("mtl_task_nested_duplicate_key", lambda ws: mt_yaml(ws, "task_instance: topic\ntask_dir: tasks\n",
                                                         "reader: cls\ntrain_file: ../cls.tsv\nn_classes: 2\n"
                                                         "label_map: {a: 0, a: 1}\n"),
     ["topic.yaml:4: the task config gives key 'a' twice on line 4"]),
    ("mtl_task_file_empty", lambda ws: mt_yaml(ws, "task_instance: topic\ntask_dir: tasks\n", "# nothing yet\n"),
     ["tasks/topic.yaml: the task config is empty"]),
    # multi-task configuration: every problem at once
    ("mtl_global_and_task_errors_together", lambda ws: mt_yaml(
        ws, "task_instance: topic\ntask_dir: tasks\nmix_ratio: abc\n",
        "reader: cls\ntrain_file: ../cls.tsv\nn_classes: 2\nbatch_size: sixteen\n"),
     ["mix_ratio", "abc", "batch_size", "sixteen"]),
    ("mtl_task_file_missing", lambda ws: mt_yaml(ws, "task_instance: topic, nosuch\ntask_dir: tasks\n"),
     ["nosuch", "does not exist"]),
    ("mtl_task_name_not_ascii", lambda ws: (write(ws / "tasks" / "情感.yaml", "reader: cls\ntrain_file: ../cls.tsv\n"
                                                                          "n_classes: 2\n"),
                                            mt_yaml(ws, "task_instance: 情感\ntask_dir: tasks\n"))[1],
     ["task names ['情感'] may only use ASCII letters", "rename the task and its task file"]),
    ("mtl_unknown_reader", lambda ws: mt_yaml(ws, "task_instance: topic\ntask_dir: tasks\n",
                                              "reader: clss\ntrain_file: ../cls.tsv\n"), ["unknown reader 'clss'"]),
    ("mtl_no_task_instance", lambda ws: mt_yaml(ws, "task_dir: tasks\nmix_ratio: 1\n"),
     ["mix_ratio"]),  # without task_instance it is a flag file: mix_ratio is no flag
    ("mtl_task_override_bad", lambda ws: mt_yaml(ws, "task_instance: topic\ntask_dir: tasks\n") +
     ["--tasks.topic.batch_size=abc"], ["--tasks.topic.batch_size", "abc"]),
    ("mtl_plugin_raises", lambda ws: (write(ws / "p.py", "raise RuntimeError('boom')\n"),
                                      mt_yaml(ws, "task_instance: topic\ntask_dir: tasks\nplugins: p.py\n"))[1],
     ["plugins", "RuntimeError: boom"]),
    ("mtl_unknown_callback", lambda ws: mt_yaml(ws, "task_instance: topic\ntask_dir: tasks\ncallbacks: [nope]\n"),
     ["unknown callback 'nope'"]),
    ("tsv_not_utf8", lambda ws: (write(ws / "cls.tsv", (ws / "cls.tsv").read_bytes() + b"1\t\xff\xfe\n"),
                                 mt_yaml(ws, "task_instance: topic\ntask_dir: tasks\n"))[1], ["cls.tsv:26:",
                                                                                             "not UTF-8"]),
    ("tsv_wrong_field_count", lambda ws: (write(ws / "cls.tsv", (ws / "cls.tsv").read_text() + "1\ta\tb\n"),
                                          mt_yaml(ws, "task_instance: topic\ntask_dir: tasks\n"))[1],
     ["cls.tsv:26:", "3 tab-separated fields"]),
    ("tsv_missing_header", lambda ws: (write(ws / "cls.tsv", "1\t好\n"),
                                       mt_yaml(ws, "task_instance: topic\ntask_dir: tasks\n"))[1],
     ["cls.tsv:1:", "header row"]),
    ("label_map_not_json", lambda ws: (write(ws / "lm.json", "{"), write(ws / "tasks" / "topic.yaml",
                                       "reader: cls\ntrain_file: ../cls.tsv\nlabel_map: ../lm.json\n"),
                                       mt_yaml(ws, "task_instance: topic\ntask_dir: tasks\n"))[2],
     ["lm.json:1", "not valid JSON"]),
    ("mrc_not_json", lambda ws: (write(ws / "qa.json", '{"data": [\n  {"paragraphs": [}\n]}'),
                                 write(ws / "tasks" / "topic.yaml", "reader: mrc\ntrain_file: ../qa.json\n"),
                                 mt_yaml(ws, "task_instance: topic\ntask_dir: tasks\n"))[2],
     ["qa.json:2:", "not valid JSON"]),
    # a target's test_file is read before training, as dev_file is (not after training and export)
    ("test_file_missing", lambda ws: mt_yaml(ws, "task_instance: topic\ntask_dir: tasks\n",
                                             "reader: cls\ntrain_file: ../cls.tsv\ntest_file: ../nope.tsv\n"
                                             "n_classes: 2\n"),
     ["topic.yaml: key 'test_file' '../nope.tsv': file not found"]),
    ("test_file_header_only", lambda ws: with_test_file(ws, "label\ttext_a\n"),
     ["task topic: test_file", "t.tsv has no examples"]),
    ("test_file_bad_row", lambda ws: with_test_file(ws, "label\ttext_a\n1\t好\n0\ta\tb\n"),
     ["task topic: test_file: ", "t.tsv:3: 3 tab-separated fields"]),
    ("test_file_not_utf8", lambda ws: with_test_file(ws, b"label\ttext_a\n1\t\xff\xfe\n"),
     ["task topic: test_file: ", "t.tsv:2: not UTF-8"]),
    ("test_file_unknown_tag", lambda ws: seq_label_task(ws, "text_a\tlabel\n的\x02了\tB\x02X\n"),
     ["task topic: test_file: ", "seg_test.tsv:2: tag(s) ['X'] are not in label_map"]),
    ("test_file_no_header", lambda ws: with_test_file(ws, "1\t好\n"), ["task topic: test_file: ", "t.tsv:1:",
                                                                      "header row"]),
    ("dev_file_bad_row_names_key", lambda ws: (write(ws / "d.tsv", "label\ttext_a\n1\ta\tb\n"), mt_yaml(
        ws, "task_instance: topic\ntask_dir: tasks\n",
        "reader: cls\ntrain_file: ../cls.tsv\ndev_file: ../d.tsv\nn_classes: 2\n"))[1],
     ["task topic: dev_file: ", "d.tsv:2:"]),
    # checkpoints: never skipped, never overwritten
    ("ckpt_state_garbage", lambda ws: damage_state(ws, "garbage"), ["model_last/train_state.json is damaged",
                                                                    "--resume none"]),
    ("ckpt_state_truncated", lambda ws: damage_state(ws, "truncated"), ["train_state.json is damaged"]),
    ("ckpt_state_deleted", lambda ws: damage_state(ws, "deleted"), ["train_state.json is missing"]),
    ("ckpt_step_a_string", lambda ws: damage_state(ws, "step_string"), ["step is str '6'"]),
    ("ckpt_params_truncated", lambda ws: damage_file(ws, "state/rank_0.pdparams", "truncate"),
     ["rank_0.pdparams is damaged", "model_3 (step 3)", "--resume PATH"]),
    ("ckpt_opt_deleted", lambda ws: damage_file(ws, "state/rank_0.pdopt", "delete"),
     ["rank_0.pdopt is missing", "model_3 (step 3)"]),
    ("ckpt_resume_none_over_checkpoints", lambda ws: flag("--resume", "none"),
     ["--resume none", "holds checkpoints", "--overwrite_output_dir"]),
    ("ckpt_changed_seed", lambda ws: flag("--seed", "99"), ["cannot resume exactly", "seed: checkpoint 1234 vs "
                                                                                      "now 99"]),
    ("ckpt_disk_full_on_save", lambda ws: flag("--output_dir", "out2", drop=("--output_dir",)),
     ["cannot write checkpoint", "ws/out2/", "File too large; the file exceeds the size limit",
      "previous checkpoints are unchanged"]),
    # converter
    ("s2d_damaged_checkpoint", lambda ws: (damage_file(ws, "state/rank_0.pdparams", "truncate"),
                                           S2D + ["--input", "out/model_last", "--output_dir", "conv"])[1],
     ["rank_0.pdparams is damaged"]),
    ("s2d_overwrite_a_file", lambda ws: (write(ws / "conv", "keep me"), S2D + ["--input", "out/model_last",
                                                                              "--output_dir", "conv",
                                                                              "--overwrite"])[1],
     ["--output_dir", "conv is a file"]),
    ("s2d_missing_input", lambda ws: S2D + ["--input", "nowhere", "--output_dir", "conv"], ["nowhere"]),
    ("s2d_verify_truncated_export", lambda ws: (truncate_to(ws / "mtl/topic/infer_model/model.pdiparams", 100),
                                                S2D + ["--input", "mtl/topic/infer_model", "--output_dir", "conv",
                                                       "--verify"])[1], ["model.pdiparams", "re-export"]),
    # prediction and evaluation
    ("predict_unknown_task", lambda ws: RUN + ["--do_predict", "--task", "nosuch", "--pred_file", "cls.tsv",
                                               "--output_dir", "mtl"], ["--task nosuch", "['topic']"]),
    ("predict_not_utf8", lambda ws: (write(ws / "p.tsv", b"text_a\n\xff\xfe\n"),
                                     RUN + ["--do_predict", "--task", "topic", "--pred_file", "p.tsv",
                                            "--output_dir", "mtl"])[1], ["p.tsv:2:", "not UTF-8"]),
    ("predict_truncated_model", lambda ws: (write(ws / "mtl/topic/infer_model/model.pdiparams",
                                                  (ws / "mtl/topic/infer_model/model.pdiparams").read_bytes()[:100]),
                                            RUN + ["--do_predict", "--task", "topic", "--pred_file", "cls.tsv",
                                                   "--output_dir", "mtl"])[1], ["model.pdiparams", "damaged"]),
    ("eval_wrong_format", lambda ws: (write(ws / "e.tsv", "label\ttext_a\n1\ta\tb\n"),
                                      RUN + ["--do_eval", "--task", "topic", "--eval_file", "e.tsv",
                                             "--output_dir", "mtl"])[1], ["e.tsv:2:"]),
    ("eval_without_file", lambda ws: RUN + ["--do_eval", "--task", "topic", "--output_dir", "mtl"],
     ["--do_eval needs --eval_file"]),
    # data tools
    ("tool_vocab_without_mask", lambda ws: (write(ws / "nomask.txt", "\n".join(["[PAD]", "[CLS]", "[SEP]", "[UNK]"]
                                                                               + CHARS)),
                                            dt("create_pretraining_data") + ["--input", "docs.txt", "--vocab_file",
                                                                             "nomask.txt", "--output_prefix",
                                                                             "c2"])[1], ["nomask.txt", "[MASK]"]),
    ("tool_input_missing", lambda ws: dt("create_pretraining_data") + ["--input", "nope.txt", "--vocab_file",
                                                                      "vocab.txt", "--output_prefix", "c2"],
     ["nope.txt"]),
    ("tool_vocab_output_is_a_folder", lambda ws: ((ws / "vdir").mkdir(),
                                                  dt("build_vocab") + ["--input", "docs.txt", "--output", "vdir"])[1],
     ["vdir"]),
    ("tool_merge_other_vocab", lambda ws: (write(ws / "corpus.json", json.dumps(
        {**json.loads((ws / "corpus.json").read_text()), "vocab_sha1": "2" * 40})),
        dt("merge") + ["--inputs", "corpus", "out_c", "--output_prefix", "merged"])[1], ["merge"]),
    # --do_eval --checkpoint verifies the checkpoint as resume and the converter do
    ("eval_ckpt_params_truncated", lambda ws: (truncate(ws / "mtl/best_topic/state/rank_0.pdparams"),
                                               EVAL_CKPT)[1],
     ["--checkpoint", "best_topic/state/rank_0.pdparams is damaged", "truncated", "mtl/model_last (step"]),
    ("eval_ckpt_params_same_size", lambda ws: (flip_byte(ws / "mtl/best_topic/state/rank_0.pdparams"), EVAL_CKPT)[1],
     ["rank_0.pdparams is damaged", "SHA-1 differs", "evaluate an intact checkpoint"]),
    ("eval_ckpt_step_edited", lambda ws: (edit_state(ws, "best_topic", _set("step", 99), root="mtl"), EVAL_CKPT)[1],
     ["best_topic/train_state.json is damaged", "step 99 disagrees with lr_scheduler.last_epoch"]),
    ("eval_ckpt_written_damaged", lambda ws: (written_damaged(ws, "best_topic", ".pdparams", root="mtl"),
                                              EVAL_CKPT)[1], ["best_topic/state/rank_0.pdparams is damaged",
                                                              "unreadable", "written damaged"]),
    ("eval_manifest_garbage", lambda ws: (write(ws / "mtl/topic/infer_model/manifest.json", "garbage{"), EVAL)[1],
     ["infer_model/manifest.json is damaged", "not valid JSON", "mtl/best_topic"]),
    ("eval_manifest_not_an_object", lambda ws: (write(ws / "mtl/topic/infer_model/manifest.json", "[1, 2]"),
                                                EVAL)[1], ["manifest.json is damaged", "JSON list"]),
    ("predict_manifest_without_feeds", lambda ws: (
        write(ws / "mtl/topic/infer_model/manifest.json", json.dumps(
            {k: v for k, v in json.loads((ws / "mtl/topic/infer_model/manifest.json").read_text()).items()
             if k != "feeds"})),
        RUN + ["--do_predict", "--task", "topic", "--pred_file", "cls.tsv", "--output_dir", "mtl"])[1],
     ["manifest.json is damaged", "'feeds' missing"]),
    # resume checks train_state.json field by field and the ranks' own records
    ("ckpt_step_edited", resume_edited("model_3", _set("step", 5)),
     ["model_3/train_state.json is damaged", "step 5 disagrees with the folder name model_3",
      "model_6 (step 6)", "--resume PATH"]),
    ("ckpt_step_negative", resume_edited("model_3", _set("step", -3)), ["model_3/train_state.json is damaged",
                                                                        "step -3 is negative"]),
    ("ckpt_topology_missing", resume_edited("model_3", lambda raw: raw.pop("topology")),
     ["model_3/train_state.json is damaged", "no 'topology'", "model_6 (step 6)"]),
    ("ckpt_topology_key_missing", resume_edited("model_3", lambda raw: raw["topology"].pop("world_size")),
     ["model_3/train_state.json is damaged", "topology lacks ['world_size']"]),
    ("ckpt_rank_sha1_disagrees", lambda ws: (write(ws / "out/model_3/state/rank_0.sha1", json.dumps(
        {k: dict(v, sha1="0" * 40)
         for k, v in json.loads((ws / "out/model_3/state/rank_0.sha1").read_text()).items()})),
        flag("--resume", "out/model_3", *run_data(ws)))[1],
     ["model_3/state/rank_0.sha1 disagrees with", "model_3/train_state.json", "model_6 (step 6)"]),
    ("ckpt_consumed_edited", resume_edited("model_3", _set("consumed_samples", 999)),
     ["consumed_samples 999 disagrees with the task schedule's 12"]),
    ("ckpt_lr_epoch_edited", resume_edited("model_3", lambda raw: raw["lr_scheduler"].update(last_epoch=1)),
     ["step 3 disagrees with lr_scheduler.last_epoch 1"]),
    ("ckpt_auto_newest_edited", lambda ws: ([edit_state(ws, f, _set("step", 7)) for f in ("model_last", "model_6")],
                                            flag(*run_data(ws)))[1],
     ["cannot resume from", "step 7 disagrees", "Intact checkpoints: ", "model_3 (step 3)"]),
    ("ckpt_resume_path_damaged_lists_intact", lambda ws: (truncate(ws / "out/model_3/state/rank_0.pdparams"),
                                                          flag("--resume", "out/model_3"))[1],
     ["cannot resume from", "model_3/state/rank_0.pdparams is damaged", "model_6 (step 6)", "--resume PATH"]),
    ("ckpt_opt_written_damaged", lambda ws: (written_damaged(ws, "model_3", ".pdopt"),
                                             flag("--resume", "out/model_3", *run_data(ws)))[1],
     ["model_3/state/rank_0.pdopt is damaged", "unreadable", "written damaged", "model_6 (step 6)"]),
    ("ckpt_none_intact", lambda ws: ([write(ws / "out" / f / "train_state.json", "garbage{{{")
                                      for f in ("model_last", "model_3", "model_6")], flag())[1],
     ["train_state.json is damaged", "No intact checkpoint remains: start a new run in another --output_dir, or "
                                     "here with --resume none --overwrite_output_dir"]),
    ("s2d_rank_sha1_missing", lambda ws: ((ws / "out/model_last/state/rank_0.sha1").unlink(),
                                          S2D + ["--input", "out/model_last", "--output_dir", "conv"])[1],
     ["rank_0.sha1 is missing", "convert an intact checkpoint", "model_3 (step 3)"]),
    # another global batch, warm starts, the topology-free format
    ("ckpt_another_global_batch", lambda ws: flag("--global_batch_size", "8"),
     ["cannot continue", "with another global batch: global batch 4 samples per step vs 8 now",
      "keep --global_batch_size 4 (micro batch x 1 data-parallel ranks x accumulation: e.g. --micro_batch_size 4 "
      "gives accumulation 1)", "from the checkpoint's 24 consumed samples", "add --allow_batch_change"]),
    ("dry_run_another_global_batch", lambda ws: flag("--global_batch_size", "8", "--dry_run"),
     ["cannot continue", "with another global batch", "add --allow_batch_change"]),
    ("ckpt_batch_change_micro_not_dividing", lambda ws: flag("--resume", "out/model_3", "--global_batch_size", "8",
                                                             "--micro_batch_size", "8", "--allow_batch_change",
                                                             *run_data(ws)),
     ["cannot continue", "model_3 with --micro_batch_size 8: its 12 consumed samples are not a whole number of "
                         "micro-batches of 8", "e.g. 4, the checkpoint's"]),
    ("init_from_with_resume_path", lambda ws: flag("--init_from", "out/model_3", "--resume", "out/model_3"),
     ["--init_from", "starts a new run from its weights, --resume", "pick one"]),
    ("init_from_missing", lambda ws: flag("--init_from", "nowhere", "--output_dir", "o", drop=("--output_dir",)),
     ["--init_from", "nowhere: no such directory", "PaddleNLP model directory"]),
    ("init_optimizer_without_init_from", lambda ws: flag("--init_optimizer", "--output_dir", "o",
                                                         drop=("--output_dir",)),
     ["--init_optimizer loads the optimizer state of --init_from, which is not given"]),
    ("init_from_other_shapes", lambda ws: flag("--init_from", "out/model_3", "--output_dir", "o", "--vocab_size",
                                               str(len(SPECIALS) + len(CHARS) + 8),
                                               drop=("--output_dir", "--vocab_size")),
     ["--init_from", "model_3: ", "differ in shape or type: ernie.embeddings.word_embeddings.weight: shape "
                                  f"[{len(SPECIALS) + len(CHARS)}, "]),
    ("init_optimizer_from_paddlenlp", lambda ws: (paddlenlp_dir(ws), flag(
        "--init_from", "pnlp", "--init_optimizer", "--output_dir", "o", drop=("--output_dir",)))[1],
     ["--init_optimizer: --init_from", "pnlp is a PaddleNLP model directory, which holds no optimizer state"]),
    ("init_from_paddlenlp_lacking", lambda ws: (paddlenlp_dir(ws), flag("--init_from", "pnlp", "--output_dir", "o",
                                                                        drop=("--output_dir",)))[1],
     ["--init_from", "pnlp: ", "model_state.pdparams lacks", "of the model's parameters"]),
    ("ckpt_resume_an_average", lambda ws: (sh(RESHARD + ["out/model_3", "out/model_6", "--average", "--output",
                                                         "avg"], ws), flag("--resume", "avg"))[1],
     ["avg holds weights only", "out/model_6 (step 6)", "with --init_from", "avg"]),
    ("reshard_average_of_one", lambda ws: RESHARD + ["out/model_3", "--average", "--output", "conv"],
     ["ernie-mtl-reshard: error: --average needs at least two checkpoints"]),
    ("reshard_average_of_two_models", lambda ws: RESHARD + ["out/model_3", "mtl/best_topic", "--average", "--output",
                                                             "conv"],
     ["best_topic does not hold the weights of out/model_3", "average checkpoints of one model"]),
    ("reshard_output_exists", lambda ws: (write(ws / "conv" / "keep", "me"), RESHARD + ["out/model_3", "--output",
                                                                                       "conv"])[1],
     ["conv exists; choose another --output or pass --overwrite"]),
    ("reshard_damaged_input", lambda ws: (truncate(ws / "out/model_3/state/rank_0.pdparams"),
                                          RESHARD + ["out/model_3", "--output", "conv"])[1],
     ["model_3/state/rank_0.pdparams is damaged"]),
    # launch scripts
    ("launch_master_malformed", lambda ws: ["bash", ROOT / "scripts" / "run.sh"], ["MASTER"]),
    # a PORT_RANGE the user set is checked before the launcher takes it as it is
    ("launch_port_range_garbage", lambda ws: ["bash", ROOT / "scripts" / "run_cpu.sh"],
     ["run_cpu.sh: error: PORT_RANGE='garbage' is malformed", "LOW:HIGH", "unset PORT_RANGE"]),
    ("launch_port_range_reversed", lambda ws: ["bash", ROOT / "scripts" / "run_cpu.sh"],
     ["PORT_RANGE='9000:8000'", "LOW 9000 is not below HIGH 8000", "PORT_RANGE=8000:9000"]),
    ("launch_port_range_one_number", lambda ws: ["bash", ROOT / "scripts" / "run_cpu.sh"],
     ["PORT_RANGE='5000' is malformed", "LOW:HIGH"]),
    ("launch_port_range_above_65535", lambda ws: ["bash", ROOT / "scripts" / "run_cpu.sh"],
     ["PORT_RANGE='70000:80000' lies outside the ports 1..65535"]),
    ("launch_port_range_port_zero", lambda ws: ["bash", ROOT / "scripts" / "run_single_node.sh"],
     ["run_single_node.sh: error: PORT_RANGE='0:100' lies outside the ports 1..65535"]),
    ("launch_port_range_too_small", lambda ws: ["bash", ROOT / "scripts" / "run_cpu.sh"],
     ["PORT_RANGE='40000:40002' holds 3 port(s), but the launcher needs 4", "2 process(es)"]),
    ("launch_port_range_ips_mode", lambda ws: ["bash", ROOT / "scripts" / "run.sh"],
     ["run.sh: error: PORT_RANGE='61000-65535' is malformed"]),
]
ENV = {"launch_master_malformed": {"MASTER": "host-without-port", "NNODES": "2", "GPUS": "0", "CONFIG": "global.yaml",
                                   "OUTPUT_DIR": "o", "DRY_RUN": "1"},
       # DRY_RUN: the check comes before the command is printed; without it the old scripts' launcher
       # died in a traceback, or (70000:80000) tried to bind a port forever
       **{f"launch_port_range_{case}": {"PORT_RANGE": value, "NPROC": "2", "GPUS": "0", "CONFIG": "global.yaml",
                                        "OUTPUT_DIR": "o", "DRY_RUN": "1", **extra}
          for case, value, extra in [("garbage", "garbage", {}), ("reversed", "9000:8000", {}),
                                     ("one_number", "5000", {}), ("above_65535", "70000:80000", {}),
                                     ("port_zero", "0:100", {}), ("too_small", "40000:40002", {}),
                                     ("ips_mode", "61000-65535", {"IPS": "10.0.0.1"})]}}
LIMIT = {"ckpt_disk_full_on_save": 40_000}
# fragments the message must NOT contain (a wrong cause, a spurious follow-on problem)
ABSENT = {"ckpt_another_global_batch": ["cannot resume exactly"],
          "vocab_with_bom": ["lacks", "problems"], "tool_vocab_with_bom": ["lacks"],
          "mixture_folder_orphan_bin": ["problems"],
          "config_syntax_error_alone": ["is required", "problems"], "config_empty": ["is required"],
          "config_duplicate_key": ["problems"], "ckpt_opt_written_damaged": ["another configuration"],
          "eval_ckpt_written_damaged": ["Traceback"]}
# folders of the workspace whose files are listed before and after: a refused command adds none
# (no VisualDL record, no metrics file, no checkpoint)
WATCHED = ("out", "mtl", "mtl2", "conv", "o", "pnlp")


# Refusals that need the engine: the parser accepts these commands.
ENGINE = {
    "data_cache_not_writable", "tsv_not_utf8", "tsv_wrong_field_count", "tsv_missing_header", "label_map_not_json",
    "mrc_not_json", "test_file_header_only", "test_file_bad_row", "test_file_not_utf8", "test_file_unknown_tag",
    "test_file_no_header", "dev_file_bad_row_names_key", "ckpt_state_garbage", "ckpt_state_truncated",
    "ckpt_state_deleted", "ckpt_step_a_string", "ckpt_params_truncated", "ckpt_opt_deleted",
    "ckpt_resume_none_over_checkpoints", "ckpt_changed_seed", "ckpt_disk_full_on_save", "predict_not_utf8",
    "predict_truncated_model", "eval_wrong_format", "eval_ckpt_params_truncated", "eval_ckpt_params_same_size",
    "eval_ckpt_step_edited", "eval_ckpt_written_damaged", "eval_manifest_garbage", "eval_manifest_not_an_object",
    "predict_manifest_without_feeds", "ckpt_step_edited", "ckpt_step_negative", "ckpt_topology_missing",
    "ckpt_topology_key_missing", "ckpt_rank_sha1_disagrees", "ckpt_consumed_edited", "ckpt_lr_epoch_edited",
    "ckpt_auto_newest_edited", "ckpt_resume_path_damaged_lists_intact", "ckpt_opt_written_damaged",
    "ckpt_none_intact", "ckpt_another_global_batch", "dry_run_another_global_batch",
    "ckpt_batch_change_micro_not_dividing", "init_from_other_shapes",
    "init_optimizer_from_paddlenlp", "init_from_paddlenlp_lacking", "ckpt_resume_an_average",
}
# a file-size limit on the process (LIMIT); a model loaded through Paddle Inference
OWN_PROCESS = {"ckpt_disk_full_on_save", "s2d_verify_truncated_export"}
# also run as the real command: parser, engine and tool refusals, for the path from the command line to the message
END_TO_END = {"flag_not_a_number", "config_duplicate_key", "mtl_global_and_task_errors_together", "vocab_with_bom",
              "ckpt_params_truncated", "ckpt_changed_seed", "test_file_bad_row",
              "eval_ckpt_written_damaged", "predict_truncated_model", "tool_input_missing", "s2d_damaged_checkpoint",
              "reshard_output_exists"}


def is_launch_script(name):
    return name.startswith("launch_")


IN_PROCESS = [c for c in CASES if c[0] not in OWN_PROCESS and not is_launch_script(c[0])]
REAL_COMMAND = [c for c in CASES if c[0] in OWN_PROCESS | END_TO_END or is_launch_script(c[0])]


def test_there_are_at_least_110_cases():
    assert len(CASES) >= 110 and len({c[0] for c in CASES}) == len(CASES)
    names = {c[0] for c in CASES}
    assert ENGINE | OWN_PROCESS | END_TO_END <= names  # no stale name
    assert {c[0] for c in IN_PROCESS} | {c[0] for c in REAL_COMMAND} == names  # every case runs
    assert not any(n in LIMIT or n in ENV for n, _, _ in IN_PROCESS)  # those need a process of their own


def check_refusal(name, fragments, code, text, before, after):
    assert code == 2, (code, text[-3000:])
    assert "Traceback" not in text and "During handling" not in text, text[-3000:]
    for fragment in fragments:
        assert fragment in text, (fragment, text[-3000:])
    for fragment in ABSENT.get(name, ()):
        assert fragment not in text, (fragment, text[-3000:])
    changed = [p for p, data in before.items() if after.get(p) != data]
    assert not changed, changed  # every file that existed before is byte-identical
    added = [p for p in after if p not in before and p.split(os.sep)[0] in WATCHED]
    assert not added, added  # and the run's folders gained nothing


def workspace(base, tmp_path):
    ws = tmp_path / "ws"
    shutil.copytree(base, ws, symlinks=True)
    return ws


@pytest.mark.parametrize("name,make,fragments", REAL_COMMAND, ids=[c[0] for c in REAL_COMMAND])
def test_the_real_command_refuses_with_one_clear_message_and_nothing_changed(base, tmp_path, name, make, fragments):
    ws = workspace(base, tmp_path)
    cmd = make(ws)
    before = snapshot(ws)
    proc = sh(cmd, ws, limit=LIMIT.get(name), env=ENV.get(name))
    check_refusal(name, fragments, proc.returncode, proc.stdout + proc.stderr, before, snapshot(ws))


def engine_not_reached(*args, **kwargs):
    raise AssertionError("the parser accepted this command: list the case in ENGINE if the engine refuses it")


def entry_point(cmd, name, monkeypatch):
    """(the function the command runs once its process is set up, its arguments) for a case's command."""
    cmd = [str(c) for c in cmd]
    if cmd[:2] == [str(c) for c in RUN]:
        from ernie_mtl import main
        from ernie_mtl.engine import run

        if name not in ENGINE:  # the parser's refusal: no engine function may run
            for function in ("train", "predict", "evaluate", "plan", "prebuild"):
                monkeypatch.setattr(run, function, engine_not_reached)
        return main.run_command, cmd[2:]
    if cmd[:2] == [str(c) for c in S2D]:
        from ernie_mtl.convert import cli

        return cli.main, cmd[2:]
    assert cmd[0] == sys.executable and cmd[1] == "-m", cmd
    return importlib.import_module(cmd[2]).main, cmd[3:]


@contextlib.contextmanager
def captured_output():
    """stdout and stderr of this process, and the ernie_mtl logger's lines, as one text."""
    from helpers import captured_command

    text = io.StringIO()
    with captured_command(text, text):
        yield text


@pytest.mark.parametrize("name,make,fragments", IN_PROCESS, ids=[c[0] for c in IN_PROCESS])
def test_refused_in_process_with_one_clear_message_and_nothing_changed(base, tmp_path, monkeypatch, name, make,
                                                                        fragments):
    ws = workspace(base, tmp_path)
    monkeypatch.chdir(ws)  # relative paths as the command run in this folder sees them
    function, argv = entry_point(make(ws), name, monkeypatch)
    before = snapshot(ws)
    with captured_output() as text:
        try:
            code = function(argv)
        except SystemExit as e:  # argparse's own refusals
            code = e.code
    check_refusal(name, fragments, code, text.getvalue(), before, snapshot(ws))
