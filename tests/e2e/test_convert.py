"""static_to_dynamic: real checkpoints (single process, two-process sharded, BERT), an exported task
model, a multi-task name map; verification, clean PaddleNLP loading, the round trip back into a
static program, optimizer state and the error messages."""
import zlib  # noqa: F401  (before paddle)

import json
import logging
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest


from helpers import global_yaml, ok, rehash_checkpoint, tiny_args, train
from helpers import run_here as mtl_run
from helpers import run_in_process

from ernie_mtl.convert import converter as C


ROOT = Path(__file__).resolve().parents[2]
CLI = str(ROOT / "static_to_dynamic.py")


def run_cli(*argv):
    """static_to_dynamic.py's command, in this process (helpers.run_in_process); `cli_process` runs the script."""
    from ernie_mtl.convert import cli

    return run_in_process(argv, cwd=os.getcwd(), command=cli.main)


def cli_process(*argv):
    return subprocess.run([sys.executable, CLI, *map(str, argv)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def short_run(demo, out, cwd, **flags):
    common = dict(max_steps=2, logging_freq=1, eval_freq=2, eval_iters=1, checkpoint_steps=2, save_steps=100,
                  max_lr=5e-3, min_lr=1e-4, warmup_rate=0.25, max_seq_len=32)
    ok(train(tiny_args(demo, out, **{**common, **flags}), cwd=cwd, launch_procs=2 if flags.get("use_sharding") else 0))
    return out / "model_last"


@pytest.fixture(scope="module")
def flag_ckpt(demo, tmp_path_factory):
    """Single-process ERNIE pretraining checkpoint (flag mode: the task `pretrain`, head heads.pretrain.*)."""
    tmp = tmp_path_factory.mktemp("flag")
    return short_run(demo, tmp / "run", tmp, micro_batch_size=4)


@pytest.fixture(scope="module")
def sharded_ckpt(demo, tmp_path_factory):
    """Two gloo processes with sharding 2: every rank writes its own share."""
    tmp = tmp_path_factory.mktemp("sharded")
    return short_run(demo, tmp / "run", tmp, use_sharding="true", sharding_degree=2, micro_batch_size=2,
                     global_batch_size=8)


@pytest.fixture(scope="module")
def sharded_out(sharded_ckpt, tmp_path_factory):
    out = tmp_path_factory.mktemp("sharded_out") / "converted"
    proc = cli_process("--input", sharded_ckpt, "--output_dir", out, "--verify")  # the script itself, once
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out, proc.stdout


class PaddleNLPLog:
    """Records of paddlenlp's logger (it does not propagate to the root logger)."""

    def __enter__(self):
        self.records = []
        self.handler = logging.Handler()
        self.handler.emit = self.records.append
        logging.getLogger("PaddleNLP").addHandler(self.handler)
        return self

    def __exit__(self, *exc):
        logging.getLogger("PaddleNLP").removeHandler(self.handler)

    def warnings(self):
        return [r.getMessage() for r in self.records if r.levelno >= logging.WARNING]


def pickled(path):
    with open(path, "rb") as f:
        return {k: np.asarray(v) for k, v in pickle.load(f).items() if not k.startswith("StructuredToParameter")}


def load_dygraph(cls_name, path):
    import paddle
    import paddlenlp.transformers as T

    import paddle.distributed.fleet as fleet

    paddle.disable_static()
    fleet.fleet._hcg = None  # a program test in this process may have left a hybrid group behind
    with PaddleNLPLog() as log:
        model = getattr(T, cls_name).from_pretrained(str(path))
    return model, log.warnings()


@pytest.mark.slow
def test_sharded_checkpoint_merges_ranks_and_verifies(sharded_ckpt, sharded_out):
    out, stdout = sharded_out
    saved = json.loads((sharded_ckpt / "train_state.json").read_text())
    assert saved["per_rank_state"] is True and saved["world_size"] == 2
    rank0, rank1 = (pickled(sharded_ckpt / f"state/rank_{r}.pdparams") for r in (0, 1))
    assert rank0 and rank1 and not set(rank0) & set(rank1)  # each rank holds its own share only
    # the differences are printed on success too, all within 1e-5 (in fact bitwise here)
    lines = [line for line in stdout.splitlines() if "max |diff|" in line]
    assert [line.split(":")[0].strip() for line in lines] == ["sequence_output", "pooled_output",
                                                             "prediction_scores", "seq_relationship_score"]
    assert all(float(line.split("max |diff| ")[1].split()[0]) <= 1e-5 for line in lines)
    import paddle

    state = paddle.load(str(out / "model_state.pdparams"), return_numpy=True)
    merged = {**rank0, **rank1}
    # every PaddleNLP key, tied ones under each name: the pretrain task's head `heads.pretrain.*` is `cls.*`
    as_paddlenlp = {k.replace("heads.pretrain.", "cls.", 1): v for k, v in saved["name_map"].items()}
    assert set(state) == set(as_paddlenlp)
    for structured, static in as_paddlenlp.items():
        np.testing.assert_array_equal(state[structured], merged[static], err_msg=structured)
    assert sorted(p.name for p in out.iterdir()) == [
        "backbone", "config.json", "conversion.json", "heads", "model_state.pdparams", "special_tokens_map.json",
        "tokenizer_config.json", "vocab.txt"]  # no optimizer state unless asked for
    assert sorted(p.name for p in (out / "heads").iterdir()) == ["pretrain.json", "pretrain.pdparams"]
    assert not list(out.parent.glob(".converted*"))  # temporary folder renamed away


@pytest.mark.slow
def test_converted_directory_loads_in_paddlenlp_without_key_warnings(sharded_out):
    out, _ = sharded_out
    model, warnings = load_dygraph("ErnieForPretraining", out)
    assert warnings == []
    backbone, warnings = load_dygraph("ErnieModel", out / "backbone")
    assert warnings == []
    # the full directory also loads into ErnieModel: every backbone weight, the cls.* weights reported
    # unused (PaddleNLP's own behaviour for its pretraining checkpoints; see docs/convert.md)
    _, warnings = load_dygraph("ErnieModel", out)
    assert len(warnings) == 1 and "were not used" in warnings[0] and "newly initialized" not in warnings[0]
    np.testing.assert_array_equal(backbone.embeddings.word_embeddings.weight.numpy(),
                                  model.ernie.embeddings.word_embeddings.weight.numpy())
    from paddlenlp.transformers import ErnieTokenizer

    tokenizer = ErnieTokenizer.from_pretrained(str(out))
    vocab = (out / "vocab.txt").read_text(encoding="utf-8").split("\n")
    assert tokenizer.vocab_size == len([v for v in vocab if v]) and tokenizer.do_lower_case
    assert tokenizer.convert_tokens_to_ids(["[CLS]"]) == [vocab.index("[CLS]")]


@pytest.mark.slow
def test_round_trip_into_a_fresh_static_program_is_bitwise(sharded_ckpt, sharded_out):
    """checkpoint -> PaddleNLP directory -> load_pretrained_into_scope (how the static trainer starts from
    --model_name_or_path DIR) gives the same outputs as the checkpoint's own weights."""
    out, _ = sharded_out
    source = C.read_source(sharded_ckpt)
    arch = dict(source.arch, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    ref = C.build_static_reference("ernie", arch, pretraining=True)
    batch = C.verification_batch(arch, seed=3)
    original = C.run_static(ref, C.map_weights(source)[0], batch)
    reloaded = C.run_static(ref, out, batch)
    assert sorted(original) == ["pooled_output", "prediction_scores", "seq_relationship_score", "sequence_output"]
    for name in original:
        np.testing.assert_array_equal(original[name], reloaded[name], err_msg=name)
    assert np.abs(original["sequence_output"]).max() > 0.1  # a real forward, not zeros


@pytest.mark.slow
def test_flag_mode_with_optimizer_state(flag_ckpt, tmp_path):
    import paddle

    source = C.read_source(flag_ckpt, with_optimizer=True)
    result = C.convert(source, tmp_path / "out")
    assert result.pretraining_heads == "heads.pretrain" and result.filled == []
    diffs = C.verify(source, tmp_path / "out")
    assert max(d.max_abs_diff for d in diffs) <= 1e-5
    opt = paddle.load(str(tmp_path / "out" / "optimizer_state.pdparams"), return_numpy=True)
    pdopt = pickled(flag_ckpt / "state/rank_0.pdopt")
    name_map = json.loads((flag_ckpt / "train_state.json").read_text())["name_map"]
    params = set(name_map.values())
    assert len(opt) == 4 * len(params)  # moment1, moment2, beta1_pow, beta2_pow per parameter
    word = name_map["ernie.embeddings.word_embeddings.weight"]  # tied: keyed by the backbone name
    np.testing.assert_array_equal(opt["ernie.embeddings.word_embeddings.weight_moment1_0"], pdopt[f"{word}_moment1_0"])
    assert not any(k.startswith("cls.predictions.decoder.weight") for k in opt)
    # keyed like PaddleNLP's named_parameters(), so a dygraph optimizer can be fed parameter by parameter
    model, _ = load_dygraph("ErnieForPretraining", tmp_path / "out")
    accumulators = ("moment1_0", "moment2_0", "beta1_pow_acc_0", "beta2_pow_acc_0")
    assert set(opt) == {f"{k}_{a}" for k, _ in model.named_parameters() for a in accumulators}
    assert np.abs(opt["ernie.embeddings.word_embeddings.weight_moment2_0"]).max() > 0  # trained moments


@pytest.mark.slow
def test_bert_checkpoint(demo, tmp_path):
    ckpt = short_run(demo, tmp_path / "run", tmp_path, micro_batch_size=4, model_type="bert",
                     model_name_or_path="bert-tiny-test")
    proc = run_cli("--input", ckpt, "--output_dir", tmp_path / "out", "--verify")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "verified (atol 1e-05)" in proc.stdout
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["architectures"] == ["BertForPretraining"] and config["hidden_act"] == "gelu"
    assert load_dygraph("BertForPretraining", tmp_path / "out")[1] == []
    assert load_dygraph("BertModel", tmp_path / "out" / "backbone")[1] == []
    from paddlenlp.transformers import BertTokenizer

    assert BertTokenizer.from_pretrained(str(tmp_path / "out")).convert_tokens_to_ids("[SEP]") >= 0


@pytest.mark.slow
def test_multitask_mlm_head_becomes_cls_and_pair_head_is_zero_filled(flag_ckpt, tmp_path):
    """Multi-task naming: backbone `ernie.*`, an `mlm` task's head `heads.lm.predictions.*` (no pair
    classifier) and a classifier `heads.news.*` stored under new static names."""
    ckpt = tmp_path / "mt"
    shutil.copytree(flag_ckpt, ckpt)
    raw = json.loads((ckpt / "train_state.json").read_text())
    name_map = {("heads.lm." + k[len("heads.pretrain."):] if k.startswith("heads.pretrain.predictions.") else k): v
                for k, v in raw["name_map"].items() if not k.startswith("heads.pretrain.seq_relationship")}
    rng = np.random.RandomState(0)
    params = pickled(ckpt / "state/rank_0.pdparams")
    params["linear_99.w_0"] = rng.randn(32, 3).astype(np.float32)
    params["linear_99.b_0"] = rng.randn(3).astype(np.float32)
    name_map.update({"heads.news.weight": "linear_99.w_0", "heads.news.bias": "linear_99.b_0"})
    with open(ckpt / "state/rank_0.pdparams", "wb") as f:
        pickle.dump(params, f)
    raw.update(name_map=name_map, extra=dict(raw["extra"], tasks=[
        {"name": "lm", "reader": "mlm", "group": "lm", "is_target": False, "manifest": {}},
        {"name": "news", "reader": "cls", "group": "news", "is_target": True,
         "manifest": {"n_classes": 3, "label_map": {"a": 0, "b": 1, "c": 2}}}]))
    (ckpt / "train_state.json").write_text(json.dumps(raw))
    rehash_checkpoint(ckpt)

    source = C.read_source(ckpt)
    result = C.convert(source, tmp_path / "out")
    assert result.pretraining_heads == "heads.lm" and result.heads == ["lm", "news"]
    assert result.filled == ["cls.seq_relationship.weight", "cls.seq_relationship.bias"]
    assert max(d.max_abs_diff for d in C.verify(source, tmp_path / "out")) <= 1e-5
    assert load_dygraph("ErnieForPretraining", tmp_path / "out")[1] == []
    import paddle

    state = paddle.load(str(tmp_path / "out" / "model_state.pdparams"), return_numpy=True)
    old = json.loads((flag_ckpt / "train_state.json").read_text())["name_map"]
    flag_params = pickled(flag_ckpt / "state/rank_0.pdparams")
    np.testing.assert_array_equal(state["cls.predictions.transform.weight"],
                                  flag_params[old["heads.pretrain.predictions.transform.weight"]])
    assert not state["cls.seq_relationship.weight"].any()
    news = paddle.load(str(tmp_path / "out" / "heads" / "news.pdparams"), return_numpy=True)
    assert sorted(news) == ["bias", "weight"]
    np.testing.assert_array_equal(news["weight"], params["linear_99.w_0"])
    meta = json.loads((tmp_path / "out" / "heads" / "news.json").read_text())
    assert meta["tasks"][0]["manifest"]["label_map"] == {"a": 0, "b": 1, "c": 2} and not meta["written_as_cls"]
    lm = json.loads((tmp_path / "out" / "heads" / "lm.json").read_text())
    assert lm["written_as_cls"] and lm["tied_to_backbone"] == {
        "predictions.decoder.weight": "ernie.embeddings.word_embeddings.weight"}


@pytest.mark.slow
def test_real_multitask_run_checkpoint_and_exports(data, tmp_path):
    """The multi-task trainer's own checkpoint (heads.<group>.*, extra.tasks) and exported models, from
    the tasks of tests/helpers.make_mtl_data: sentiment (cls), wordseg (seq_label), corpus (pretrain)."""
    import paddle

    out = tmp_path / "run"
    ok(mtl_run(["--config", global_yaml(data, "gc.yaml", save_path=str(out), num_epochs=1)], cwd=tmp_path))
    proc = run_cli("--input", out / "model_last", "--output_dir", tmp_path / "ckpt_out", "--verify")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "pretraining heads: heads.corpus" in proc.stdout and "prediction_scores: max |diff|" in proc.stdout
    converted = tmp_path / "ckpt_out"
    assert load_dygraph("ErnieForPretraining", converted)[1] == []
    assert sorted(p.name for p in (converted / "heads").iterdir()) == [
        "corpus.json", "corpus.pdparams", "sentiment.json", "sentiment.pdparams", "wordseg.json", "wordseg.pdparams"]
    assert json.loads((converted / "heads" / "sentiment.json").read_text())["tasks"][0]["reader"] == "cls"

    proc = run_cli("--input", out / "sentiment", "--output_dir", tmp_path / "export_out", "--verify")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    exported = tmp_path / "export_out"
    assert sorted(p.name for p in (exported / "heads").iterdir()) == ["sentiment.json", "sentiment.pdparams"]
    assert load_dygraph("ErnieModel", exported)[1] == []
    # the export and the checkpoint hold the same sentiment head (the export comes from the best step,
    # so compare shapes and key sets, not values)
    a = paddle.load(str(exported / "heads" / "sentiment.pdparams"), return_numpy=True)
    b = paddle.load(str(converted / "heads" / "sentiment.pdparams"), return_numpy=True)
    assert {k: v.shape for k, v in a.items()} == {k: v.shape for k, v in b.items()}

    proc = run_cli("--input", out / "wordseg", "--output_dir", tmp_path / "seg_out")
    assert proc.returncode == 2 and "lacks ['ernie.pooler.dense.weight', 'ernie.pooler.dense.bias']" in proc.stderr
    assert "convert the run's checkpoint" in proc.stderr


def test_exported_task_model_converts_and_its_head_rebuilds_in_dygraph(demo, tmp_path):
    """An exported classifier (save_inference_model + manifest): the dygraph ErnieModel + the head's
    Linear rebuilt from heads/<group>.pdparams give the inference program's logits."""
    import paddle
    from paddle.utils import unique_name

    from ernie_mtl.config import ARCHITECTURES
    from ernie_mtl.program.forward import build_backbone

    vocab_size = sum(1 for _ in open(demo / "vocab.txt", encoding="utf-8"))
    arch = dict(ARCHITECTURES["ernie-tiny-test"], vocab_size=vocab_size, hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0)
    export = tmp_path / "news" / "infer_model"
    export.mkdir(parents=True)
    paddle.enable_static()
    try:
        main, startup = paddle.static.Program(), paddle.static.Program()
        startup.random_seed = 5
        with paddle.static.program_guard(main, startup), unique_name.guard():
            ids = paddle.static.data("input_ids", [-1, -1], "int64")
            seg = paddle.static.data("segment_ids", [-1, -1], "int64")
            mask = paddle.static.data("input_mask", [-1, 1, 1, -1], "float32")
            backbone, _ = build_backbone("ernie", arch)
            _, pooled = backbone(ids, token_type_ids=seg, attention_mask=mask)[:2]
            head = paddle.nn.Linear(arch["hidden_size"], 3)
            logits = head(pooled)
        name_map = {f"ernie.{k}": v.name for k, v in backbone.state_dict().items()}
        name_map.update({f"heads.news.{k}": v.name for k, v in head.state_dict().items()})
        exe = paddle.static.Executor(paddle.CPUPlace())
        scope = paddle.static.Scope()
        exe.run(startup, scope=scope)
        with paddle.static.scope_guard(scope):
            paddle.static.save_inference_model(str(export / "model"), [ids, seg, mask], [logits], exe, program=main)
        batch = C.verification_batch(arch, seed=1)
        (expected,) = exe.run(main.clone(for_test=True), feed=batch, fetch_list=[logits], scope=scope)
    finally:
        paddle.disable_static()
    shutil.copy(demo / "vocab.txt", export / "vocab.txt")
    (export / "manifest.json").write_text(json.dumps({
        "task": "news", "reader": "cls", "arch": arch, "name_map": name_map,
        "feeds": ["input_ids", "segment_ids", "input_mask"], "fetches": ["logits"],
        "label_map": {"sports": 0, "tech": 1, "arts": 2}, "max_seq_len": 32, "vocab": "vocab.txt"}))

    proc = run_cli("--input", tmp_path / "news", "--output_dir", tmp_path / "out", "--verify")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = tmp_path / "out"
    assert not (out / "backbone").exists()  # no cls.* weights: the directory is the backbone
    assert json.loads((out / "config.json").read_text())["architectures"] == ["ErnieModel"]
    meta = json.loads((out / "heads" / "news.json").read_text())
    assert meta["tasks"][0]["manifest"]["label_map"] == {"sports": 0, "tech": 1, "arts": 2}
    model, warnings = load_dygraph("ErnieModel", out)
    assert warnings == []
    model.eval()
    head = paddle.nn.Linear(arch["hidden_size"], meta["params"]["weight"][1])
    head.set_state_dict(paddle.load(str(out / "heads" / "news.pdparams")))
    _, pooled = model(paddle.to_tensor(batch["input_ids"]), token_type_ids=paddle.to_tensor(batch["segment_ids"]),
                      attention_mask=paddle.to_tensor(batch["input_mask"]))
    np.testing.assert_allclose(head(pooled).numpy(), expected, atol=1e-5)
    assert np.abs(expected).max() > 1e-3


# -- errors -------------------------------------------------------------------------------------------
def test_not_a_checkpoint(tmp_path):
    (tmp_path / "junk").mkdir()
    proc = run_cli("--input", tmp_path / "junk", "--output_dir", tmp_path / "out")
    assert proc.returncode == 2
    assert f"--input {tmp_path / 'junk'} is not a checkpoint (train_state.json missing" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "out").exists()
    proc = run_cli("--input", tmp_path / "nowhere", "--output_dir", tmp_path / "out")
    assert proc.returncode == 2 and "no such directory" in proc.stderr


@pytest.mark.slow
def test_missing_rank_file(sharded_ckpt, tmp_path):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(sharded_ckpt, ckpt)
    (ckpt / "state" / "rank_1.pdparams").unlink()
    proc = run_cli("--input", ckpt, "--output_dir", tmp_path / "out")
    assert proc.returncode == 2, proc.stderr
    assert f"{ckpt}/state/rank_1.pdparams is missing from checkpoint {ckpt}" in proc.stderr
    assert "convert an intact checkpoint" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_truncated_state_file(sharded_ckpt, tmp_path):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(sharded_ckpt, ckpt)
    data = (ckpt / "state" / "rank_1.pdparams").read_bytes()
    (ckpt / "state" / "rank_1.pdparams").write_bytes(data[: len(data) // 2])
    proc = run_cli("--input", ckpt, "--output_dir", tmp_path / "out")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"{ckpt}/state/rank_1.pdparams is damaged: " in proc.stderr and "(truncated or replaced)" in proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_ranks_that_disagree(sharded_ckpt, tmp_path):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(sharded_ckpt, ckpt)
    rank0 = pickled(ckpt / "state/rank_0.pdparams")
    rank1 = pickled(ckpt / "state/rank_1.pdparams")
    name = next(iter(rank0))
    rank1[name] = rank0[name] + 1.0
    with open(ckpt / "state/rank_1.pdparams", "wb") as f:
        pickle.dump(rank1, f)
    rehash_checkpoint(ckpt)
    with pytest.raises(C.ConvertError, match=f"variable {name} differs between rank_0.pdparams and rank_1.pdparams"):
        C.read_source(ckpt)


@pytest.mark.slow
def test_shape_mismatch(flag_ckpt, tmp_path):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(flag_ckpt, ckpt)
    raw = json.loads((ckpt / "train_state.json").read_text())
    raw["extra"]["arch"]["intermediate_size"] = 48
    (ckpt / "train_state.json").write_text(json.dumps(raw))
    proc = run_cli("--input", ckpt, "--output_dir", tmp_path / "out")
    assert proc.returncode == 2
    assert "the weights do not fit the architecture (ernie, vocab_size=" in proc.stderr
    assert "ernie.encoder.layers.0.linear1.weight: shape [32, 64] in the source but [32, 48]" in proc.stderr


@pytest.mark.slow
def test_verify_fails_with_the_largest_difference(flag_ckpt, tmp_path):
    import paddle

    source = C.read_source(flag_ckpt)
    C.convert(source, tmp_path / "out")
    weights = paddle.load(str(tmp_path / "out" / "model_state.pdparams"), return_numpy=True)
    weights["ernie.pooler.dense.bias"] = weights["ernie.pooler.dense.bias"] + 0.01
    paddle.save(weights, str(tmp_path / "out" / "model_state.pdparams"))
    with pytest.raises(C.VerificationError, match=r"more than --atol 1e-05: pooled_output: max \|diff\|"):
        C.verify(source, tmp_path / "out")
    with pytest.raises(C.ConvertError, match="already exists; choose another directory or pass --overwrite"):
        C.convert(source, tmp_path / "out")
    C.convert(source, tmp_path / "out", overwrite=True)
    assert max(d.max_abs_diff for d in C.verify(source, tmp_path / "out")) <= 1e-5
