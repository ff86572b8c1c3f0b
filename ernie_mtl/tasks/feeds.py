"""The feed contract: what a program takes and what a task type's `collate` must produce.

Task types and user plugins import from here (not from the program builder): `FeedSpec` describes
one input; `BACKBONE_FEEDS` are the inputs of the shared ERNIE/BERT backbone, identical for every
task; `MLM_FEEDS` / `NSP_FEED` are the masked-LM and sentence-pair labels of the `mlm` and
`pretrain` types. A task's own feeds are named `<task>.<name>` in the program (`feed_name`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple


@dataclass(frozen=True)
class FeedSpec:
    """One input of the program: what the collate function must produce."""

    name: str
    shape: Tuple[int, ...]
    dtype: str
    doc: str


BACKBONE_FEEDS: Tuple[FeedSpec, ...] = (
    FeedSpec("input_ids", (-1, -1), "int64", "token ids [batch, seq]"),
    FeedSpec("segment_ids", (-1, -1), "int64", "segment (token type) ids [batch, seq]"),
    FeedSpec("input_mask", (-1, 1, 1, -1), "float32", "additive attention mask: 0 keep, -1e4 padding"),
)
MLM_FEEDS: Tuple[FeedSpec, ...] = (
    FeedSpec("masked_lm_positions", (-1,), "int64", "flattened positions b*seq+pos of masked tokens"),
    FeedSpec("masked_lm_labels", (-1, 1), "int64", "original ids of masked tokens; -1 = padding slot"),
)
NSP_FEED = FeedSpec("next_sentence_labels", (-1, 1), "int64", "sentence-pair label (binary head only)")
IGNORE_LABEL = -1  # label of a padding slot (masked LM): no loss, not counted

TASK_GATE = "task_gate"  # one-hot of the micro-batch's task (the gated multi-task loss)
TASK_TYPE_IDS = "task_type_ids"  # ERNIE's task embedding input (use_task_id)


def feed_name(task: str, name: str) -> str:
    """Program name of a task's own feed."""
    return f"{task}.{name}"
