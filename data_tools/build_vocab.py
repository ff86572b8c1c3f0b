"""Train an ERNIE-style WordPiece vocab.txt from a corpus.

    python -m data_tools.build_vocab --input corpus.jsonl --output vocab.txt --vocab_size 18000
    python -m data_tools.build_vocab --from_vocab ernie_vocab.txt --output vocab.txt  # markers only

Layout of the result (one token per line, id = line number):
  0-4   [PAD] [CLS] [SEP] [MASK] [UNK]
  then  the WordPiece vocabulary learned by the `tokenizers` trainer on text normalised and
        split exactly as the tokenizer will split it (data_tools.tokenization.bert_pipeline:
        every CJK character and punctuation mark on its own, "##" continuation pieces);
  last  "##<char>" for every single CJK character of the vocabulary: the whole-word markers
        (PaddleNLP's extend_chinese_char adds the same tokens at run time).
`--vocab_size` is the WordPiece target; the markers come on top of it. The file loads in
paddlenlp's ErnieTokenizer(vocab_file=...).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Iterable, Iterator, Optional, Sequence

from data_tools.cli_utils import str2bool
from data_tools.indexed_dataset import mkstemp_public
from data_tools.tokenization import SPECIAL_TOKENS, bert_pipeline, is_cjk_char, load_vocab


def build_vocab(texts: Iterable[str], output: str, *, vocab_size: int = 18000, min_frequency: int = 2,
                do_lower_case: bool = True, limit_alphabet: Optional[int] = None,
                show_progress: bool = False) -> dict:
    """Train on `texts` and write vocab.txt atomically to `output`. Returns counts."""
    from tokenizers import Tokenizer, models, trainers

    if vocab_size <= len(SPECIAL_TOKENS):
        raise ValueError(f"--vocab_size must exceed the {len(SPECIAL_TOKENS)} special tokens, got {vocab_size}")
    if min_frequency < 1:
        raise ValueError(f"--min_frequency must be >= 1, got {min_frequency}")
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer, tok.pre_tokenizer = bert_pipeline(do_lower_case)
    options = {} if limit_alphabet is None else {"limit_alphabet": limit_alphabet}
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                        special_tokens=list(SPECIAL_TOKENS), continuing_subword_prefix="##",
                                        show_progress=show_progress, **options)
    tok.train_from_iterator(texts, trainer=trainer)
    learned = [t for t, _ in sorted(tok.get_vocab().items(), key=lambda kv: kv[1])]
    if tuple(learned[:len(SPECIAL_TOKENS)]) != SPECIAL_TOKENS:
        raise RuntimeError(f"trainer put the special tokens at unexpected ids: {learned[:len(SPECIAL_TOKENS)]}")
    if len(learned) == len(SPECIAL_TOKENS):
        raise ValueError("the corpus produced no tokens: is the input empty or the --json_key wrong?")
    present = set(learned)
    markers = [f"##{t}" for t in learned if is_cjk_char(t) and f"##{t}" not in present]
    _write_lines(learned + markers, output)
    return {"tokens": len(learned) + len(markers), "wordpiece": len(learned), "cjk_markers": len(markers),
            "cjk_chars": sum(1 for t in learned if is_cjk_char(t)),
            "continuation_pieces": sum(1 for t in learned if t.startswith("##"))}


def extend_vocab(source: str, output: str) -> dict:
    """Copy an existing vocab.txt and append the "##<char>" marker of every single CJK character
    that lacks one (ids of existing tokens are unchanged). Returns counts."""
    vocab = load_vocab(source)
    tokens = sorted(vocab, key=vocab.get)
    markers = [f"##{t}" for t in tokens if is_cjk_char(t) and f"##{t}" not in vocab]
    _write_lines(tokens + markers, output)
    return {"tokens": len(tokens) + len(markers), "wordpiece": len(tokens), "cjk_markers": len(markers),
            "cjk_chars": sum(1 for t in tokens if is_cjk_char(t))}


def _write_lines(tokens: Sequence[str], output: str) -> None:
    directory = os.path.dirname(os.path.abspath(output))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = mkstemp_public(directory, os.path.basename(output) + ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write("".join(t + "\n" for t in tokens))
        os.replace(tmp, output)
    except BaseException:
        os.remove(tmp)
        raise


def main(argv: Optional[Sequence[str]] = None) -> int:
    from data_tools.create_pretraining_data import InputError, iter_documents, list_input_files

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
    args = p.parse_args(argv)
    if (args.input is None) == (args.from_vocab is None):
        print("error: give either --input (train a vocabulary) or --from_vocab (extend one)", file=sys.stderr)
        return 2
    if args.from_vocab is not None:
        try:
            stats = extend_vocab(args.from_vocab, args.output)
        except (OSError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"wrote {args.output}: {stats['tokens']} tokens ({stats['wordpiece']} from {args.from_vocab} "
              f"+ {stats['cjk_markers']} ##<char> markers)")
        return 0
    try:
        files = list_input_files(args.input)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    skipped = []

    def texts() -> Iterator[str]:
        for doc in iter_documents(files, args.json_key):
            if doc.error is None:
                yield doc.text
            else:
                skipped.append(doc)

    t0 = time.perf_counter()
    try:
        stats = build_vocab(texts(), args.output, vocab_size=args.vocab_size, min_frequency=args.min_frequency,
                            do_lower_case=args.do_lower_case, limit_alphabet=args.limit_alphabet,
                            show_progress=sys.stderr.isatty())
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.output}: {stats['tokens']} tokens ({stats['wordpiece']} WordPiece incl. "
          f"{stats['cjk_chars']} CJK characters, + {stats['cjk_markers']} ##<char> markers) "
          f"in {time.perf_counter() - t0:.1f}s")
    if skipped:
        print(f"skipped {len(skipped)} malformed lines, e.g. " +
              "; ".join(f"{d.file}:{d.line}: {d.error}" for d in skipped[:5]), file=sys.stderr)
    if stats["tokens"] >= 65500:
        print("note: 65,500 tokens or more: token files will be int32 instead of uint16", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
