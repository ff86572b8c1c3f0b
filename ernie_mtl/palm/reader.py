"""PaddlePALM's readers (`palm.reader.*`): what a task reads and how, collected for the engine's task
types (docs/palm.md).

A reader keeps PALM's constructor and `load_data(input_file, batch_size, num_epochs, file_format,
shuffle_train)`; it becomes the task keys of one task (`reader`, `train_file` or `pred_file`,
`batch_size`, `max_seq_len`, `do_lower_case`, `for_cn`, its own options) and the run's vocabulary
and seed. `load_data` reads the file at once, as PALM did, so `num_examples` is right after it and a
bad row is reported there, by the engine's own reader (file:line). The files are PALM's: TSV with a
header (`label`/`text_a`/`text_b`, any column order), sequence labels joined by `\\x02`, SQuAD-style
MRC JSON, a `text_a` TSV for masked LM. Batches are made by the engine (ernie_mtl/engine/feeding.py)
when the trainer runs: every example once per epoch in a seeded order, the last batch included.
"""
from __future__ import annotations

import copy
import os
from typing import Any, Dict, Optional

from ernie_mtl.config import ConfigError

_LANGS = {"en": False, "english": False, "cn": True, "chinese": True}
_COUNTING_CLASSES = 2 ** 31 - 1  # n_classes while only counting examples (the head sets the real one)


class Reader:
    """PALM's `Reader` base: phase, batch size, epochs, the attributes registered for a backbone."""

    task_type = ""  # the engine's task type (`reader:` key)
    default_attrs: Dict[str, Any] = {}  # PALM's registered outputs besides the backbone's (train phase)

    def __init__(self, vocab_path, max_len, tokenizer="wordpiece", lang="en", seed=None, do_lower_case=False,
                 phase="train", **options):
        if phase not in ("train", "predict"):
            raise ValueError(f"phase {phase!r}: a reader's phase is 'train' or 'predict'")
        if str(lang).lower() not in _LANGS:
            raise ValueError(f"lang {lang!r}: use one of {sorted(_LANGS)}")
        if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 3:
            raise ValueError(f"max_len {max_len!r}: the longest sequence in tokens, an integer >= 3")
        self._vocab_path = os.path.abspath(vocab_path)
        self._max_len = max_len
        self._tokenizer = tokenizer  # PALM ignored it too: WordPiece is the only tokenizer
        self._for_cn = _LANGS[str(lang).lower()]
        self._seed = seed
        self._do_lower_case = bool(do_lower_case)
        self._phase = phase
        self._options = dict(options)  # the engine task type's own keys
        self._input_file: Optional[str] = None
        self._batch_size: Optional[int] = None
        self._num_epochs: Optional[float] = None
        self._num_examples: Optional[int] = None
        self._register = set(self.default_attrs) if phase == "train" else set()
        self._registered_backbone = None

    # -- PALM's interface ---------------------------------------------------------------------------
    @property
    def phase(self) -> str:
        return self._phase

    def clone(self, phase: str = "train") -> "Reader":
        """A copy of this reader, in `phase`."""
        other = copy.copy(self)
        other._phase = phase
        other._register = set(self.default_attrs) if phase == "train" else set()
        return other

    def require_attr(self, attr_name: str) -> None:
        self._register.add(attr_name)

    def register_with(self, backbone) -> None:
        """Record the backbone whose inputs this reader feeds (PALM's check that reader and backbone fit)."""
        for attr in backbone.inputs_attr:
            self.require_attr(attr)
        self._registered_backbone = backbone

    def get_registered_backbone(self):
        return self._registered_backbone

    @property
    def outputs_attr(self) -> Dict[str, Any]:
        """The batch keys this reader yields for its registered backbone (PALM's names)."""
        known = {**_BACKBONE_ATTRS, **self.default_attrs}
        return {k: known.get(k) for k in sorted(self._register)}

    def load_data(self, input_file, batch_size, num_epochs=None, file_format="tsv", shuffle_train=True):
        """Read `input_file` (eagerly, as PALM did: `num_examples` is known at once, a bad row is an
        error now); `num_epochs` None means "as the trainer decides" (one epoch for a single trainer, the
        mix-ratio quota in a MultiHeadTrainer)."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size {batch_size!r}: examples per batch, an integer >= 1")
        if num_epochs is not None and not (isinstance(num_epochs, (int, float)) and num_epochs > 0):
            raise ValueError(f"num_epochs {num_epochs!r}: a number > 0, or None")
        if not shuffle_train and self._phase == "train":
            raise ConfigError(["load_data(shuffle_train=False) is not supported: the engine reads every epoch in a "
                               "seeded permutation (one per task, epoch and seed), which exact resume relies on; "
                               "set a seed on the reader for a reproducible order"])
        if not os.path.isfile(input_file):
            raise ConfigError([f"load_data: {input_file}: no such file"])
        self._input_file = os.path.abspath(input_file)
        self._batch_size = batch_size
        self._num_epochs = num_epochs
        self._num_examples = self._count()

    @property
    def num_examples(self) -> int:
        """Examples of the loaded file (MRC: its windows, PALM's `features`)."""
        if self._num_examples is None:
            raise RuntimeError("num_examples: call load_data(...) first")
        return self._num_examples

    @property
    def num_epochs(self):
        return self._num_epochs

    @property
    def batch_size(self) -> Optional[int]:
        return self._batch_size

    @property
    def input_file(self) -> Optional[str]:
        return self._input_file

    @property
    def vocab_path(self) -> str:
        return self._vocab_path

    @property
    def seed(self):
        return self._seed

    @property
    def max_len(self) -> int:
        return self._max_len

    # -- the engine's view --------------------------------------------------------------------------
    def engine_type(self) -> str:
        """The engine's task type this reader's file is read by."""
        return self.task_type

    def options(self) -> Dict[str, Any]:
        """The engine task type's options this reader sets."""
        return dict(self._options)

    def task_keys(self) -> Dict[str, Any]:
        """The task keys of the engine's task (inline under `tasks:`) this reader gives."""
        if self._input_file is None:
            raise RuntimeError(f"{type(self).__name__}: call load_data(...) before the trainer uses this reader")
        keys = {"reader": self.engine_type(), "max_seq_len": self._max_len, "batch_size": self._batch_size,
                "do_lower_case": self._do_lower_case, "for_cn": self._for_cn}
        keys["train_file" if self._phase == "train" else "pred_file"] = self._input_file
        keys.update(self.options())
        return keys

    def _count(self) -> int:
        from ernie_mtl.config import TaskSpec
        from ernie_mtl.tasks.base import TaskContext, get_task_type

        cls = get_task_type(self.engine_type())
        options = {k: o.default for k, o in cls.options.items()}
        options.update(self._counting_options())
        options.update(self.options())
        split = "train" if self._phase == "train" else "pred"
        spec = TaskSpec(name="palm_reader", reader=self.engine_type(), index=0, max_seq_len=self._max_len,
                        batch_size=self._batch_size, do_lower_case=self._do_lower_case, for_cn=self._for_cn,
                        options=options, **{f"{split}_file": self._input_file})
        task = cls(spec, TaskContext(vocab_file=self._vocab_path, seed=0, log=lambda message: None))
        data = task.load(split)
        return task.num_train_examples(data) if split == "train" else len(data)

    def _counting_options(self) -> Dict[str, Any]:
        return {}


_BACKBONE_ATTRS = {"token_ids": [[-1, -1], "int64"], "position_ids": [[-1, -1], "int64"],
                   "segment_ids": [[-1, -1], "int64"], "input_mask": [[-1, -1, 1], "float32"],
                   "task_ids": [[-1, -1], "int64"]}


def _header(path: str):
    with open(path, encoding="utf-8-sig") as f:
        return f.readline().rstrip("\r\n").split("\t")


class ClassifyReader(Reader):
    """Sentence (or sentence-pair) classification: TSV `label<TAB>text_a[<TAB>text_b]`, integer labels.
    A file with a `text_b` column is read as pairs (the engine's `match` task type, pointwise)."""

    task_type = "cls"
    default_attrs = {"label_ids": [[-1], "int64"]}

    def __init__(self, vocab_path, max_len, tokenizer="wordpiece", lang="en", seed=None, do_lower_case=False,
                 phase="train"):
        super().__init__(vocab_path, max_len, tokenizer, lang, seed, do_lower_case, phase)

    def engine_type(self) -> str:
        if self._input_file is not None and "text_b" in _header(self._input_file):
            return "match"
        return "cls"

    def _counting_options(self) -> Dict[str, Any]:
        return {"n_classes": _COUNTING_CLASSES}


class MatchReader(Reader):
    """Sentence-pair matching: pointwise TSV `text_a<TAB>text_b<TAB>label`, or pairwise training rows
    `text_a<TAB>text_b<TAB>text_b_neg`."""

    task_type = "match"
    default_attrs = {"label_ids": [[-1], "int64"]}

    def __init__(self, vocab_path, max_len, tokenizer="wordpiece", lang="en", seed=None, do_lower_case=False,
                 learning_strategy="pointwise", phase="train", dev_count=1, print_prefix=""):
        if learning_strategy not in ("pointwise", "pairwise"):
            raise ValueError(f"learning_strategy {learning_strategy!r}: 'pointwise' or 'pairwise'")
        super().__init__(vocab_path, max_len, tokenizer, lang, seed, do_lower_case, phase,
                         learning_strategy=learning_strategy)
        if learning_strategy == "pairwise" and phase == "train":
            self.default_attrs = {f"{k}_neg": v for k, v in _BACKBONE_ATTRS.items()}
            self._register = set(self.default_attrs)

    def _counting_options(self) -> Dict[str, Any]:
        return {"n_classes": 2 if self._options["learning_strategy"] == "pairwise" else _COUNTING_CLASSES}


class SequenceLabelReader(Reader):
    """Sequence labeling: TSV `text_a<TAB>label`, tokens and their tags each joined by `\\x02`;
    `label_map_config` is the JSON {tag: id}."""

    task_type = "seq_label"
    default_attrs = {"label_ids": [[-1, -1], "int64"], "seq_lens": [[-1], "int64"]}

    def __init__(self, vocab_path, max_len, label_map_config, tokenizer="wordpiece", lang="en", seed=None,
                 do_lower_case=False, phase="train", dev_count=1, print_prefix=""):
        if not os.path.isfile(label_map_config):
            raise ConfigError([f"label_map_config {label_map_config}: no such file (a JSON {{tag: id}})"])
        super().__init__(vocab_path, max_len, tokenizer, lang, seed, do_lower_case, phase,
                         label_map=os.path.abspath(label_map_config))
        if phase != "train":
            self._register = {"seq_lens"}

    @property
    def label_map_path(self) -> str:
        return self._options["label_map"]


class MRCReader(Reader):
    """Extractive reading comprehension: SQuAD-style JSON; a question's context is cut into windows of
    `max_len` tokens `doc_stride` apart, the question kept to `max_query_len` tokens."""

    task_type = "mrc"
    default_attrs = {"start_positions": [[-1], "int64"], "end_positions": [[-1], "int64"]}

    def __init__(self, vocab_path, max_len, max_query_len, doc_stride, tokenizer="wordpiece", lang="en", seed=None,
                 do_lower_case=False, remove_noanswer=True, phase="train"):
        super().__init__(vocab_path, max_len, tokenizer, lang, seed, do_lower_case, phase,
                         max_query_len=max_query_len, doc_stride=doc_stride, remove_noanswer=bool(remove_noanswer))
        if phase != "train":
            self._register = {"unique_ids"}

    def load_data(self, input_file, batch_size, num_epochs=None, file_format="json", shuffle_train=True):
        super().load_data(input_file, batch_size, num_epochs, file_format, shuffle_train)


class MaskLMReader(Reader):
    """Masked language modelling: TSV with a `text_a` column; masked anew every epoch."""

    task_type = "mlm"
    default_attrs = {"mask_label": [[-1], "int64"], "mask_pos": [[-1], "int64"]}

    def __init__(self, vocab_path, max_len, tokenizer="wordpiece", lang="en", seed=None, do_lower_case=False,
                 phase="train", dev_count=1, print_prefix=""):
        super().__init__(vocab_path, max_len, tokenizer, lang, seed, do_lower_case, phase)

    def load_data(self, input_file, batch_size, num_epochs=None, file_format="csv", shuffle_train=True):
        super().load_data(input_file, batch_size, num_epochs, file_format, shuffle_train)


__all__ = ["Reader", "ClassifyReader", "MatchReader", "SequenceLabelReader", "MRCReader", "MaskLMReader"]
