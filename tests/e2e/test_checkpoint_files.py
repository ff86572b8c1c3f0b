"""Checkpoint files that are not what they should be, through the real tools (resume, warm start,
ernie-mtl-reshard, static_to_dynamic.py): garbage safetensors headers whose checksums were recomputed,
keys moved between tensor files, a tensor file the checkpoint does not list, outputs that would write over
a resumable checkpoint or the tool's own input, a weights-only average asked for its optimizer state, a
full disk during reshard. Each ends in one message naming the file and the fix (exit 2), and nothing
already written changes. Also: a Paddle-format and a portable checkpoint of one model average together
(training and the offline conversion once named one variable differently)."""
import zlib  # noqa: F401  (before paddle)

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import ROOT, ok, tiny_args, train

RUN = dict(max_steps=2, micro_batch_size=2, global_batch_size=2, checkpoint_steps=1, save_steps=1, keep_last=5,
           logging_freq=1, eval_freq=1000, num_workers=0)


@pytest.fixture(scope="module")
def runs(demo, tmp_path_factory):
    """{format: output_dir} of two 2-step runs of one model (same seed), in each checkpoint format."""
    tmp = tmp_path_factory.mktemp("ckpt")
    out = {}
    for fmt in ("paddle", "portable"):
        ok(train(tiny_args(demo, tmp / fmt, checkpoint_format=fmt, **RUN), cwd=tmp))
        out[fmt] = tmp / fmt
    return out


def tool(name, *args, cwd, env=None):
    module = {"reshard": "ernie_mtl.convert.reshard_cli", "convert": "ernie_mtl.convert.cli"}[name]
    code = f"import zlib, sys; from {module} import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          env={**__import__("os").environ, "PYTHONPATH": str(ROOT), **(env or {})}, timeout=300)


def refused(proc, *words):
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "Traceback" not in text, text[-3000:]
    for w in words:
        assert w in text, (w, text[-3000:])
    return text


def rehash(path):
    """Record a hand-edited checkpoint's files again (train_state.json and the writer's record) so the edit
    reaches the reader instead of the checksum check."""
    from ernie_mtl.checkpoint import sha1_of

    raw = json.loads((path / "train_state.json").read_text())
    files = sorted(str(p.relative_to(path)) for p in (path / "tensors").glob("*.safetensors"))
    raw["files"] = {rel: {"size": (path / rel).stat().st_size, "sha1": sha1_of(path / rel)} for rel in files}
    (path / "train_state.json").write_text(json.dumps(raw))
    for sums in (path / "state").glob("rank_*.sha1"):
        sums.unlink()
    (path / "state" / "rank_0.sha1").write_text(json.dumps(raw["files"]))


def snapshot(folder):
    return sorted((str(p.relative_to(folder)), p.stat().st_size, p.stat().st_mtime_ns)
                  for p in Path(folder).rglob("*") if p.is_file())


def copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def with_header(file, header: bytes):
    """Replace a safetensors file's JSON header, keeping its data."""
    data = file.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    file.write_bytes(struct.pack("<Q", len(header)) + header + data[8 + n:])


GARBAGE = {
    "not an object": b"[1, 2, 3]",
    "offsets outside the file": None,  # built from the real header below
    "nested": b"[" * 100_000 + b"]" * 100_000,
    "unknown dtype": None,
}


@pytest.mark.parametrize("kind", list(GARBAGE))
def test_a_garbage_safetensors_header_is_refused_by_inspect(runs, tmp_path, kind):
    ckpt = copy(runs["portable"] / "model_last", tmp_path / "model_2")
    file = sorted((ckpt / "tensors").glob("*.safetensors"))[1]
    header = GARBAGE[kind]
    if header is None:
        real = json.loads(file.read_bytes()[8:8 + struct.unpack("<Q", file.read_bytes()[:8])[0]])
        key = next(k for k in real if k != "__metadata__")
        if kind == "unknown dtype":
            real[key]["dtype"] = "F128"
        else:
            real[key]["data_offsets"] = [0, 10 ** 9]
        header = json.dumps(real).encode()
    with_header(file, header)
    rehash(ckpt)
    refused(tool("reshard", ckpt, "--inspect", cwd=tmp_path), f"{file}", "damaged safetensors header")


def test_a_garbage_header_is_refused_by_resume_and_warm_start(runs, demo, tmp_path):
    out = tmp_path / "run"
    copy(runs["portable"], out)
    file = sorted((out / "model_last" / "tensors").glob("*.safetensors"))[2]
    with_header(file, b'{"x": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 4]}}')
    rehash(out / "model_last")
    before = snapshot(out)
    proc = train(tiny_args(demo, out, checkpoint_format="portable", resume=out / "model_last", **RUN), cwd=tmp_path)
    refused(proc, str(file), "damaged safetensors header", "not a list of non-negative integers")
    assert snapshot(out) == before
    warm = train(tiny_args(demo, tmp_path / "warm", init_from=out / "model_last", **RUN), cwd=tmp_path)
    refused(warm, str(file), "damaged safetensors header")


def test_keys_moved_between_tensor_files_or_an_unlisted_file_are_refused(runs, demo, tmp_path):
    from ernie_mtl.checkpoint.portable import read_file, write_file

    out = tmp_path / "run"
    copy(runs["portable"], out)
    ckpt = out / "model_last"
    a, b = sorted((ckpt / "tensors").glob("ernie.encoder.layers.0.*.safetensors"))[:2]
    ta, tb = read_file(a), read_file(b)
    write_file(a, tb)  # each file now holds the other's tensors under the other's keys
    write_file(b, ta)
    rehash(ckpt)
    proc = train(tiny_args(demo, out, checkpoint_format="portable", resume=ckpt, **RUN), cwd=tmp_path)
    refused(proc, "the tensor files were edited or mixed up")

    out2 = tmp_path / "run2"
    copy(runs["portable"], out2)
    extra = out2 / "model_last" / "tensors" / "ernie.extra.weight.safetensors"
    write_file(extra, {"ernie.extra.weight": np.zeros(3, np.float32)})
    proc = train(tiny_args(demo, out2, checkpoint_format="portable", resume=out2 / "model_last", **RUN), cwd=tmp_path)
    refused(proc, f"{extra} is not listed in {out2 / 'model_last' / 'train_state.json'}")


def test_no_tool_writes_over_a_resumable_checkpoint_or_its_own_input(runs, tmp_path):
    run = copy(runs["portable"], tmp_path / "run")
    before = snapshot(run)
    cases = [
        (tool("reshard", run / "model_1", run / "model_last", "--average", "--output", run / "model_2", "--overwrite",
              cwd=tmp_path), "--output", "is a checkpoint a run can resume (step 2)"),
        (tool("reshard", run / "model_1", run / "model_2", "--average", "--output", run / "model_2", "--overwrite",
              cwd=tmp_path), "--output", "is the input"),
        (tool("reshard", run / "model_1", "--output", run, "--overwrite", cwd=tmp_path), "--output", "holds the input"),
        (tool("convert", "--input", run / "model_last", "--output_dir", run / "model_last", "--overwrite",
              cwd=tmp_path), "--output_dir", "is the input"),
        (tool("convert", "--input", run / "model_1", "--output_dir", run / "model_2", "--overwrite", cwd=tmp_path),
         "--output_dir", "is a checkpoint a run can resume"),
    ]
    for proc, flag, words in cases:
        refused(proc, flag, words)
    assert snapshot(run) == before


def test_a_weights_only_average_is_not_asked_for_optimizer_state(runs, demo, tmp_path):
    avg = tmp_path / "avg"
    ok(tool("reshard", runs["portable"] / "model_1", runs["portable"] / "model_last", "--average", "--output", avg,
            cwd=tmp_path))
    refused(tool("convert", "--input", avg, "--output_dir", tmp_path / "conv", "--with_optimizer", cwd=tmp_path),
            f"--with_optimizer: {avg} is weights only (the mean of 2 checkpoints", "drop --with_optimizer")
    proc = train(tiny_args(demo, tmp_path / "warm", init_from=avg, init_optimizer="true", **RUN), cwd=tmp_path)
    refused(proc, f"--init_optimizer: --init_from {avg} is weights only", "drop --init_optimizer")
    assert not (tmp_path / "conv").exists() and not (tmp_path / "warm" / "model_last").exists()


def test_a_paddle_format_and_a_portable_checkpoint_of_one_model_average(runs, tmp_path):
    """Training stored the pretraining decoder's bias under `decoder_bias`, the offline conversion under
    `decoder.bias` (one variable, two structured names): the average refused them as other models."""
    avg = tmp_path / "avg"
    ok(tool("reshard", runs["paddle"] / "model_last", runs["portable"] / "model_last", "--average", "--output", avg,
            cwd=tmp_path))
    converted = tmp_path / "converted"
    ok(tool("reshard", runs["paddle"] / "model_last", "--output", converted, cwd=tmp_path))
    ok(tool("reshard", converted, runs["portable"] / "model_last", "--average", "--output", tmp_path / "avg2",
            cwd=tmp_path))


def test_a_full_disk_during_reshard_names_the_output_and_leaves_nothing(runs, tmp_path):
    out = tmp_path / "portable"
    limit = 64 * 1024
    code = ("import zlib, resource, signal, sys\n"
            "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
            f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))\n"
            "from ernie_mtl.convert.reshard_cli import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    proc = subprocess.run([sys.executable, "-c", code, str(runs["paddle"] / "model_last"), "--output", str(out)],
                          cwd=tmp_path, capture_output=True, text=True, env={**__import__("os").environ,
                                                                               "PYTHONPATH": str(ROOT)})
    refused(proc, f"cannot write {out}: File too large", "nothing was written")
    assert not out.exists() and not list(tmp_path.glob(".portable*"))


def test_a_missing_tensor_file_or_an_edited_format_is_named_as_damage(runs, tmp_path):
    """Both used to be blamed on something else: a removed (and unlisted) tensor file on "this topology", a
    portable checkpoint whose state_format was edited on a missing rank_0.pdparams."""
    ckpt = copy(runs["portable"] / "model_last", tmp_path / "model_2")
    gone = sorted((ckpt / "tensors").glob("ernie.encoder.layers.1.*.safetensors"))[0]
    gone.unlink()
    rehash(ckpt)
    refused(tool("reshard", ckpt, "--output", tmp_path / "out", cwd=tmp_path),
            f"{ckpt} lacks the tensors of 1 variable(s) its name map lists ({gone.name[:-len('.safetensors')]})",
            "a tensor file is missing")
    edited = copy(runs["portable"] / "model_last", tmp_path / "edited" / "model_2")
    raw = json.loads((edited / "train_state.json").read_text())
    raw["state_format"] = "paddle"
    (edited / "train_state.json").write_text(json.dumps(raw))
    refused(tool("reshard", edited, "--inspect", cwd=tmp_path),
            "it says the Paddle format, but the folder holds tensors/", "state_format was edited")
    raw["state_format"] = "pdparams"
    (edited / "train_state.json").write_text(json.dumps(raw))
    refused(tool("reshard", edited, "--inspect", cwd=tmp_path), "state_format 'pdparams' is none of")
