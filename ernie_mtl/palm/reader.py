"""PaddlePALM's readers (`palm.reader.*`) and PALM's contract for writing one (`palm.reader.Reader`).

A built-in reader keeps PALM's constructor and `load_data(input_file, batch_size, num_epochs,
file_format, shuffle_train)`; it becomes the task keys of one task (`reader`, `train_file` or
`pred_file`, `batch_size`, `max_seq_len`, `do_lower_case`, `for_cn`, `shuffle`, its own options) and the
run's vocabulary and seed. `load_data` reads the file at once, as PALM did, so `num_examples` is right
after it and a bad row is reported there, by the engine's own reader (file:line). The files are PALM's:
TSV with a header (`label`/`text_a`/`text_b`, any column order), sequence labels joined by `\\x02`,
SQuAD-style MRC JSON, a `text_a` TSV for masked LM. Batches are made by the engine
(ernie_mtl/engine/step_feeds.py) when the trainer runs: every example once per epoch in a seeded order (the
file's order with `shuffle_train=False`), the last batch included. `_iterator()` yields the file's
batches in order as PALM's dicts (prediction; `Trainer.fit_reader` gives the training batches).

A user's reader subclasses `Reader` as in PALM: `__init__(..., phase)` calls `Reader.__init__(self,
phase)`, `load_data(...)` sets `self._batch_size` and `self._num_epochs`, `outputs_attr` describes the
fields, `_iterator()` yields one dict of numpy arrays per batch (`token_ids`, `segment_ids`,
`input_mask` [B, L, 1] and what the head reads), `num_examples` counts the rows of one pass. The engine
trains on those batches in the order `_iterator()` yields them (ernie_mtl/palm/adaptor.py).
"""
from __future__ import annotations

import copy
import functools
import os
from typing import Any, Dict, Optional

from ernie_mtl.config import ConfigError
from ernie_mtl.palm.batches import palm_view

_LANGS = {"en": False, "english": False, "cn": True, "chinese": True}
_COUNTING_CLASSES = 2 ** 31 - 1  # n_classes while only counting examples (the head sets the real one)


class Reader:
    """PALM's `Reader` base: phase, batch size, epochs and the fields registered for a backbone. A user's
    reader implements `load_data`, `outputs_attr`, `_iterator` and `num_examples` (and
    `get_epoch_outputs` when its head's `epoch_postprocess` reads them)."""

    def __init__(self, phase: str = "train"):
        if phase not in ("train", "predict"):
            raise ValueError(f"phase {phase!r}: a reader's phase is 'train' or 'predict'")
        self._phase = phase
        self._batch_size: Optional[int] = None
        self._num_epochs = None
        self._register: set = set()
        self._registered_backbone = None

    def __init_subclass__(cls, **kwargs):
        """A reader's own `load_data` also records its input file (the run's training data) and, if the
        reader did not, its batch size and epochs (PALM's contract asks load_data to set them)."""
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("load_data")
        if own is None or getattr(own, "_records_input", False):
            return

        @functools.wraps(own)
        def load_data(self, input_file, *args, **kwargs):
            result = own(self, input_file, *args, **kwargs)
            if isinstance(input_file, (str, os.PathLike)):
                self.__dict__["_input_file"] = os.path.abspath(input_file)
            given = dict(zip(("batch_size", "num_epochs"), args), **kwargs)
            if self.__dict__.get("_batch_size") is None and "batch_size" in given:
                self.__dict__["_batch_size"] = given["batch_size"]
            if "_num_epochs" not in self.__dict__ and "num_epochs" in given:
                self.__dict__["_num_epochs"] = given["num_epochs"]
            return result

        load_data._records_input = True
        cls.load_data = load_data

    @classmethod
    def create_register(cls):
        return set()

    @property
    def phase(self) -> str:
        return self.__dict__.get("_phase", "train")

    def clone(self, phase: str = "train") -> "Reader":
        """A copy of this reader, in `phase`."""
        other = copy.copy(self)
        other._phase = phase
        return other

    def require_attr(self, attr_name: str) -> None:
        self.__dict__.setdefault("_register", set()).add(attr_name)

    def register_with(self, backbone) -> None:
        """Register the fields the backbone reads (PALM's check that reader and backbone fit)."""
        for attr in backbone.inputs_attr:
            self.require_attr(attr)
        self._registered_backbone = backbone

    def get_registered_backbone(self):
        return self.__dict__.get("_registered_backbone")

    def _get_registed_attrs(self, attrs: Dict[str, Any]) -> Dict[str, Any]:
        """PALM's helper for `outputs_attr`: the registered fields of `attrs`."""
        out = {}
        for name in self.__dict__.get("_register", set()):
            if name not in attrs:
                raise NotImplementedError(f"output attr {name} is not found in this reader.")
            out[name] = attrs[name]
        return out

    def load_data(self, input_file, batch_size, num_epochs=None, file_format="tsv", shuffle_train=True):
        """Read `input_file`; set `self._batch_size` and `self._num_epochs`."""
        raise NotImplementedError(f"{type(self).__name__}.load_data(input_file, batch_size, num_epochs, file_format, "
                                  "shuffle_train) is not implemented")

    @property
    def outputs_attr(self) -> Dict[str, Any]:
        """{field: [shape, dtype]} of the dicts `_iterator()` yields."""
        raise NotImplementedError(f"{type(self).__name__}.outputs_attr is not implemented")

    def _iterator(self):
        """One dict of numpy arrays per batch (PALM: restarting at the end is allowed)."""
        raise NotImplementedError(f"{type(self).__name__}._iterator() is not implemented")

    def get_epoch_outputs(self):
        """What `epoch_postprocess` gets as post_inputs['reader'] (examples, features, ...)."""
        raise NotImplementedError(f"{type(self).__name__}.get_epoch_outputs() is not implemented")

    @property
    def num_examples(self) -> int:
        """Rows of one pass over the data."""
        raise NotImplementedError(f"{type(self).__name__}.num_examples is not implemented")

    @property
    def num_epochs(self):
        return self.__dict__.get("_num_epochs")

    @property
    def batch_size(self) -> Optional[int]:
        return self.__dict__.get("_batch_size")


def is_builtin_reader(reader) -> bool:
    """Whether the engine's own task type reads `reader`'s file (a built-in reader, also subclassed,
    unless the subclass yields its own batches: it overrides `_iterator`)."""
    return isinstance(reader, _EngineReader) and type(reader)._iterator is _EngineReader._iterator


class _EngineReader(Reader):
    """A reader whose file the engine's task type reads (the built-in readers)."""

    task_type = ""  # the engine's task type (`reader:` key)
    default_attrs: Dict[str, Any] = {}  # PALM's registered outputs besides the backbone's (train phase)

    def __init__(self, vocab_path, max_len, tokenizer="wordpiece", lang="en", seed=None, do_lower_case=False,
                 phase="train", **options):
        super().__init__(phase)
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
        self._options = dict(options)  # the engine task type's own keys
        self._input_file: Optional[str] = None
        self._num_examples: Optional[int] = None
        self._shuffle = True
        self._loaded = None  # (task type instance, TaskData) of the file read by load_data
        self._register = set(self.default_attrs) if phase == "train" else set()

    # -- PALM's interface ---------------------------------------------------------------------------
    def clone(self, phase: str = "train") -> "Reader":
        other = super().clone(phase)
        other._register = set(self.default_attrs) if phase == "train" else set()
        return other

    @property
    def outputs_attr(self) -> Dict[str, Any]:
        """The batch keys this reader yields for its registered backbone (PALM's names)."""
        known = {**_BACKBONE_ATTRS, **self.default_attrs}
        return {k: known.get(k) for k in sorted(self._register)}

    def load_data(self, input_file, batch_size, num_epochs=None, file_format="tsv", shuffle_train=True):
        """Read `input_file` (eagerly, as PALM did: `num_examples` is known at once, a bad row is an
        error now); `num_epochs` None means "as the trainer decides" (one epoch for a single trainer, the
        mix-ratio quota in a MultiHeadTrainer); `shuffle_train=False` reads the training examples in the
        file's order every epoch."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size {batch_size!r}: examples per batch, an integer >= 1")
        if num_epochs is not None and not (isinstance(num_epochs, (int, float)) and num_epochs > 0):
            raise ValueError(f"num_epochs {num_epochs!r}: a number > 0, or None")
        if not os.path.isfile(input_file):
            raise ConfigError([f"load_data: {input_file}: no such file"])
        self._input_file = os.path.abspath(input_file)
        self._batch_size = batch_size
        self._num_epochs = num_epochs
        self._shuffle = bool(shuffle_train)
        self._num_examples = self._count()

    def _iterator(self):
        """The file's batches in order, as PALM's dicts (numpy arrays; the engine's collated batch is
        their `collated` attribute)."""
        task, data = self._require_loaded()
        size = self._batch_size
        for start in range(0, len(data), size):
            batch = task.collate([data.get(i) for i in range(start, min(start + size, len(data)))])
            yield palm_view(batch, [f.name for f in task.label_feeds()], prefix="")

    def get_epoch_outputs(self):
        """PALM's: the file's examples (its rows as {column: value}, or the engine's examples where it keeps
        them: MRC's questions) and features (the engine's featurization), in file order."""
        _, data = self._require_loaded()
        examples = data.examples
        if examples is None:
            from ernie_mtl.tasks.base import text_lines

            lines = text_lines(self._input_file)
            _, header = next(lines, (1, ""))
            columns = header.split("\t")
            examples = [dict(zip(columns, line.split("\t"))) for _, line in lines if line.strip()]
        return {"examples": examples, "features": data.features}

    @property
    def num_examples(self) -> int:
        """Examples of the loaded file (MRC: its windows, PALM's `features`)."""
        if self._num_examples is None:
            raise RuntimeError("num_examples: call load_data(...) first")
        return self._num_examples

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

    @property
    def shuffle(self) -> bool:
        return self._shuffle

    # -- the engine's view --------------------------------------------------------------------------
    def engine_type(self) -> str:
        """The engine's task type this reader's file is read by."""
        return self.task_type

    def options(self) -> Dict[str, Any]:
        """The engine task type's options this reader sets."""
        return dict(self._options)

    def counting_options(self) -> Dict[str, Any]:
        """Options the task type needs to read the file when no head says them (class counts)."""
        return self._counting_options()

    def task_keys(self) -> Dict[str, Any]:
        """The task keys of the engine's task (inline under `tasks:`) this reader gives."""
        if self._input_file is None:
            raise RuntimeError(f"{type(self).__name__}: call load_data(...) before the trainer uses this reader")
        keys = {"reader": self.engine_type(), "max_seq_len": self._max_len, "batch_size": self._batch_size,
                "do_lower_case": self._do_lower_case, "for_cn": self._for_cn}
        keys["train_file" if self._phase == "train" else "pred_file"] = self._input_file
        if not self._shuffle and self._phase == "train":
            keys["shuffle"] = False
        keys.update(self.options())
        return keys

    def _require_loaded(self):
        if self._loaded is None:
            raise RuntimeError(f"{type(self).__name__}: call load_data(...) first")
        return self._loaded

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
        self._loaded = (task, data)
        return task.num_train_examples(data) if split == "train" else len(data)

    def _counting_options(self) -> Dict[str, Any]:
        return {}


_BACKBONE_ATTRS = {"token_ids": [[-1, -1], "int64"], "position_ids": [[-1, -1], "int64"],
                   "segment_ids": [[-1, -1], "int64"], "input_mask": [[-1, -1, 1], "float32"],
                   "task_ids": [[-1, -1], "int64"]}


def _header(path: str):
    with open(path, encoding="utf-8-sig") as f:
        return f.readline().rstrip("\r\n").split("\t")


class ClassifyReader(_EngineReader):
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


class MatchReader(_EngineReader):
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


class SequenceLabelReader(_EngineReader):
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


class MRCReader(_EngineReader):
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


class MaskLMReader(_EngineReader):
    """Masked language modelling: TSV with a `text_a` column; masked anew every epoch."""

    task_type = "mlm"
    default_attrs = {"mask_label": [[-1], "int64"], "mask_pos": [[-1], "int64"]}

    def __init__(self, vocab_path, max_len, tokenizer="wordpiece", lang="en", seed=None, do_lower_case=False,
                 phase="train", dev_count=1, print_prefix=""):
        super().__init__(vocab_path, max_len, tokenizer, lang, seed, do_lower_case, phase)

    def load_data(self, input_file, batch_size, num_epochs=None, file_format="csv", shuffle_train=True):
        super().load_data(input_file, batch_size, num_epochs, file_format, shuffle_train)


__all__ = ["Reader", "ClassifyReader", "MatchReader", "SequenceLabelReader", "MRCReader", "MaskLMReader"]
