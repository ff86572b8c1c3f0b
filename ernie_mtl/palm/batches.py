"""A batch as PALM's scripts see it: the engine's collated batch under PALM's field names (`palm_view`,
`ReaderBatch`). The built-in readers yield these (ernie_mtl/palm/reader.py), the adaptor reads them back
(ernie_mtl/palm/adaptor.py)."""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Sequence

import numpy as np

# a built-in reader's label feeds (the engine's names) -> PALM's field names
PALM_FIELDS = {"label": "label_ids", "labels": "label_ids", "masked_lm_positions": "mask_pos",
               "masked_lm_labels": "mask_label"}


def backbone_fields(batch: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """The backbone inputs of the engine's batch by PALM's names: token_ids, position_ids, segment_ids,
    input_mask [B, L, 1] (1.0 on padding, as PALM's readers give it) and task_ids."""
    ids = np.asarray(batch["input_ids"])
    b, s = ids.shape
    return {"token_ids": ids, "position_ids": np.tile(np.arange(s, dtype=np.int64), (b, 1)),
            "segment_ids": np.asarray(batch["segment_ids"]),
            "input_mask": (np.asarray(batch["input_mask"]).reshape(b, s, 1) == 0).astype(np.float32),
            "task_ids": np.zeros((b, s), dtype=np.int64)}


def palm_view(batch: Mapping[str, np.ndarray], label_names: Sequence[str], *, prefix: str = "") -> "ReaderBatch":
    """The engine's collated batch as PALM's reader dict: token_ids, position_ids, segment_ids,
    input_mask [B, L, 1], task_ids and the task's fields under PALM's names (with `prefix`)."""
    out = ReaderBatch(backbone_fields(batch))
    for name in label_names:
        if name in batch:
            out[prefix + PALM_FIELDS.get(name, name)] = np.asarray(batch[name])
    out.collated = dict(batch)
    return out


class ReaderBatch(dict):
    """A batch as PALM's reader dict; `collated` is the engine's batch it shows (fed as it is)."""

    collated: Optional[Dict[str, np.ndarray]] = None


PALM_KEYS = {"input_ids": "token_ids", "label": "label_ids", "labels": "label_ids",
              "masked_lm_positions": "mask_pos", "masked_lm_labels": "mask_label"}


class PalmBatch(dict):
    """One training step's batch, by PALM's names (`token_ids`, `position_ids`, `segment_ids`,
    `input_mask` [B, L, 1], `task_ids`, `<trainer name>.label_ids`, ...; `__task_id` in a
    MultiHeadTrainer). It is a view of the engine's micro-batch, which `train_one_step` trains."""

    prepared: Any = None
    task: str = ""
