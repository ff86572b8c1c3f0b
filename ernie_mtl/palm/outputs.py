"""PaddlePALM's prediction files, written from the engine's predictions (`engine.inference.Predicted`),
so evaluation scripts written for PALM read them unchanged. Each writer also returns the records.

    Classify / Match (pointwise)  predictions.json: one JSON object per line, in input order,
                                  {"index", "label", "logits", "probs"}; `label` is the argmax class id
    Match (pairwise)              {"index", "probs", "score"} per line; probs = sigmoid(score)
    SequenceLabel                 one JSON list of tag ids per line: [CLS] position, one id per token of
                                  `text_a`, [SEP] position ([CLS]/[SEP] are len(label_map) - 1, as PALM)
    MRC                           predictions.json {question id: answer} and nbest_predictions.json
                                  (null_odds.json with with_negative)
    MaskLM                        one predicted token id per line, per masked position in order

Where these differ from PALM's files (docs/palm.md): `logits` are log-probabilities (the classifier's
logits shifted by their log-sum-exp: the same softmax, the same argmax); sequence-label lines are not
padded to the batch's longest row and hold one id per *token of the file* (PALM wrote one per word
piece, which a tokenized English word misaligns), decoded by Viterbi; MRC answers are substrings of
the context (PALM joined Chinese characters with spaces).
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional

import numpy as np


def write(head, predicted, output_dir: Optional[str]) -> Any:
    """The records of `predicted` in `head`'s PALM format; written under `output_dir` when given."""
    kind = type(head).__name__
    task = predicted.task
    if task.name in ("cls", "match") and not getattr(task, "pairwise", False):
        records = _classes(predicted)
    elif task.name == "match":
        records = _pairwise(predicted)
    elif task.name == "seq_label":
        records = _tags(predicted)
    elif task.name == "mrc":
        answers, nbest, null_odds = _spans(predicted)
        if output_dir is not None:
            os.makedirs(output_dir, exist_ok=True)
            _dump(os.path.join(output_dir, "predictions.json"), answers)
            _dump(os.path.join(output_dir, "nbest_predictions.json"), nbest)
            if null_odds is not None:
                _dump(os.path.join(output_dir, "null_odds.json"), null_odds)
            print(f"Writing predictions to: {os.path.join(output_dir, 'predictions.json')}")
        return answers
    elif task.name == "mlm":
        records = _masked(predicted)
    else:
        raise ValueError(f"{kind}: no PALM prediction format for task type {task.name!r}")
    if output_dir is not None:
        os.makedirs(output_dir, exist_ok=True)
        path = os.path.join(output_dir, "predictions.json")
        with open(path, "w", encoding="utf-8") as f:
            for r in records:
                f.write((json.dumps(r, ensure_ascii=False) if not isinstance(r, list) else str(r)) + "\n")
        print(f"Predictions saved at {path}")
    return records


def _dump(path: str, obj: Any) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(obj, indent=4, ensure_ascii=False) + "\n")


def _classes(predicted) -> List[Dict[str, Any]]:
    probs = np.concatenate([np.asarray(b) for b in predicted.outputs["probs"]], axis=0)
    logits = np.log(np.clip(probs.astype(np.float64), 1e-30, None))
    return [{"index": i, "label": int(p.argmax()), "logits": [float(x) for x in lg], "probs": [float(x) for x in p]}
            for i, (p, lg) in enumerate(zip(probs, logits))]


def _pairwise(predicted) -> List[Dict[str, Any]]:
    scores = np.concatenate([np.asarray(b).reshape(-1) for b in predicted.outputs["score"]])
    return [{"index": i, "probs": float(1.0 / (1.0 + np.exp(-s))), "score": float(s)} for i, s in enumerate(scores)]


def _tags(predicted) -> List[List[int]]:
    task = predicted.task
    outside = len(task.label_map) - 1  # PALM's id for [CLS], [SEP] and padding
    rows = task._predicted_tags(predicted.data, predicted.outputs)
    return [[outside] + [task.label_map[tag] for tag in tags] + [outside] for tags in rows]


def _spans(predicted):
    from paddlenlp.metrics.squad import compute_prediction

    task, data, outputs = predicted.task, predicted.data, predicted.outputs
    starts = [row for batch in outputs["start_logits"] for row in np.asarray(batch)]
    ends = [row for batch in outputs["end_logits"] for row in np.asarray(batch)]
    opts = task.opts
    answers, nbest, diffs = compute_prediction(
        data.examples, data.features, (starts, ends), bool(opts["with_negative"]), opts["n_best_size"],
        opts["max_answer_len"], float(opts["null_score_diff_threshold"]))
    nbest = {qid: [{k: (float(v) if isinstance(v, (np.floating, float)) else v) for k, v in entry.items()}
                   for entry in entries] for qid, entries in nbest.items()}
    null_odds = {qid: float(v) for qid, v in diffs.items()} if opts["with_negative"] else None
    return dict(answers), nbest, null_odds


def _masked(predicted) -> List[int]:
    from ernie_mtl.tasks.mlm import masked_slots_per_example

    return [int(token_id) for _, ids in masked_slots_per_example(predicted.data, predicted.outputs) for token_id in ids]
