"""Train an ERNIE-style WordPiece vocab.txt from a corpus, reproducibly.

    python -m data_tools.build_vocab --input corpus.jsonl --output vocab.txt --vocab_size 18000
    python -m data_tools.build_vocab --from_vocab ernie_vocab.txt --output vocab.txt  # markers only

Layout of the result (one token per line, id = line number):
  0-4   [PAD] [CLS] [SEP] [MASK] [UNK]
  then  the alphabet (every character of the corpus, by code point), the "##<char>" pieces of the
        characters that occur inside words (by code point), then the merged pieces in the order
        they were learned, on text normalised and split exactly as the tokenizer will split it
        (data_tools.tokenization.bert_pipeline: every CJK character and punctuation mark on its own);
  last  "##<char>" for every single CJK character of the vocabulary: the whole-word markers
        (PaddleNLP's extend_chinese_char adds the same tokens at run time).
`--vocab_size` is the WordPiece target; the markers come on top of it. The file loads in
paddlenlp's ErnieTokenizer(vocab_file=...).

Reproducible: the same inputs and flags give a byte-identical file on any machine, run or thread
count. The training is the algorithm of the `tokenizers` WordPiece trainer (BPE merges with the
"##" prefix), computed here because that trainer numbers the "##" pieces in hash-map order
(random per process) and breaks ties between equally frequent merges by those numbers, so its
output changed from run to run. Here every tie is broken by the pair's ids, which are themselves
fixed (code-point order), and a merge applies to every occurrence of the pair.
"""
from __future__ import annotations

import argparse
import heapq
import os
import sys
import time
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from data_tools.cli_utils import IO_ERRNOS, UserError, run_cli, str2bool, write_error
from data_tools.indexed_dataset import mkstemp_public
from data_tools.tokenization import SPECIAL_TOKENS, WordCounter, is_cjk_char

PROG = "data_tools.build_vocab"
PREFIX = "##"
_BATCH_CHARS = 1 << 20  # characters of text counted per batch


def count_words(texts: Iterable[str], do_lower_case: bool = True) -> Dict[str, int]:
    """{word: count} over `texts`, words as the tokenizer's pipeline splits them (sorted by word)."""
    counter = WordCounter(do_lower_case)
    batch: List[str] = []
    size = 0
    for text in texts:
        batch.append(text)
        size += len(text)
        if size >= _BATCH_CHARS:
            counter.add(batch)
            batch, size = [], 0
    if batch:
        counter.add(batch)
    return counter.counts()


def train_wordpiece(word_counts: Dict[str, int], *, vocab_size: int, min_frequency: int = 2,
                    limit_alphabet: Optional[int] = None,
                    special_tokens: Sequence[str] = SPECIAL_TOKENS) -> List[str]:
    """The vocabulary (tokens in id order) that WordPiece training learns from `word_counts`.

    1. ids: the special tokens; the alphabet (all characters, or the `limit_alphabet` most frequent,
       ties by code point), by code point; "##<c>" for each character that occurs after the first
       position of a word, by code point. A character outside the alphabet is left out of its words.
    2. Each word is a sequence of ids (first character plain, the others "##"); pairs of adjacent
       ids are counted over all words, weighted by the word counts.
    3. Repeatedly merge the most frequent pair (ties: the smallest (first id, second id)) into a new
       token (the first piece + the second without "##") in every word where it occurs, until the
       vocabulary has `vocab_size` tokens or the best pair occurs fewer than `min_frequency` times.
    """
    vocab: List[str] = list(dict.fromkeys(special_tokens))
    ids: Dict[str, int] = {t: i for i, t in enumerate(vocab)}

    def add(token: str) -> int:
        if token not in ids:
            ids[token] = len(vocab)
            vocab.append(token)
        return ids[token]

    char_counts: Dict[str, int] = {}
    for word, count in word_counts.items():
        for c in word:
            char_counts[c] = char_counts.get(c, 0) + count
    alphabet = sorted(char_counts)
    if limit_alphabet is not None and len(alphabet) > limit_alphabet:
        alphabet = sorted(sorted(alphabet, key=lambda c: (-char_counts[c], c))[:limit_alphabet])
    for c in alphabet:
        add(c)
    allowed = set(alphabet)
    inner = sorted({c for word in word_counts for c in word[1:] if c in allowed})
    for c in inner:
        add(PREFIX + c)

    words: List[List[int]] = []
    counts: List[int] = []
    for word, count in word_counts.items():
        # as in the tokenizers trainer: the word's first character is plain, the others "##"
        symbols = [ids[c if i == 0 else PREFIX + c] for i, c in enumerate(word) if c in allowed]
        if len(symbols) >= 2:  # single pieces have no pairs (and are in the vocabulary already)
            words.append(symbols)
            counts.append(count)

    pair_counts: Dict[Tuple[int, int], int] = {}
    where: Dict[Tuple[int, int], set] = {}
    for w, (symbols, count) in enumerate(zip(words, counts)):
        for pair in zip(symbols, symbols[1:]):
            pair_counts[pair] = pair_counts.get(pair, 0) + count
            where.setdefault(pair, set()).add(w)
    heap = [(-c, a, b) for (a, b), c in pair_counts.items() if c > 0]
    heapq.heapify(heap)
    while heap and len(vocab) < vocab_size:
        neg, a, b = heapq.heappop(heap)
        current = pair_counts.get((a, b), 0)
        if -neg != current:  # stale entry: requeue with the current count
            if current > 0:
                heapq.heappush(heap, (-current, a, b))
            continue
        if current < max(min_frequency, 1):
            break
        second = vocab[b][len(PREFIX):] if vocab[b].startswith(PREFIX) else vocab[b]
        new = add(vocab[a] + second)
        touched: Dict[Tuple[int, int], int] = {}
        for w in sorted(where.pop((a, b), ())):
            symbols = words[w]
            merged = _merge(symbols, a, b, new)
            if merged is None:
                continue
            count = counts[w]
            for pair in zip(symbols, symbols[1:]):
                pair_counts[pair] -= count
                touched[pair] = 0
            for pair in zip(merged, merged[1:]):
                pair_counts[pair] = pair_counts.get(pair, 0) + count
                where.setdefault(pair, set()).add(w)
                touched[pair] = 0
            words[w] = merged
        for pair in touched:
            c = pair_counts[pair]
            if c > 0 and pair != (a, b):
                heapq.heappush(heap, (-c, pair[0], pair[1]))
    return vocab


def _merge(symbols: List[int], a: int, b: int, new: int) -> Optional[List[int]]:
    """`symbols` with every (a, b), left to right without overlap, replaced by `new`; None if absent."""
    out: List[int] = []
    i, n, changed = 0, len(symbols), False
    while i < n:
        if i + 1 < n and symbols[i] == a and symbols[i + 1] == b:
            out.append(new)
            i += 2
            changed = True
        else:
            out.append(symbols[i])
            i += 1
    return out if changed else None


def build_vocab(texts: Iterable[str], output: str, *, vocab_size: int = 18000, min_frequency: int = 2,
                do_lower_case: bool = True, limit_alphabet: Optional[int] = None,
                check_input: Optional[Callable[[], None]] = None) -> dict:
    """Train on `texts` and write vocab.txt atomically to `output`. Returns counts.
    `check_input` is called once the texts are read, before anything is written (it may raise)."""
    if vocab_size <= len(SPECIAL_TOKENS):
        raise UserError(f"--vocab_size {vocab_size}: must exceed the {len(SPECIAL_TOKENS)} special tokens")
    if min_frequency < 1:
        raise UserError(f"--min_frequency {min_frequency}: must be >= 1")
    if limit_alphabet is not None and limit_alphabet < 1:
        raise UserError(f"--limit_alphabet {limit_alphabet}: must be >= 1")
    word_counts = count_words(texts, do_lower_case)
    if check_input is not None:
        check_input()
    if not word_counts:
        raise UserError("the corpus has no words (it is empty, or only whitespace and control characters); "
                        "check --input and --json_key")
    learned = train_wordpiece(word_counts, vocab_size=vocab_size, min_frequency=min_frequency,
                              limit_alphabet=limit_alphabet)
    present = set(learned)
    markers = [f"{PREFIX}{t}" for t in learned if is_cjk_char(t) and f"{PREFIX}{t}" not in present]
    _write_lines(learned + markers, output)
    return {"tokens": len(learned) + len(markers), "wordpiece": len(learned), "cjk_markers": len(markers),
            "cjk_chars": sum(1 for t in learned if is_cjk_char(t)),
            "continuation_pieces": sum(1 for t in learned if t.startswith(PREFIX)),
            "words": len(word_counts), "word_count": sum(word_counts.values())}


def extend_vocab(source: str, output: str) -> dict:
    """Copy an existing vocab.txt and append the "##<char>" marker of every single CJK character
    that lacks one (ids of existing tokens are unchanged). Returns counts."""
    from data_tools.create_pretraining_data import check_vocab

    vocab = check_vocab(source, "--from_vocab")
    tokens = sorted(vocab, key=vocab.get)
    markers = [f"{PREFIX}{t}" for t in tokens if is_cjk_char(t) and f"{PREFIX}{t}" not in vocab]
    _write_lines(tokens + markers, output)
    return {"tokens": len(tokens) + len(markers), "wordpiece": len(tokens), "cjk_markers": len(markers),
            "cjk_chars": sum(1 for t in tokens if is_cjk_char(t))}


def _write_lines(tokens: Sequence[str], output: str) -> None:
    bad = [t for t in tokens if "\n" in t or "\r" in t or t == ""]
    if bad:
        raise UserError(f"token {bad[0]!r} cannot be written one per line")
    try:
        _write_atomic(tokens, output)
    except OSError as exc:
        if exc.errno not in IO_ERRNOS:
            raise
        raise write_error(exc, output, "nothing was written") from exc


def _write_atomic(tokens: Sequence[str], output: str) -> None:
    directory = os.path.dirname(os.path.abspath(output))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = mkstemp_public(directory, os.path.basename(output) + ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write("".join(t + "\n" for t in tokens))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, output)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", nargs="+",
                   help="corpus files or directories (.jsonl/.json: JSON lines; other: plain text)")
    p.add_argument("--from_vocab", default=None,
                   help="instead of training: copy this vocab.txt and append the missing ##<CJK char> markers")
    p.add_argument("--output", required=True, help="vocab.txt to write")
    p.add_argument("--json_key", default="text", help="text field of JSON-lines inputs")
    p.add_argument("--vocab_size", type=int, default=18000,
                   help="WordPiece vocabulary size (the ##<CJK char> markers are added on top)")
    p.add_argument("--min_frequency", type=int, default=2, help="minimum count of a merged piece")
    p.add_argument("--do_lower_case", type=str2bool, nargs="?", const=True, default=True,
                   help="lower-case and strip accents (must match create_pretraining_data)")
    p.add_argument("--limit_alphabet", type=int, default=None,
                   help="keep only the N most frequent characters (default: all, so no CJK character is lost)")
    p.add_argument("--max_malformed", default="0.001",
                   help="tolerated malformed lines (undecodable, bad JSON, ...): a count (10) or a fraction "
                        "of the records (0.001), as in create_pretraining_data")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Returns the exit status: 0 done, 2 a problem the user can fix (the message says which)."""
    return run_cli(PROG, lambda: _main(argv))


def _main(argv: Optional[Sequence[str]]) -> int:
    from data_tools.create_pretraining_data import (DocumentReader, list_input_files, parse_max_malformed,
                                                   print_malformed)

    args = build_parser().parse_args(argv)
    if (args.input is None) == (args.from_vocab is None):
        raise UserError("give either --input (train a vocabulary) or --from_vocab (extend one)")
    problems = []
    if os.path.isdir(args.output) or args.output.endswith(os.sep):
        problems.append(f"--output {args.output}: is a directory; give the file to write, such as "
                        f"{os.path.join(args.output, 'vocab.txt')}")
    else:
        from data_tools.create_pretraining_data import output_parent_problem

        parent = output_parent_problem(args.output, "--output")
        if parent:
            problems.append(parent)
    if args.from_vocab is not None:
        if problems:
            raise UserError(problems)
        if not os.path.isfile(args.from_vocab):
            raise UserError(f"--from_vocab {args.from_vocab}: "
                            + ("is a directory" if os.path.isdir(args.from_vocab) else "file not found"))
        stats = extend_vocab(args.from_vocab, args.output)
        print(f"wrote {args.output}: {stats['tokens']} tokens ({stats['wordpiece']} from {args.from_vocab} "
              f"+ {stats['cjk_markers']} ##<char> markers)")
        return 0
    files: List[str] = []
    limit = ("count", 0.0)
    for check in (lambda: list_input_files(args.input), lambda: parse_max_malformed(args.max_malformed)):
        try:
            result = check()
        except UserError as exc:
            problems.append(str(exc))
            continue
        if isinstance(result, list):
            files = result
        else:
            limit = result
    if problems:
        raise UserError(problems)
    from tqdm import tqdm

    reader = DocumentReader(files, args.json_key, limit, chunk_docs=1024)
    bar = tqdm(total=sum(os.path.getsize(f) for f in files), unit="B", unit_scale=True, desc="counting words",
               disable=None, file=sys.stderr, mininterval=1.0)

    def texts() -> Iterator[str]:
        for batch, nbytes, _ in reader.chunks():
            yield from batch
            bar.update(nbytes)
        bar.close()

    t0 = time.perf_counter()
    try:
        stats = build_vocab(texts(), args.output, vocab_size=args.vocab_size, min_frequency=args.min_frequency,
                            do_lower_case=args.do_lower_case, limit_alphabet=args.limit_alphabet,
                            check_input=reader.check_fraction)
    except UserError as exc:
        bar.close()
        print_malformed(reader)
        if reader.malformed_count:
            raise UserError(f"{exc}; nothing was written to {args.output}") from None
        raise
    print_malformed(reader)
    print(f"wrote {args.output}: {stats['tokens']} tokens ({stats['wordpiece']} WordPiece incl. "
          f"{stats['cjk_chars']} CJK characters, + {stats['cjk_markers']} ##<char> markers) from "
          f"{stats['word_count']:,} words ({stats['words']:,} distinct) in {time.perf_counter() - t0:.1f}s")
    if stats["wordpiece"] < args.vocab_size:
        print(f"note: {stats['wordpiece']} WordPiece tokens, fewer than --vocab_size {args.vocab_size}: the corpus "
              f"has no more pairs occurring at least --min_frequency {args.min_frequency} times", file=sys.stderr)
    if stats["tokens"] >= 65500:
        print("note: 65,500 tokens or more: token files will be int32 instead of uint16", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
