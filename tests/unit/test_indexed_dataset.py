"""The MMIDIDX `.bin/.idx` format: round trips, byte layout, validation, pickling, atomic writes."""
import zlib  # noqa: F401  (before paddle: paddle 2.6.2 exports clashing zlib symbols)

import os
import pickle
import struct

import numpy as np
import pytest

from data_tools.indexed_dataset import (HEADER_SIZE, IndexedDatasetBuilder, IndexedDatasetError,
                                        MMapIndexedDataset, best_dtype, file_identity)

# The README's worked example: document 0 = sentences [5, 6, 7] and [8, 9]; document 1 = [65535].
EXAMPLE = [[[5, 6, 7], [8, 9]], [[65535]]]
EXAMPLE_IDX_HEX = (
    "4d4d4944494458000001000000000000000803000000000000000300000000000000"  # 34-byte header
    "030000000200000001000000"  # sizes int32[3]
    "000000000000000006000000000000000a00000000000000"  # byte pointers int64[3]
    "000000000000000002000000000000000300000000000000"  # doc_idx int64[3]
)
EXAMPLE_BIN_HEX = "05000600070008000900ffff"


def _write(prefix, docs, dtype=np.uint16):
    with IndexedDatasetBuilder(prefix, dtype) as b:
        for doc in docs:
            for sent in doc:
                b.add_sentence(np.array(sent))
            b.end_document()
        return b.finalize()


def _random_docs(rng, n_docs, high):
    return [[rng.integers(0, high, size=int(rng.integers(1, 40))).tolist() for _ in range(int(rng.integers(1, 6)))]
            for _ in range(n_docs)]


@pytest.mark.parametrize("dtype,high", [(np.uint16, 65535), (np.int32, 2**31 - 1)])
def test_round_trip(tmp_path, dtype, high):
    docs = _random_docs(np.random.default_rng(1), 50, high)
    stats = _write(tmp_path / "c", docs, dtype)
    ds = MMapIndexedDataset(tmp_path / "c")
    flat = [s for d in docs for s in d]
    assert (stats["documents"], stats["sequences"], stats["tokens"]) == (50, len(flat), sum(map(len, flat)))
    assert len(ds) == len(flat) and ds.num_docs == 50 and ds.dtype == np.dtype(dtype)
    assert ds.sizes.dtype == np.int32 and ds.pointers.dtype == np.int64 and ds.doc_idx.dtype == np.int64
    assert ds.doc_idx.tolist() == np.cumsum([0] + [len(d) for d in docs]).tolist()
    for i, sent in enumerate(flat):
        assert ds[i].tolist() == sent
    assert ds[-1].tolist() == flat[-1]
    assert [a.tolist() for a in ds[2:5]] == flat[2:5]
    assert ds.get(0, offset=1, length=1).tolist() == flat[0][1:2]
    ds.verify()
    assert ds[0].base is not None and not ds[0].flags.writeable  # a view of the map, not a copy


def test_bulk_add_documents_writes_identical_files(tmp_path):
    docs = _random_docs(np.random.default_rng(2), 30, 60000)
    _write(tmp_path / "a", docs)
    with IndexedDatasetBuilder(tmp_path / "b", np.uint16) as b:
        for chunk in (docs[:10], docs[10:]):
            sents = [s for d in chunk for s in d]
            b.add_documents(np.concatenate(sents), [len(s) for s in sents], [len(d) for d in chunk])
        b.finalize()
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"a{ext}").read_bytes() == (tmp_path / f"b{ext}").read_bytes()


def test_best_dtype():
    assert best_dtype(18000) == np.uint16 and best_dtype(65499) == np.uint16
    assert best_dtype(65500) == np.int32 and best_dtype(250000) == np.int32


def test_megatron_byte_layout(tmp_path):
    stats = _write(tmp_path / "ex", EXAMPLE)
    header = b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + bytes([8]) + struct.pack("<QQ", 3, 3)
    idx = (tmp_path / "ex.idx").read_bytes()
    assert len(header) == HEADER_SIZE == 34 and idx[:34] == header
    assert idx[34:] == np.array([3, 2, 1], "<i4").tobytes() + np.array([0, 6, 10], "<i8").tobytes() \
        + np.array([0, 2, 3], "<i8").tobytes()
    assert idx.hex() == EXAMPLE_IDX_HEX  # the hex shown in data_tools/README.md
    assert (tmp_path / "ex.bin").read_bytes().hex() == EXAMPLE_BIN_HEX
    assert stats["idx_bytes"] == 34 + 12 * 3 + 8 * 3 and stats["bin_bytes"] == 12


def test_empty_sentences_and_documents(tmp_path):
    with IndexedDatasetBuilder(tmp_path / "e", np.uint16) as b:
        with pytest.raises(ValueError, match="empty sentence"):
            b.add_sentence([])
        b.end_document()  # nothing open: no-op
        b.add_sentence([1])
        b.end_document()
        b.end_document()  # again: no-op
        b.add_sentence([2, 3])  # left open: finalize closes it
        stats = b.finalize()
    ds = MMapIndexedDataset(tmp_path / "e")
    assert stats["documents"] == 2 and ds.doc_idx.tolist() == [0, 1, 2]


@pytest.mark.parametrize("tokens", [[70000], [-1], [1.5]])
def test_refuses_tokens_out_of_dtype_range(tmp_path, tokens):
    with IndexedDatasetBuilder(tmp_path / "r", np.uint16) as b:
        with pytest.raises(ValueError, match="out of range|integers"):
            b.add_sentence(tokens)
        b.add_sentence([1])
        b.finalize()


def test_empty_dataset(tmp_path):
    with IndexedDatasetBuilder(tmp_path / "z", np.uint16) as b:
        b.finalize()
    ds = MMapIndexedDataset(tmp_path / "z")
    assert len(ds) == 0 and ds.num_docs == 0 and ds.doc_idx.tolist() == [0]


def test_pickle_reopens_from_prefix(tmp_path):
    _write(tmp_path / "p", EXAMPLE)
    ds = MMapIndexedDataset(str(tmp_path / "p"))
    blob = pickle.dumps(ds)
    assert len(blob) < 300  # the prefix, not the arrays
    clone = pickle.loads(blob)
    assert clone.path_prefix == ds.path_prefix and [clone[i].tolist() for i in range(3)] == [[5, 6, 7], [8, 9], [65535]]
    assert clone.doc_idx.tolist() == [0, 2, 3]


def test_failure_mid_write_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError, match="boom"):
        with IndexedDatasetBuilder(tmp_path / "f", np.uint16) as b:
            b.add_sentence([1, 2])
            b.end_document()
            raise RuntimeError("boom")
    assert os.listdir(tmp_path) == []
    with pytest.raises(RuntimeError, match="without finalize"):
        with IndexedDatasetBuilder(tmp_path / "g", np.uint16) as b:
            b.add_sentence([1])
    assert os.listdir(tmp_path) == []


def test_failed_rebuild_keeps_previous_complete_pair(tmp_path):
    _write(tmp_path / "k", EXAMPLE)
    before = {f: (tmp_path / f).read_bytes() for f in ("k.bin", "k.idx")}
    with pytest.raises(KeyError):
        with IndexedDatasetBuilder(tmp_path / "k", np.uint16) as b:
            b.add_sentence([1])
            raise KeyError("interrupted")
    assert sorted(os.listdir(tmp_path)) == ["k.bin", "k.idx"]
    assert {f: (tmp_path / f).read_bytes() for f in before} == before
    _write(tmp_path / "k", [[[7]]])  # a successful rebuild replaces both
    assert MMapIndexedDataset(tmp_path / "k")[0].tolist() == [7]


def test_file_identity_changes_with_content(tmp_path):
    _write(tmp_path / "i", EXAMPLE)
    first = file_identity(tmp_path / "i")
    assert set(first) == {"idx", "bin"} and set(first["bin"]) == {"size", "sha1"}
    assert file_identity(str(tmp_path / "i") + ".idx") == first
    os.utime(tmp_path / "i.bin", ns=(1, 1))  # touched, same bytes: the same data
    assert file_identity(tmp_path / "i") == first
    import hashlib

    assert first["bin"]["sha1"] == hashlib.sha1((tmp_path / "i.bin").read_bytes()).hexdigest()  # small: whole file
    _write(tmp_path / "i", EXAMPLE + [[[1, 2]]])
    assert file_identity(tmp_path / "i")["idx"] != first["idx"]
    with pytest.raises(IndexedDatasetError, match="not built"):
        file_identity(tmp_path / "missing")


# ---------------------------------------------------------------------------------------------
# Corruption: each defect raises IndexedDatasetError naming the file and the defect.

def _corrupt_idx(prefix, offset=None, data=None, truncate=None, append=b""):
    path = f"{prefix}.idx"
    raw = bytearray(open(path, "rb").read())
    if data is not None:
        raw[offset:offset + len(data)] = data
    if truncate is not None:
        raw = raw[:truncate]
    with open(path, "wb") as f:
        f.write(bytes(raw) + append)
    return path


DOC_IDX_OFFSET = 34 + 12 * 3

CORRUPTIONS = {
    "wrong magic": (dict(offset=0, data=b"NOTANIDX\x00"), "wrong magic"),
    "old TNTIDX": (dict(offset=0, data=b"TNTIDX\x00\x00\x00"), "TNTIDX"),
    "version": (dict(offset=9, data=struct.pack("<Q", 2)), "version 2"),
    "dtype code": (dict(offset=17, data=bytes([11])), "unknown dtype code 11"),
    "truncated": (dict(truncate=60), "truncated"),
    "trailing bytes": (dict(append=b"\x00" * 8), "trailing bytes"),
    "doc_idx start": (dict(offset=DOC_IDX_OFFSET, data=struct.pack("<q", 1)), "starts at 1, expected 0"),
    "doc_idx end": (dict(offset=DOC_IDX_OFFSET + 16, data=struct.pack("<q", 2)), "ends at 2, expected"),
    "doc_idx order": (dict(offset=DOC_IDX_OFFSET + 8, data=struct.pack("<q", 4)), "not monotonic"),
    "header too short": (dict(truncate=20), "shorter than the 34-byte"),
}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_corrupt_index_is_reported(tmp_path, case):
    _write(tmp_path / "c", EXAMPLE)
    kwargs, message = CORRUPTIONS[case]
    path = _corrupt_idx(tmp_path / "c", **kwargs)
    with pytest.raises(IndexedDatasetError) as err:
        MMapIndexedDataset(tmp_path / "c")
    assert path in str(err.value) and message in str(err.value)


def test_fairseq_style_index_is_named(tmp_path):
    path = tmp_path / "fs.idx"  # fairseq MMIDIDX: no document count, no document index
    path.write_bytes(b"MMIDIDX\x00\x00" + struct.pack("<QBQ", 1, 8, 2) + np.array([1, 1], "<i4").tobytes()
                     + np.array([0, 2], "<i8").tobytes())
    (tmp_path / "fs.bin").write_bytes(b"\x01\x00\x02\x00")
    with pytest.raises(IndexedDatasetError, match="fairseq-style"):
        MMapIndexedDataset(tmp_path / "fs")


def test_missing_files_and_inconsistent_bin(tmp_path):
    with pytest.raises(IndexedDatasetError, match=r"nope\.idx: index file not found"):
        MMapIndexedDataset(tmp_path / "nope")
    _write(tmp_path / "m", EXAMPLE)
    with open(tmp_path / "m.bin", "ab") as f:
        f.write(b"\x00\x00")
    with pytest.raises(IndexedDatasetError, match=r"m\.bin: data file has 14 bytes but its index .* 12 bytes"):
        MMapIndexedDataset(tmp_path / "m")
    os.remove(tmp_path / "m.bin")
    with pytest.raises(IndexedDatasetError, match=r"m\.bin: data file not found"):
        MMapIndexedDataset(tmp_path / "m")


def test_verify_catches_bad_pointer(tmp_path):
    _write(tmp_path / "v", EXAMPLE)
    _corrupt_idx(tmp_path / "v", offset=34 + 12 + 8, data=struct.pack("<q", 4))  # pointer 1: 6 -> 4
    ds = MMapIndexedDataset(tmp_path / "v")  # open-time checks pass (first/last pointer fine)
    with pytest.raises(IndexedDatasetError, match="byte pointer 1 is 4, expected 6"):
        ds.verify()


def test_interoperates_with_paddlenlp_reader_and_writer(tmp_path):
    from paddlenlp.data import indexed_dataset as pnlp

    docs = _random_docs(np.random.default_rng(3), 20, 30000)
    _write(tmp_path / "ours", docs)
    theirs = pnlp.MMapIndexedDataset(str(tmp_path / "ours"), skip_warmup=True)
    flat = [s for d in docs for s in d]
    assert [theirs[i].tolist() for i in range(len(flat))] == flat
    assert theirs.doc_idx.tolist() == MMapIndexedDataset(tmp_path / "ours").doc_idx.tolist()

    builder = pnlp.MMapIndexedDatasetBuilder(str(tmp_path / "pd.bin"), dtype=np.uint16)
    for doc in docs:
        for sent in doc:
            builder.add_item(np.array(sent, dtype=np.uint16))
        builder.end_document()
    builder.finalize(str(tmp_path / "pd.idx"))
    ours = MMapIndexedDataset(tmp_path / "pd")
    assert [ours[i].tolist() for i in range(len(ours))] == flat
    assert (tmp_path / "pd.idx").read_bytes() == (tmp_path / "ours.idx").read_bytes()


@pytest.mark.parametrize("change", ["zeroed in place", "truncated", "index truncated"])
def test_a_corpus_changed_under_a_reader_is_an_error_not_sigbus_or_zeros(tmp_path, change):
    """A truncated .bin under a memory map used to end the run with SIGBUS (nothing named); one zeroed in
    place trained on [PAD] to exit 0. Every read compares the files with what was mapped; a worker's copy
    (a pickle) compares with what the trainer mapped."""
    import time

    _write(tmp_path / "p", EXAMPLE)
    ds = MMapIndexedDataset(str(tmp_path / "p"))
    blob = pickle.dumps(ds)
    assert ds[0].tolist() == [5, 6, 7]
    time.sleep(0.01)  # a distinct modification time even on coarse clocks
    target = tmp_path / ("p.idx" if change == "index truncated" else "p.bin")
    size = target.stat().st_size
    with open(target, "r+b") as f:
        if change == "zeroed in place":
            f.write(b"\0" * size)
        else:
            f.truncate(size - 4)
    with pytest.raises(IndexedDatasetError) as e:
        ds[1]
    message = str(e.value)
    assert f"{tmp_path / 'p'}{target.suffix} changed while this run was reading it ({size:,} bytes" in message
    assert "must not be written" in message and "resumes from the last checkpoint" in message
    with pytest.raises(IndexedDatasetError) as e:  # a worker opening its copy after the change
        pickle.loads(blob)
    assert str(target) in str(e.value)  # "changed while ...", or the index check's own "index truncated"
