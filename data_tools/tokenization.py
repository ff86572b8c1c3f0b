"""Text -> token ids for ERNIE pretraining data.

- `TextTokenizer`: ERNIE's WordPiece tokenizer built from a local vocab.txt. The default "fast"
  backend is the Rust `tokenizers` WordPiece configured to reproduce paddlenlp's
  `ErnieTokenizer` exactly (tests/test_preprocess.py compares ids on real text); the
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

import functools
import logging
import os
import re
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


def load_vocab(vocab_file: PathLike) -> Dict[str, int]:
    """token -> id from a vocab.txt (id = line number), read as paddlenlp reads it."""
    vocab: Dict[str, int] = {}
    try:
        f = open(vocab_file, encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"vocab file {vocab_file} not found; build one with "
                                "`python -m data_tools.build_vocab`") from None
    with f:
        for i, line in enumerate(f):
            token = line.rstrip("\n")
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

    Backends, all producing the same ids as paddlenlp's ErnieTokenizer (tests/test_preprocess.py):
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
        if backend == "fast":
            forms, self._other_runs = _single_token_forms(self.do_lower_case)
            self._char_ids = {c: self.vocab.get(n, self.unk_id) for c, n in forms.items()}

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


@functools.lru_cache(maxsize=2)
def _single_token_forms(do_lower_case: bool) -> Tuple[Dict[str, str], "re.Pattern"]:
    """({char: normalised char}, regex of runs of other characters) for every CJK, punctuation
    or symbol character that the Rust pipeline normalises to one character and isolates between
    letters: such a character is one token (its normalised form, or [UNK]) whatever surrounds it.
    Derived from the pipeline itself, so the table cannot drift from it; computed once per process."""
    import unicodedata

    normalizer, pre_tokenizer = bert_pipeline(do_lower_case)
    normalize = normalizer.normalize_str
    # CJK characters: isolated by the pre-tokenizer's CJK ranges (the same CJK_RANGES), so only
    # their normal form needs checking
    forms = {c: n for a, b in CJK_RANGES for c in map(chr, range(a, b + 1))
             for n in [normalize(c)] if len(n) == 1 and _CJK_RE.match(n)}
    # punctuation and symbols of the BMP and of the emoji/symbol blocks (others simply take the
    # Rust path: a smaller table is slower, never different)
    candidates = [chr(cp) for cp in (*range(0xD800), *range(0xE000, 0x10000), *range(0x1F000, 0x1FC00))
                  if unicodedata.category(chr(cp))[0] in "PS" and not _CJK_RE.match(chr(cp))]
    candidates += [chr(cp) for cp in _EXTRA_SYMBOLS]
    pairs = [(c, n) for c in candidates for n in [normalize(c)]
             if len(n) == 1 and not n.isspace() and not unicodedata.combining(n)]
    # one pre-tokenizer call on "a" n1 "a" n2 "a" ...: n_k is isolated iff it comes back as the
    # one-character piece at (character) offset 2k+1
    probe = "a" + "a".join(n for _, n in pairs) + "a"
    isolated = {start for piece, (start, end) in pre_tokenizer.pre_tokenize_str(probe)
                if end - start == 1 and piece != "a"}
    forms.update((c, n) for k, (c, n) in enumerate(pairs) if 2 * k + 1 in isolated)
    return forms, re.compile("[^" + _char_class(forms) + "]+")


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


# --------------------------------------------------------------------------------------------
# Chinese word segmentation (jieba)

_RE_HAN = re.compile("[\u4E00-\u9FD5a-zA-Z0-9+#&\\._%\\-]+")  # jieba's re_han_default blocks
_RE_HMM_HAN = re.compile("([\u4E00-\u9FD5]+)")  # jieba.finalseg.re_han
_RE_HMM_SKIP = re.compile(r"([a-zA-Z0-9]+(?:\.\d+)?%?)")  # jieba.finalseg.re_skip
_RE_ENG = re.compile("[a-zA-Z0-9]")  # jieba.re_eng
_MISSING = object()


class JiebaSegmenter:
    """Word boundaries from jieba's accurate mode (`jieba.cut(text, HMM=hmm)`).

    engine="fast" computes the same segmentation as jieba without its per-word generators:
    one backward pass per block fuses jieba's `get_DAG` and `calc` (same dictionary, same
    log-probabilities summed in the same order, same tie-breaking), and unknown runs go
    through jieba's HMM with an unrolled Viterbi (same arithmetic and tie-breaking). It reads
    jieba's dictionary once per process (later `jieba.add_word` calls are not seen).
    engine="jieba" calls `jieba.cut`. Build one per process: jieba's dictionary load takes
    about a second.
    """

    def __init__(self, hmm: bool = True, engine: str = "fast"):
        if engine not in ("fast", "jieba"):
            raise ValueError(f"segmenter engine must be 'fast' or 'jieba', got {engine!r}")
        import jieba
        from jieba import finalseg

        jieba.setLogLevel(logging.WARNING)
        jieba.initialize()
        self.hmm = bool(hmm)
        self.engine = engine
        self._jieba = jieba.dt
        self._finalseg = finalseg
        if engine == "fast":
            self._logp, self._fallback = _jieba_log_probabilities()
            t, e, s = finalseg.trans_P, finalseg.emit_P, finalseg.start_P
            self._trans = (t["B"]["E"], t["B"]["M"], t["E"]["B"], t["E"]["S"],
                           t["M"]["E"], t["M"]["M"], t["S"]["B"], t["S"]["S"])
            self._emit = (e["B"].get, e["M"].get, e["E"].get, e["S"].get)
            self._start = (s["B"], s["M"], s["E"], s["S"])

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
        lengths = np.fromiter(self.word_lengths(text), dtype=np.int64)
        internal = np.ones(len(text), dtype=bool)
        if lengths.size:
            internal[np.cumsum(lengths) - lengths] = False
        return internal

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
        if not self.hmm:  # consecutive single ASCII letters/digits form one word
            out.append(b - a)
        elif b - a == 1:
            out.append(1)
        elif self._logp.get(s[a:b]) is not None:  # the run is itself a word: jieba yields its characters
            out.extend([1] * (b - a))
        elif self._finalseg.Force_Split_Words:  # user-configured HMM splits: defer to jieba
            out.extend(len(w) for w in self._finalseg.cut(s[a:b]))
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
        low = self._finalseg.MIN_FLOAT
        c = obs[0]
        sB, sM, sE, sS = self._start
        vB, vM, vE, vS = sB + eB(c, low), sM + eM(c, low), sE + eE(c, low), sS + eS(c, low)
        back = []
        for c in obs[1:]:
            em = eB(c, low)
            a, b = vE + tEB + em, vS + tSB + em
            nB, pB = (b, "S") if b >= a else (a, "E")
            em = eM(c, low)
            a, b = vM + tMM + em, vB + tBM + em
            nM, pM = (a, "M") if a >= b else (b, "B")
            em = eS(c, low)
            a, b = vS + tSS + em, vE + tES + em
            nS, pS = (a, "S") if a >= b else (b, "E")
            em = eE(c, low)
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


@functools.lru_cache(maxsize=1)
def _jieba_log_probabilities() -> Tuple[Dict[str, Optional[float]], float]:
    """({word: log(freq) - log(total), pure prefix: None}, score of a non-word character) from
    jieba's default dictionary, built once per process."""
    import jieba

    jieba.dt.check_initialized()
    logtotal = log(jieba.dt.total)
    return {w: (log(f) - logtotal if f else None) for w, f in jieba.dt.FREQ.items()}, -logtotal  # log(1) - logtotal


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
           "bert_pipeline", "TextTokenizer", "sentence_spans", "split_sentences", "JiebaSegmenter",
           "DocumentEncoder"]
