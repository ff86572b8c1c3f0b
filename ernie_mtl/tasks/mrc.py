"""`mrc`: extractive machine reading comprehension (SQuAD v1.1 / v2 JSON), start/end span head.

Featurization follows PaddleNLP's SQuAD/DuReader examples and PALM's MRC reader: the question is
truncated to `max_query_len` tokens, the context is cut into windows of at most
`max_seq_len - len(question) - 3` tokens whose starts are `doc_stride` tokens apart, each window is
`[CLS] question [SEP] window [SEP]`, and a window that does not contain the whole answer points
at [CLS] (position 0). Token -> context-character offsets come from the tokenizer's own
`get_offset_mapping` (character-level for Chinese: the basic tokenizer splits CJK characters).
Decoding (`n_best_size`, `max_answer_len`, `null_score_diff_threshold`, max-context filtering) and
EM/F1 are paddlenlp's `compute_prediction` and `squad_evaluate`; with `for_cn` F1 is
character-level as in PaddleNLP's CMRC2018/DuReader examples (`is_whitespace_splited=False`).
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ernie_mtl.config import ConfigError
from ernie_mtl.tasks.feeds import FeedSpec
from ernie_mtl.tasks.base import (read_json_file,
    Encoded, HeadOutputs, Option, TaskData, TaskType, pad_backbone_inputs, register_task_type)

_MAX_REPORTED = 20  # problems listed in one error; the rest are counted


class _Examples(list):
    """Examples as paddlenlp's `compute_prediction` reads them: iterable rows and `examples["id"]`."""

    def __getitem__(self, key):
        if isinstance(key, str):
            return [row[key] for row in self]
        return super().__getitem__(key)


def _answer_problem(context: str, text: str, start: Any) -> Optional[str]:
    """Why (text, answer_start) does not locate an answer in `context`, with the fix; None if it does."""
    if not isinstance(start, int) or isinstance(start, bool):
        return f"answer_start {start!r} is not a character index; give the answer's first character (from 0)"
    if not text.strip():
        return f"empty answer text {text!r}; an answerable question needs a non-blank answer"
    if context[start:start + len(text)] == text:
        return None
    found = context.find(text)
    fix = (f"the text occurs at character {found}: set answer_start to {found}" if found >= 0
           else "the text does not occur in the context: fix the text")
    return (f"answer_start {start} gives {context[start:start + len(text)]!r}, not the answer text {text!r}; "
            f"{fix} (answer_start counts characters from 0)")


class _WindowOffsets:
    """A window's token -> context-character offsets as paddlenlp's `compute_prediction` reads them
    (None outside the context), as a view of the paragraph's shared offset array: features of
    long files then cost a few objects each instead of a tuple per token."""

    __slots__ = ("offsets", "start", "length", "head")

    def __init__(self, offsets: np.ndarray, start: int, length: int, head: int):
        self.offsets, self.start, self.length, self.head = offsets, start, length, head

    def __len__(self) -> int:
        return self.head + self.length + 1  # [CLS] question [SEP] window [SEP]

    def __getitem__(self, position: int) -> Optional[Tuple[int, int]]:
        j = position - self.head
        if not 0 <= j < self.length:
            return None
        a, b = self.offsets[self.start + j]
        return int(a), int(b)


class _MaxContext:
    """`token_is_max_context` of one window for `compute_prediction` (`.get(str(position))`), computed
    on demand from the question's windows."""

    __slots__ = ("windows", "current", "head")

    def __init__(self, windows: Tuple[Tuple[int, int], ...], current: int, head: int):
        self.windows, self.current, self.head = windows, current, head

    def get(self, position: str, default: bool = False) -> bool:
        start, length = self.windows[self.current]
        j = int(position) - self.head
        return _is_max_context(self.windows, self.current, start + j) if 0 <= j < length else default


def _is_max_context(windows: Sequence[Tuple[int, int]], current: int, position: int) -> bool:
    """Whether window `current` gives token `position` its most balanced context (BERT/PALM rule:
    score = min(left, right context) + 0.01 * window length), so overlapping windows do not
    propose the same span twice from a worse vantage point."""
    best, best_score = None, None
    for i, (start, length) in enumerate(windows):
        end = start + length - 1
        if not start <= position <= end:
            continue
        score = min(position - start, end - position) + 0.01 * length
        if best_score is None or score > best_score:
            best, best_score = i, score
    return best == current


@register_task_type("mrc")
class MRCTask(TaskType):
    """SQuAD-style span extraction; see the module docstring and docs/tasks/mrc.md."""

    main_metric = "f1"
    options = {
        "max_query_len": Option(64, "question tokens kept (the rest is cut)"),
        "doc_stride": Option(128, "tokens between the starts of consecutive context windows"),
        "n_best_size": Option(20, "start and end candidates considered per window when decoding"),
        "max_answer_len": Option(30, "longest answer (in tokens) decoding may return"),
        "with_negative": Option(False, "SQuAD v2: questions may be unanswerable (is_impossible)"),
        "null_score_diff_threshold": Option(0.0, "SQuAD v2: answer '' when null score - best span score exceeds it"),
        "remove_noanswer": Option(False, "train split: drop windows that do not contain the answer "
                                         "(false: they point at [CLS])"),
    }

    def __init__(self, spec, ctx):
        super().__init__(spec, ctx)
        opts = {**{k: o.default for k, o in self.options.items()}, **spec.options}
        problems = [f"task {spec.name!r}: option {key} = {opts.get(key)!r} must be a positive integer"
                    for key in ("max_query_len", "doc_stride", "n_best_size", "max_answer_len")
                    if not (isinstance(opts.get(key), int) and not isinstance(opts.get(key), bool)
                            and opts.get(key) > 0)]
        if spec.max_seq_len < 4:
            problems.append(f"task {spec.name!r}: max_seq_len = {spec.max_seq_len} leaves no room for a question "
                            "and context; use e.g. 384 or 512")
        if problems:
            raise ConfigError(problems)
        self.opts = opts

    # -- data ----------------------------------------------------------------------------------
    def _read(self, path: str, split: str) -> List[Dict[str, Any]]:
        """The questions of a SQuAD-style file, validated; every problem reported with its JSON path."""
        doc = read_json_file(path, "an MRC file", 'SQuAD-style {"data": [{"paragraphs": [{"context": ..., '
                                                  '"qas": [...]}]}]}')
        labelled = split != "pred"
        problems: List[str] = []
        examples: List[Dict[str, Any]] = []
        seen: Dict[str, str] = {}

        def need(obj, key, kind, where, typ=None):
            """obj[key], or None after recording why not (missing, or not of type `typ`)."""
            if not isinstance(obj, dict) or key not in obj:
                problems.append(f"{path}: {where or 'top level'}: missing key {key!r} (SQuAD format: {kind})")
                return None
            if typ is not None and not isinstance(obj[key], typ):
                problems.append(f"{path}: {where + '.' if where else ''}{key}: expected a {typ.__name__}, "
                                f"found {obj[key]!r:.60}")
                return None
            return obj[key]

        articles = need(doc, "data", '{"data": [articles]}', "", list)
        for a, article in enumerate(articles or []):
            for p, para in enumerate(need(article, "paragraphs", '{"paragraphs": [...]}', f"data[{a}]", list) or []):
                where_p = f"data[{a}].paragraphs[{p}]"
                context = need(para, "context", '{"context": text, "qas": [...]}', where_p, str)
                qas = need(para, "qas", '{"context": text, "qas": [...]}', where_p, list)
                if context is None:
                    continue
                for q, qa in enumerate(qas or []):
                    where = f"{where_p}.qas[{q}]"
                    qid = need(qa, "id", '{"id", "question", "answers"}', where)
                    question = need(qa, "question", '{"id", "question", "answers"}', where)
                    if qid is None or question is None:
                        continue
                    qid = str(qid)
                    where = f"{where} (id {qid!r})"
                    if qid in seen:
                        problems.append(f"{path}: {where}: question id {qid!r} also used at {seen[qid]}; "
                                        "ids must be unique (predictions are keyed by id)")
                        continue
                    seen[qid] = where
                    impossible = bool(qa.get("is_impossible", False))
                    texts, starts = [], []
                    if labelled and impossible and not self.opts["with_negative"]:
                        problems.append(f"{path}: {where}: is_impossible is true but option with_negative is false; "
                                        "set with_negative: true in the task YAML for SQuAD v2 data")
                        continue
                    if labelled and not impossible:
                        answers = qa.get("answers", [])
                        if not isinstance(answers, list) or not answers:
                            problems.append(f"{path}: {where}: no answers; give answers "
                                            '[{"text", "answer_start"}] or mark it "is_impossible": true '
                                            "(with with_negative: true)")
                            continue
                        for n, ans in enumerate(answers):
                            w = f"{where}.answers[{n}]"
                            text = need(ans, "text", '{"text", "answer_start"}', w)
                            start = need(ans, "answer_start", '{"text", "answer_start"}', w)
                            if text is not None and start is not None:
                                problem = _answer_problem(context, str(text), start)
                                if problem:
                                    problems.append(f"{path}: {w}: {problem}")
                                else:
                                    texts.append(text)
                                    starts.append(start)
                    examples.append({"id": qid, "question": str(question), "context": context,
                                     "answers": {"text": texts, "answer_start": starts}, "is_impossible": impossible})
        if problems:
            more = len(problems) - _MAX_REPORTED
            raise ConfigError(problems[:_MAX_REPORTED]
                              + ([f"{path}: ... and {more} more problems"] if more > 0 else []))
        if not examples:
            raise ConfigError([f"{path}: no questions found; expected SQuAD-style {{\"data\": [{{\"paragraphs\": "
                               '[{"context": ..., "qas": [{"id", "question", "answers"}]}]}]}'])
        return examples

    def _tokenize_context(self, context: str) -> Tuple[List[int], np.ndarray]:
        """Token ids of a context and their [start, end) character offsets ([n, 2] int32)."""
        tok = self.ctx.tokenizer(self.spec.do_lower_case)
        tokens = tok.tokenize(context)
        offsets = np.asarray(tok.get_offset_mapping(context) if tokens else [], dtype=np.int32).reshape(-1, 2)
        if len(offsets) != len(tokens):  # the tokenizer disagreeing with itself: decoding would be wrong
            raise RuntimeError(f"{len(offsets)} offsets for {len(tokens)} tokens of context {context[:60]!r}")
        return tok.convert_tokens_to_ids(tokens), offsets

    def _featurize(self, example: Dict[str, Any], ctx_ids: List[int], offsets: np.ndarray,
                   train: bool) -> List[Dict[str, Any]]:
        """Windows of one question (see the module docstring)."""
        tok = self.ctx.tokenizer(self.spec.do_lower_case)
        q_ids = tok.convert_tokens_to_ids(tok.tokenize(example["question"])[:self.opts["max_query_len"]])
        room = self.spec.max_seq_len - len(q_ids) - 3
        if room <= 0:
            raise ConfigError([f"task {self.spec.name!r}: max_seq_len {self.spec.max_seq_len} leaves no room for the "
                               f"context after a {len(q_ids)}-token question (max_query_len "
                               f"{self.opts['max_query_len']}); raise max_seq_len or lower max_query_len"])
        windows: List[Tuple[int, int]] = []
        start = 0
        while True:  # PaddleNLP's/BERT's stepping: the last window ends at the context's end
            length = min(len(ctx_ids) - start, room)
            windows.append((start, length))
            if start + length >= len(ctx_ids):
                break
            start += min(length, self.opts["doc_stride"])

        span: Optional[Tuple[int, int]] = None  # answer's first and last context token
        if example["answers"]["text"] and not example["is_impossible"]:
            s = example["answers"]["answer_start"][0]
            e = s + len(example["answers"]["text"][0])
            inside = np.flatnonzero((offsets[:, 0] < e) & (offsets[:, 1] > s))
            if len(inside):
                span = (int(inside[0]), int(inside[-1]))
        head = len(q_ids) + 2  # [CLS] question [SEP]
        windows_t = tuple(windows)
        feats = []
        for w, (ws, length) in enumerate(windows):
            if span is not None and ws <= span[0] and span[1] < ws + length:
                positions = (head + span[0] - ws, head + span[1] - ws)
            else:
                if train and span is not None and self.opts["remove_noanswer"]:
                    continue
                positions = (0, 0)
            feats.append({
                "input_ids": np.asarray([tok.cls_token_id] + q_ids + [tok.sep_token_id] + ctx_ids[ws:ws + length]
                                        + [tok.sep_token_id], dtype=np.int32),
                "segment_ids": np.repeat(np.array([0, 1], dtype=np.int8), [head, length + 1]),
                "start_position": positions[0], "end_position": positions[1],
                "example_id": example["id"],
                "offset_mapping": _WindowOffsets(offsets, ws, length, head),
                "token_is_max_context": _MaxContext(windows_t, w, head),
            })
        return feats

    def load(self, split: str) -> TaskData:
        path = self.spec.file(split)
        if path is None:
            raise ConfigError([f"task {self.spec.name!r}: no {split}_file configured; set it in the task YAML"])
        examples = self._read(path, split)
        contexts: Dict[str, Tuple[List[int], np.ndarray]] = {}  # a paragraph's questions share one tokenization
        features = []
        for ex in examples:
            if ex["context"] not in contexts:
                contexts[ex["context"]] = self._tokenize_context(ex["context"])
            features += self._featurize(ex, *contexts[ex["context"]], train=split == "train")
        return TaskData(split=split, features=features, examples=_Examples(examples), has_labels=split != "pred")

    def collate(self, features: Sequence[Dict[str, Any]]) -> Dict[str, np.ndarray]:
        tok = self.ctx.tokenizer(self.spec.do_lower_case)
        batch = pad_backbone_inputs([f["input_ids"] for f in features], [f["segment_ids"] for f in features],
                                    pad_id=tok.pad_token_id)
        batch["start_positions"] = np.array([f["start_position"] for f in features], dtype=np.int64)
        batch["end_positions"] = np.array([f["end_position"] for f in features], dtype=np.int64)
        return batch

    def label_feeds(self) -> Tuple[FeedSpec, ...]:
        return (FeedSpec("start_positions", (-1,), "int64", "answer start token (0 = [CLS]: not in this window)"),
                FeedSpec("end_positions", (-1,), "int64", "answer end token, inclusive (0 = [CLS])"))

    def dummy_labels(self, batch_size: int, seq_len: int) -> Dict[str, np.ndarray]:
        zeros = np.zeros((batch_size,), dtype=np.int64)
        return {"start_positions": zeros, "end_positions": zeros.copy()}

    # -- model ---------------------------------------------------------------------------------
    def create_head(self, enc: Encoded) -> Any:
        import paddle

        return paddle.nn.Linear(enc.config.hidden_size, 2)

    def head_forward(self, head: Any, enc: Encoded, feeds: Mapping[str, Any]) -> HeadOutputs:
        import paddle
        import paddle.nn.functional as F

        logits = head(enc.sequence_output)  # [B, S, 2]
        # Padding gets the additive attention mask (-1e4) so it takes no probability mass.
        pad = paddle.reshape(enc.feeds["input_mask"], [0, -1])
        start_logits = logits[:, :, 0] + pad
        end_logits = logits[:, :, 1] + pad
        start_loss = F.cross_entropy(start_logits, paddle.unsqueeze(feeds["start_positions"], -1))
        end_loss = F.cross_entropy(end_logits, paddle.unsqueeze(feeds["end_positions"], -1))
        return HeadOutputs(loss=(start_loss + end_loss) / 2,
                           predictions={"start_logits": start_logits, "end_logits": end_logits})

    def head_signature(self) -> Tuple[Any, ...]:
        return (self.name, 2)

    # -- evaluation and prediction -------------------------------------------------------------
    def decode(self, data: TaskData, outputs: Mapping[str, List[np.ndarray]]
               ) -> Tuple[Dict[str, str], Dict[str, float]]:
        """Answers by question id ('' = no answer, SQuAD v2) and the v2 null-score differences,
        by paddlenlp's `compute_prediction` over all windows of each question."""
        from paddlenlp.metrics.squad import compute_prediction

        starts = [row for batch in outputs["start_logits"] for row in np.asarray(batch)]
        ends = [row for batch in outputs["end_logits"] for row in np.asarray(batch)]
        if len(starts) != len(data.features) or len(ends) != len(data.features):
            raise ValueError(f"task {self.spec.name!r}: {len(starts)} start / {len(ends)} end logit rows for "
                             f"{len(data.features)} features; outputs must cover data.features in order")
        answers, _, diffs = compute_prediction(
            data.examples, data.features, (starts, ends), bool(self.opts["with_negative"]),
            self.opts["n_best_size"], self.opts["max_answer_len"], float(self.opts["null_score_diff_threshold"]))
        return dict(answers), dict(diffs)

    def evaluate(self, data: TaskData, outputs: Mapping[str, List[np.ndarray]]) -> Dict[str, float]:
        """`em` and `f1` in percent (SQuAD convention); with `with_negative` also has_ans_*/no_ans_* and
        `best_f1` / `best_f1_thresh` (the null_score_diff_threshold that would maximise F1)."""
        from paddlenlp.metrics.squad import squad_evaluate

        answers, diffs = self.decode(data, outputs)
        # Without "is_impossible": paddlenlp's make_qid_to_has_ans reads that key inverted; it then
        # derives has-answer from the answer list, which is what we mean.
        gold = [{"id": ex["id"], "answers": ex["answers"]} for ex in data.examples]
        kwargs = {}
        if self.opts["with_negative"]:  # same decision rule as compute_prediction: diff > threshold -> ''
            kwargs = dict(na_probs=diffs, na_prob_thresh=float(self.opts["null_score_diff_threshold"]))
        res = squad_evaluate(gold, answers, is_whitespace_splited=not self.spec.for_cn, **kwargs)
        names = {"exact": "em", "f1": "f1"}
        if self.opts["with_negative"]:
            names.update(HasAns_exact="has_ans_em", HasAns_f1="has_ans_f1", NoAns_exact="no_ans_em",
                         NoAns_f1="no_ans_f1", best_f1="best_f1", best_f1_thresh="best_f1_thresh")
        return {names[k]: float(v) for k, v in res.items() if k in names}

    def predictions(self, data: TaskData, outputs: Mapping[str, List[np.ndarray]]) -> Dict[str, str]:
        """{question id: answer text} ('' = unanswerable, SQuAD v2), the --do_predict JSON."""
        return self.decode(data, outputs)[0]
