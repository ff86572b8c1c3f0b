"""Sentence classification (`cls`) and sentence-pair matching (`match`) task types.

Both read PALM's TSV files (header row required) and put a head on the backbone's pooled [CLS]
output. They share everything through `_PooledTask`: reading, label mapping, tokenisation
(`[CLS] a [SEP]` or `[CLS] a [SEP] b [SEP]`, longest-first truncation), the softmax classifier
and its metrics. `match` adds PALM's `learning_strategy: pairwise`: a scalar score per pair
trained with the hinge loss `max(0, margin - s(a, b) + s(a, b_neg))` on (`text_a`, `text_b`,
`text_b_neg`) rows, as in PALM's match reader (`paddlepalm/reader/utils/reader4ernie.py`).

Pairwise batches stack the positive pairs and then the negative pairs into one batch; the label
feeds `pos_index`/`neg_index` say which rows pair up, so a placeholder (`[0]`, `[0]`) fits a
micro-batch of any size (loss = margin, gradient 0) and eval batches (pointwise rows) need no
pairing at all.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from ernie_mtl.config import ConfigError
from ernie_mtl.tasks.feeds import FeedSpec
from ernie_mtl.tasks.base import (Encoded, HeadOutputs, Option, TaskData, TaskType, pad_backbone_inputs,
                                  read_label_map, read_tsv, register_task_type)

NO_LABEL = -1  # label id of a row from a pred file without a label column


class Example(NamedTuple):
    """One model input: token ids and segments of `[CLS] a [SEP] (b [SEP])`, and its label id."""

    input_ids: List[int]
    segment_ids: List[int]
    label: int = NO_LABEL


class PairExample(NamedTuple):
    """One pairwise training row: (text_a, text_b) should score above (text_a, text_b_neg)."""

    pos: Example
    neg: Example


class _PooledTask(TaskType):
    """Common base of `cls` and `match`: reader, label map, softmax classifier on the pooled output."""

    options = {
        "n_classes": Option(None, "number of classes (required unless label_map is given)"),
        "label_map": Option(None, "path to a JSON object {label string: class id}, ids 0..n-1; without it "
                                  "labels in the files must be the integers 0..n_classes-1"),
        "dropout": Option(0.1, "dropout probability on the pooled output before the classifier (training only)"),
    }
    main_metric = "acc"
    text_columns: Tuple[str, ...] = ("text_a",)

    def __init__(self, spec, ctx):
        super().__init__(spec, ctx)
        if spec.max_seq_len < 1 + len(self.text_columns):  # room for [CLS] and one [SEP] per text
            raise ConfigError([f"task {spec.name!r}: max_seq_len: {spec.max_seq_len} leaves no room for the special "
                               f"tokens; use at least {1 + len(self.text_columns)} (typically 128)"])
        self.dropout = float(self._option("dropout"))
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError([f"task {spec.name!r}: dropout: {self.dropout} is not in [0, 1); use e.g. 0.1"])
        self.label_map: Optional[Dict[str, int]] = None
        n_classes = self._option("n_classes")
        if self._option("label_map") is not None:
            self.label_map = read_label_map(self._option("label_map"), spec.name, item="label", id_word="class id",
                                            example='{"negative": 0, "positive": 1}')
            if n_classes is not None and int(n_classes) != len(self.label_map):
                raise ConfigError([f"task {spec.name!r}: n_classes: {n_classes} disagrees with the "
                                   f"{len(self.label_map)} labels of label_map {self._option('label_map')}; "
                                   "drop n_classes (the label map sets it) or fix one of them"])
            n_classes = len(self.label_map)
        if n_classes is None:
            raise ConfigError([f"task {spec.name!r} ({self.name}): n_classes is missing; set `n_classes: <number of "
                               "classes>` or `label_map: <path to a JSON {label: id}>` in the task YAML"])
        if isinstance(n_classes, bool) or not isinstance(n_classes, int) or n_classes < 2:
            raise ConfigError([f"task {spec.name!r}: n_classes: {n_classes!r} must be an integer >= 2"])
        self.n_classes = n_classes
        self.id_to_label = ({v: k for k, v in self.label_map.items()} if self.label_map is not None else None)

    # -- reading -------------------------------------------------------------------------------
    def _option(self, key: str) -> Any:
        return self.spec.options.get(key, self.options[key].default)


    def _label_id(self, path: str, line: int, value: str) -> int:
        """The class id of a label as written in a file (checked against the label map or 0..n-1)."""
        if self.label_map is not None:
            if value not in self.label_map:
                raise ConfigError([f"{path}:{line}: label {value!r} is not in label_map {self._option('label_map')} "
                                   f"(labels: {sorted(self.label_map)}); add it to the map or fix the row"])
            return self.label_map[value]
        try:
            label = int(value)
        except ValueError:
            label = None
        if label is None or not 0 <= label < self.n_classes:
            raise ConfigError([f"{path}:{line}: label {value!r} is not a class id in 0..{self.n_classes - 1}; write "
                               f"integer labels 0..n_classes-1 (n_classes: {self.n_classes}) or give "
                               "`label_map: <JSON {label: id}>` for string labels"])
        return label

    def _tokens(self, text: str) -> List[int]:
        tok = self.ctx.tokenizer(self.spec.do_lower_case)
        return tok.convert_tokens_to_ids(tok.tokenize(text))

    def encode(self, text_a: str, text_b: Optional[str] = None) -> Tuple[List[int], List[int]]:
        """Ids and segments of `[CLS] a [SEP]` / `[CLS] a [SEP] b [SEP]` within max_seq_len (longest-first)."""
        tok = self.ctx.tokenizer(self.spec.do_lower_case)
        a = self._tokens(text_a)
        b = self._tokens(text_b) if text_b is not None else None
        budget = self.spec.max_seq_len - (2 if b is None else 3)
        if b is None:
            a = a[:budget]
        else:
            while len(a) + len(b) > budget:  # drop from the longer side; b on ties (as BERT/PALM)
                (a if len(a) > len(b) else b).pop()
        ids = [tok.cls_token_id] + a + [tok.sep_token_id]
        segments = [0] * len(ids)
        if b is not None:
            ids += b + [tok.sep_token_id]
            segments += [1] * (len(b) + 1)
        return ids, segments

    def _path(self, split: str) -> str:
        path = self.spec.file(split)
        if path is None:
            raise ConfigError([f"task {self.spec.name!r}: no {split}_file is set; add `{split}_file: <path>` to its "
                               "task YAML"])
        return path

    def load(self, split: str) -> TaskData:
        """Pointwise rows `label<TAB>text_a(<TAB>text_b)` (the label column is optional in a pred file)."""
        path = self._path(split)
        optional = ("label",) if split == "pred" else ()
        required = self.text_columns if split == "pred" else ("label",) + self.text_columns
        rows = read_tsv(path, required, optional_columns=optional + self._extra_columns())
        has_labels = split != "pred" or all("label" in r for _, r in rows)
        features = []
        for line, row in rows:
            ids, segments = self.encode(*(row[c] for c in self.text_columns))
            label = self._label_id(path, line, row["label"]) if has_labels else NO_LABEL
            features.append(Example(ids, segments, label))
        return TaskData(split, features, has_labels=has_labels)

    def _extra_columns(self) -> Tuple[str, ...]:
        return ()

    def _pad_id(self) -> int:
        return self.ctx.tokenizer(self.spec.do_lower_case).pad_token_id

    # -- pointwise classifier ------------------------------------------------------------------
    def collate(self, features: Sequence[Example]) -> Dict[str, np.ndarray]:
        batch = pad_backbone_inputs([f.input_ids for f in features], [f.segment_ids for f in features],
                                    pad_id=self._pad_id())
        # A pred row has no label: 0 keeps the (unused) loss finite.
        batch["label"] = np.array([max(f.label, 0) for f in features], dtype=np.int64)
        return batch

    def label_feeds(self) -> Tuple[FeedSpec, ...]:
        return (FeedSpec("label", (-1,), "int64", "class id of each example"),)

    def dummy_labels(self, batch_size: int, seq_len: int) -> Dict[str, np.ndarray]:
        return {"label": np.zeros(batch_size, dtype=np.int64)}

    def head_signature(self) -> Tuple[Any, ...]:
        # cls and pointwise match heads are the same layer: they may share it when n_classes agree.
        return ("softmax_classifier", self.n_classes)

    def _linear(self, enc: Encoded, size: int):
        import paddle

        init = paddle.nn.initializer.TruncatedNormal(std=getattr(enc.config, "initializer_range", 0.02))
        return paddle.nn.Linear(enc.config.hidden_size, size, weight_attr=paddle.ParamAttr(initializer=init),
                                bias_attr=paddle.ParamAttr(initializer=paddle.nn.initializer.Constant(0.0)))

    def _pooled(self, enc: Encoded):
        import paddle.nn.functional as F

        # The task's own rate (not the head's): tasks sharing a head keep their dropout. Dropout ops
        # become identity in the `clone(for_test=True)` program used for evaluation and export.
        return F.dropout(enc.pooled_output, p=self.dropout, training=True) if self.dropout else enc.pooled_output

    def create_head(self, enc: Encoded):
        return self._linear(enc, self.n_classes)

    def head_forward(self, head, enc: Encoded, feeds: Mapping[str, Any]) -> HeadOutputs:
        import paddle.nn.functional as F

        logits = head(self._pooled(enc))
        loss = F.cross_entropy(logits, feeds["label"], reduction="mean")
        return HeadOutputs(loss=loss, predictions={"probs": F.softmax(logits, axis=-1)})

    # -- evaluation ----------------------------------------------------------------------------
    @staticmethod
    def _gather(data: TaskData, outputs: Mapping[str, List[np.ndarray]], name: str) -> np.ndarray:
        values = np.concatenate([np.asarray(b) for b in outputs[name]], axis=0)
        if len(values) != len(data.features):
            raise ValueError(f"{len(values)} rows of {name!r} for {len(data.features)} {data.split} examples; pass "
                             "the outputs of every batch of this split, in order")
        return values

    @staticmethod
    def _labels(data: TaskData) -> np.ndarray:
        if not data.has_labels:
            raise ValueError(f"the {data.split} split has no labels to evaluate against")
        return np.array([f.label for f in data.features], dtype=np.int64)

    @staticmethod
    def _classification_metrics(y_true: np.ndarray, y_pred: np.ndarray, n_classes: int) -> Dict[str, float]:
        from sklearn.metrics import accuracy_score, f1_score

        metrics = {"acc": float(accuracy_score(y_true, y_pred))}
        if n_classes == 2:
            metrics["f1"] = float(f1_score(y_true, y_pred, pos_label=1, average="binary", zero_division=0))
        else:
            metrics["macro_f1"] = float(f1_score(y_true, y_pred, average="macro", zero_division=0))
        return metrics

    def evaluate(self, data: TaskData, outputs: Mapping[str, List[np.ndarray]]) -> Dict[str, float]:
        """`acc`, and `f1` (class 1 positive) for 2 classes or `macro_f1` otherwise (scikit-learn)."""
        pred = self._gather(data, outputs, "probs").argmax(axis=-1)
        return self._classification_metrics(self._labels(data), pred, self.n_classes)

    def predictions(self, data: TaskData, outputs: Mapping[str, List[np.ndarray]]) -> List[Dict[str, Any]]:
        """[{"index", "label" (label-map string or int), "probs"}] in file order."""
        probs = self._gather(data, outputs, "probs")
        records = []
        for i, p in enumerate(probs):
            k = int(p.argmax())
            records.append({"index": i, "label": self.id_to_label[k] if self.id_to_label else k,
                            "probs": [float(x) for x in p]})
        return records

    def manifest(self) -> Dict[str, Any]:
        return {"n_classes": self.n_classes, "label_map": self.label_map}


@register_task_type("cls")
class ClassificationTask(_PooledTask):
    """`label<TAB>text_a` -> softmax over n_classes."""


@register_task_type("match")
class MatchTask(_PooledTask):
    """`label<TAB>text_a<TAB>text_b` pair classification, or pairwise ranking (`learning_strategy`)."""

    options = {
        **_PooledTask.options,
        "n_classes": Option(2, "number of classes of pointwise matching (pairwise: must be 2, dev/test labels 0/1)"),
        "learning_strategy": Option("pointwise", "pointwise: classify label<TAB>text_a<TAB>text_b; pairwise: rank "
                                                 "(text_a, text_b) above (text_a, text_b_neg) with a hinge loss"),
        "margin": Option(0.5, "hinge margin of the pairwise loss max(0, margin - s_pos + s_neg) (PALM's default)"),
    }
    text_columns = ("text_a", "text_b")

    def __init__(self, spec, ctx):
        super().__init__(spec, ctx)
        self.strategy = self._option("learning_strategy")
        if self.strategy not in ("pointwise", "pairwise"):
            raise ConfigError([f"task {spec.name!r}: learning_strategy: {self.strategy!r} is not one of "
                               "'pointwise', 'pairwise'"])
        self.pairwise = self.strategy == "pairwise"
        if self.pairwise and self.n_classes != 2:
            raise ConfigError([f"task {spec.name!r}: n_classes: {self.n_classes} with learning_strategy: pairwise; "
                               "pairwise dev/test labels are 0/1 (no match / match): drop n_classes or set it to 2"])
        self.margin = float(self._option("margin"))
        if self.margin < 0:
            raise ConfigError([f"task {spec.name!r}: margin: {self.margin} must be >= 0 (PALM's default is 0.5)"])

    def _extra_columns(self) -> Tuple[str, ...]:
        return ("qid",)  # PALM's optional query id column: accepted and ignored

    def load(self, split: str) -> TaskData:
        """Pairwise train rows are `text_a<TAB>text_b<TAB>text_b_neg`; every other file is pointwise."""
        if not (self.pairwise and split == "train"):
            return super().load(split)
        rows = read_tsv(self._path(split), ("text_a", "text_b", "text_b_neg"), optional_columns=self._extra_columns())
        features = [PairExample(Example(*self.encode(r["text_a"], r["text_b"])),
                                Example(*self.encode(r["text_a"], r["text_b_neg"]))) for _, r in rows]
        return TaskData(split, features, has_labels=True)

    # -- pairwise ranking (pointwise matching is the inherited classifier) ---------------------
    def collate(self, features: Sequence[Any]) -> Dict[str, np.ndarray]:
        if not self.pairwise:
            return super().collate(features)
        pairs = bool(features) and isinstance(features[0], PairExample)
        rows = [p.pos for p in features] + [p.neg for p in features] if pairs else list(features)
        batch = pad_backbone_inputs([r.input_ids for r in rows], [r.segment_ids for r in rows], pad_id=self._pad_id())
        n = len(features)
        if pairs:  # row i (positive) pairs with row n + i (negative)
            batch["pos_index"], batch["neg_index"] = np.arange(n, dtype=np.int64), np.arange(n, 2 * n, dtype=np.int64)
        else:  # eval/pred rows are scored one by one; the loss is not used
            batch.update(self.dummy_labels(n, 0))
        return batch

    def label_feeds(self) -> Tuple[FeedSpec, ...]:
        if not self.pairwise:
            return super().label_feeds()
        return (FeedSpec("pos_index", (-1,), "int64", "batch row of each positive pair"),
                FeedSpec("neg_index", (-1,), "int64", "batch row of the negative pair ranked below it"))

    def dummy_labels(self, batch_size: int, seq_len: int) -> Dict[str, np.ndarray]:
        if not self.pairwise:
            return super().dummy_labels(batch_size, seq_len)
        zero = np.zeros(1, dtype=np.int64)  # row 0 against itself: loss = margin, gradient 0
        return {"pos_index": zero, "neg_index": zero.copy()}

    def head_signature(self) -> Tuple[Any, ...]:
        return ("pairwise_score", 1) if self.pairwise else super().head_signature()

    def create_head(self, enc: Encoded):
        return self._linear(enc, 1) if self.pairwise else super().create_head(enc)

    def head_forward(self, head, enc: Encoded, feeds: Mapping[str, Any]) -> HeadOutputs:
        if not self.pairwise:
            return super().head_forward(head, enc, feeds)
        import paddle
        import paddle.nn.functional as F

        # A linear score (PALM applies a sigmoid): eval thresholds it at 0.
        score = paddle.reshape(head(self._pooled(enc)), [-1])
        pos, neg = paddle.gather(score, feeds["pos_index"]), paddle.gather(score, feeds["neg_index"])
        loss = paddle.mean(F.relu(self.margin - pos + neg))
        return HeadOutputs(loss=loss, predictions={"score": score})

    def evaluate(self, data: TaskData, outputs: Mapping[str, List[np.ndarray]]) -> Dict[str, float]:
        """Pairwise: a pair is predicted a match when its score is > 0; `acc` and `f1` against the 0/1 labels."""
        if not self.pairwise:
            return super().evaluate(data, outputs)
        pred = (self._gather(data, outputs, "score") > 0).astype(np.int64)
        return self._classification_metrics(self._labels(data), pred, 2)

    def predictions(self, data: TaskData, outputs: Mapping[str, List[np.ndarray]]) -> List[Dict[str, Any]]:
        """Pairwise: [{"index", "score"}] in file order; otherwise as `cls`."""
        if not self.pairwise:
            return super().predictions(data, outputs)
        return [{"index": i, "score": float(s)} for i, s in enumerate(self._gather(data, outputs, "score"))]

    def manifest(self) -> Dict[str, Any]:
        return {**super().manifest(), "learning_strategy": self.strategy}
