"""Text -> token ids for ERNIE pretraining data.

- `TextTokenizer`: ERNIE's WordPiece tokenizer built from a local vocab.txt. The default "fast"
  backend is the Rust `tokenizers` WordPiece configured to reproduce paddlenlp's
  `ErnieTokenizer` exactly (tests/unit/test_preprocess.py compares ids on real text); the
  "paddlenlp" backend *is* that tokenizer (slow; the reference).
- `sentence_spans` / `split_sentences`: rule-based Chinese + English sentence splitting.
- `JiebaSegmenter`: jieba's word boundaries. The default engine re-implements jieba's accurate
  mode (prefix-dictionary DAG, max-probability route, HMM for unknown runs) over jieba's own
  dictionary and model, with identical output and about 2x the speed; engine="jieba" calls
  `jieba.cut`.
- `DocumentEncoder`: a document -> one id array per sentence, optionally with Chinese
  whole-word markers: a CJK character that continues a jieba word is written as the id of
  `##<char>` (PaddleNLP's convention), so word boundaries live in the ids;
  `continuation_table` gives the map back to `<char>` used at sample time.
"""
from __future__ import annotations

import io
import functools
import hashlib
import json
import logging
import os
import re
import shutil
import sys
import tempfile
from math import log
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

SPECIAL_TOKENS = ("[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]")
UNK_TOKEN = "[UNK]"
MAX_CHARS_PER_WORD = 100  # paddlenlp WordpieceTokenizer: longer words become [UNK]

# "Chinese character" exactly as paddlenlp's BasicTokenizer._is_chinese_char defines it.
CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
              (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))
_CJK_RE = re.compile("[" + "".join(f"{chr(a)}-{chr(b)}" for a, b in CJK_RANGES) + "]")
# paddlenlp's _is_symbol also splits these code points (besides Unicode categories S*)
_EXTRA_SYMBOLS = (0x00AD, 0x00B2, 0x00BA, 0x3007, 0x00B5, 0x00D8, 0x014B, 0x01B1)

PathLike = Union[str, os.PathLike]


def is_cjk_char(ch: str) -> bool:
    """True for one character in paddlenlp's CJK ranges (each is its own token)."""
    return len(ch) == 1 and any(a <= ord(ch) <= b for a, b in CJK_RANGES)


BOM = "\ufeff"


def bom_problem(vocab_file: PathLike, first_token: str) -> str:
    """Why a vocab.txt that starts with a UTF-8 byte-order mark is refused, and the fix."""
    return (f"{vocab_file} starts with a UTF-8 byte-order mark (BOM), which paddlenlp's tokenizer reads as part of "
            f"the first token ({first_token!r} instead of {first_token[1:]!r}); save the file as UTF-8 without BOM, "
            f"e.g. sed -i '1s/^\\xEF\\xBB\\xBF//' {vocab_file}")


VOCAB_MAX_BYTES = 256 << 20  # a vocab.txt larger than this is not a vocabulary (ERNIE's is 90 KB)


def load_vocab(vocab_file: PathLike) -> Dict[str, int]:
    """token -> id from a vocab.txt (id = line number), read as paddlenlp reads it; a FIFO, device or
    oversized file is refused (`data_tools.safe_io`) instead of blocking or filling memory."""
    from data_tools.safe_io import read_text_bounded

    vocab: Dict[str, int] = {}
    try:
        text = read_text_bounded(vocab_file, max_bytes=VOCAB_MAX_BYTES, what="vocab file")
    except FileNotFoundError:
        raise FileNotFoundError(f"vocab file {vocab_file} not found; build one with "
                                "`python -m data_tools.build_vocab`") from None
    with io.StringIO(text, newline=None) as f:  # universal newlines, as open() in text mode reads
        for i, line in enumerate(f):
            token = line.rstrip("\n")
            if i == 0 and token.startswith(BOM):
                raise ValueError(bom_problem(vocab_file, token))
            if token in vocab:
                raise ValueError(f"{vocab_file}:{i + 1}: token {token!r} already on line {vocab[token] + 1}; "
                                 "a vocab file must list each token once")
            vocab[token] = i
    if not vocab:
        raise ValueError(f"vocab file {vocab_file} is empty")
    return vocab


def continuation_table(vocab: Mapping[str, int]) -> Tuple[np.ndarray, np.ndarray]:
    """(is_continuation bool[V], base_id int32[V]) indexed by token id.

    is_continuation: the token continues the previous word (any "##..." piece).
    base_id: for "##<CJK char>" the id of "<CJK char>" (the whole-word marker maps back to the
    character fed to the model); every other id maps to itself.
    """
    size = max(vocab.values()) + 1
    is_cont = np.zeros(size, dtype=bool)
    base = np.arange(size, dtype=np.int32)
    for token, i in vocab.items():
        if token.startswith("##") and len(token) > 2:
            is_cont[i] = True
            char = token[2:]
            if is_cjk_char(char) and char in vocab:
                base[i] = vocab[char]
    return is_cont, base


def marker_table(vocab: Mapping[str, int]) -> np.ndarray:
    """int64[V]: for the id of a CJK character, the id of its "##<char>" marker; -1 elsewhere."""
    table = np.full(max(vocab.values()) + 1, -1, dtype=np.int64)
    for token, i in vocab.items():
        if token.startswith("##") and is_cjk_char(token[2:]) and token[2:] in vocab:
            table[vocab[token[2:]]] = i
    return table


def bert_pipeline(do_lower_case: bool):
    """(normalizer, pre_tokenizer) of the `tokenizers` library reproducing paddlenlp's
    BasicTokenizer: drop control characters and map whitespace to spaces; lower-case and strip
    accents (NFD, drop Mn) when do_lower_case; split on whitespace; isolate every punctuation
    (Unicode P* and ASCII non-alphanumerics), symbol (S* plus paddlenlp's extra code points) and
    CJK character. Shared by the vocabulary trainer and the fast tokenizer so both see the same
    words."""
    from tokenizers import Regex, normalizers, pre_tokenizers

    extra = "".join(f"\\x{{{cp:04X}}}" for cp in _EXTRA_SYMBOLS)
    cjk = "".join(f"\\x{{{a:04X}}}-\\x{{{b:04X}}}" for a, b in CJK_RANGES)
    isolate = Regex(r"[\p{P}\p{S}!-/:-@\[-`{-~" + extra + cjk + "]")
    # CJK characters are isolated by the pre-tokenizer (with paddlenlp's exact ranges) rather
    # than by BertNormalizer's handle_chinese_chars, whose ranges differ slightly.
    normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=False,
                                            strip_accents=do_lower_case, lowercase=do_lower_case)
    pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                             pre_tokenizers.Split(isolate, behavior="isolated")])
    return normalizer, pre_tokenizer


class TextTokenizer:
    """ERNIE WordPiece tokenizer from a local vocab.txt (no special tokens are added).

    Backends, all producing the same ids as paddlenlp's ErnieTokenizer (tests/unit/test_preprocess.py):
    - "tokenizers": the Rust `tokenizers` pipeline of `bert_pipeline` + WordPiece (greedy
      longest match, "##" continuations, words over 100 characters -> [UNK]). A special-token
      string in the text ("[MASK]") is split like any text, as by ErnieTokenizer(vocab_file=...):
      raw text cannot inject control tokens.
    - "fast" (default): the same, minus the per-character cost on Chinese text. Characters that
      the pipeline always turns into one token of their own (CJK characters, punctuation and
      symbols whose normalisation is one isolated character) are looked up in a table computed
      from the Rust pipeline itself; only the runs between them go through `tokenizers`.
    - "paddlenlp": paddlenlp's `ErnieTokenizer(vocab_file, do_lower_case)` itself (slow; the reference).
    """

    BACKENDS = ("fast", "tokenizers", "paddlenlp")

    def __init__(self, vocab_file: PathLike, do_lower_case: bool = True, backend: str = "fast"):
        if backend not in self.BACKENDS:
            raise ValueError(f"tokenizer backend must be one of {self.BACKENDS}, got {backend!r}")
        self.vocab_file = os.fspath(vocab_file)
        self.vocab = load_vocab(vocab_file)
        if UNK_TOKEN not in self.vocab:
            raise ValueError(f"vocab file {vocab_file} has no {UNK_TOKEN} token")
        self.unk_id = self.vocab[UNK_TOKEN]
        self.do_lower_case = bool(do_lower_case)
        self.backend = backend
        if backend == "paddlenlp":
            import zlib  # noqa: F401  (before paddle: paddle 2.6.2 exports clashing zlib symbols)
            from paddlenlp.transformers import ErnieTokenizer

            self._ref = ErnieTokenizer(vocab_file=self.vocab_file, do_lower_case=self.do_lower_case)
            self._cjk_ids: Dict[str, int] = {}
            return
        from tokenizers import Tokenizer, models

        tok = Tokenizer(models.WordPiece(self.vocab, unk_token=UNK_TOKEN, max_input_chars_per_word=MAX_CHARS_PER_WORD))
        tok.normalizer, tok.pre_tokenizer = bert_pipeline(self.do_lower_case)
        self._rust = tok
        self._char_ids: Optional[Dict[str, int]] = None  # "fast", per text: built on first use
        self._cp_ids: Optional[np.ndarray] = None  # "fast", batched: filled as characters appear

    @property
    def vocab_size(self) -> int:
        return max(self.vocab.values()) + 1

    def tokenize(self, text: str) -> List[str]:
        if self.backend == "paddlenlp":
            return self._ref.tokenize(text)
        return self._rust.encode(text, add_special_tokens=False).tokens

    def encode(self, text: str) -> List[int]:
        if self.backend == "paddlenlp":
            return self._ref.convert_tokens_to_ids(self._ref.tokenize(text))
        return self.encode_with_starts(text)[0].tolist()

    def encode_batch(self, texts: Sequence[str]) -> List[List[int]]:
        return [self.encode(t) for t in texts]

    def encode_with_starts(self, text: str) -> Tuple[np.ndarray, np.ndarray]:
        """(ids int64[n], starts int64[n]): starts[k] is the character offset where token k
        begins. The "paddlenlp" backend knows it only for tokens made from one CJK character
        (-1 elsewhere)."""
        if self.backend == "paddlenlp":
            return self._ref_with_starts(text)
        if self.backend == "tokenizers":
            return _ids_starts(self._rust.encode(text, add_special_tokens=False), 0)
        # table lookups for single-token characters, the Rust pipeline for the runs between them
        if self._char_ids is None:
            forms, self._other_runs = _single_token_forms(self.do_lower_case)
            self._char_ids = {c: self.vocab.get(n, self.unk_id) for c, n in forms.items()}
        char_id = self._char_ids.__getitem__
        runs = [(m.start(), m.group()) for m in self._other_runs.finditer(text)]
        if not runs:
            return np.fromiter(map(char_id, text), np.int64, len(text)), np.arange(len(text), dtype=np.int64)
        ids: List[int] = []
        starts: List[int] = []
        pos = 0
        for (a, run), enc in zip(runs, self._rust.encode_batch([r for _, r in runs], add_special_tokens=False)):
            if a > pos:
                ids += map(char_id, text[pos:a])
                starts += range(pos, a)
            ids += enc.ids
            starts += [a + s for s, _ in enc.offsets]
            pos = a + len(run)
        ids += map(char_id, text[pos:])
        starts += range(pos, len(text))
        return np.array(ids, dtype=np.int64), np.array(starts, dtype=np.int64)

    def encode_codes(self, text: str, codes: Optional[np.ndarray] = None) -> Tuple[np.ndarray, np.ndarray]:
        """`encode_with_starts` for long texts (such as a chunk of documents joined by newlines),
        vectorised for the "fast" backend: single-token characters through a code-point table
        (classified as they first appear, by the rule of `_single_token_forms`), and one Rust call
        on the runs of other characters joined by spaces (a space always separates tokens, so
        this yields exactly the tokens of each run), whose offsets map back to the text."""
        if self.backend != "fast":
            return self.encode_with_starts(text)
        if codes is None:
            codes = text_codes(text)
        table = self._code_point_ids(codes)
        tid = table[codes]
        other = tid < 0
        single = np.flatnonzero(~other)
        ids, starts = tid[single].astype(np.int64), single.astype(np.int64)
        if len(single) < len(codes):
            # the runs, each preceded by the single-token character before it written as a space
            keep = other.copy()
            keep[:-1] |= other[1:] & ~other[:-1]
            where = np.flatnonzero(keep)
            joined = np.where(other[where], codes[where], np.uint32(32)).astype("<u4")
            enc = self._rust.encode(joined.tobytes().decode("utf-32-le", "surrogatepass"), add_special_tokens=False)
            if enc.ids:
                ids = np.concatenate([ids, np.array(enc.ids, dtype=np.int64)])
                starts = np.concatenate([starts, where[np.array(enc.offsets, dtype=np.int64)[:, 0]]])
                order = np.argsort(starts, kind="stable")
                ids, starts = ids[order], starts[order]
        return ids, starts

    def _code_point_ids(self, codes: np.ndarray) -> np.ndarray:
        """int32[0x110000]: the id of a single-token character, -1 for any other character,
        -2 for one not classified yet; classifies the new characters of `codes`."""
        if self._cp_ids is None:
            self._cp_ids = np.full(0x110000, -2, dtype=np.int32)
        table = self._cp_ids
        new = codes[table[codes] == -2]
        if len(new):
            new = np.unique(new)
            forms = _classify_chars([chr(c) for c in new.tolist()], self.do_lower_case)
            table[new] = [self.vocab.get(forms[chr(c)], self.unk_id) if chr(c) in forms else -1
                          for c in new.tolist()]
        return table

    def encode_spans(self, text: str, spans: Sequence[Tuple[int, int]]) -> List[Tuple[np.ndarray, np.ndarray]]:
        """[(ids, starts)] of `text[a:b]` for each (a, b) span, starts as offsets into `text`.

        Tokens never cross a sentence boundary (sentences end after punctuation or at whitespace,
        where the tokenizer always splits), so "fast"/"tokenizers" tokenize the whole text once and
        cut by offsets; "paddlenlp" tokenizes span by span."""
        if self.backend == "paddlenlp":
            out = []
            for a, b in spans:
                ids, starts = self._ref_with_starts(text[a:b])
                out.append((ids, np.where(starts >= 0, starts + a, -1)))
            return out
        ids, starts = self.encode_with_starts(text)
        cuts = np.searchsorted(starts, np.asarray(spans, dtype=np.int64).reshape(-1))
        return [(ids[lo:hi], starts[lo:hi]) for lo, hi in cuts.reshape(-1, 2)]

    def _ref_with_starts(self, text: str) -> Tuple[np.ndarray, np.ndarray]:
        # paddlenlp's tokenizer gives no offsets. Its BasicTokenizer puts spaces around every CJK
        # character, so tokenizing the runs between CJK characters and each character alone
        # yields the same tokens as tokenizing the whole text, with known CJK positions.
        ids: List[int] = []
        starts: List[int] = []
        pos = 0
        for m in _CJK_RE.finditer(text):
            if m.start() > pos:
                seg = self.encode(text[pos:m.start()])
                ids += seg
                starts += [-1] * len(seg)
            char = m.group()
            if char not in self._cjk_ids:
                one = self.encode(char)
                if len(one) != 1:
                    raise RuntimeError(f"paddlenlp tokenized CJK character {char!r} into {len(one)} tokens")
                self._cjk_ids[char] = one[0]
            ids.append(self._cjk_ids[char])
            starts.append(m.start())
            pos = m.end()
        if pos < len(text):
            seg = self.encode(text[pos:])
            ids += seg
            starts += [-1] * len(seg)
        return np.array(ids, dtype=np.int64), np.array(starts, dtype=np.int64)


class WordCounter:
    """Counts the words a vocabulary is trained on: the pieces of `bert_pipeline` (normalised and
    pre-tokenized exactly as the tokenizer will see the text). Characters that are always a word of
    their own (CJK, most punctuation and symbols: `_classify_chars`) are counted with NumPy; the
    runs between them go through the Rust pipeline, joined by spaces (a space always separates
    words). `tests/unit/test_build_vocab.py` checks the counts against the pipeline applied to each text."""

    def __init__(self, do_lower_case: bool = True):
        self.do_lower_case = bool(do_lower_case)
        self.normalizer, self.pre_tokenizer = _pipeline(self.do_lower_case)
        self._forms = np.full(0x110000, -2, dtype=np.int64)  # normalised code point, -1 other, -2 unknown
        self._singles = np.zeros(0x110000, dtype=np.int64)  # counts by normalised code point
        self._words: Dict[str, int] = {}

    def add(self, texts: Sequence[str]) -> None:
        """Count the words of `texts` (a batch: they are joined by newlines)."""
        text = "\n".join(texts)
        codes = text_codes(text)
        forms = self._forms
        new = codes[forms[codes] == -2]
        if len(new):
            new = np.unique(new)
            found = _classify_chars([chr(c) for c in new.tolist()], self.do_lower_case)
            forms[new] = [ord(found[chr(c)]) if chr(c) in found else -1 for c in new.tolist()]
        f = forms[codes]
        single = f >= 0
        self._singles += np.bincount(f[single], minlength=0x110000)
        if single.all():
            return
        other = ~single
        keep = other.copy()
        keep[:-1] |= other[1:] & ~other[:-1]
        where = np.flatnonzero(keep)
        joined = np.where(other[where], codes[where], np.uint32(32)).astype("<u4")
        runs = joined.tobytes().decode("utf-32-le", "surrogatepass")
        words = self._words
        for word, _ in self.pre_tokenizer.pre_tokenize_str(self.normalizer.normalize_str(runs)):
            words[word] = words.get(word, 0) + 1

    def counts(self) -> Dict[str, int]:
        """{word: count}, in a fixed order (by word)."""
        merged = dict(self._words)
        for cp in np.flatnonzero(self._singles).tolist():
            w = chr(cp)
            merged[w] = merged.get(w, 0) + int(self._singles[cp])
        return {w: merged[w] for w in sorted(merged)}


@functools.lru_cache(maxsize=2)
def _single_token_forms(do_lower_case: bool) -> Tuple[Dict[str, str], "re.Pattern"]:
    """({char: normalised char}, regex of runs of other characters) for every CJK, punctuation
    or symbol character that the Rust pipeline normalises to one character and isolates between
    letters: such a character is one token (its normalised form, or [UNK]) whatever surrounds it.
    Derived from the pipeline itself, so the table cannot drift from it; computed once per process."""
    candidates = [chr(cp) for a, b in CJK_RANGES for cp in range(a, b + 1)]
    # punctuation and symbols of the BMP and of the emoji/symbol blocks (others simply take the
    # Rust path: a smaller table is slower, never different)
    candidates += [c for cp in (*range(0xD800), *range(0xE000, 0x10000), *range(0x1F000, 0x1FC00))
                   for c in [chr(cp)] if _is_symbol_candidate(c)]
    forms = _classify_chars(candidates, do_lower_case)
    return forms, re.compile("[^" + _char_class(forms) + "]+")


def _is_symbol_candidate(c: str) -> bool:
    import unicodedata

    cp = ord(c)
    if cp in _EXTRA_SYMBOLS:
        return True
    in_table_range = cp < 0xD800 or 0xE000 <= cp < 0x10000 or 0x1F000 <= cp < 0x1FC00
    return in_table_range and unicodedata.category(c)[0] in "PS" and not _CJK_RE.match(c)


def _classify_chars(chars: Sequence[str], do_lower_case: bool) -> Dict[str, str]:
    """{char: normalised char} for those of `chars` that are one token whatever surrounds them:
    CJK characters whose normal form is one CJK character, and punctuation/symbol candidates
    (`_is_symbol_candidate`) whose normal form is one character that the pre-tokenizer isolates.
    The answer for a character does not depend on the others given with it."""
    import unicodedata

    normalizer, pre_tokenizer = _pipeline(do_lower_case)
    cjk = [c for c in chars if _CJK_RE.match(c)]
    symbols = [c for c in chars if not _CJK_RE.match(c) and _is_symbol_candidate(c)]
    forms = {c: n for c, n in zip(cjk, _normalize_each(normalizer, cjk)) if len(n) == 1 and _CJK_RE.match(n)}
    pairs = [(c, n) for c, n in zip(symbols, _normalize_each(normalizer, symbols))
             if len(n) == 1 and not n.isspace() and not unicodedata.combining(n)]
    if pairs:
        # one pre-tokenizer call on "a" n1 "a" n2 "a" ...: n_k is isolated iff it comes back as the
        # one-character piece at (character) offset 2k+1
        probe = "a" + "a".join(n for _, n in pairs) + "a"
        isolated = {start for piece, (start, end) in pre_tokenizer.pre_tokenize_str(probe)
                    if end - start == 1 and piece != "a"}
        forms.update((c, n) for k, (c, n) in enumerate(pairs) if 2 * k + 1 in isolated)
    return forms


@functools.lru_cache(maxsize=2)
def _pipeline(do_lower_case: bool):
    return bert_pipeline(do_lower_case)


def _normalize_each(normalizer, chars: Sequence[str]) -> List[str]:
    """normalizer.normalize_str of each character, in one call on the characters joined by
    spaces (a space stays a space, and no character's normal form merges with its neighbours');
    one call per character if the pieces do not come back one per character."""
    if not chars:
        return []
    pieces = normalizer.normalize_str(" ".join(chars)).split(" ")
    if len(pieces) == len(chars):
        return pieces
    return [normalizer.normalize_str(c) for c in chars]


def _ids_starts(encoding, offset: int) -> Tuple[np.ndarray, np.ndarray]:
    ids = np.array(encoding.ids, dtype=np.int64)
    starts = np.array([s for s, _ in encoding.offsets], dtype=np.int64).reshape(-1) + offset
    return ids, starts


def _char_class(chars: Mapping[str, int]) -> str:
    """A regex character class body matching exactly the given characters (as code-point ranges)."""
    cps = sorted(map(ord, chars))
    parts = []
    lo = prev = cps[0]
    for cp in cps[1:] + [-1]:
        if cp == prev + 1:
            prev = cp
            continue
        parts.append(re.escape(chr(lo)) if lo == prev else f"{re.escape(chr(lo))}-{re.escape(chr(prev))}")
        lo = prev = cp
    return "".join(parts)


# --------------------------------------------------------------------------------------------
# Sentence splitting

_CLOSERS = "\"'”’」』）)】》〕"
# A sentence ends after: Chinese 。！？； (runs, e.g. "？！"); ASCII ! or ? before a CJK character;
# or . ! ? before whitespace / end of line. Closing quotes and brackets stay with the sentence.
_SENT_END = re.compile(
    "(?:[。！？；]+[!?]*"
    f"|[!?]+(?=[{_CLOSERS}]*[\u3400-\u9fff])"
    f"|[.!?]+(?=[{_CLOSERS}]*(?:\\s|$)))"
    f"[{_CLOSERS}]*")
_LINE = re.compile(r"[^\n]+")


def sentence_spans(text: str, split_punctuation: bool = True) -> List[Tuple[int, int]]:
    """(start, end) character spans of the sentences of `text`, whitespace-stripped, non-empty.
    Every newline ends a sentence; with split_punctuation, so does sentence-final punctuation
    (English abbreviations such as "Mr. " are split too: the rule has no abbreviation list)."""
    spans = []
    for line in _LINE.finditer(text):
        cuts = [line.start()]
        if split_punctuation:
            cuts += [line.start() + m.end() for m in _SENT_END.finditer(line.group())]
        cuts.append(line.end())
        for a, b in zip(cuts, cuts[1:]):
            piece = text[a:b]
            stripped = piece.strip()
            if stripped:
                a += len(piece) - len(piece.lstrip())
                spans.append((a, a + len(stripped)))
    return spans


def split_sentences(text: str, split_punctuation: bool = True) -> List[str]:
    """The sentences of `text` (see `sentence_spans`)."""
    return [text[a:b] for a, b in sentence_spans(text, split_punctuation)]


# str.isspace (what str.strip() removes) for the code points where it can be true (all < U+3001)
_ISSPACE = np.array([chr(cp).isspace() for cp in range(0x3001)], dtype=bool)


_SENT_FIRST = np.zeros(0x10000, dtype=bool)  # characters a _SENT_END match can start with
_SENT_FIRST[[ord(c) for c in "。！？；!?."]] = True


def _sentence_ends(text: str, codes: np.ndarray) -> np.ndarray:
    """The ends of `_SENT_END.finditer(text)`, trying the pattern only where it can start."""
    first = np.zeros(len(codes), dtype=bool)
    bmp = codes < 0x10000
    first[bmp] = _SENT_FIRST[codes[bmp]]
    ends = []
    last = 0
    match = _SENT_END.match
    for pos in np.flatnonzero(first).tolist():
        if pos < last:
            continue  # inside the previous match (finditer resumes after it)
        m = match(text, pos)
        if m:
            last = m.end()
            ends.append(last)
    return np.array(ends, dtype=np.int64)


def sentence_span_arrays(text: str, codes: Optional[np.ndarray] = None,
                         split_punctuation: bool = True) -> Tuple[np.ndarray, np.ndarray]:
    """`sentence_spans` as two int64 arrays (starts, ends), vectorised for long texts. The same
    rule: newlines and the ends of `_SENT_END` matches (which never contain a newline, and whose
    look-aheads treat a newline as the end of a line) cut the text, and each piece is stripped
    of str.isspace characters; empty pieces are dropped."""
    if codes is None:
        codes = text_codes(text)
    n = len(codes)
    newlines = np.flatnonzero(codes == 10)
    cuts = [np.array([0, n]), newlines, newlines + 1]
    if split_punctuation:
        cuts.append(_sentence_ends(text, codes))
    cuts = np.unique(np.concatenate(cuts))
    space = np.zeros(n, dtype=bool)
    small = codes < len(_ISSPACE)
    space[small] = _ISSPACE[codes[small]]
    solid = np.flatnonzero(~space)  # the non-space characters; a piece keeps those inside it
    first = np.searchsorted(solid, cuts[:-1])
    stop = np.searchsorted(solid, cuts[1:])
    keep = stop > first
    return solid[first[keep]].astype(np.int64), solid[stop[keep] - 1].astype(np.int64) + 1


# --------------------------------------------------------------------------------------------
# Chinese word segmentation (jieba)

_RE_HAN = re.compile("[\u4E00-\u9FD5a-zA-Z0-9+#&\\._%\\-]+")  # jieba's re_han_default blocks
_RE_HMM_HAN = re.compile("([\u4E00-\u9FD5]+)")  # jieba.finalseg.re_han
_RE_HMM_SKIP = re.compile(r"([a-zA-Z0-9]+(?:\.\d+)?%?)")  # jieba.finalseg.re_skip
_RE_ENG = re.compile("[a-zA-Z0-9]")  # jieba.re_eng
_MISSING = object()
_HAN_LO, _HAN_HI = 0x4E00, 0x9FD5  # jieba's Han range (re_han_default, finalseg.re_han)
_BLOCK_ASCII = np.zeros(128, dtype=bool)  # the ASCII characters of jieba's blocks
_BLOCK_ASCII[[ord(c) for c in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+#&._%-"]] = True
_ENG_ASCII = np.zeros(128, dtype=bool)  # jieba.re_eng
_ENG_ASCII[[ord(c) for c in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"]] = True
_B, _M, _E, _S = 0, 1, 2, 3  # HMM states, in the order of the model arrays
# Blocks and HMM runs longer than this take a plain loop: the lockstep costs one step per
# character of the longest (in People's Daily 0.2% of the characters are in blocks over 64).
_LOCKSTEP_MAX = 64
_BATCH_MIN_CHARS = 2048  # word_internal of shorter texts: the per-character path has less overhead
_JIEBA_TABLES_FORMAT = 1


def cache_dir() -> str:
    """Where derived tables are cached: $ERNIE_MTL_CACHE_DIR, else $XDG_CACHE_HOME/ernie_mtl,
    else ~/.cache/ernie_mtl."""
    explicit = os.environ.get("ERNIE_MTL_CACHE_DIR")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ernie_mtl")


def _jieba_source() -> Tuple[str, Dict[str, object]]:
    """(dictionary path, identity) of the dictionary and HMM files jieba would load, found without
    importing jieba (its import alone takes 0.1 s)."""
    import importlib.util

    jieba_mod = sys.modules.get("jieba")
    custom = getattr(getattr(jieba_mod, "dt", None), "dictionary", None) if jieba_mod else None
    spec = importlib.util.find_spec("jieba")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the jieba package is needed for Chinese word segmentation: pip install jieba")
    pkg = list(spec.submodule_search_locations)[0]
    files = [custom or os.path.join(pkg, "dict.txt")] + [os.path.join(pkg, "finalseg", f"prob_{n}.py")
                                                         for n in ("start", "trans", "emit")]
    ident: Dict[str, object] = {"format": _JIEBA_TABLES_FORMAT}
    for path in files:
        st = os.stat(path)
        ident[os.path.abspath(path)] = [st.st_size, st.st_mtime_ns]
    return files[0], ident


def _build_jieba_arrays() -> Dict[str, np.ndarray]:
    """jieba's prefix dictionary and HMM as arrays (from jieba itself: seconds; cached on disk)."""
    import jieba
    from jieba import finalseg

    jieba.setLogLevel(logging.WARNING)
    jieba.dt.check_initialized()
    freq = jieba.dt.FREQ
    logtotal = log(jieba.dt.total)
    words = list(freq)
    # the same expression as jieba's calc(): log(freq) - logtotal; NaN marks a pure prefix
    values = np.array([log(f) - logtotal if f else np.nan for f in freq.values()], dtype=np.float64)
    alphabet = sorted({c for w in words for c in w})
    char_id = {c: i + 1 for i, c in enumerate(alphabet)}  # 0: a character jieba does not know
    base = len(alphabet) + 1
    kmax = max(1, min(4, int(63 / np.log2(base))))  # longest word whose key fits in int64
    single_logp = np.full(base, np.nan)
    single_in = np.zeros(base, dtype=bool)
    keys, key_values, long_words, long_values = [], [], [], []
    for w, v in zip(words, values.tolist()):
        if len(w) == 1:
            single_in[char_id[w]] = True
            single_logp[char_id[w]] = v
        elif len(w) <= kmax:
            k = 0
            for c in w:
                k = k * base + char_id[c]
            keys.append(k)
            key_values.append(v)
        else:
            long_words.append(w)
            long_values.append(v)
    hash_keys, hash_values = _hash_table(np.array(keys, dtype=np.int64), np.array(key_values, dtype=np.float64))
    e = finalseg.emit_P
    emit = np.full((4, _HAN_HI - _HAN_LO + 1), finalseg.MIN_FLOAT, dtype=np.float64)
    for s, state in enumerate("BMES"):
        for c, p in e[state].items():
            if _HAN_LO <= ord(c) <= _HAN_HI:
                emit[s, ord(c) - _HAN_LO] = p
    t, st = finalseg.trans_P, finalseg.start_P
    return {
        "alphabet": np.array([ord(c) for c in alphabet], dtype=np.int64),
        "kmax": np.array(kmax), "fallback": np.array(0.0 - logtotal),  # log(1) - logtotal
        "single_logp": single_logp, "single_in": single_in,
        "hash_keys": hash_keys, "hash_values": hash_values,
        "long_words": np.frombuffer("\n".join(long_words).encode("utf-8"), dtype=np.uint8),
        "long_values": np.array(long_values, dtype=np.float64),
        "words": np.frombuffer("\n".join(words).encode("utf-8"), dtype=np.uint8), "word_values": values,
        "hmm_start": np.array([st[s] for s in "BMES"], dtype=np.float64),
        # order of JiebaSegmenter._trans: BE BM EB ES ME MM SB SS
        "hmm_trans": np.array([t["B"]["E"], t["B"]["M"], t["E"]["B"], t["E"]["S"],
                               t["M"]["E"], t["M"]["M"], t["S"]["B"], t["S"]["S"]], dtype=np.float64),
        "hmm_emit": emit, "hmm_min": np.array(finalseg.MIN_FLOAT),
    }


_HASH_MULT = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing


def _hash_slots(keys: np.ndarray, bits: int) -> np.ndarray:
    with np.errstate(over="ignore"):
        return ((keys.astype(np.uint64) * _HASH_MULT) >> np.uint64(64 - bits)).astype(np.int64)


def _hash_table(keys: np.ndarray, values: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Open addressing with linear probing, built in rounds (round r places, at slot h + r, the
    keys whose earlier slots were all taken), so a lookup probes h, h+1, ... until the key or an
    empty slot (-1). Load factor below 1/3."""
    bits = max(4, int(np.ceil(np.log2(3 * max(len(keys), 1)))))
    size = 1 << bits
    slot_keys = np.full(size, -1, dtype=np.int64)
    slot_values = np.full(size, np.nan)
    home = _hash_slots(keys, bits)
    pending = np.arange(len(keys))
    probe = 0
    while len(pending):
        slots = (home[pending] + probe) & (size - 1)
        free = slot_keys[slots] == -1
        taken, first = np.unique(slots[free], return_index=True)
        winners = pending[free][first]
        slot_keys[taken] = keys[winners]
        slot_values[taken] = values[winners]
        placed = np.zeros(len(keys), dtype=bool)
        placed[winners] = True
        pending = pending[~placed[pending]]
        probe += 1
    return slot_keys, slot_values


class _JiebaModel:
    """jieba's dictionary and HMM in the arrays the segmenters use, memory-mapped from a cache
    folder (`cache_dir()`/jieba-<key>/, one .npy file per array; key = the identity of jieba's
    dictionary and HMM files) or built from jieba and cached. Loading takes milliseconds instead
    of jieba's second, and forked workers share the pages."""

    _ARRAYS = ("alphabet", "kmax", "fallback", "single_logp", "single_in", "hash_keys", "hash_values",
               "long_words", "long_values", "words", "word_values", "hmm_start", "hmm_trans", "hmm_emit", "hmm_min")

    def __init__(self):
        self.dictionary, ident = _jieba_source()
        key = hashlib.sha1(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
        self.cache_path = os.path.join(cache_dir(), f"jieba-{key}")
        arrays = self._load()
        if arrays is None:
            arrays = _build_jieba_arrays()
            self._save(arrays)
        self._arrays = arrays
        alphabet = arrays["alphabet"]
        self.base = len(alphabet) + 1
        self.kmax = int(arrays["kmax"])
        self.char_ids = np.zeros(int(alphabet.max(initial=0)) + 2, dtype=np.int64)  # last entry: unknown
        self.char_ids[alphabet] = np.arange(1, len(alphabet) + 1)
        self.single_in = np.asarray(arrays["single_in"])
        # edge weights: -inf where there is no word (a pure prefix, or not in the dictionary)
        self.single_edge = np.where(np.isnan(arrays["single_logp"]), -np.inf, arrays["single_logp"])
        self.hash_keys, self.hash_values = arrays["hash_keys"], arrays["hash_values"]
        self.hash_bits = int(len(self.hash_keys)).bit_length() - 1
        long_text = np.asarray(arrays["long_words"]).tobytes().decode("utf-8")
        self.long: Dict[str, Optional[float]] = dict(zip(
            long_text.split("\n") if long_text else [],
            [None if v != v else v for v in arrays["long_values"].tolist()]))
        self.fallback = float(arrays["fallback"])
        self.hmm_start = tuple(arrays["hmm_start"].tolist())
        self.hmm_trans = tuple(arrays["hmm_trans"].tolist())
        self.hmm_emit = np.asarray(arrays["hmm_emit"])
        self.hmm_min = float(arrays["hmm_min"])
        self._logp: Optional[Dict[str, Optional[float]]] = None

    def _load(self) -> Optional[Dict[str, np.ndarray]]:
        try:
            return {name: np.load(os.path.join(self.cache_path, name + ".npy"), mmap_mode="r")
                    for name in self._ARRAYS}
        except (OSError, ValueError, EOFError):
            return None  # missing or unreadable: rebuild

    def _save(self, arrays: Dict[str, np.ndarray]) -> None:
        """Write the cache folder atomically (a temporary folder renamed into place); a cache that
        cannot be written is only slower next time."""
        parent = os.path.dirname(self.cache_path)
        tmp = None
        try:
            os.makedirs(parent, exist_ok=True)
            tmp = tempfile.mkdtemp(prefix=os.path.basename(self.cache_path) + ".", suffix=".tmp", dir=parent)
            for name in self._ARRAYS:
                np.save(os.path.join(tmp, name + ".npy"), arrays[name])
            if os.path.isdir(self.cache_path):  # damaged (it did not load): replace it
                shutil.rmtree(self.cache_path, ignore_errors=True)
            os.rename(tmp, self.cache_path)
            tmp = None
        except OSError:
            pass  # another process may have just renamed its copy into place: keep that one
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)

    @property
    def logp(self) -> Dict[str, Optional[float]]:
        """{word: log-probability, pure prefix: None}: the per-character path's dictionary
        (half a million entries: built on first use)."""
        if self._logp is None:
            words, values = self._arrays["words"], self._arrays["word_values"]
            self._logp = dict(zip(np.asarray(words).tobytes().decode("utf-8").split("\n"),
                                  [None if v != v else v for v in values.tolist()]))
        return self._logp

    def lookup(self, keys: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """(in the prefix dictionary, log-probability: -inf for a pure prefix) of words of
        2..kmax characters given as keys (base-`base` numbers of their character ids, all > 0)."""
        found = np.zeros(len(keys), dtype=bool)
        value = np.full(len(keys), -np.inf)
        mask = len(self.hash_keys) - 1
        slots = _hash_slots(keys, self.hash_bits)
        pending = np.arange(len(keys))
        while len(pending):
            k = self.hash_keys[slots]
            hit = k == keys
            if hit.any():
                where = pending[hit]
                found[where] = True
                value[where] = self.hash_values[slots[hit]]
            go_on = ~hit & (k != -1)
            pending, keys, slots = pending[go_on], keys[go_on], (slots[go_on] + 1) & mask
        value[np.isnan(value)] = -np.inf  # NaN in the table: a pure prefix
        return found, value

    def ids(self, codes: np.ndarray) -> np.ndarray:
        """Character ids (0 = not in the dictionary) of code points."""
        return self.char_ids[np.minimum(codes, len(self.char_ids) - 1)]


@functools.lru_cache(maxsize=1)
def _jieba_model() -> _JiebaModel:
    return _JiebaModel()


def text_codes(text: str) -> np.ndarray:
    """uint32 code points of `text` (lone surrogates kept as themselves)."""
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")


def _runs(mask: np.ndarray, joined: Optional[np.ndarray] = None) -> Tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of the maximal runs of True in `mask`; with `joined` (bool[len-1]), items i
    and i+1 belong to one run only where joined[i]."""
    m = mask.astype(np.int8)
    if joined is None:
        edges = np.diff(m, prepend=np.int8(0), append=np.int8(0))
        return np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    link = np.zeros(len(mask) + 1, dtype=bool)
    link[1:-1] = mask[:-1] & mask[1:] & joined
    starts = np.flatnonzero(mask & ~link[:-1])
    ends = np.flatnonzero(mask & ~link[1:]) + 1
    return starts, ends


class JiebaSegmenter:
    """Word boundaries from jieba's accurate mode (`jieba.cut(text, HMM=hmm)`).

    engine="fast" computes the same segmentation as jieba (same dictionary, same log-probabilities
    summed in the same order, same tie-breaking, same HMM) without jieba's per-word generators, in
    two ways with identical output:
    - per character (`word_lengths`, short texts): one backward pass per block fuses jieba's
      `get_DAG` and `calc`; unknown runs go through an unrolled Viterbi;
    - batched (`word_starts`, long texts and whole chunks of documents): the same steps as NumPy
      operations over all blocks of the text at once. The dictionary is a sorted array of
      integer keys (a word of up to 4 characters = a number in base |alphabet|+1); the route is
      computed for all blocks in lockstep, position by position from the block ends, with the
      same float64 additions and comparisons as jieba; the route walk and jieba's HMM Viterbi
      run in lockstep over all words and unknown runs. Blocks and runs over 64 characters
      (rare) are computed by plain loops over the same arrays.
    It reads jieba's dictionary and HMM files (as shipped, or jieba.set_dictionary's) through a
    cache of arrays (`cache_dir()`), so it starts in milliseconds; words added with
    `jieba.add_word` are not seen (use engine="jieba"). engine="jieba" calls `jieba.cut`.
    """

    def __init__(self, hmm: bool = True, engine: str = "fast"):
        if engine not in ("fast", "jieba"):
            raise ValueError(f"segmenter engine must be 'fast' or 'jieba', got {engine!r}")
        self.hmm = bool(hmm)
        self.engine = engine
        if engine == "jieba":
            import jieba

            jieba.setLogLevel(logging.WARNING)
            jieba.initialize()
            self._jieba = jieba.dt
            return
        self._model = _jieba_model()
        self._fallback = self._model.fallback
        self._trans = self._model.hmm_trans
        self._start = self._model.hmm_start
        self._emit = tuple(self._model.hmm_emit)
        self._low = self._model.hmm_min

    @property
    def _logp(self) -> Dict[str, Optional[float]]:
        return self._model.logp

    def word_lengths(self, text: str) -> List[int]:
        """Lengths of the words of jieba.cut(text, HMM=hmm), in order (they sum to len(text))."""
        if self.engine == "jieba":
            return [len(w) for w in self._jieba.cut(text, HMM=self.hmm)]
        out: List[int] = []
        pos = 0
        for m in _RE_HAN.finditer(text):
            if m.start() > pos:
                _gap_lengths(text[pos:m.start()], out)
            self._block(m.group(), out)
            pos = m.end()
        if pos < len(text):
            _gap_lengths(text[pos:], out)
        return out

    def word_internal(self, text: str) -> np.ndarray:
        """bool[len(text)]: True where the character continues a word (is not its first)."""
        if self.engine == "fast" and len(text) >= _BATCH_MIN_CHARS:
            return ~self.word_starts(text)
        lengths = np.fromiter(self.word_lengths(text), dtype=np.int64)
        internal = np.ones(len(text), dtype=bool)
        if lengths.size:
            internal[np.cumsum(lengths) - lengths] = False
        return internal

    # ---- the batched path ---------------------------------------------------------------------

    def word_starts(self, text: str, codes: Optional[np.ndarray] = None) -> np.ndarray:
        """bool[len(text)]: True where a word of jieba.cut(text, HMM=hmm) starts (batched)."""
        if self.engine == "jieba":
            return ~self.word_internal(text)
        if codes is None:
            codes = text_codes(text)
        n = len(codes)
        starts = np.zeros(n, dtype=bool)
        if n == 0:
            return starts
        model = self._model
        han = (codes - np.uint32(_HAN_LO)) <= np.uint32(_HAN_HI - _HAN_LO)
        ascii_ = codes < 128
        in_block = han.copy()
        in_block[ascii_] = _BLOCK_ASCII[codes[ascii_]]
        # gaps between blocks: every character is a word, except that "\r\n" is one
        starts[~in_block] = True
        crlf = np.flatnonzero((codes[1:] == 10) & (codes[:-1] == 13)) + 1
        starts[crlf] = False
        bstart, bend = _runs(in_block)
        if not len(bstart):
            return starts
        blen = bend - bstart
        # Q: the positions of the blocks, block after block; local index j
        qoff = np.cumsum(blen) - blen  # j of each block's first character
        q = np.arange(int(blen.sum()), dtype=np.int64) + np.repeat(bstart - qoff, blen)
        left = np.repeat(bend, blen) - q  # characters from q to its block's end (>= 1)
        cid = model.ids(codes[q])
        edge, long_edges = self._edges(text, q, left, cid)
        long_block = blen > _LOCKSTEP_MAX
        end_len = self._route(q, left, edge, long_edges, n, np.repeat(~long_block, blen))
        word = self._walk(qoff[~long_block], left, end_len)
        for j0, j1 in zip(qoff[long_block].tolist(), (qoff + blen)[long_block].tolist()):
            self._route_block(j0, j1, edge, long_edges, end_len)
            steps = end_len[j0:j1].tolist()
            j = 0
            while j < j1 - j0:
                word[j0 + j] = True
                j += steps[j]
        single = word & (end_len == 1)
        if self.hmm:
            self._hmm_runs(text, codes, q, left, cid, single, word)
        else:  # consecutive single ASCII letters/digits form one word (jieba's __cut_DAG_NO_HMM)
            cq = codes[q]
            eng = single & (cq < 128)
            eng[eng] = _ENG_ASCII[cq[eng]]
            rs, re_ = _runs(eng, left[:-1] > 1)
            _clear_inner(word, rs, re_)
        starts[q] = word
        return starts

    def _edges(self, text: str, q: np.ndarray, left: np.ndarray, cid: np.ndarray):
        """edge[j, L-1]: log-probability of the word of L characters at q[j] (-inf: none), for
        L <= kmax, following jieba's get_DAG (a word is looked up only while its prefixes are
        in the prefix dictionary); {j: [(L, logp), ...]} for longer words (few: plain Python)."""
        model = self._model
        kmax = model.kmax
        edge = np.full((len(q), kmax), -np.inf)
        edge[:, 0] = model.single_edge[cid]
        j = np.flatnonzero(model.single_in[cid] & (left >= 2))
        key = cid[j]
        for length in range(2, kmax + 1):
            key = key * model.base + cid[j + length - 1]
            hit, value = model.lookup(key)
            j, key = j[hit], key[hit]
            edge[j, length - 1] = value[hit]
            more = left[j] > length
            j, key = j[more], key[more]
        long_edges: Dict[int, List[Tuple[int, float]]] = {}
        if len(j):
            get = model.long.get
            for jj, p, n_left in zip(j.tolist(), q[j].tolist(), left[j].tolist()):
                found = []
                for length in range(kmax + 1, n_left + 1):
                    v = get(text[p:p + length], _MISSING)
                    if v is _MISSING:
                        break
                    if v is not None:
                        found.append((length, v))
                if found:
                    long_edges[jj] = found
        return edge, long_edges

    def _route(self, q, left, edge, long_edges, n, lockstep) -> np.ndarray:
        """jieba's calc() for the blocks of the positions where `lockstep` is True, in lockstep:
        route[idx] = max over the words s[idx:i+1] of (logp(word) + route[i+1], i), from each
        block's end backwards (step t handles the positions t characters before their block's
        end); a position without a word takes log(1) - logtotal. Returns the length of the chosen
        word at each position (1 where `lockstep` is False: see _route_block)."""
        kmax = edge.shape[1]
        score = np.zeros(n + kmax + 1)  # score[block end] = 0: the positions after blocks stay 0
        end_len = np.ones(len(q), dtype=np.int64)
        sel = np.flatnonzero(lockstep)
        if not len(sel):
            return end_len
        q, left, edge = q[sel], left[sel], edge[sel]
        if long_edges:  # renumber to the selected positions
            keys = np.array(sorted(long_edges), dtype=np.int64)
            k = np.searchsorted(sel, keys)
            kept = (k < len(sel)) & (sel[np.minimum(k, len(sel) - 1)] == keys)
            long_edges = {kk: long_edges[jj] for kk, jj in zip(k[kept].tolist(), keys[kept].tolist())}
        order = np.argsort(left.astype(np.uint16 if left.max() < 65536 else np.int64), kind="stable")
        bounds = np.searchsorted(left[order], np.arange(1, int(left.max()) + 2))
        qs = q[order]
        succ = qs[:, None] + np.arange(1, kmax + 1)  # the positions after a word of 1..kmax characters
        ws = edge[order]
        lengths = np.ones(len(q), dtype=np.int64)  # in `order`
        long_at: Dict[int, List[int]] = {}
        if long_edges:
            rank = np.empty(len(q), dtype=np.int64)
            rank[order] = np.arange(len(q))
            for jj in long_edges:
                long_at.setdefault(int(left[jj]), []).append(jj)
        fallback = self._fallback
        for t in range(1, len(bounds)):
            lo, hi = int(bounds[t - 1]), int(bounds[t])
            if lo == hi:
                continue
            sc = ws[lo:hi] + score[succ[lo:hi]]  # -inf where there is no word
            best = sc.max(axis=1)
            # the longest word among those with the best score (jieba: max over (score, i))
            length = kmax - np.argmax((sc == best[:, None])[:, ::-1], axis=1)
            none = best == -np.inf
            if none.any():
                best[none] = fallback + score[qs[lo:hi][none] + 1]
                length[none] = 1
            for jj in long_at.get(t, ()):  # longer words come last, as in jieba's DAG order
                k = int(rank[jj]) - lo
                pk = int(q[jj])
                b, ln, f = best[k], int(length[k]), not none[k]
                for ln2, v in long_edges[jj]:
                    sc2 = v + score[pk + ln2]
                    if not f or sc2 >= b:
                        b, ln, f = sc2, ln2, True
                best[k], length[k] = b, ln
            score[qs[lo:hi]] = best
            lengths[lo:hi] = length
        chosen = np.empty(len(q), dtype=np.int64)
        chosen[order] = lengths
        end_len[sel] = chosen
        return end_len

    def _route_block(self, j0: int, j1: int, edge: np.ndarray, long_edges, end_len: np.ndarray) -> None:
        """_route for one long block (positions j0..j1-1) as a plain loop: the same additions and
        comparisons, in jieba's order, one position at a time."""
        kmax = edge.shape[1]
        rows = edge[j0:j1].tolist()
        n = j1 - j0
        score = [0.0] * (n + kmax + 1)
        lengths = [1] * n
        fallback = self._fallback
        ninf = -np.inf
        for i in range(n - 1, -1, -1):
            best, length, found = 0.0, 1, False
            for ln, v in enumerate(rows[i], 1):
                if v != ninf:
                    sc = v + score[i + ln]
                    if not found or sc >= best:
                        best, length, found = sc, ln, True
            for ln, v in long_edges.get(j0 + i, ()):
                sc = v + score[i + ln]
                if not found or sc >= best:
                    best, length, found = sc, ln, True
            score[i] = best if found else fallback + score[i + 1]
            lengths[i] = length
        end_len[j0:j1] = lengths

    @staticmethod
    def _walk(qoff: np.ndarray, left: np.ndarray, end_len: np.ndarray) -> np.ndarray:
        """Word starts along the route from each block's first character (all blocks in lockstep)."""
        word = np.zeros(len(left), dtype=bool)
        cur = qoff
        while len(cur):
            word[cur] = True
            step = end_len[cur]
            cur = (cur + step)[step < left[cur]]
        return word

    def _hmm_runs(self, text, codes, q, left, cid, single, word) -> None:
        """jieba's __cut_DAG: a run of single-character words that is not itself a dictionary
        word is re-segmented by finalseg.cut (HMM Viterbi on its Han blocks)."""
        model = self._model
        rs, re_ = _runs(single, left[:-1] > 1)
        rl = re_ - rs
        keep = rl >= 2
        rs, re_, rl = rs[keep], re_[keep], rl[keep]
        if not len(rs):
            return
        is_word = np.zeros(len(rs), dtype=bool)
        for length in range(2, model.kmax + 1):
            sel = np.flatnonzero(rl == length)
            if len(sel):
                key = cid[rs[sel]]
                known = key > 0  # a character id 0 (unknown) would alias a shorter word's key
                for k in range(1, length):
                    c = cid[rs[sel] + k]
                    key = key * model.base + c
                    known &= c > 0
                hit, value = model.lookup(key)
                is_word[sel] = hit & (value > -np.inf) & known
        longer = np.flatnonzero(rl > model.kmax)
        if len(longer):
            get = model.long.get
            for k, a, ln in zip(longer.tolist(), q[rs[longer]].tolist(), rl[longer].tolist()):
                is_word[k] = get(text[a:a + ln]) is not None
        rs, re_ = rs[~is_word], re_[~is_word]
        if not len(rs):
            return
        _clear_inner(word, rs, re_)  # the HMM decides every boundary inside the run
        finalseg = sys.modules.get("jieba.finalseg")
        if finalseg is not None and finalseg.Force_Split_Words:  # user-configured: defer to jieba
            for a, b in zip(rs.tolist(), re_.tolist()):
                lengths = [len(w) for w in finalseg.cut(text[q[a]:q[a] + b - a])]
                word[a + np.cumsum(lengths) - lengths] = True
            return
        # inside the runs: Han blocks go to the Viterbi, other characters to finalseg's re_skip
        in_run = np.zeros(len(q) + 1, dtype=np.int64)
        np.add.at(in_run, rs, 1)
        np.add.at(in_run, re_, -1)
        in_run = np.cumsum(in_run[:-1]).astype(bool)
        hq = ((codes[q] - np.uint32(_HAN_LO)) <= np.uint32(_HAN_HI - _HAN_LO))
        run_id = np.cumsum(np.isin(np.arange(len(q)), rs)) - 1
        joined = run_id[:-1] == run_id[1:]
        hs, he = _runs(in_run & hq, joined)
        if len(hs):
            word[hs] = True
            long_run = he - hs > _LOCKSTEP_MAX
            for a, b in zip(hs[long_run].tolist(), he[long_run].tolist()):
                lengths: List[int] = []
                self._viterbi(text[q[a]:q[a] + b - a], lengths)
                word[a + np.cumsum(lengths[:-1])] = True
            if (~long_run).any():
                self._viterbi_batch(codes[q], hs[~long_run], (he - hs)[~long_run], word)
        os_, oe = _runs(in_run & ~hq, joined)
        for a, b in zip(os_.tolist(), oe.tolist()):
            pos = a
            for piece in _RE_HMM_SKIP.split(text[q[a]:q[a] + b - a]):
                if piece:
                    word[pos] = True
                    pos += len(piece)

    def _viterbi_batch(self, codes: np.ndarray, hs: np.ndarray, hl: np.ndarray, word: np.ndarray) -> None:
        """jieba.finalseg.viterbi + __cut for many Han runs in lockstep (same arithmetic as
        `_viterbi`); marks the word starts inside each run in `word` (indexed like `codes`)."""
        order = np.argsort(-hl, kind="stable")
        hs, hl = hs[order], hl[order]
        active = np.searchsorted(-hl, -np.arange(int(hl[0])), side="left")  # runs longer than t
        tBE, tBM, tEB, tES, tME, tMM, tSB, tSS = self._trans
        eB, eM, eE, eS = self._emit
        sB, sM, sE, sS = self._start
        e = (codes[hs] - _HAN_LO).astype(np.int64)
        vB, vM, vE, vS = sB + eB[e], sM + eM[e], sE + eE[e], sS + eS[e]
        back = np.zeros((len(codes), 4), dtype=np.uint8)
        for t in range(1, int(hl[0])):
            k = int(active[t])
            pos = hs[:k] + t
            e = (codes[pos] - _HAN_LO).astype(np.int64)
            xB, xM, xE, xS = vB[:k], vM[:k], vE[:k], vS[:k]
            em = eB[e]
            a, b = xE + tEB + em, xS + tSB + em
            c = b >= a
            nB = np.where(c, b, a)
            back[pos, _B] = np.where(c, _S, _E)
            em = eM[e]
            a, b = xM + tMM + em, xB + tBM + em
            c = a >= b
            nM = np.where(c, a, b)
            back[pos, _M] = np.where(c, _M, _B)
            em = eS[e]
            a, b = xS + tSS + em, xE + tES + em
            c = a >= b
            nS = np.where(c, a, b)
            back[pos, _S] = np.where(c, _S, _E)
            em = eE[e]
            a, b = xB + tBE + em, xM + tME + em
            c = b >= a
            nE = np.where(c, b, a)
            back[pos, _E] = np.where(c, _M, _B)
            vB[:k], vM[:k], vE[:k], vS[:k] = nB, nM, nE, nS
        state = np.where(vS >= vE, _S, _E).astype(np.uint8)
        for t in range(int(hl[0]) - 1, 0, -1):
            k = int(active[t])
            pos = hs[:k] + t
            st = state[:k]
            word[pos] = (st == _B) | (st == _S)  # __cut: a word starts at B and at S
            state[:k] = back[pos, st]

    # ---- the per-character path ------------------------------------------------------------

    def _block(self, s: str, out: List[int]) -> None:
        # jieba.Tokenizer.get_DAG + calc fused: route[idx] = max over dictionary words s[idx:i+1]
        # of (log p(word) + route[i+1], i); jieba breaks score ties towards the larger i.
        n = len(s)
        score = [0.0] * (n + 1)
        end = list(range(n + 1))
        get = self._logp.get
        fallback = self._fallback
        for idx in range(n - 1, -1, -1):
            best = fallback + score[idx + 1]
            found = False
            i = idx
            v = get(s[idx], _MISSING)
            while v is not _MISSING:
                if v is not None:
                    sc = v + score[i + 1]
                    if not found or sc >= best:
                        best, end[idx], found = sc, i, True
                i += 1
                if i >= n:
                    break
                v = get(s[idx:i + 1], _MISSING)
            score[idx] = best
        # jieba.Tokenizer.__cut_DAG (HMM) / __cut_DAG_NO_HMM: walk the route
        x = 0
        run = -1  # start of a run of single-character words
        while x < n:
            y = end[x] + 1
            if y - x == 1 and (self.hmm or _RE_ENG.match(s[x])):
                if run < 0:
                    run = x
            else:
                if run >= 0:
                    self._flush_run(s, run, x, out)
                    run = -1
                out.append(y - x)
            x = y
        if run >= 0:
            self._flush_run(s, run, n, out)

    def _flush_run(self, s: str, a: int, b: int, out: List[int]) -> None:
        finalseg = sys.modules.get("jieba.finalseg")
        if not self.hmm:  # consecutive single ASCII letters/digits form one word
            out.append(b - a)
        elif b - a == 1:
            out.append(1)
        elif self._logp.get(s[a:b]) is not None:  # the run is itself a word: jieba yields its characters
            out.extend([1] * (b - a))
        elif finalseg is not None and finalseg.Force_Split_Words:  # user-configured HMM splits: defer to jieba
            out.extend(len(w) for w in finalseg.cut(s[a:b]))
        else:  # jieba.finalseg.cut
            for blk in _RE_HMM_HAN.split(s[a:b]):
                if not blk:
                    continue
                if _RE_HMM_HAN.match(blk):
                    self._viterbi(blk, out)
                else:
                    out.extend(len(p) for p in _RE_HMM_SKIP.split(blk) if p)

    def _viterbi(self, obs: str, out: List[int]) -> None:
        # jieba.finalseg.viterbi unrolled over its four states. Each candidate is computed as
        # jieba does ((V + trans) + emit); ties go to the larger previous-state letter, as in
        # jieba's max over (prob, state) tuples.
        tBE, tBM, tEB, tES, tME, tMM, tSB, tSS = self._trans
        eB, eM, eE, eS = self._emit
        c = ord(obs[0]) - _HAN_LO
        sB, sM, sE, sS = self._start
        vB, vM, vE, vS = sB + float(eB[c]), sM + float(eM[c]), sE + float(eE[c]), sS + float(eS[c])
        back = []
        for ch in obs[1:]:
            c = ord(ch) - _HAN_LO
            em = float(eB[c])
            a, b = vE + tEB + em, vS + tSB + em
            nB, pB = (b, "S") if b >= a else (a, "E")
            em = float(eM[c])
            a, b = vM + tMM + em, vB + tBM + em
            nM, pM = (a, "M") if a >= b else (b, "B")
            em = float(eS[c])
            a, b = vS + tSS + em, vE + tES + em
            nS, pS = (a, "S") if a >= b else (b, "E")
            em = float(eE[c])
            a, b = vB + tBE + em, vM + tME + em
            nE, pE = (b, "M") if b >= a else (a, "B")
            back.append({"B": pB, "M": pM, "E": pE, "S": pS})
            vB, vM, vE, vS = nB, nM, nE, nS
        state = "S" if vS >= vE else "E"
        tags = [state]
        for pointers in reversed(back):
            state = pointers[state]
            tags.append(state)
        tags.reverse()
        begin = nexti = 0
        for i, tag in enumerate(tags):  # jieba.finalseg.__cut
            if tag == "B":
                begin = i
            elif tag == "E":
                out.append(i + 1 - begin)
                nexti = i + 1
            elif tag == "S":
                out.append(1)
                nexti = i + 1
        if nexti < len(obs):
            out.append(len(obs) - nexti)


def _clear_inner(word: np.ndarray, rs: np.ndarray, re_: np.ndarray) -> None:
    """word[rs[k]+1 : re_[k]] = False for every run k (vectorised)."""
    if not len(rs):
        return
    inner = np.zeros(len(word) + 1, dtype=np.int64)
    np.add.at(inner, rs + 1, 1)
    np.add.at(inner, re_, -1)
    word[np.cumsum(inner[:-1]) > 0] = False


def _gap_lengths(gap: str, out: List[int]) -> None:
    # outside jieba's blocks every character is its own word, except "\r\n"
    parts = gap.split("\r\n")
    for k, part in enumerate(parts):
        if k:
            out.append(2)
        out.extend([1] * len(part))


# --------------------------------------------------------------------------------------------
# Documents

class DocumentEncoder:
    """A document's text -> one int64 id array per non-empty sentence.

    Sentences: `sentence_spans` (split_sentences=False: newlines only). With whole_word, the
    document is segmented by jieba once and every token made from a CJK character that is not
    the first character of its jieba word becomes the id of "##<char>" (when the vocab has it).
    """

    def __init__(self, vocab_file: PathLike, *, do_lower_case: bool = True, split_sentences: bool = True,
                 whole_word: bool = False, backend: str = "fast", segmenter: str = "fast", hmm: bool = True):
        self.tokenizer = TextTokenizer(vocab_file, do_lower_case=do_lower_case, backend=backend)
        self.split_sentences = bool(split_sentences)
        self.whole_word = bool(whole_word)
        self.segmenter: Optional[JiebaSegmenter] = None
        if self.whole_word:
            self.markers = marker_table(self.tokenizer.vocab)
            if not (self.markers >= 0).any():
                raise ValueError(f"vocab file {vocab_file} has no '##<Chinese character>' entries, which "
                                 "whole-word marking needs: add them with `python -m data_tools.build_vocab "
                                 "--from_vocab VOCAB --output NEW_VOCAB`, or run without --cn_whole_word_segment")
            self.segmenter = JiebaSegmenter(hmm=hmm, engine=segmenter)

    @property
    def batched(self) -> bool:
        """True when `encode_batch` takes the vectorised path (fast tokenizer and segmenter)."""
        return self.tokenizer.backend == "fast" and (self.segmenter is None or self.segmenter.engine == "fast")

    def encode_batch(self, texts: Sequence[str]) -> Tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """Many documents at once: (tokens int64, sentence sizes int64, sentences per non-empty
        document int64, number of empty documents), exactly what `encode` gives document by
        document. With the fast tokenizer and segmenter the documents are joined by newlines
        (a newline ends every sentence, token and jieba block, so nothing crosses it) and each
        step runs once, vectorised, over the whole text."""
        if not self.batched:
            encoded = [self.encode(t) for t in texts]
            sentences = [s for doc in encoded for s in doc]
            tokens = np.concatenate(sentences) if sentences else np.zeros(0, dtype=np.int64)
            per_doc = np.array([len(doc) for doc in encoded], dtype=np.int64)
            return (tokens.astype(np.int64), np.array([len(x) for x in sentences], dtype=np.int64),
                    per_doc[per_doc > 0], int((per_doc == 0).sum()))
        text = "\n".join(texts)
        codes = text_codes(text)
        lengths = np.fromiter((len(t) for t in texts), dtype=np.int64, count=len(texts))
        doc_start = np.cumsum(lengths + 1) - lengths - 1
        span_a, span_b = sentence_span_arrays(text, codes, self.split_sentences)
        ids, starts = self.tokenizer.encode_codes(text, codes)
        if self.whole_word:
            word = self.segmenter.word_starts(text, codes)
            marker = self.markers[ids]
            mark = (marker >= 0) & ~word[starts]
            ids = np.where(mark, marker, ids)
        lo = np.searchsorted(starts, span_a)
        hi = np.searchsorted(starts, span_b)
        keep = hi > lo  # sentences without tokens are dropped
        lo, hi, span_a = lo[keep], hi[keep], span_a[keep]
        inside = np.zeros(len(ids) + 1, dtype=np.int64)
        inside[lo] += 1
        inside[hi] -= 1
        tokens = ids[np.cumsum(inside[:-1]) > 0]
        per_doc = np.bincount(np.searchsorted(doc_start, span_a, side="right") - 1, minlength=len(texts))
        return tokens, hi - lo, per_doc[per_doc > 0], int((per_doc == 0).sum())

    def encode(self, text: str) -> List[np.ndarray]:
        spans = sentence_spans(text, self.split_sentences)
        if not spans:
            return []
        encoded = self.tokenizer.encode_spans(text, spans)
        if not self.whole_word:
            return [ids for ids, _ in encoded if ids.size]
        internal = self.segmenter.word_internal(text)
        out = []
        for ids, starts in encoded:
            if not ids.size:
                continue
            marker = self.markers[ids]
            cand = np.flatnonzero(marker >= 0)  # tokens that are one CJK character with a marker
            cand = cand[internal[starts[cand]]]
            ids = ids.copy()
            ids[cand] = marker[cand]
            out.append(ids)
        return out


__all__ = ["SPECIAL_TOKENS", "CJK_RANGES", "is_cjk_char", "load_vocab", "continuation_table", "marker_table",
           "bert_pipeline", "TextTokenizer", "sentence_spans", "sentence_span_arrays", "split_sentences",
           "JiebaSegmenter", "DocumentEncoder", "WordCounter", "text_codes", "cache_dir"]
