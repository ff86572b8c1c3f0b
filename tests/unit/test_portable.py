"""The topology-free checkpoint format (ernie_mtl/checkpoint/portable.py): safetensors files read back
bitwise (with NumPy alone, and as the safetensors layout specifies), every rank writing its share in
parallel, the store's integrity checks on it, and the offline tools (ernie-mtl-reshard: convert,
inspect, average)."""
import zlib  # noqa: F401  (before paddle)

import json
import struct

import numpy as np
import pytest

from ernie_mtl.checkpoint import offline, portable
from ernie_mtl.checkpoint.store import CheckpointError, Checkpointer, TrainState, merged_state, read_train_state_file

NAME_MAP = {"ernie.embeddings.word_embeddings.weight": "embedding_0.w_0", "ernie.pooler.dense.weight": "linear_0.w_0",
            "ernie.pooler.dense.bias": "linear_0.b_0", "heads.pretrain.decoder_weight": "embedding_0.w_0"}


def test_a_file_reads_back_bitwise_and_follows_the_safetensors_layout(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {"w": rng.standard_normal((3, 5)).astype("float32"), "h": rng.standard_normal(4).astype("float16"),
               "bf16_bits": rng.integers(0, 2**16, (2, 2)).astype("uint16"), "step": np.array([7], "int32"),
               "count": np.array(3, "int64"), "flag": np.array([True, False]), "empty": np.zeros((0, 4), "float32")}
    entry = portable.write_file(tmp_path / "a.safetensors", tensors, metadata={"format": "pt"})
    raw = (tmp_path / "a.safetensors").read_bytes()
    assert entry["size"] == len(raw) and len(entry["sha1"]) == 40
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    assert (8 + n) % 8 == 0 and header["__metadata__"] == {"format": "pt"}
    assert header["w"] == {"dtype": "F32", "shape": [3, 5], "data_offsets": header["w"]["data_offsets"]}
    assert header["bf16_bits"]["dtype"] == "U16" and header["flag"]["dtype"] == "BOOL"
    begin, end = header["w"]["data_offsets"]
    assert np.array_equal(np.frombuffer(raw[8 + n + begin:8 + n + end], "<f4").reshape(3, 5), tensors["w"])
    back = portable.read_file(tmp_path / "a.safetensors")
    assert sorted(back) == sorted(tensors)
    for k, v in tensors.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape and np.array_equal(back[k], v), k
    assert sorted(portable.read_file(tmp_path / "a.safetensors", ["w", "nope"])) == ["w"]


def test_damaged_files_are_named(tmp_path):
    path = tmp_path / "a.safetensors"
    portable.write_file(path, {"w": np.ones((64, 64), "float32")})
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(portable.PortableError, match=r"tensor 'w' has its bytes at 0..16384, outside the file's 16284 "
                                                     r"bytes of data \(truncated\?\)"):
        portable.read_file(path)
    path.write_bytes(b"\xff" * 16)
    with pytest.raises(portable.PortableError, match="header length .* beyond the file"):
        portable.read_file(path)


def test_groups_by_parameter_and_shares_for_parallel_writers():
    params = {"ernie.pooler.dense.weight", "ernie.pooler.dense.bias"}
    assert portable.group_of("ernie.pooler.dense.weight_moment1_0", params) == "ernie.pooler.dense.weight"
    assert portable.group_of("ernie.pooler.dense.bias@EMA", params) == "ernie.pooler.dense.bias"
    assert portable.group_of("loss_scaling_0", params) == portable.RUN_GROUP
    groups = [portable.RUN_GROUP] + [f"p{i}" for i in range(7)]
    shares = [portable.share(groups, r, 3) for r in range(3)]
    assert shares[0][0] == portable.RUN_GROUP and sorted(sum(shares, [])) == sorted(groups)
    assert [len(s) for s in shares] == [4, 2, 2]


# -- the store writes and reads it ------------------------------------------------------------------------------
def _rank_states():
    """What every rank's program holds without sharding (structured keys), as fake tensors."""
    rng = np.random.default_rng(1)
    full = {"ernie.embeddings.word_embeddings.weight": rng.standard_normal((6, 4)).astype("float32"),
            "ernie.embeddings.word_embeddings.weight_moment1_0": rng.standard_normal((6, 4)).astype("float32"),
            "ernie.pooler.dense.weight": rng.standard_normal((4, 4)).astype("float32"),
            "ernie.pooler.dense.weight@EMA": rng.standard_normal((4, 4)).astype("float32"),
            "ernie.pooler.dense.bias": rng.standard_normal(4).astype("float32"),
            "loss_scaling_0": np.array([32768.0], "float32")}
    return full


def _checkpointers(tmp_path, world, written):
    params = {"ernie.embeddings.word_embeddings.weight", "ernie.pooler.dense.weight", "ernie.pooler.dense.bias"}
    full = _rank_states()
    grouped = portable.grouped(full, params)

    def state_of(rank):
        def pick(choose):
            chosen = choose(sorted(grouped))
            written[rank] = chosen
            return {g: grouped[g] for g in chosen}
        return pick

    def unused(prefix):
        raise AssertionError("the portable format does not use paddle.static.save")

    return full, [Checkpointer(tmp_path, rank=r, world_size=world, per_rank_state=False, save_program_state=unused,
                               load_program_state=unused, state_format="portable", portable_state=state_of(r),
                               log=lambda m: None) for r in range(world)]


def _state(step=2):
    return TrainState(step=step, consumed_samples=8, lr_scheduler={"last_epoch": step}, name_map=dict(NAME_MAP),
                      topology={"world_size": 1, "dp_degree": 1, "sharding_degree": 1, "micro_batch_size": 2,
                                "global_batch_size": 4})


def test_a_portable_checkpoint_is_verified_and_read_by_name(tmp_path):
    written = {}
    full, (cp,) = _checkpointers(tmp_path, 1, written)
    path = cp.save("model_2", _state())
    raw = read_train_state_file(path)
    assert raw["state_format"] == "portable" and sorted(p.name for p in (path / "tensors").iterdir()) == [
        "@run.safetensors", "ernie.embeddings.word_embeddings.weight.safetensors",
        "ernie.pooler.dense.bias.safetensors", "ernie.pooler.dense.weight.safetensors"]
    assert json.loads((path / "state" / "rank_0.sha1").read_text()) == raw["files"]
    back = portable.read_tensors(path)
    assert sorted(back) == sorted(full) and all(np.array_equal(back[k], full[k]) for k in full)
    static = merged_state(path)  # readers of Paddle-format states get static names
    assert np.array_equal(static["embedding_0.w_0_moment1_0"],
                          full["ernie.embeddings.word_embeddings.weight_moment1_0"])
    assert np.array_equal(static["linear_0.w_0@EMA"], full["ernie.pooler.dense.weight@EMA"])
    # damage: a changed byte, a missing record
    victim = path / "tensors" / "ernie.pooler.dense.bias.safetensors"
    data = bytearray(victim.read_bytes())
    data[-1] ^= 1
    victim.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="ernie.pooler.dense.bias.safetensors is damaged: its SHA-1 differs"):
        merged_state(path)
    (path / "state" / "rank_0.sha1").unlink()
    with pytest.raises(CheckpointError, match="disagree with .*train_state.json about .*a record is missing"):
        merged_state(path)


def test_without_sharding_every_rank_writes_a_share(tmp_path):
    """Three ranks holding the same state write disjoint shares of it (rank 0 the run-level group), at
    the same time in a real job; together the complete set, each rank recording its own files."""
    written = {}
    full, cps = _checkpointers(tmp_path, 3, written)
    for cp in cps[1:]:  # the folder exists once rank 0 made it (a barrier in a real job)
        cp._barrier = lambda *a, **k: None
    path = tmp_path / ".model_last.tmp"
    (path / "state").mkdir(parents=True)
    for cp in cps:
        cp._save_portable(path)
    assert sorted(sum(written.values(), [])) == ["@run", "ernie.embeddings.word_embeddings.weight",
                                                 "ernie.pooler.dense.bias", "ernie.pooler.dense.weight"]
    records = [json.loads((path / "state" / f"rank_{r}.sha1").read_text()) for r in range(3)]
    assert all(records) and not set(records[0]) & set(records[1]) and len(set().union(*records)) == 4
    assert "tensors/@run.safetensors" in records[0]


# -- offline ---------------------------------------------------------------------------------------------------
def test_convert_and_average_offline(tmp_path):
    written = {}
    full, (cp,) = _checkpointers(tmp_path / "run", 1, written)
    a = cp.save("model_2", _state(2))
    b = cp.save("model_4", _state(4))
    out, n = offline.convert_checkpoint(a, tmp_path / "copy")
    assert n == len(full) and read_train_state_file(out)["step"] == 2
    assert all(np.array_equal(portable.read_tensors(out)[k], full[k]) for k in full)
    with pytest.raises(CheckpointError, match="exists; choose another --output or pass --overwrite"):
        offline.convert_checkpoint(a, (tmp_path / "other").mkdir() or tmp_path / "other")
    for overwrite in (False, True):  # a resumable checkpoint is never replaced, --overwrite or not
        with pytest.raises(CheckpointError, match=r"is a checkpoint a run can resume \(step 2\); no tool replaces one"):
            offline.convert_checkpoint(b, tmp_path / "copy", overwrite=overwrite)
    with pytest.raises(CheckpointError, match="model_<step> must hold that step"):
        offline.convert_checkpoint(a, tmp_path / "model_9")
    avg, n = offline.average_checkpoints([a, b], tmp_path / "avg")
    raw = read_train_state_file(avg)
    assert raw["weights_only"] is True and raw["step"] == 4 and n == 3  # the three weights, no optimizer state
    assert sorted(portable.read_tensors(avg)) == ["ernie.embeddings.word_embeddings.weight",
                                                 "ernie.pooler.dense.bias", "ernie.pooler.dense.weight"]
    from ernie_mtl.checkpoint.reshard import ReshardError, decide

    with pytest.raises(ReshardError, match="holds weights only .* start a new run from it with --init_from"):
        decide(raw, raw["topology"], flag_mode=True)
