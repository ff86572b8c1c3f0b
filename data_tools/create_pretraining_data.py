"""Tokenize a text corpus into a Megatron-compatible `.bin/.idx` dataset for ERNIE pretraining.

    python -m data_tools.create_pretraining_data --input corpus.jsonl --vocab_file vocab.txt \\
        --output_prefix data/corpus --cn_whole_word_segment --workers 4

Input: files or directories (walked in sorted order, hidden files skipped). `.jsonl`/`.json` files
are JSON lines, one document per line, text under --json_key; any other file is plain text, where
a blank line separates documents and each line holds one or more sentences. Every sentence
becomes one sequence of the output; empty documents are skipped. Output: `<prefix>.bin`,
`<prefix>.idx` and a `<prefix>.json` sidecar (vocab sha1, options, counts); each appears only
when complete. Malformed lines (undecodable, bad JSON, missing key, non-string text) are
skipped and reported as file:line; the run fails, leaving nothing new under the output names,
when they exceed --max_malformed. Memory does not grow with the corpus (streamed input, a
bounded number of chunks in flight, streamed output); the output order is the input order for
any --workers. Errors (bad flags, a vocab without the special tokens, an input without text,
too many malformed lines, a full disk, ...) print one message and exit with status 2
(ERNIE_MTL_DEBUG=1 adds the traceback); no temporary file is left behind.
"""
from __future__ import annotations

import argparse
import collections
import hashlib
import json
import multiprocessing
import os
import re
import sys
import time
from dataclasses import dataclass
from typing import Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from data_tools.cli_utils import IO_ERRNOS, UserError, run_cli, str2bool, write_error
from data_tools.indexed_dataset import IndexedDatasetBuilder, best_dtype, mkstemp_public

PROG = "data_tools.create_pretraining_data"

JSON_SUFFIXES = (".jsonl", ".json")
_LIST_MALFORMED = 20  # malformed lines listed in the summary
_ALL_BAD_PROBE = 1000  # stop early when this many leading records are all malformed


class InputError(UserError):
    """Bad command-line input (the message names the flag or file and the fix)."""


@dataclass
class Document:
    """One input document, or (error set) one malformed line."""
    file: str
    line: int
    text: Optional[str]
    nbytes: int
    error: Optional[str] = None


def list_input_files(inputs: Sequence[str]) -> List[str]:
    """Expand files and directories (recursively, sorted, hidden entries skipped)."""
    files: List[str] = []
    for item in inputs:
        if os.path.isfile(item):
            files.append(item)
        elif os.path.isdir(item):
            found = []
            for root, dirs, names in os.walk(item):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                found += [os.path.join(root, n) for n in names if not n.startswith(".")]
            if not found:
                raise InputError(f"--input {item}: directory holds no files")
            files += sorted(found)
        else:
            raise InputError(f"--input {item}: no such file or directory")
    return files


def iter_documents(files: Iterable[str], json_key: str = "text") -> Iterator[Document]:
    """Stream documents (and malformed-line records) from the input files."""
    for path in files:
        if path.lower().endswith(JSON_SUFFIXES):
            yield from _json_documents(path, json_key)
        else:
            yield from _text_documents(path)


def _decode(raw: bytes, lineno: int) -> str:
    text = raw.decode("utf-8")
    return text[1:] if lineno == 1 and text.startswith("\ufeff") else text  # byte-order mark


def _json_documents(path: str, key: str) -> Iterator[Document]:
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(_decode(raw, lineno))
            except UnicodeDecodeError as exc:
                yield Document(path, lineno, None, len(raw), f"not valid UTF-8 ({exc.reason} at byte {exc.start})")
                continue
            except json.JSONDecodeError as exc:
                yield Document(path, lineno, None, len(raw), f"invalid JSON ({exc.msg} at column {exc.colno})")
                continue
            if _SURROGATE_ESCAPE.search(raw) and isinstance(obj, dict) and isinstance(obj.get(key), str) \
                    and not _encodable(obj[key]):
                yield Document(path, lineno, None, len(raw), "not valid Unicode (a lone surrogate escape such as "
                               "\\ud800 in the JSON string)")
            elif not isinstance(obj, dict):
                yield Document(path, lineno, None, len(raw), f"expected a JSON object, got {type(obj).__name__}")
            elif key not in obj:
                yield Document(path, lineno, None, len(raw),
                               f"no key {key!r} (keys: {', '.join(list(obj)[:5])}; set --json_key)")
            elif not isinstance(obj[key], str):
                yield Document(path, lineno, None, len(raw),
                               f"{key!r} is {type(obj[key]).__name__}, expected a string")
            else:
                yield Document(path, lineno, obj[key], len(raw))


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # how a lone surrogate gets into a JSON string


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _text_documents(path: str) -> Iterator[Document]:
    lines: List[str] = []
    first = 0
    nbytes = 0
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            nbytes += len(raw)
            try:
                text = _decode(raw, lineno)
            except UnicodeDecodeError as exc:
                yield Document(path, lineno, None, 0, f"not valid UTF-8 ({exc.reason} at byte {exc.start})")
                continue
            if text.strip():
                if not lines:
                    first = lineno
                lines.append(text.rstrip("\r\n"))
            elif lines:
                yield Document(path, first, "\n".join(lines), nbytes)
                lines, nbytes = [], 0
    if lines:
        yield Document(path, first, "\n".join(lines), nbytes)


def parse_max_malformed(value: str) -> Tuple[str, float]:
    """'25' -> ('count', 25); '0.001' -> ('fraction', 0.001) (of the input records)."""
    text = str(value).strip()
    try:
        count = int(text)
    except ValueError:
        try:
            frac = float(text)
        except ValueError:
            frac = -1.0
        if not 0.0 <= frac < 1.0:
            raise InputError(f"--max_malformed {value!r}: give a count (e.g. 10) or a fraction in [0, 1) "
                             "(e.g. 0.001)") from None
        return "fraction", frac
    if count < 0:
        raise InputError(f"--max_malformed {value!r}: a count must be >= 0")
    return "count", float(count)


# --------------------------------------------------------------------------------------------
# Workers: one DocumentEncoder (tokenizer + jieba) per process, built once (before forking).

_ENCODER = None
_DTYPE = None


def _init_worker(encoder_kwargs: dict, dtype: str) -> None:
    global _ENCODER, _DTYPE
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core per worker
    from data_tools.tokenization import DocumentEncoder

    _ENCODER = DocumentEncoder(**encoder_kwargs)
    _DTYPE = np.dtype(dtype)


def _encode_chunk(texts: List[str]):
    """Documents -> (tokens, sentence sizes, sentences per non-empty document, empty documents)."""
    tokens, sizes, doc_sentences, empty = _ENCODER.encode_batch(texts)
    return tokens.astype(_DTYPE), sizes.astype(np.int32), doc_sentences.astype(np.int32), empty


def _ordered_results(chunks: Iterator[Tuple[List[str], int, int]], workers: int, init_args: tuple):
    """Yield (result, nbytes, ndocs) per chunk in input order. `workers` processes encode: this one
    and workers - 1 helpers (forked where the system can: they inherit the encoder built here).
    A chunk goes to a helper while fewer than two per helper are waiting, otherwise this process
    encodes it between reading and writing, so no process idles and none is oversubscribed.
    At most 4 x workers chunks are held (a stalled helper makes this process wait for it)."""
    _init_worker(*init_args)
    if workers == 1:
        for texts, nbytes, ndocs in chunks:
            yield _encode_chunk(texts), nbytes, ndocs
        return
    helpers = workers - 1
    if "fork" in multiprocessing.get_all_start_methods():
        pool = multiprocessing.get_context("fork").Pool(helpers)
    else:
        pool = multiprocessing.get_context("spawn").Pool(helpers, initializer=_init_worker, initargs=init_args)
    with pool:
        pending: collections.deque = collections.deque()  # [helper job or None, result, nbytes, ndocs]

        def finished():
            job, result, b, d = pending.popleft()
            return (job.get() if job is not None else result), b, d

        for texts, nbytes, ndocs in chunks:
            waiting = sum(1 for job, *_ in pending if job is not None and not job.ready())
            if waiting < 2 * helpers:
                pending.append([pool.apply_async(_encode_chunk, (texts,)), None, nbytes, ndocs])
            else:
                pending.append([None, _encode_chunk(texts), nbytes, ndocs])
            while pending and (pending[0][0] is None or pending[0][0].ready() or len(pending) >= 4 * workers):
                yield finished()
        while pending:
            yield finished()
        pool.close()  # a normal end: let the helpers exit (leaving the block terminates them)
        pool.join()


class _MalformedLimit(UserError):
    pass


_MIN_TAIL_CHUNK = 16 << 10


class DocumentReader:
    """Streams chunks of documents and keeps the malformed-line and record counts.

    With `total_bytes` and `workers` given, chunks shrink as the input runs out (to a third of
    what is left per worker, at least 16 KiB), so the processes finish together: at the end one
    waits at most for a small chunk of another. (Chunking never changes the output.)"""

    def __init__(self, files: List[str], json_key: str, limit: Tuple[str, float], chunk_docs: int,
                 chunk_bytes: int = 1 << 20, total_bytes: Optional[int] = None, workers: int = 1):
        self.files, self.json_key, self.limit = files, json_key, limit
        self.chunk_docs, self.chunk_bytes = chunk_docs, chunk_bytes
        self.total_bytes, self.workers = total_bytes, workers
        self.records = 0
        self.malformed: List[Document] = []
        self.malformed_count = 0

    def chunks(self) -> Iterator[Tuple[List[str], int, int]]:
        texts: List[str] = []
        nbytes = done = 0
        target = self._target(0)
        for doc in iter_documents(self.files, self.json_key):
            self.records += 1
            if doc.error is not None:
                self._malformed(doc)
                nbytes += doc.nbytes
                continue
            texts.append(doc.text)
            nbytes += doc.nbytes
            if len(texts) >= self.chunk_docs or nbytes >= target:
                yield texts, nbytes, len(texts)
                done += nbytes
                texts, nbytes = [], 0
                target = self._target(done)
        if texts or nbytes:
            yield texts, nbytes, len(texts)

    def _target(self, done: int) -> int:
        if self.total_bytes is None or self.workers < 2:
            return self.chunk_bytes
        share = (self.total_bytes - done) // (3 * self.workers)
        return max(min(self.chunk_bytes, share), min(self.chunk_bytes, _MIN_TAIL_CHUNK))

    def _malformed(self, doc: Document) -> None:
        self.malformed_count += 1
        if len(self.malformed) < _LIST_MALFORMED:
            self.malformed.append(doc)
        kind, value = self.limit
        if kind == "count" and self.malformed_count > value:
            raise _MalformedLimit(f"more than {int(value)} malformed lines (--max_malformed {int(value)})")
        if self.records == _ALL_BAD_PROBE and self.malformed_count == _ALL_BAD_PROBE:
            raise _MalformedLimit(f"the first {_ALL_BAD_PROBE} records are all malformed: wrong --json_key "
                                  "or input format?")

    def check_fraction(self) -> None:
        kind, value = self.limit
        if kind == "fraction" and self.malformed_count > value * max(self.records, 1):
            raise _MalformedLimit(f"{self.malformed_count} malformed of {self.records} records "
                                  f"({self.malformed_count / max(self.records, 1):.4%}) exceeds --max_malformed "
                                  f"{value} (a fraction)")


def _sha1(path: str) -> str:
    h = hashlib.sha1()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def write_json_temp(path: str, obj: dict) -> str:
    """Write `obj` to a temporary file beside `path` (fsynced) and return its name; the caller
    renames it into place. Nothing is left behind when writing or closing fails."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = mkstemp_public(directory, os.path.basename(path) + ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=2, ensure_ascii=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        remove_quietly(tmp)
        raise
    return tmp


def remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def _write_json_atomic(path: str, obj: dict) -> None:
    tmp = write_json_temp(path, obj)
    try:
        os.replace(tmp, path)
    except BaseException:
        remove_quietly(tmp)
        raise


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bool_flag = dict(type=str2bool, nargs="?", const=True)
    p.add_argument("--input", nargs="+", required=True, help="input files or directories")
    p.add_argument("--vocab_file", required=True, help="vocab.txt (e.g. from `python -m data_tools.build_vocab`)")
    p.add_argument("--output_prefix", required=True, help="writes <prefix>.bin, <prefix>.idx, <prefix>.json")
    p.add_argument("--json_key", default="text", help="text field of JSON-lines inputs")
    p.add_argument("--do_lower_case", default=True, **bool_flag,
                   help="lower-case and strip accents (as the vocab was built)")
    p.add_argument("--split_sentences", default=True, **bool_flag,
                   help="split at sentence-final punctuation; false: only newlines end sentences")
    p.add_argument("--cn_whole_word_segment", default=False, **bool_flag,
                   help="mark Chinese word continuations as ##<char> ids (jieba segmentation)")
    p.add_argument("--jieba_hmm", default=True, **bool_flag,
                   help="jieba's HMM for words missing from its dictionary (jieba's default)")
    p.add_argument("--segmenter", choices=("fast", "jieba"), default="fast",
                   help="fast: re-implementation of jieba's algorithm, identical output; jieba: jieba.cut")
    p.add_argument("--tokenizer", choices=("fast", "paddlenlp"), default="fast",
                   help="fast: Rust `tokenizers` matching paddlenlp's ErnieTokenizer; paddlenlp: that tokenizer")
    p.add_argument("--workers", type=int, default=1,
                   help="processes that tokenize: this one and workers - 1 helpers (the output is the same for any N)")
    p.add_argument("--chunk_bytes", type=int, default=128 << 10,
                   help="input bytes per work unit (encoded at once; 128 KiB and up run fastest)")
    p.add_argument("--chunk_docs", type=int, default=4096, help="at most this many documents per work unit")
    p.add_argument("--max_malformed", default="0.001",
                   help="tolerated malformed lines: a count (10) or a fraction of the records (0.001)")
    p.add_argument("--log_interval", type=int, default=10000,
                   help="documents between progress lines when stderr is not a terminal")
    return p


def output_parent_problem(path: str, flag: str) -> Optional[str]:
    """A problem with the folder `path` would be written in (created if missing), or None: the
    nearest existing ancestor must be a folder."""
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        return f"{flag} {path}: {parent} is a file, not a folder; choose a path inside a folder"
    return None


def is_output_fault(e: OSError, prefix: str) -> bool:
    """An I/O fault of writing the outputs of `prefix` (write() errors carry no file name; the
    temporary files are named after the prefix)."""
    if e.errno not in IO_ERRNOS:
        return False
    if e.filename is None:
        return True
    name = os.path.abspath(e.filename)
    out = os.path.abspath(prefix)
    return os.path.dirname(name) == os.path.dirname(out) and os.path.basename(name).startswith(os.path.basename(out))


def check_vocab(path: str, flag: str = "--vocab_file") -> dict:
    """Load a vocab.txt for the data tools: token -> id. A vocab that the training would refuse
    (a duplicate token, no special tokens) is refused here, before any work is done."""
    from data_tools.tokenization import SPECIAL_TOKENS, load_vocab

    try:
        vocab = load_vocab(path)
    except UnicodeDecodeError as exc:
        raise UserError(f"{flag} {path}: not a UTF-8 text file ({exc.reason} at byte {exc.start}); "
                        "give a vocab.txt with one token per line") from None
    except ValueError as exc:
        raise UserError(f"{flag} {path}: {exc}") from None
    missing = [t for t in SPECIAL_TOKENS if t not in vocab]
    if missing:
        raise UserError(f"{flag} {path}: lacks the special token(s) {' '.join(missing)}, which ERNIE "
                        f"pretraining needs ({' '.join(SPECIAL_TOKENS)}); build the vocab with "
                        "`python -m data_tools.build_vocab`, or add them to the file")
    return vocab


def _validate(args) -> Tuple[List[str], Tuple[str, float], dict]:
    problems = []
    files: List[str] = []
    limit = ("count", 0.0)
    vocab: dict = {}
    try:
        files = list_input_files(args.input)
    except InputError as exc:
        problems.append(str(exc))
    try:
        limit = parse_max_malformed(args.max_malformed)
    except InputError as exc:
        problems.append(str(exc))
    if os.path.isdir(args.vocab_file):
        problems.append(f"--vocab_file {args.vocab_file}: is a directory; give the vocab.txt file")
    elif not os.path.isfile(args.vocab_file):
        problems.append(f"--vocab_file {args.vocab_file}: file not found (build one with "
                        "`python -m data_tools.build_vocab`)")
    else:
        try:
            vocab = check_vocab(args.vocab_file)
        except UserError as exc:
            problems.append(str(exc))
    if args.workers < 1:
        problems.append(f"--workers {args.workers}: must be >= 1")
    if args.chunk_docs < 1:
        problems.append(f"--chunk_docs {args.chunk_docs}: must be >= 1")
    if args.chunk_bytes < 1:
        problems.append(f"--chunk_bytes {args.chunk_bytes}: must be >= 1")
    if args.log_interval < 1:
        problems.append(f"--log_interval {args.log_interval}: must be >= 1")
    if os.path.isdir(args.output_prefix):
        problems.append(f"--output_prefix {args.output_prefix}: is a directory; give a file prefix such as "
                        f"{os.path.join(args.output_prefix, 'corpus')}")
    else:
        parent = output_parent_problem(args.output_prefix, "--output_prefix")
        if parent:
            problems.append(parent)
    outputs = {os.path.abspath(args.output_prefix + s) for s in (".bin", ".idx", ".json")}
    clash = [f for f in files if os.path.abspath(f) in outputs]
    if clash:
        problems.append(f"--output_prefix {args.output_prefix}: would overwrite the input {clash[0]}")
    if problems:
        raise InputError("invalid arguments:\n  " + "\n  ".join(problems))
    return files, limit, vocab


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the preprocessing; returns the exit status: 0 done, 2 a problem the user can fix (the
    message says which), 1 a bug (with its traceback)."""
    return run_cli(PROG, lambda: _main(argv))


def _main(argv: Optional[Sequence[str]]) -> int:
    args = build_parser().parse_args(argv)
    files, limit, vocab = _validate(args)
    from tqdm import tqdm

    dtype = best_dtype(max(vocab.values()) + 1)
    encoder_kwargs = dict(vocab_file=args.vocab_file, do_lower_case=args.do_lower_case,
                          split_sentences=args.split_sentences, whole_word=args.cn_whole_word_segment,
                          backend=args.tokenizer, segmenter=args.segmenter, hmm=args.jieba_hmm)
    total_bytes = sum(os.path.getsize(f) for f in files)
    reader = DocumentReader(files, args.json_key, limit, args.chunk_docs, args.chunk_bytes, total_bytes, args.workers)
    tqdm.monitor_interval = 0  # no monitor thread: worker processes are forked while the bar runs
    sentences = tokens = documents = empty = docs_done = bytes_done = 0
    t0 = time.perf_counter()
    bar = tqdm(total=total_bytes, unit="B", unit_scale=True, desc="tokenizing", disable=None,
               file=sys.stderr, mininterval=1.0)
    next_log = args.log_interval
    json_path = args.output_prefix + ".json"
    json_tmp = None
    try:
        with IndexedDatasetBuilder(args.output_prefix, dtype) as builder:
            for (chunk_tokens, sizes, doc_sents, n_empty), nbytes, ndocs in _ordered_results(
                    reader.chunks(), args.workers, (encoder_kwargs, dtype.name)):
                if len(doc_sents):
                    builder.add_documents(chunk_tokens, sizes, doc_sents)
                sentences += len(sizes)
                tokens += len(chunk_tokens)
                documents += len(doc_sents)
                empty += n_empty
                docs_done += ndocs
                bytes_done += nbytes
                bar.update(nbytes)
                elapsed = max(time.perf_counter() - t0, 1e-9)
                bar.set_postfix_str(f"{docs_done / elapsed:,.0f} docs/s", refresh=False)
                if bar.disable and docs_done >= next_log:
                    print(f"{docs_done:,} documents, {docs_done / elapsed:,.0f} docs/s, "
                          f"{bytes_done / elapsed / 1e6:.2f} MB/s", file=sys.stderr, flush=True)
                    next_log = docs_done + args.log_interval
            reader.check_fraction()
            if documents == 0:
                raise UserError(_nothing_to_write(args, reader, empty, total_bytes))
            sidecar = _sidecar(args, files, vocab, dtype, total_bytes, documents, sentences, tokens, empty,
                               reader.malformed_count)
            json_tmp = write_json_temp(json_path, sidecar)  # before the data goes live: no data without it
            stats = builder.finalize()
            os.replace(json_tmp, json_path)
            json_tmp = None
    except UserError as exc:
        bar.close()  # before the report, so the two do not interleave
        print_malformed(reader)
        if isinstance(exc, _MalformedLimit):
            raise _MalformedLimit(f"{exc}; nothing was written under {args.output_prefix}.*") from None
        raise
    except OSError as exc:
        if not is_output_fault(exc, args.output_prefix):
            raise
        bar.close()
        raise write_error(exc, f"{args.output_prefix}.bin/.idx/.json",
                          "nothing was written (temporary files removed)") from exc
    finally:
        bar.close()
        if json_tmp is not None:
            remove_quietly(json_tmp)
    seconds = time.perf_counter() - t0
    print_malformed(reader)
    mb = total_bytes / 1e6
    print(f"documents {stats['documents']:,} | sentences {stats['sequences']:,} | tokens {stats['tokens']:,} "
          f"({stats['dtype']}) | empty documents skipped {empty:,} | malformed lines {reader.malformed_count:,}\n"
          f"input {mb:.2f} MB in {seconds:.1f}s = {mb / max(seconds, 1e-9):.2f} MB/s with {args.workers} worker(s)\n"
          f"wrote {stats['bin_path']} ({stats['bin_bytes']:,} B), {stats['idx_path']} ({stats['idx_bytes']:,} B), "
          f"{json_path}")
    return 0


def _nothing_to_write(args, reader: DocumentReader, empty: int, total_bytes: int) -> str:
    where = " ".join(args.input)
    if reader.records == 0:
        return (f"--input {where}: no documents ({total_bytes:,} bytes: the input is empty or holds only "
                "blank lines); nothing was written")
    if reader.malformed_count == reader.records:
        return (f"--input {where}: all {reader.records:,} records are malformed (see the list above); "
                "nothing was written")
    return (f"--input {where}: none of the {reader.records:,} records has text that gives a token "
            f"({empty:,} empty documents, {reader.malformed_count:,} malformed lines); nothing was written")


def _sidecar(args, files, vocab, dtype, total_bytes, documents, sentences, tokens, empty, malformed) -> dict:
    return {
        "format": "Megatron-LM MMIDIDX v1 (.bin tokens + .idx index)",
        "dtype": dtype.name,
        "vocab_file": os.path.abspath(args.vocab_file),
        "vocab_sha1": _sha1(args.vocab_file),
        "vocab_file_bytes": os.path.getsize(args.vocab_file),
        "vocab_size": len(vocab),
        "do_lower_case": args.do_lower_case,
        "split_sentences": args.split_sentences,
        "cn_whole_word_segment": args.cn_whole_word_segment,
        "jieba_hmm": args.jieba_hmm if args.cn_whole_word_segment else None,
        "tokenizer": args.tokenizer,
        "json_key": args.json_key,
        "inputs": [os.path.abspath(f) for f in files],
        "input_bytes": total_bytes,
        "documents": documents,
        "sentences": sentences,
        "tokens": tokens,
        "empty_documents_skipped": empty,
        "malformed_lines": malformed,
    }


def print_malformed(reader: DocumentReader) -> None:
    if not reader.malformed_count:
        return
    more = reader.malformed_count - len(reader.malformed)
    print(f"{reader.malformed_count} malformed line(s) skipped:", file=sys.stderr)
    for d in reader.malformed:
        print(f"  {d.file}:{d.line}: {d.error}", file=sys.stderr)
    if more:
        print(f"  ... and {more} more", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
