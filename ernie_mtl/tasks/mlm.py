"""`mlm`: masked language modelling on a TSV of texts, with dynamic whole-word n-gram masking.

The head is PaddleNLP's own LM prediction head (`ErnieLMPredictionHead` / `BertLMPredictionHead`:
transform -> activation -> layer norm -> decoder) with the decoder weight tied to the backbone's
word-embedding table, held under the attribute `predictions` so that its state_dict keys are
`ErnieForPretraining`'s `cls.predictions.*` keys minus `cls.`: the converter writes them back
unchanged. The pieces shared with the `pretrain` task type (head construction, loss, metrics,
per-example predictions) live here; ernie_mtl/tasks/pretrain.py imports them.
"""
from __future__ import annotations

import functools
from typing import Any, Dict, List, Mapping, Sequence, Tuple

import numpy as np

from ernie_mtl.config import ConfigError
from ernie_mtl.data.masking import VocabInfo, mask_whole_word_ngrams
from ernie_mtl.data.pretrain import PretrainSampleConfig, collate_pretrain
from ernie_mtl.tasks.feeds import IGNORE_LABEL, MLM_FEEDS, FeedSpec
from ernie_mtl.tasks.base import (Encoded, HeadOutputs, Option, TaskData, TaskSpec, TaskType, read_tsv,
                                  register_task_type)

MASKING_OPTIONS: Dict[str, Option] = {
    "masked_lm_prob": Option(0.15, "fraction of a sequence's tokens to predict (whole words, rounded)"),
    "max_predictions_per_seq": Option(20, "at most this many masked tokens per sequence"),
    "max_ngrams": Option(3, "masked spans are 1..max_ngrams whole words, p(n) proportional to 1/n"),
}
# A sample is the tuple ErniePretrainDataset yields, so both task types share collate_pretrain:
# (input_ids, segment_ids, masked_positions, masked_labels, pair_label), all int64 arrays / int.
Sample = Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]
_SPLIT_IDS = {"train": 0, "dev": 1, "test": 2, "pred": 3}


def sample_config(spec: TaskSpec, seed: int, **extra: Any) -> PretrainSampleConfig:
    """The task's masking (and, for `pretrain`, sampling) options as a validated PretrainSampleConfig."""
    o = spec.options
    cfg = PretrainSampleConfig(max_seq_len=spec.max_seq_len, masked_lm_prob=float(o["masked_lm_prob"]),
                               max_predictions_per_seq=int(o["max_predictions_per_seq"]),
                               max_ngrams=int(o["max_ngrams"]), seed=seed, **extra)
    problems = cfg.problems()
    if problems:  # PretrainSampleConfig names its fields as --flags; here they are task-YAML keys
        raise ConfigError([f"task {spec.name!r} ({spec.reader}): {p.replace('--', '', 1)} (task YAML key)"
                           for p in problems])
    return cfg


# -- head ------------------------------------------------------------------------------------------------
def pretraining_losses(prediction_scores, seq_relationship_score, masked_lm_labels,
                       next_sentence_labels=None):
    """(mlm_loss, nsp_loss or None), both float32 means.

    The MLM mean is over real masked tokens only: padding slots (label -1, added to make the
    masked count a multiple of 8) neither add loss nor count, unlike ErniePretrainingCriterion,
    whose mean divides by all slots. A batch without masked tokens gives 0, not NaN.
    """
    import paddle
    import paddle.nn.functional as F

    per_token = F.cross_entropy(_fp32(prediction_scores), masked_lm_labels, ignore_index=IGNORE_LABEL,
                                reduction="none")
    real = paddle.cast(masked_lm_labels != IGNORE_LABEL, "float32")
    mlm_loss = paddle.sum(per_token) / paddle.clip(paddle.sum(real), min=1.0)
    if next_sentence_labels is None:
        return mlm_loss, None
    return mlm_loss, F.cross_entropy(_fp32(seq_relationship_score), next_sentence_labels)


def _fp32(x):
    import paddle

    return x if x.dtype == paddle.float32 else paddle.cast(x, "float32")


def _paddlenlp_heads(model_type: str):
    """(LM prediction head class, pretraining heads class) of the backbone family."""
    if model_type == "bert":
        from paddlenlp.transformers.bert.modeling import BertLMPredictionHead, BertPretrainingHeads

        return BertLMPredictionHead, BertPretrainingHeads
    from paddlenlp.transformers.ernie.modeling import ErnieLMPredictionHead, ErniePretrainingHeads

    return ErnieLMPredictionHead, ErniePretrainingHeads


def tie_decoder_to_embedding(lm_head: Any, enc: Encoded) -> None:
    """Make `lm_head.decoder.weight` the backbone's word-embedding parameter itself.

    PaddleNLP's head creates its own vocab x hidden decoder weight before the tie; in a static
    program that orphan would stay a persistable, initialised, checkpointed parameter (as big as the
    embedding table), so its variable and initialiser are removed from the programs being built.
    """
    import paddle

    embedding = enc.backbone.embeddings.word_embeddings.weight
    orphan = lm_head.decoder.weight
    if tuple(orphan.shape) != tuple(embedding.shape):
        raise ValueError(f"the LM decoder weight {list(orphan.shape)} cannot be tied to the word embedding "
                         f"{list(embedding.shape)}")
    lm_head.decoder.weight = embedding
    if paddle.in_dynamic_mode():
        return
    name = orphan.name  # read once: removing the variable frees the object's description
    del orphan
    from ernie_mtl.tasks.base import remove_variable

    remove_variable(name, (paddle.static.default_main_program(), paddle.static.default_startup_program()))


def build_mlm_head(enc: Encoded, model_type: str, *, with_pair_classifier: bool = False) -> Any:
    """PaddleNLP's LM head tied to the word embedding, as a Layer whose state_dict keys are
    `ErnieForPretraining`'s `cls.*` keys minus `cls.` (`predictions.*`, and `seq_relationship.*`
    with `with_pair_classifier`: then it is PaddleNLP's ErniePretrainingHeads/BertPretrainingHeads)."""
    import paddle

    lm_cls, pretraining_cls = _paddlenlp_heads(model_type)
    if with_pair_classifier:
        head = pretraining_cls(enc.config)
    else:
        head = paddle.nn.Layer()
        head.predictions = lm_cls(enc.config)
    tie_decoder_to_embedding(head.predictions, enc)
    return head


def mlm_outputs(head: Any, enc: Encoded, feeds: Mapping[str, Any], next_sentence: bool = False) -> HeadOutputs:
    """Loss (pretraining_losses: MLM over real masked tokens [+ NSP]) and the
    evaluation outputs: per masked slot the argmax id, the label (-1 = padding slot) and the
    negative log-likelihood of the label (0 on padding slots); per sequence the pair prediction."""
    import paddle
    import paddle.nn.functional as F

    labels = feeds["masked_lm_labels"]
    scores = head.predictions(enc.sequence_output, masked_positions=feeds["masked_lm_positions"])
    pair_scores = head.seq_relationship(enc.pooled_output) if next_sentence else None
    mlm_loss, nsp_loss = pretraining_losses(scores, pair_scores, labels,
                                            feeds["next_sentence_labels"] if next_sentence else None)
    nll = F.cross_entropy(paddle.cast(scores, "float32"), labels, ignore_index=IGNORE_LABEL, reduction="none")
    predictions = {"mlm_pred": paddle.argmax(scores, axis=-1), "mlm_label": paddle.reshape(labels, [-1]),
                   "mlm_nll": paddle.reshape(nll, [-1])}
    if not next_sentence:
        return HeadOutputs(loss=mlm_loss, predictions=predictions, scalars={"mlm_loss": mlm_loss})
    predictions["nsp_pred"] = paddle.argmax(pair_scores, axis=-1)
    predictions["nsp_label"] = paddle.reshape(feeds["next_sentence_labels"], [-1])
    pair_nll = F.cross_entropy(paddle.cast(pair_scores, "float32"), feeds["next_sentence_labels"], reduction="none")
    predictions["nsp_nll"] = paddle.reshape(pair_nll, [-1])
    return HeadOutputs(loss=mlm_loss + nsp_loss, predictions=predictions,
                       scalars={"mlm_loss": mlm_loss, "nsp_loss": nsp_loss})


def mlm_dummy_labels() -> Dict[str, np.ndarray]:
    """One padding slot (position 0, label -1): the MLM loss is exactly 0."""
    return {"masked_lm_positions": np.zeros(1, dtype=np.int64),
            "masked_lm_labels": np.full((1, 1), IGNORE_LABEL, dtype=np.int64)}


# -- metrics and predictions -----------------------------------------------------------------------------
def concat_outputs(outputs: Mapping[str, List[np.ndarray]], name: str) -> np.ndarray:
    """The per-batch arrays of prediction `name`, flattened and joined in feature order."""
    arrays = [np.asarray(a).reshape(-1) for a in outputs[name]]
    return np.concatenate(arrays) if arrays else np.zeros(0)


def mlm_metrics(outputs: Mapping[str, List[np.ndarray]]) -> Dict[str, float]:
    """mlm_acc: argmax == label over real masked tokens of the split; mlm_loss: their mean NLL
    (token-weighted over the whole split, i.e. the training MLM loss of one big batch)."""
    labels = concat_outputs(outputs, "mlm_label")
    real = labels != IGNORE_LABEL
    count = max(int(real.sum()), 1)
    return {"mlm_acc": float((concat_outputs(outputs, "mlm_pred")[real] == labels[real]).sum() / count),
            "mlm_loss": float(concat_outputs(outputs, "mlm_nll")[real].sum() / count)}


def masked_slots_per_example(data: TaskData, outputs: Mapping[str, List[np.ndarray]]
                             ) -> List[Tuple[Sample, np.ndarray]]:
    """(sample, predicted ids of its masked positions) per example of `data`, in order.

    Collate lays out every batch as its samples' masked slots in order, then padding slots
    (label -1); so the real slots of all batches, concatenated, are the samples' slots in order.
    """
    labels = concat_outputs(outputs, "mlm_label")
    predicted = concat_outputs(outputs, "mlm_pred")[labels != IGNORE_LABEL].astype(np.int64)
    out, offset = [], 0
    for i in range(len(data)):
        sample = data.get(i, 0)
        n = len(sample[2])
        out.append((sample, predicted[offset:offset + n]))
        offset += n
    if offset != len(predicted):
        raise ValueError(f"the outputs hold {len(predicted)} masked-token predictions but the {len(data)} "
                         f"examples of the {data.split} split have {offset}: outputs and data do not match")
    return out


@functools.lru_cache(maxsize=1)
def _segmenter():
    from data_tools.tokenization import JiebaSegmenter

    return JiebaSegmenter()


# -- the task type ---------------------------------------------------------------------------------------
@register_task_type("mlm")
class MaskedLMTask(TaskType):
    """`text_a` per row -> `[CLS] text [SEP]`, masked anew every epoch (see the module docstring)."""

    options = {**MASKING_OPTIONS,
               "text_columns": Option("text_a", "the column(s) whose texts are the examples, comma-separated: "
                                                "each non-empty cell is one example (e.g. text_a, text_b)"),
               "other_columns": Option("refuse", "refuse | ignore: what to do with other columns (ignore: a "
                                                 "labelled file of another task read as text)"),
               "token_separator": Option(None, "a sequence-labelling file's token separator (\\x02): tokens "
                                               "joined again with nothing (for_cn) or a space")}
    main_metric = "mlm_acc"
    exportable = False  # predictions need masked positions, not only the backbone inputs
    pretrained_head_prefix = "cls."

    def __init__(self, spec: TaskSpec, ctx):
        super().__init__(spec, ctx)
        self.cfg = sample_config(spec, ctx.seed)
        self.vocab = VocabInfo.from_file(ctx.vocab_file)
        o = spec.options
        self.text_columns = tuple(c.strip() for c in str(o.get("text_columns") or "text_a").split(",") if c.strip())
        problems = []
        if not self.text_columns:
            problems.append(f"task {spec.name!r} (mlm): text_columns {o.get('text_columns')!r} names no column; "
                            "use e.g. text_a or 'text_a, text_b'")
        if o.get("other_columns", "refuse") not in ("refuse", "ignore"):
            problems.append(f"task {spec.name!r} (mlm): other_columns {o.get('other_columns')!r} must be refuse or "
                            "ignore")
        separator = o.get("token_separator")
        if separator is not None and (not isinstance(separator, str) or not separator):
            problems.append(f"task {spec.name!r} (mlm): token_separator {separator!r} must be a non-empty string "
                            "(the separator of a sequence-labelling file's tokens, \\x02)")
        if problems:
            raise ConfigError(problems)

    # -- data ----------------------------------------------------------------------------------
    def load(self, split: str) -> TaskData:
        path = self.spec.file(split)
        if path is None:
            raise ConfigError([f"task {self.spec.name!r}: no {split}_file is set; add `{split}_file: <path>` "
                               "to its task YAML"])
        texts = self._texts(path)
        features = [self._encode(text) for text in texts]
        mask = functools.partial(self._mask, _SPLIT_IDS[split])  # picklable: data-loading workers get it

        if split == "train":  # a new mask every epoch
            return TaskData(split, features, examples=texts, transform=mask)
        # evaluation sees one fixed mask per example (epoch 0's), so its metrics are comparable over time
        return TaskData(split, [mask(f, i, 0) for i, f in enumerate(features)], examples=texts)

    def _texts(self, path: str) -> List[str]:
        """The examples of a file: each non-empty cell of the text columns, row by row, column by column."""
        o = self.spec.options
        first, rest = self.text_columns[0], self.text_columns[1:]
        rows = read_tsv(path, [first], optional_columns=rest, other_columns=o.get("other_columns", "refuse"))
        separator = o.get("token_separator")
        joiner = "" if self.spec.for_cn else " "
        texts = []
        for _, row in rows:
            for column in self.text_columns:
                text = row.get(column, "")
                if separator:
                    text = joiner.join(piece for piece in text.split(separator) if piece)
                if text.strip():
                    texts.append(text)
        if not texts:
            raise ConfigError([f"{path}: no text in the column(s) {list(self.text_columns)}: the masked-LM task "
                               f"{self.spec.name!r} has no examples; point it at a file with text"])
        return texts

    def _mask(self, split_id: int, tokens: np.ndarray, index: int, epoch: int) -> Sample:
        """Example `index` of a split as masked in `epoch`: a pure function of (seed, task, split,
        index, epoch)."""
        rng = np.random.default_rng([self.ctx.seed, self.spec.index, split_id, index, epoch])
        ids, positions, labels = mask_whole_word_ngrams(
            tokens, self.vocab, rng, masked_lm_prob=self.cfg.masked_lm_prob,
            max_predictions=self.cfg.max_predictions_per_seq, max_ngrams=self.cfg.max_ngrams)
        return ids, np.zeros(len(ids), dtype=np.int64), positions, labels, 0

    def _encode(self, text: str) -> np.ndarray:
        """`[CLS] pieces [SEP]` ids, truncated; with a vocab that has `##<char>` entries (and for_cn),
        a Chinese character inside a jieba word becomes its marker id, so masking takes whole words
        (mask_whole_word_ngrams maps markers back to the character for input and label)."""
        tokenizer = self.ctx.tokenizer(self.spec.do_lower_case)
        pieces = tokenizer.tokenize(text)[:self.spec.max_seq_len - 2]
        ids = np.asarray(tokenizer.convert_tokens_to_ids(pieces), dtype=np.int64).reshape(-1)
        if len(ids) and self.spec.for_cn and self._markers is not None:
            marker = self._markers[ids]
            candidates = np.flatnonzero(marker >= 0)
            if len(candidates):
                internal = _segmenter().word_internal(text)
                offsets = tokenizer.get_offset_mapping(text)
                inside = [k for k in candidates.tolist() if internal[offsets[k][0]]]
                ids[inside] = marker[inside]
        return np.concatenate([[self.vocab.cls_id], ids, [self.vocab.sep_id]]).astype(np.int64)

    @functools.cached_property
    def _markers(self):
        """Character id -> `##<char>` id (-1: none), or None when the vocab has no such markers."""
        from data_tools.tokenization import load_vocab, marker_table

        table = marker_table(load_vocab(self.ctx.vocab_file))
        return table if (table >= 0).any() else None

    def collate(self, features: Sequence[Sample]) -> Dict[str, np.ndarray]:
        batch = collate_pretrain(features, pad_id=self.vocab.pad_id)
        del batch["next_sentence_labels"]
        return batch

    def label_feeds(self) -> Tuple[FeedSpec, ...]:
        return MLM_FEEDS

    def dummy_labels(self, batch_size: int, seq_len: int) -> Dict[str, np.ndarray]:
        return mlm_dummy_labels()

    # -- model ---------------------------------------------------------------------------------
    def create_head(self, enc: Encoded) -> Any:
        return build_mlm_head(enc, self.ctx.model_type)

    def head_forward(self, head: Any, enc: Encoded, feeds: Mapping[str, Any]) -> HeadOutputs:
        return mlm_outputs(head, enc, feeds)

    def head_signature(self) -> Tuple[Any, ...]:
        return (self.name, self.vocab.size)

    # -- evaluation and prediction -------------------------------------------------------------
    def evaluate(self, data: TaskData, outputs: Mapping[str, List[np.ndarray]]) -> Dict[str, float]:
        return mlm_metrics(outputs)

    def predictions(self, data: TaskData, outputs: Mapping[str, List[np.ndarray]]) -> List[Dict[str, Any]]:
        """Per row: its text, the masked positions (in `[CLS] text [SEP]`), the original and the
        predicted tokens there."""
        tokenizer = self.ctx.tokenizer(self.spec.do_lower_case)
        records = []
        for text, (sample, predicted) in zip(data.examples, masked_slots_per_example(data, outputs)):
            records.append({"text_a": text, "masked_positions": sample[2].tolist(),
                            "original": tokenizer.convert_ids_to_tokens(sample[3].tolist()),
                            "predicted": tokenizer.convert_ids_to_tokens(predicted.tolist())})
        return records
