"""`seq_label`: sequence labeling (NER, word segmentation, ...) with a softmax or a linear-chain CRF head.

Data: TSV with a header `text_a<TAB>label`; the tokens of `text_a` and their tags are each joined by
"\\x02" (PaddleNLP's lexical-analysis convention), e.g. `中\\x02国\\tB\\x02E`. A pred file needs only `text_a`.
A trailing "\\x02" after the last token and the last tag (PALM's ATIS files) is accepted.

Alignment. Every file token is tokenized to word pieces; its tag goes on the *first* piece. The softmax
loss and the metrics read first pieces only (continuation pieces get weight 0, i.e. are ignored); so a
predicted tag sequence has exactly the file's token count. Tokens whose first piece falls beyond
`max_seq_len` are predicted as the *fallback tag* (`O` if the label map has it, else `S`, else the tag of
id 0) and are still counted by the metrics (they are not dropped: truncation must cost, not hide, errors).

CRF. The chain runs over input positions 1..n-2 (the text pieces: not [CLS], [SEP] or padding; `n`
is derived from `input_mask`, so the exported inference model needs only the backbone inputs). A
continuation piece carries its word's tag in the chain, so every transition stays one between real word
tags (B -> B for a two-piece `B` word is the price; a separate "X" tag instead would cut the chain's
memory at every split word). Loss and decoding are Paddle's `linear_chain_crf` and `crf_decoding` ops
(one parameter [num_labels + 2, num_labels]: start weights, end weights, transitions); both take a
padded batch with lengths and run in static graphs with dynamic shapes, unlike paddlenlp's
LinearChainCrf, which loops over the sequence in Python. Prediction is the Viterbi path (PALM decoded
its CRF head with argmax).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ernie_mtl.config import ConfigError
from ernie_mtl.tasks.feeds import FeedSpec
from ernie_mtl.tasks.base import (Encoded, HeadOutputs, Option, TaskData, TaskType, pad_backbone_inputs,
                                  read_label_map, read_tsv, register_task_type)

SEP = "\x02"
# Chunk schemes understood by seqeval (strict mode) plus BMES, evaluated as IOBES with M read as I.
_SCHEME_LETTERS = {"IOB1": "IOB", "IOB2": "IOB", "IOE1": "IOE", "IOE2": "IOE", "IOBES": "IOBES", "BILOU": "BILOU",
                   "BMES": "BMESO"}
_SCHEME_ALIASES = {"BIOES": "IOBES", "BMEOS": "BMES"}
_PREFIXES = set("BIMESLUO")
_UNTYPED = "X"  # chunk type given to bare tags (B/M/E/S) so that seqeval can read them


@dataclass(frozen=True)
class SeqLabelExample:
    """One row of the file: its tokens and (if labelled) their tags."""

    line: int
    tokens: List[str]
    tags: Optional[List[str]]


@dataclass(frozen=True)
class SeqLabelFeature:
    """Model input of one row. `labels` has one id per input position (first and continuation pieces
    carry their token's tag, [CLS]/[SEP] 0), `word_starts` the input position of each kept token's first
    piece (tokens beyond max_seq_len have none)."""

    input_ids: List[int]
    labels: Optional[List[int]]
    word_starts: List[int]
    num_tokens: int


_PADDING_TAGS = {"PAD", "[PAD]", "<PAD>"}  # a label map's padding entry (PALM's ATIS map has "PAD": 0)


def parse_tag(tag: str) -> Tuple[str, Optional[str]]:
    """A chunk tag -> (prefix letter, chunk type or None): `B-PER`, `PER-B` and bare `B` are understood;
    a padding tag (`PAD`, `[PAD]`, `<PAD>`) is outside any chunk, like `O`."""
    if tag in _PREFIXES:
        return tag, None
    if tag.upper() in _PADDING_TAGS:
        return "O", None
    if "-" in tag:
        head, rest = tag.split("-", 1)
        if head in _PREFIXES and rest:
            return head, rest
        rest, tail = tag.rsplit("-", 1)
        if tail in _PREFIXES and rest:
            return tail, rest
    raise ValueError(tag)


def detect_scheme(tags: Sequence[str]) -> str:
    """The chunk scheme a label map's tags imply (see docs/tasks/seq_label.md)."""
    letters = {parse_tag(tag)[0] for tag in tags}
    if "M" in letters:
        return "BMES"
    if letters & {"L", "U"}:
        return "BILOU"
    if letters & {"E", "S"}:
        return "IOBES"
    return "IOB2" if "B" in letters else "IOB1"


def to_seqeval(tag: str, scheme: str) -> str:
    """A tag in seqeval's `P-TYPE` spelling (BMES: M -> I, evaluated as IOBES)."""
    prefix, kind = parse_tag(tag)
    if prefix == "O":
        return "O"
    if scheme == "BMES" and prefix == "M":
        prefix = "I"
    return f"{prefix}-{kind or _UNTYPED}"


def chunk_metrics(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]], scheme: str) -> Dict[str, float]:
    """Chunk precision/recall/F1 (seqeval, strict mode for `scheme`) and token accuracy of tag sequences."""
    import seqeval.scheme
    from seqeval.metrics import f1_score, precision_score, recall_score

    klass = getattr(seqeval.scheme, "IOBES" if scheme == "BMES" else scheme)
    y_true = [[to_seqeval(tag, scheme) for tag in seq] for seq in gold]
    y_pred = [[to_seqeval(tag, scheme) for tag in seq] for seq in pred]
    kwargs = dict(mode="strict", scheme=klass, zero_division=0)
    total = sum(len(s) for s in gold)
    correct = sum(g == p for gs, ps in zip(gold, pred) for g, p in zip(gs, ps))
    return {"precision": float(precision_score(y_true, y_pred, **kwargs)),
            "recall": float(recall_score(y_true, y_pred, **kwargs)),
            "f1": float(f1_score(y_true, y_pred, **kwargs)),
            "accuracy": correct / total if total else 0.0}


def crf_nll(emissions, transitions, labels, lengths):
    """Per-sequence negative log-likelihood [B, 1] of a linear-chain CRF (Paddle's `linear_chain_crf` op).

    emissions [B, T, L] float32, transitions [L + 2, L] (row 0 start, row 1 end, then from -> to),
    labels [B, T] int64, lengths [B] int64 (>= 1; positions beyond a length are ignored)."""
    import paddle
    from paddle.base.layer_helper import LayerHelper

    # The op exponentiates the transition table as is: exp(w) overflows float32 for w > 88. Every path of
    # a sequence has one start, one end and length-1 transition weights, so subtracting the table's
    # maximum shifts all path scores of a sequence equally and leaves the likelihood (and its gradient)
    # unchanged; the shift itself carries no gradient.
    shift = paddle.max(transitions)
    shift.stop_gradient = True
    helper = LayerHelper("linear_chain_crf")
    outs = {k: helper.create_variable_for_type_inference("float32")
            for k in ("Alpha", "EmissionExps", "TransitionExps", "LogLikelihood")}
    helper.append_op(type="linear_chain_crf",
                     inputs={"Emission": [emissions], "Transition": [transitions - shift],
                             "Label": [paddle.unsqueeze(labels, -1)], "Length": [lengths]},
                     outputs={k: [v] for k, v in outs.items()})
    return outs["LogLikelihood"]  # despite its name the op returns -log p(labels | emissions)


def crf_decode(emissions, transitions, lengths):
    """Viterbi path [B, T] int64 of the same CRF (Paddle's `crf_decoding` op); 0 beyond each length."""
    from paddle.base.layer_helper import LayerHelper

    helper = LayerHelper("crf_decoding")
    path = helper.create_variable_for_type_inference("int64")
    helper.append_op(type="crf_decoding", inputs={"Emission": [emissions], "Transition": [transitions],
                                                  "Length": [lengths]},
                     outputs={"ViterbiPath": [path]})
    return path


def _head_layer(hidden_size: int, num_labels: int, use_crf: bool, dropout: float):
    import paddle
    from paddle import nn

    class SeqLabelHead(nn.Layer):
        """Dropout + linear emissions; with a CRF also the [num_labels + 2, num_labels] transition table."""

        def __init__(self):
            super().__init__()
            self.dropout = nn.Dropout(dropout)
            self.emission = nn.Linear(hidden_size, num_labels)
            # Zero transitions: training starts as the softmax head would and learns the structure.
            self.transitions = (self.create_parameter([num_labels + 2, num_labels], dtype="float32",
                                                      default_initializer=nn.initializer.Constant(0.0))
                                if use_crf else None)

        def forward(self, sequence_output):
            return paddle.cast(self.emission(self.dropout(sequence_output)), "float32")

    return SeqLabelHead()


@register_task_type("seq_label")
class SeqLabelTask(TaskType):
    """Token tagging; chunk-level F1 on first word pieces. See the module docstring."""

    main_metric = "f1"
    options = {
        "label_map": Option(None, "path of a JSON file {tag: id} with ids 0..n-1 (required; PALM: label_map_config)"),
        "label_map_config": Option(None, "PALM's name of `label_map` (accepted; `label_map` is preferred)"),
        "use_crf": Option(False, "linear-chain CRF loss and Viterbi decoding instead of per-token softmax"),
        "scheme": Option("auto", "chunk scheme of the metrics: auto, IOB1, IOB2, IOE1, IOE2, IOBES (BIOES), BILOU, "
                                 "BMES (auto: from the label map's tags)"),
        "dropout": Option(0.1, "dropout on the encoder output before the emission layer"),
    }

    def __init__(self, spec, ctx):
        super().__init__(spec, ctx)
        opts = spec.options
        where = f"task {spec.name!r}"
        problems: List[str] = []
        path = opts.get("label_map") or opts.get("label_map_config")
        if opts.get("label_map") and opts.get("label_map_config") and opts["label_map"] != opts["label_map_config"]:
            problems.append(f"{where}: both label_map ({opts['label_map']!r}) and label_map_config "
                            f"({opts['label_map_config']!r}) are set; keep only label_map")
        if not path:
            problems.append(f"{where}: seq_label needs `label_map: <path of a JSON file {{tag: id}}>` "
                            "(PALM's label_map_config is accepted too)")
        use_crf, dropout = opts.get("use_crf", False), opts.get("dropout", 0.1)
        if not isinstance(use_crf, bool):
            problems.append(f"{where}: use_crf must be true or false, got {use_crf!r}")
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
            problems.append(f"{where}: dropout must be a number in [0, 1), got {dropout!r}")
        scheme = str(opts.get("scheme", "auto"))
        scheme = _SCHEME_ALIASES.get(scheme.upper(), scheme.upper()) if scheme.lower() != "auto" else "auto"
        if scheme != "auto" and scheme not in _SCHEME_LETTERS:
            problems.append(f"{where}: scheme {opts.get('scheme')!r} is unknown; use auto or one of "
                            f"{sorted(_SCHEME_LETTERS) + sorted(_SCHEME_ALIASES)}")
        if problems:
            raise ConfigError(problems)
        self.label_map_path = os.path.abspath(path)
        self.label_map = read_label_map(self.label_map_path, spec.name, item="tag", id_word="id",
                                        example='{"B": 0, "M": 1, "E": 2, "S": 3}')
        self.id_to_tag = sorted(self.label_map, key=self.label_map.get)
        self.scheme = self._resolve_scheme(scheme)
        self.use_crf, self.dropout = use_crf, float(dropout)
        self.fallback_tag = next((tag for tag in ("O", "S") if tag in self.label_map), self.id_to_tag[0])

    # -- configuration -------------------------------------------------------------------------

    def _resolve_scheme(self, scheme: str) -> str:
        bad = []
        for tag in self.label_map:
            try:
                parse_tag(tag)
            except ValueError:
                bad.append(tag)
        if bad:
            raise ConfigError([f"{self.label_map_path}: tag(s) {bad} are not chunk tags; chunk metrics need tags "
                               "like B-PER / PER-B / bare B with a prefix in B, I, M, E, S, L, U, O"])
        resolved = detect_scheme(list(self.label_map)) if scheme == "auto" else scheme
        letters = {parse_tag(tag_name)[0] for tag_name in self.label_map} - {"O"}
        extra = sorted(letters - set(_SCHEME_LETTERS[resolved]))
        if extra:
            raise ConfigError([f"task {self.spec.name!r}: scheme {resolved} has no prefix {extra} used by the tags of "
                               f"{self.label_map_path}; set scheme: auto or a scheme that has them"])
        return resolved

    # -- data ----------------------------------------------------------------------------------
    def load(self, split: str) -> TaskData:
        path = self.spec.file(split)
        if not path:
            raise ConfigError([f"task {self.spec.name!r}: no {split}_file is configured"])
        labelled = split != "pred"
        rows = read_tsv(path, ["text_a", "label"] if labelled else ["text_a"],
                        optional_columns=() if labelled else ["label"])
        tokenizer = self.ctx.tokenizer(self.spec.do_lower_case)
        pieces_of: Dict[str, List[int]] = {}  # token -> piece ids: Chinese text repeats characters a lot

        def pieces(token: str) -> List[int]:
            if token not in pieces_of:
                # A token the tokenizer drops (whitespace, control characters) still needs a tag: [UNK].
                pieces_of[token] = (tokenizer.convert_tokens_to_ids(tokenizer.tokenize(token))
                                    or [tokenizer.unk_token_id])
            return pieces_of[token]

        budget = self.spec.max_seq_len - 2
        examples, features = [], []
        truncated_tokens = truncated_rows = 0
        for line, row in rows:
            text, label = row["text_a"], row.get("label")
            if text.endswith(SEP) and (label is None or label.endswith(SEP)):
                # PALM's ATIS files end every token and tag with \x02: the empty last pair is no token
                text, label = text[:-1], None if label is None else label[:-1]
            tokens = text.split(SEP)
            if not text:
                raise ConfigError([f"{path}:{line}: text_a is empty; every row needs at least one token"])
            tags = self._tags(path, line, tokens, label) if label is not None else None
            ids, labels, starts = [tokenizer.cls_token_id], [0], []
            for k, token in enumerate(tokens):
                room = budget - (len(ids) - 1)
                if room <= 0:
                    truncated_tokens += len(tokens) - k
                    truncated_rows += 1
                    break
                piece_ids = pieces(token)[:room]
                starts.append(len(ids))
                ids += piece_ids
                labels += [self.label_map[tags[k]] if tags else 0] * len(piece_ids)
            ids.append(tokenizer.sep_token_id)
            labels.append(0)
            examples.append(SeqLabelExample(line, tokens, tags))
            features.append(SeqLabelFeature(ids, labels if tags is not None else None, starts, len(tokens)))
        if truncated_rows:
            self.ctx.log(f"task {self.spec.name}: {split}: {truncated_tokens} token(s) of {truncated_rows} row(s) lie "
                         f"beyond max_seq_len {self.spec.max_seq_len}; they are predicted as {self.fallback_tag!r}")
        return TaskData(split, features, examples, has_labels=all(e.tags is not None for e in examples))

    def _tags(self, path: str, line: int, tokens: List[str], label: str) -> List[str]:
        tags = [tag.strip() for tag in label.split(SEP)]
        if len(tags) != len(tokens):
            raise ConfigError([f"{path}:{line}: text_a has {len(tokens)} token(s) but label has {len(tags)} tag(s) "
                               f"(both are joined by \\x02); give every token exactly one tag"])
        unknown = sorted({tag for tag in tags if tag not in self.label_map})
        if unknown:
            raise ConfigError([f"{path}:{line}: tag(s) {unknown} are not in label_map {self.label_map_path} "
                               f"(known: {self.id_to_tag}); add them to the label map or fix the row"])
        return tags

    def label_feeds(self) -> Tuple[FeedSpec, ...]:
        return (FeedSpec("labels", (-1, -1), "int64", "tag id of every input position (pieces carry their word's)"),
                FeedSpec("label_weights", (-1, -1), "float32", "1 on first pieces of tokens, 0 elsewhere"))

    def collate(self, features: Sequence[SeqLabelFeature]) -> Dict[str, np.ndarray]:
        pad_id = self.ctx.tokenizer(self.spec.do_lower_case).pad_token_id
        batch = pad_backbone_inputs([f.input_ids for f in features], [[0] * len(f.input_ids) for f in features],
                                    pad_id=pad_id)
        labels = np.zeros(batch["input_ids"].shape, dtype=np.int64)
        weights = np.zeros(batch["input_ids"].shape, dtype=np.float32)
        for i, f in enumerate(features):
            if f.labels is not None:
                labels[i, :len(f.labels)] = f.labels
                weights[i, f.word_starts] = 1.0
        batch.update(labels=labels, label_weights=weights)
        return batch

    def dummy_labels(self, batch_size: int, seq_len: int) -> Dict[str, np.ndarray]:
        # Weights 0 give a softmax loss of exactly 0; the CRF sees a finite all-tag-0 path.
        return {"labels": np.zeros((batch_size, seq_len), dtype=np.int64),
                "label_weights": np.zeros((batch_size, seq_len), dtype=np.float32)}

    # -- model ---------------------------------------------------------------------------------
    def create_head(self, enc: Encoded) -> Any:
        return _head_layer(enc.config.hidden_size, len(self.label_map), self.use_crf, self.dropout)

    def head_signature(self) -> Tuple[Any, ...]:
        return (self.name, len(self.label_map), self.use_crf)

    def head_forward(self, head: Any, enc: Encoded, feeds: Mapping[str, Any]) -> HeadOutputs:
        import paddle
        import paddle.nn.functional as F

        emissions = head(enc.sequence_output)  # [B, S, L] float32
        labels, weights = feeds["labels"], feeds["label_weights"]
        if not self.use_crf:
            ce = F.cross_entropy(emissions, paddle.unsqueeze(labels, -1), reduction="none")
            loss = paddle.sum(paddle.squeeze(ce, -1) * weights) / paddle.clip(paddle.sum(weights), min=1.0)
            return HeadOutputs(loss, {"tags": paddle.argmax(emissions, axis=-1)})
        # Real positions from the additive mask; the chain is positions 1..n-2 (at least 1 for a foreign
        # micro-batch whose text may be empty, so the CRF stays finite on dummy labels).
        real = paddle.sum(paddle.cast(paddle.reshape(enc.feeds["input_mask"], [0, -1]) > -1.0, "int64"), axis=-1)
        lengths = paddle.maximum(real - 2, paddle.ones_like(real))
        chain = emissions[:, 1:, :]
        loss = paddle.mean(crf_nll(chain, head.transitions, labels[:, 1:], lengths))
        path = crf_decode(chain, head.transitions, lengths)
        # Aligned with input positions; built from `path` only, so the exported model needs no label feed.
        tags = paddle.concat([paddle.zeros_like(path[:, :1]), path], axis=1)
        return HeadOutputs(loss, {"tags": tags})

    # -- evaluation and prediction -------------------------------------------------------------
    def _predicted_tags(self, data: TaskData, outputs: Mapping[str, List[np.ndarray]]) -> List[List[str]]:
        """Per row, one predicted tag per file token (first pieces; fallback tag beyond max_seq_len)."""
        rows = [r for batch in outputs["tags"] for r in np.asarray(batch)]
        if len(rows) != len(data.features):
            raise ValueError(f"task {self.spec.name!r}: {len(rows)} predicted rows for {len(data.features)} features")
        result = []
        for row, f in zip(rows, data.features):
            tags = [self.id_to_tag[int(row[p])] for p in f.word_starts]
            result.append(tags + [self.fallback_tag] * (f.num_tokens - len(tags)))
        return result

    def evaluate(self, data: TaskData, outputs: Mapping[str, List[np.ndarray]]) -> Dict[str, float]:
        if not data.has_labels:
            raise ValueError(f"task {self.spec.name!r}: split {data.split!r} has no labels to evaluate")
        return chunk_metrics([e.tags for e in data.examples], self._predicted_tags(data, outputs), self.scheme)

    def predictions(self, data: TaskData, outputs: Mapping[str, List[np.ndarray]]) -> List[Dict[str, Any]]:
        return [{"index": i, "tokens": e.tokens, "labels": tags}
                for i, (e, tags) in enumerate(zip(data.examples, self._predicted_tags(data, outputs)))]

    def manifest(self) -> Dict[str, Any]:
        return {"label_map": dict(self.label_map), "use_crf": self.use_crf, "scheme": self.scheme,
                "tags": "prediction `tags` [batch, seq]: tag id per input position; read each token's first piece"}
