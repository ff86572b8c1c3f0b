"""Weighted corpus mixtures: parsing and its errors, per-corpus counts, blended shares, determinism,
the one-corpus case, cache keys, the plan/description, and per-node caches with real processes."""
import zlib  # noqa: F401  (before paddle, which the PaddleNLP oracle imports)

import json
import math
import multiprocessing as mp
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from data_tools import create_pretraining_data
from data_tools import index as index_helper
from data_tools.index_cache import IndexCacheError, is_index_builder
from ernie_mtl.config import ConfigError
from ernie_mtl.data import mixture as mixture_mod
from ernie_mtl.data.masking import VocabInfo
from ernie_mtl.data.mixture import (BlendedDataset, build_mixture_datasets, parse_mixture, plan_mixture,
                                    samples_per_epoch)
from ernie_mtl.data.pretrain import PretrainSampleConfig, build_pretrain_datasets
from helpers import FileBarrier

SPECIALS = ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"]
# Disjoint characters per corpus: the corpus of any sample can be told from its tokens.
ALPHABETS = {"clue": "甲乙丙丁戊己庚辛壬癸", "news": "山水风云雨雪花月星河", "wudao": "一二三四五六七八九十"}
DOCS = {"clue": 30, "news": 45, "wudao": 60}
CFG = PretrainSampleConfig(max_seq_len=24, short_seq_prob=0.1, seed=11)


def _corpus(root: Path, name: str, vocab_file: Path, docs: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    chars = ALPHABETS[name]
    text = "\n\n".join("\n".join("".join(rng.choice(list(chars), int(rng.integers(3, 9)))) + "。"
                                 for _ in range(int(rng.integers(2, 6)))) for _ in range(docs))
    (root / f"{name}.txt").write_text(text + "\n", encoding="utf-8")
    prefix = root / name
    assert create_pretraining_data.main(["--input", str(root / f"{name}.txt"), "--vocab_file", str(vocab_file),
                                         "--output_prefix", str(prefix), "--workers", "1"]) == 0
    return str(prefix)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("mix")
    vocab_file = root / "vocab.txt"
    vocab_file.write_text("\n".join(SPECIALS + list("。" + "".join(ALPHABETS.values()))) + "\n", encoding="utf-8")
    prefixes = {name: _corpus(root, name, vocab_file, DOCS[name], seed) for seed, name in enumerate(ALPHABETS)}
    vocab = VocabInfo.from_file(vocab_file)
    ids = {name: {vocab_id for vocab_id in range(vocab.size) if _token(vocab_file, vocab_id) in chars}
           for name, chars in ALPHABETS.items()}
    return root, prefixes, vocab, ids


def _token(vocab_file, i, _cache={}):
    if vocab_file not in _cache:
        _cache[vocab_file] = Path(vocab_file).read_text(encoding="utf-8").split("\n")
    return _cache[vocab_file][i]


def _spec(prefixes, weights):
    return " ".join(f"{w} {prefixes[n]}" for n, w in weights.items())


def _build(spec, vocab, cache, num_samples=(1000, 100, 10), cfg=CFG, **kw):
    return build_mixture_datasets(parse_mixture(spec), split="8,1,1", num_samples=num_samples, cfg=cfg, vocab=vocab,
                                  cache_dir=str(cache), log=lambda m: None, **kw)


def _same(a, b):
    return len(a) == len(b) and all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a, b))


# -- parsing -------------------------------------------------------------------------------------------
def test_every_form_parses_to_the_same_corpus_list(data, tmp_path, monkeypatch):
    root, p, _, _ = data
    text = parse_mixture(f"5.0 {p['clue']} 7 {p['news']} 12.0 {p['wudao']}")
    assert [(c.weight, c.prefix, c.name) for c in text] == [(5.0, p["clue"], "clue"), (7.0, p["news"], "news"),
                                                            (12.0, p["wudao"], "wudao")]
    assert text.shares == [5 / 24, 7 / 24, 12 / 24]
    assert parse_mixture([5.0, p["clue"], 7, p["news"], 12.0, p["wudao"]]).corpora == text.corpora  # YAML flat list
    assert parse_mixture([[5.0, p["clue"]], [7, p["news"]], [12.0, p["wudao"]]]).corpora == text.corpora
    assert parse_mixture(text.spec()).corpora == text.corpora  # the canonical form reads back the same
    single = parse_mixture(p["news"])
    assert single.spec() == p["news"] and parse_mixture(single.spec()).corpora == single.corpora
    assert [(c.weight, c.prefix) for c in single] == [(1.0, p["news"])]
    spaced = tmp_path / "my corpora"
    spaced.mkdir()
    for ext in (".bin", ".idx"):
        shutil.copy(p["clue"] + ext, str(spaced / "clue") + ext)
    assert parse_mixture(f"{spaced}/clue").prefixes == [f"{spaced}/clue"]  # a path with a space, as before
    # relative to the YAML file's folder (base_dir), as task files resolve their paths
    monkeypatch.chdir(tmp_path)
    assert parse_mixture("2 news 1 clue", base_dir=str(root)).prefixes == [p["news"], p["clue"]]


def test_a_folder_means_every_complete_corpus_weighted_by_tokens(data, tmp_path):
    _, p, _, _ = data
    folder = tmp_path / "corpora"
    folder.mkdir()
    for name in ("wudao", "clue", "news"):  # copied in another order: the mixture is sorted by name
        for ext in (".bin", ".idx", ".json"):
            shutil.copy(p[name] + ext, folder / f"{name}{ext}")
    mix = parse_mixture(str(folder))
    assert [c.name for c in mix] == ["clue", "news", "wudao"]
    tokens = [json.loads(Path(p[n] + ".json").read_text())["tokens"] for n in ("clue", "news", "wudao")]
    assert mix.weights == [float(t) for t in tokens]
    assert mix.weights == [os.path.getsize(p[n] + ".bin") / 2 for n in ("clue", "news", "wudao")]  # uint16
    assert parse_mixture(mix.spec()).corpora == mix.corpora
    (folder / "half.bin").write_bytes(b"\0\0")  # an unfinished corpus: refused (it would change the weights)
    (folder / "lone.idx").write_bytes(b"")
    with pytest.raises(ConfigError) as err:
        parse_mixture(str(folder), what="--input_dir")
    assert [p_.split(": ", 2)[1].split(" has no ")[0] for p_ in err.value.problems] == [
        str(folder / "half.bin"), str(folder / "lone.idx")]
    assert "half.idx beside it" in str(err.value) and "move half.bin out of the folder" in str(err.value)


def test_bad_input_names_each_item_value_and_fix(data, tmp_path):
    root, p, _, _ = data
    cases = {
        f"abc {p['clue']}": ["item 1 'abc'", "not a positive number", "'5.0 "],
        f"0 {p['clue']} -2 {p['news']}": ["item 1 '0'", "item 3 '-2'", "> 0"],
        f"nan {p['clue']}": ["item 1 'nan'", "finite"],
        f"{p['clue']} 5": ["a weight comes before its prefix", f"'5 {p['clue']}'"],
        f"5 {p['clue']} 7": ["3 items, an odd number", "weight/prefix pairs"],
        f"1 {root}/missing": [f"item 2 '{root}/missing'", "no corpus", "create_pretraining_data"],
        f"1 {p['clue']}.bin": ["names a file of the corpus", f"without the extension: {p['clue']}"],
        f"1 {root}": ["is a folder", "Give the folder alone"],
        f"1 {p['clue']} 2 {p['clue']}": ["twice (items 2 and 4)", "summed weight"],
        "5": ["'5' is a weight without a corpus"],
        "": ["is empty"],
    }
    for spec, expected in cases.items():
        with pytest.raises(ConfigError) as err:
            parse_mixture(spec, what="--input_dir")
        for fragment in expected:
            assert fragment in str(err.value), (spec, str(err.value))
    # all problems at once, one per item
    with pytest.raises(ConfigError) as err:
        parse_mixture(f"x {p['clue']} 2 {root}/nope 0 {p['news']}")
    assert len(err.value.problems) == 3
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "lonely.idx").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"folder without any complete corpus \(it holds lonely.idx without"):
        parse_mixture(str(empty))
    incomplete = tmp_path / "incomplete"
    shutil.copy(p["clue"] + ".bin", str(incomplete) + ".bin")
    with pytest.raises(ConfigError, match=r"incomplete \(.*incomplete.idx is missing\): tokenization did not finish"):
        parse_mixture(f"1 {p['clue']} 1 {incomplete}")


def test_corpora_with_different_vocabularies_are_refused_before_anything_is_built(data, tmp_path):
    root, p, _, _ = data
    other_vocab = tmp_path / "other_vocab.txt"
    other_vocab.write_text(Path(root / "vocab.txt").read_text(encoding="utf-8") + "extra\n", encoding="utf-8")
    other = _corpus(tmp_path, "news", other_vocab, 5, seed=3)
    cache = tmp_path / "cache"
    with pytest.raises(ConfigError, match=r"different vocabularies .*other_vocab.txt.*re-tokenize them with one"):
        parse_mixture(f"1 {p['clue']} 1 {other}")
    with pytest.raises(ConfigError, match=rf"item 2: {p['clue']} was tokenized with .*vocab.txt .*but the run's "
                                          rf"vocab {other_vocab}"):
        parse_mixture(f"1 {p['clue']}", vocab_file=str(other_vocab))
    assert not cache.exists()


# -- how many samples each corpus gives ----------------------------------------------------------------
def test_per_corpus_counts_follow_paddlenlp_and_megatron(data):
    _, p, _, _ = data
    mix = parse_mixture(_spec(p, {"clue": 5.0, "news": 7.0, "wudao": 12.0}))
    plan = plan_mixture(mix, split="8,1,1", num_samples=(1000, 100, 10), cfg=CFG)
    # by hand: ceil(N * w / 24 * 1.005), e.g. 1000 * 5/24 * 1.005 = 209.375 -> 210
    expected = {"clue": [210, 21, 3], "news": [294, 30, 3], "wudao": [503, 51, 6]}
    assert {cp.corpus.name: list(cp.samples.values()) for cp in plan.corpora} == expected
    # PaddleNLP's own function (the same formula as legacy Megatron-LM) agrees
    from paddlenlp.data.causal_dataset import get_datasets_weights_and_num_samples

    _, weights, counts = get_datasets_weights_and_num_samples(["5.0", "a", "7.0", "b", "12.0", "c"], [1000, 100, 10])
    assert counts == list(expected.values())
    assert weights == mix.shares


def test_blend_follows_the_weights_within_one_percent_over_10k_samples(data, tmp_path):
    _, p, vocab, ids = data
    weights = {"clue": 5.0, "news": 7.0, "wudao": 12.0}
    sets = mixture_mod.build_mixture_datasets(
        parse_mixture(_spec(p, weights)), split="8,1,1", num_samples=(10_000, 0, 0), cfg=CFG, vocab=vocab,
        cache_dir=str(tmp_path / "cache"), log=lambda m: None)
    train = sets["train"]
    assert isinstance(train, BlendedDataset) and len(train) == 10_000 and sets["valid"] is None
    # oracle: which alphabet the sample's text comes from (masked positions restored from their labels)
    seen = dict.fromkeys(weights, 0)
    for i in range(len(train)):
        input_ids, _, positions, labels, _ = train[i]
        text = np.array(input_ids)
        text[positions] = labels
        owners = [n for n in ids if set(text.tolist()) & ids[n]]
        assert len(owners) == 1, (i, text)
        seen[owners[0]] += 1
    for name, w in weights.items():
        assert abs(seen[name] / 10_000 - w / 24) < 0.01, (name, seen)
    assert sets.corpus_counts("train") == seen  # the blend's own record agrees with the content
    planned = {cp.corpus.name: cp.samples["train"] for cp in sets.plan.corpora}
    assert all(seen[n] <= math.ceil(10_000 * w / 24) <= planned[n] for n, w in weights.items())


def test_natural_size_blends_as_far_as_no_corpus_runs_out(data, tmp_path):
    _, p, vocab, _ = data
    sets = _build(_spec(p, {"clue": 1, "wudao": 3}), vocab, tmp_path / "c", num_samples=(None, 0, 0))
    lengths = [len(d) for d in sets["train"].datasets]
    size = min(math.floor(n / s) for n, s in zip(lengths, [0.25, 0.75]))
    assert len(sets["train"]) == size
    assert all(c <= n for c, n in zip(sets.corpus_counts("train").values(), lengths))


# -- determinism, the one-corpus case, cache keys ------------------------------------------------------
def test_sample_i_is_a_pure_function_of_seed_and_i(data, tmp_path):
    _, p, vocab, _ = data
    spec = _spec(p, {"clue": 1, "news": 2, "wudao": 3})
    first = _build(spec, vocab, tmp_path / "a")
    cached = _build(spec, vocab, tmp_path / "a")  # loaded from the cache
    rebuilt = _build(spec, vocab, tmp_path / "b")  # built again from nothing
    other_seed = _build(spec, vocab, tmp_path / "c", cfg=PretrainSampleConfig(max_seq_len=24, short_seq_prob=0.1,
                                                                              seed=12))
    for split in ("train", "valid", "test"):
        for i in (0, 1, 7, len(first[split]) - 1):
            assert _same(first[split][i], cached[split][i]) and _same(first[split][i], rebuilt[split][i])
    assert not all(_same(first["train"][i], other_seed["train"][i]) for i in range(20))


def test_corpora_of_a_mixture_draw_independent_masks(data, tmp_path):
    """Sample j of two corpora must not share its random draws (same seed, same split, same j)."""
    _, p, vocab, _ = data
    twin = tmp_path / "twin"
    for ext in (".bin", ".idx", ".json"):
        shutil.copy(p["wudao"] + ext, str(twin) + ext)
    sets = _build(f"1 {p['wudao']} 1 {twin}", vocab, tmp_path / "cache")
    a, b = sets["train"].datasets
    np.testing.assert_array_equal(a.mapping, b.mapping)  # same text, same sample spans
    differ = sum(not np.array_equal(a[j][2], b[j][2]) for j in range(50))  # masked positions
    assert differ > 25


def test_one_corpus_mixture_is_todays_dataset(data, tmp_path):
    _, p, vocab, _ = data
    today = build_pretrain_datasets(p["news"], split="8,1,1", num_samples=(300, 40, 20), cfg=CFG, vocab=vocab,
                                    cache_dir=str(tmp_path), log=lambda m: None)
    folders = sorted(x.name for x in tmp_path.iterdir())
    for spec in (p["news"], f"3.0 {p['news']}", [p["news"]]):
        mixed = _build(spec, vocab, tmp_path, num_samples=(300, 40, 20))
        assert sorted(x.name for x in tmp_path.iterdir()) == folders  # same cache, nothing new built
        for split in ("train", "valid", "test"):
            assert type(mixed[split]) is type(today[split]) and len(mixed[split]) == len(today[split])
            for i in (0, 3, len(today[split]) - 1):
                assert _same(mixed[split][i], today[split][i])


def test_cache_key_changes_with_weights_and_corpus_list(data, tmp_path):
    _, p, vocab, _ = data

    def blend_folders(spec):
        _build(spec, vocab, tmp_path, num_samples=(200, 0, 0))
        return {x.name for x in tmp_path.iterdir() if x.name.startswith("mixture")}

    seen = set()
    for spec in (_spec(p, {"clue": 1, "news": 2}), _spec(p, {"clue": 1, "news": 3}), _spec(p, {"news": 2, "clue": 1}),
                 _spec(p, {"clue": 1, "wudao": 2}), _spec(p, {"clue": 1, "news": 2, "wudao": 2})):
        new = blend_folders(spec) - seen
        assert len(new) == 1, spec
        seen |= new
    assert blend_folders(_spec(p, {"clue": 1, "news": 2})) == seen  # same mixture: reused
    record = json.loads(next((tmp_path / min(seen)).glob("description.json")).read_text())["description"]
    assert {"weights", "corpora", "size", "split", "helper_version"} <= set(record)
    assert all({"prefix", "weight", "data", "mapping_key"} <= set(c) for c in record["corpora"])


# -- the plan as --dry_run and the start-of-run log show it --------------------------------------------
def test_describe_gives_weight_documents_samples_and_epochs(data, tmp_path, monkeypatch):
    _, p, vocab, _ = data
    sets = _build(_spec(p, {"clue": 5, "wudao": 7}), vocab, tmp_path, num_samples=(1200, 100, 0))
    lines = sets.describe()
    assert lines[0].startswith("corpus mixture (--input_dir): 2 corpora, split 8,1,1; blended samples train 1,200, "
                               "valid 100")
    clue = next(cp for cp in sets.plan.corpora if cp.corpus.name == "clue")
    per_epoch = clue.samples_per_epoch["train"]
    # independent count: one whole epoch of the train split in one helper call
    from data_tools.indexed_dataset import MMapIndexedDataset

    corpus = MMapIndexedDataset(p["clue"])
    lo, hi = clue.doc_ranges["train"]
    whole = index_helper.build_sentence_pair_mapping(
        np.asarray(corpus.doc_idx[lo:hi + 1]), corpus.sizes, num_epochs=1, max_num_samples=1, max_seq_len=21,
        short_seq_prob=0.1, seed=11, min_num_sent=2, shuffle=False)
    assert per_epoch == len(whole) > 0
    monkeypatch.setattr(mixture_mod, "_EPOCH_COUNT_CHUNK_DOCS", 3)  # chunked counting gives the same total
    assert samples_per_epoch(corpus, (lo, hi), CFG) == per_epoch
    line = next(x for x in lines if x.startswith("  clue:"))
    # 1200 x 5/12 x 1.005 = 502.5 -> 503
    assert (f"weight 5 (share 41.67%), {DOCS['clue']} documents | train: {hi - lo} docs, 503 samples planned "
            f"({503 / per_epoch:.2f} epochs)") in line
    realised = next(x for x in lines if x.startswith("  realised train:"))
    counts = sets.corpus_counts("train")
    assert realised == f"  realised train: clue {counts['clue']:,} (41.67%), wudao {counts['wudao']:,} (58.33%)"
    # VisualDL scalars: what was consumed so far, per corpus (incremental counts match a recount)
    for consumed in (10, 500, 100, 1200):
        expected = np.bincount(np.asarray(sets["train"].dataset_index[:consumed]), minlength=2)
        assert sets.scalars(consumed) == {"data/train_samples/clue": expected[0],
                                          "data/train_samples/wudao": expected[1]}


def test_empty_split_of_one_corpus_is_one_clear_error(data, tmp_path):
    _, p, vocab, _ = data
    with pytest.raises(ConfigError, match=rf"the test split of {p['clue']} .* is empty: --split 99,1,0"):
        build_mixture_datasets(parse_mixture(_spec(p, {"clue": 1, "news": 1})), split="99,1,0", num_samples=(10, 5, 5),
                               cfg=CFG, vocab=vocab, cache_dir=str(tmp_path), log=lambda m: None)
    assert not any(tmp_path.iterdir())


# -- per-node caches with real processes ---------------------------------------------------------------
def _rank(rank, local_rank, share_folder, spec, vocab_file, root, out):
    node = rank // 2
    try:
        sets = build_mixture_datasets(
            parse_mixture(spec), split="8,1,1", num_samples=(300, 30, 0), cfg=CFG,
            vocab=VocabInfo.from_file(vocab_file),
            cache_dir=os.path.join(root, f"node{node}"), is_builder=is_index_builder(rank, local_rank, share_folder),
            barrier=FileBarrier(os.path.join(root, "barrier"), rank, 4), log=lambda m: None)
        result = {"ok": [list(map(np.ndarray.tolist, sets["train"][i][:2])) for i in (0, 99, 299)]}
    except IndexCacheError as e:
        result = {"error": str(e)}
    Path(out).write_text(json.dumps(result))


def _run_job(tmp_path, share_folder, spec, vocab_file):
    ctx = mp.get_context("fork")
    outs = [tmp_path / f"rank{r}.json" for r in range(4)]
    procs = [ctx.Process(target=_rank, args=(r, r % 2, share_folder, spec, str(vocab_file), str(tmp_path), str(o)))
             for r, o in enumerate(outs)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(120)
        assert proc.exitcode == 0
    return [json.loads(o.read_text()) for o in outs]


def test_two_nodes_without_a_shared_folder_each_build_their_own_cache(data, tmp_path):
    root, p, _, _ = data
    spec = _spec(p, {"clue": 1, "wudao": 2})
    results = _run_job(tmp_path, False, spec, root / "vocab.txt")  # --share_folder false
    assert all("ok" in r for r in results) and all(r == results[0] for r in results)
    listing = [sorted(x.name for x in (tmp_path / f"node{n}").iterdir() if not x.name.startswith(".")) for n in (0, 1)]
    assert listing[0] == listing[1] and len(listing[0]) == 2 * 2 + 2  # 2 corpora x 2 splits + 2 blends, per node


def test_a_shared_folder_that_is_not_shared_fails_clearly_on_the_other_node(data, tmp_path):
    root, p, _, _ = data
    results = _run_job(tmp_path, True, _spec(p, {"clue": 1, "wudao": 2}), root / "vocab.txt")  # --share_folder true
    assert "ok" in results[0] and "ok" in results[1]  # node 0: rank 0 built, rank 1 reads it
    for r in results[2:]:  # node 1 has its own empty folder: an error naming the fix, no hang
        assert "does not exist after the builder rank finished" in r["error"] and "--share_folder false" in r["error"]
