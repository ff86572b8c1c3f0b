"""Hostile input for the data tools: a full disk, unwritable or impossible output paths, vocabularies
without the special tokens, undecodable or empty input. Each is one message on stderr (no
traceback unless ERNIE_MTL_DEBUG=1), exit status 2, and nothing left behind: no temporary file,
no partial output, a previous complete output untouched. The tools run in subprocesses, as users
run them; a full disk is simulated without root by a file size limit (RLIMIT_FSIZE with SIGXFSZ
ignored: writes past the limit fail with EFBIG, as they fail with ENOSPC on a full disk)."""
import zlib  # noqa: F401  (before paddle: paddle 2.6.2 exports clashing zlib symbols)

import itertools
import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from data_tools import demo_corpus
from data_tools.tokenization import SPECIAL_TOKENS

ROOT = Path(__file__).resolve().parents[2]
PROG = "data_tools.create_pretraining_data"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """200 People's Daily articles (JSON lines, about 400 KB of tokens) and a vocab of their characters."""
    root = tmp_path_factory.mktemp("data")
    docs = ["\n".join(d) for d in itertools.islice(demo_corpus.iter_peoples_daily_documents(), 200)]
    src = root / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in docs), encoding="utf-8")
    chars = sorted({c for d in docs for c in d.lower() if not c.isspace()})
    vocab = root / "vocab.txt"
    vocab.write_text("".join(t + "\n" for t in list(SPECIAL_TOKENS) + chars + ["##" + c for c in chars]),
                     encoding="utf-8")
    return src, vocab


def run(module, *args, limit=None, env=None):
    def preexec():
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, preexec_fn=preexec, env=dict(os.environ, **(env or {})))


def assert_one_error(proc, prog, *fragments):
    """Exit 2, no traceback, the error is the last line of stderr and says what it must."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr and "During handling" not in proc.stderr
    error = proc.stderr[proc.stderr.index(f"{prog}: error: "):]
    assert proc.stderr.count(f"{prog}: error: ") == 1
    for fragment in fragments:
        assert fragment in error, error
    return error


@pytest.mark.parametrize("workers", ["1", "2"])
def test_full_disk_one_message_nothing_left_previous_output_kept(data, tmp_path, workers):
    src, vocab = data
    out = tmp_path / "corpus"
    assert run(PROG, "--input", src, "--vocab_file", vocab, "--output_prefix", out).returncode == 0
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    # the .bin of a whole-word run is the same size; 60 KB of it fit
    proc = run(PROG, "--input", src, "--vocab_file", vocab, "--output_prefix", out, "--cn_whole_word_segment",
               "--workers", workers, "--chunk_docs", "16", limit=60_000)
    error = assert_one_error(proc, PROG, f"cannot write {out}.bin/.idx/.json: File too large",
                             "ulimit -f", "nothing was written (temporary files removed)")
    assert error.count("\n") == 1
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # no temporary file, old output intact


def test_impossible_output_paths(data, tmp_path):
    src, vocab = data
    afile = tmp_path / "afile"
    afile.write_text("x")
    proc = run(PROG, "--input", src, "--vocab_file", vocab, "--output_prefix", afile / "sub" / "corpus")
    assert_one_error(proc, PROG, f"--output_prefix {afile / 'sub' / 'corpus'}: {afile} is a file, not a folder")
    proc = run(PROG, "--input", src, "--vocab_file", vocab, "--output_prefix", tmp_path)
    assert_one_error(proc, PROG, "is a directory")
    if os.geteuid() != 0:  # root writes into read-only folders: the size-limit test covers root
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o555)
        try:
            proc = run(PROG, "--input", src, "--vocab_file", vocab, "--output_prefix", locked / "corpus")
            assert_one_error(proc, PROG, f"cannot write {locked / 'corpus'}.bin/.idx/.json: Permission denied")
            assert os.listdir(locked) == []
        finally:
            locked.chmod(0o755)
    assert sorted(os.listdir(tmp_path)) == ["afile"]


def test_vocab_without_special_tokens_is_refused_before_any_work(data, tmp_path):
    src, vocab = data
    tokens = vocab.read_text(encoding="utf-8").split("\n")
    bad = tmp_path / "vocab.txt"
    bad.write_text("\n".join(t for t in tokens if t not in ("[MASK]", "[PAD]")), encoding="utf-8")
    proc = run(PROG, "--input", src, "--vocab_file", bad, "--output_prefix", tmp_path / "corpus")
    assert_one_error(proc, PROG, f"--vocab_file {bad}: lacks the special token(s) [PAD] [MASK]",
                     "python -m data_tools.build_vocab")
    not_text = tmp_path / "vocab.bin"
    not_text.write_bytes(b"\xff\xfe\x00[PAD]\n")
    proc = run(PROG, "--input", src, "--vocab_file", not_text, "--output_prefix", tmp_path / "corpus")
    assert_one_error(proc, PROG, f"--vocab_file {not_text}: not a UTF-8 text file")
    assert sorted(os.listdir(tmp_path)) == ["vocab.bin", "vocab.txt"]


def test_invalid_utf8_is_a_counted_malformed_line_with_file_and_line(data, tmp_path):
    src, vocab = data
    lines = src.read_bytes().split(b"\n")[:50]
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"\n".join(lines[:3] + [b'{"text": "\xe4\xb8 broken"}',
                                            b'{"text": "\\ud800 lone"}'] + lines[3:]) + b"\n")
    text = tmp_path / "bad.txt"
    text.write_bytes("第一段。\n".encode() + b"\xff\xfe bad line\n" + "同一段。\n\n第二段。\n".encode())
    out = tmp_path / "corpus"
    proc = run(PROG, "--input", bad, text, "--vocab_file", vocab, "--output_prefix", out, "--max_malformed", "3")
    assert proc.returncode == 0, proc.stderr
    assert f"{bad}:4: not valid UTF-8 (invalid continuation byte at byte 10)" in proc.stderr
    assert f"{bad}:5: not valid Unicode (a lone surrogate" in proc.stderr
    assert f"{text}:2: not valid UTF-8 (invalid start byte at byte 0)" in proc.stderr
    meta = json.loads(Path(f"{out}.json").read_text())
    assert meta["malformed_lines"] == 3 and meta["documents"] == 50 + 2  # the bad line is left out of its document
    proc = run(PROG, "--input", bad, text, "--vocab_file", vocab, "--output_prefix", tmp_path / "strict",
               "--max_malformed", "2")
    assert_one_error(proc, PROG, "more than 2 malformed lines (--max_malformed 2)", "nothing was written")
    assert not any(p.name.startswith("strict") for p in tmp_path.iterdir())


def test_input_without_text_is_refused(data, tmp_path):
    _, vocab = data
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    proc = run(PROG, "--input", empty, "--vocab_file", vocab, "--output_prefix", tmp_path / "corpus")
    assert_one_error(proc, PROG, f"--input {empty}: no documents", "nothing was written")
    blank = tmp_path / "blank.jsonl"
    blank.write_text('{"text": "  "}\n{"text": "\\u0000\\u200b"}\n', encoding="utf-8")
    proc = run(PROG, "--input", blank, "--vocab_file", vocab, "--output_prefix", tmp_path / "corpus")
    assert_one_error(proc, PROG, "none of the 2 records has text that gives a token (2 empty documents")
    assert sorted(os.listdir(tmp_path)) == ["blank.jsonl", "empty.jsonl"]


def test_debug_variable_shows_the_traceback(data, tmp_path):
    src, vocab = data
    bad = tmp_path / "vocab.txt"
    bad.write_text("[CLS]\n", encoding="utf-8")
    proc = run(PROG, "--input", src, "--vocab_file", bad, "--output_prefix", tmp_path / "c",
               env={"ERNIE_MTL_DEBUG": "1"})
    assert proc.returncode == 2 and "Traceback" in proc.stderr and f"{PROG}: error: " in proc.stderr


@pytest.mark.parametrize("module,args,fragment", [
    ("data_tools.create_pretraining_data", ["--input", "nope.jsonl", "--vocab_file", "v.txt", "--output_prefix", "o",
                                            "--workers", "0"], "--workers 0: must be >= 1"),
    ("data_tools.build_vocab", ["--input", "nope.jsonl", "--output", "v.txt"], "--input nope.jsonl: no such file"),
    ("data_tools.merge", ["--inputs", "nope", "--output_prefix", "o"], "nope.bin and nope.idx not found"),
])
def test_every_entry_point_uses_the_one_error_style(module, args, fragment, tmp_path):
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert_one_error(proc, module, fragment)


def test_builder_removes_temporary_files_when_closing_fails(tmp_path):
    """On a full disk, closing a temporary file fails too (its buffered bytes cannot be flushed):
    the files are removed all the same and the original error is the one reported."""
    import errno

    import numpy as np

    from data_tools.indexed_dataset import IndexedDatasetBuilder

    class FullDisk:
        def __init__(self, f):
            self.f = f

        def __getattr__(self, name):
            return getattr(self.f, name)

        def close(self):
            self.f.close()
            raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError) as info:
        with IndexedDatasetBuilder(tmp_path / "corpus", np.uint16) as b:
            b.add_sentence([1, 2, 3])
            b._bin, b._sizes_f, b._docs_f = FullDisk(b._bin), FullDisk(b._sizes_f), FullDisk(b._docs_f)
            raise OSError(errno.ENOSPC, "No space left on device", "the first error")
    assert info.value.filename == "the first error" and info.value.__context__ is None
    assert os.listdir(tmp_path) == []
