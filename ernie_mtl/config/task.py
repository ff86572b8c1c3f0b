"""One task as resolved from the configuration (PALM-style YAML, or the pretraining flags)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

SPLITS = ("train", "dev", "test", "pred")


@dataclass(frozen=True)
class TaskSpec:
    """One task as resolved from the global and task YAMLs (file paths absolute)."""

    name: str
    reader: str
    index: int  # position in `task_instance`: the task id (task embedding, gate, RNG streams)
    train_file: Optional[Any] = None  # a file, or a corpus prefix / weighted mixture for `pretrain`
    dev_file: Optional[str] = None
    test_file: Optional[str] = None
    pred_file: Optional[str] = None
    max_seq_len: int = 128
    batch_size: int = 32  # per rank and micro-batch
    loss_weight: float = 1.0
    is_target: bool = True
    mix_ratio: float = 1.0
    reuse_tag: Optional[int] = None  # tasks with the same tag share one head
    num_epochs: Optional[float] = None
    do_lower_case: bool = True
    for_cn: bool = True
    export_from: Optional[str] = None  # "best" or "last" weights in the exported model (default: best with a dev_file)
    options: Mapping[str, Any] = field(default_factory=dict)  # the type's own keys, defaults filled in
    shuffle: bool = True  # False: read the training examples in the file's order every epoch (PALM's shuffle)
    pred_batch_size: Optional[int] = None  # batch size of prediction (default: batch_size)
    pred_output_path: Optional[str] = None  # where PALM 1.x's Controller.pred writes the predictions
    # task-adaptive masked LM (a target's own text as an auxiliary `mlm` task) and the refine stage's budget
    tapt: bool = False
    tapt_file: Optional[str] = None  # more unlabeled in-domain text (TSV with text_a) instead of the train file
    tapt_mix_ratio: float = 1.0
    refine: Optional[bool] = None  # False: this target is not refined (default: the global `refine`)
    refine_steps: Optional[int] = None
    refine_epochs: Optional[float] = None
    refine_learning_rate: Optional[float] = None

    def to_json(self) -> dict:
        """JSON-friendly copy (stored in manifests and checkpoints). The keys added later (PALM 1.x's shuffle,
        pred_batch_size, pred_output_path; tapt and refine) appear only when set, so records written before
        them compare equal when resumed."""
        from dataclasses import asdict

        data = asdict(self)
        data["options"] = dict(self.options)
        for key, default in _OPTIONAL_DEFAULTS.items():
            if data[key] == default:
                del data[key]
        return data

    def file(self, split: str) -> Optional[str]:
        """The data file of `split` (train/dev/test/pred), or None."""
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; use one of {SPLITS}")
        return getattr(self, f"{split}_file")


_OPTIONAL_DEFAULTS = {"shuffle": True, "pred_batch_size": None, "pred_output_path": None, "tapt": False,
                      "tapt_file": None, "tapt_mix_ratio": 1.0, "refine": None, "refine_steps": None,
                      "refine_epochs": None, "refine_learning_rate": None}
