"""Task types: the contract between a task's reader, head and metric and the multi-task trainer.

A *task type* (the `reader` key of a task YAML: `cls`, `match`, `seq_label`, `mrc`, `mlm`,
`pretrain`, or a user's own) is a `TaskType` subclass registered by name. The trainer makes one
instance per task (`TaskType(spec, ctx)`) and uses it in three places:

data     `load(split)` -> `TaskData` (features in file order, plus whatever decoding needs);
         `collate(features)` -> one micro-batch as numpy arrays: the shared backbone inputs
         (`BACKBONE_FEEDS`) plus this task's label feeds (`label_feeds()`, un-prefixed names);
         `dummy_labels(batch, seq)` -> finite placeholder labels for micro-batches of *other*
         tasks (every head runs on every micro-batch; its loss is then multiplied by 0).
model    `create_head(enc)` -> a `paddle.nn.Layer` holding the head's parameters (called once per
         `task_reuse_tag` group: tasks of a group share this object, hence its parameters);
         `head_forward(head, enc, feeds)` -> `HeadOutputs(loss, predictions)` inside the static
         program being built. `loss` is a float32 scalar that is finite for dummy labels. The
         head's parameters are read from the Layer after the group's first `head_forward`, so a
         head may also create them there (the PALM face registers what a PALM head's `build` made).
eval     `evaluate(data, outputs)` -> `{metric: value}` with `main_metric` among the keys;
         `predictions(data, outputs)` -> JSON-serialisable records for `--do_predict`.
         `outputs` maps each name of `HeadOutputs.predictions` to one numpy array per batch,
         in the order of `data.features` (batches of `collate`, last one possibly smaller).

A user's task type lives in their own file: subclass `TaskType`, decorate it with
`@register_task_type("name")`, and list the file under `plugins:` in the global YAML.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Dict, List, Mapping, Optional, Sequence, Tuple, Type

import numpy as np

from ernie_mtl.config import ConfigError, TaskSpec, model_family
from ernie_mtl.tasks.feeds import FeedSpec

ATTENTION_PAD = -1e4
PAD_MULTIPLE = 8  # sequence lengths of a batch are padded to a multiple of 8 (tensor-core friendly)


@dataclass(frozen=True)
class Option:
    """A task-type-specific key of the task YAML (e.g. `n_classes`, `doc_stride`)."""

    default: Any
    help: str
    required: bool = False


def _no_barrier(*args, **kwargs) -> None:
    """The barrier of a TaskContext in a data-loading worker (never called there)."""


def _no_log(message: str) -> None:
    """The log of a TaskContext in a data-loading worker: workers say nothing."""


@dataclass
class TaskContext:
    """What a task type may use besides its spec."""

    vocab_file: str
    seed: int
    model_type: str = "ernie"  # "ernie" or "bert"
    rank: int = 0
    world_size: int = 1
    barrier: Callable[..., None] = lambda *args, **kwargs: None  # every rank calls it the same number of times
    log: Callable[[str], None] = print
    is_builder: bool = True  # builds index caches (global rank 0, or each node's local rank 0: --share_folder)
    cache_dir: Optional[str] = None  # index caches (--data_cache); None: index-cache/ beside each corpus
    extra: Dict[str, Any] = field(default_factory=dict)  # e.g. sample counts the pretrain task needs

    _tokenizer: Any = field(default=None, repr=False)

    def __getstate__(self):
        """Pickled with the task objects for data-loading worker processes (ernie_mtl/engine/data_workers.py).
        A worker builds batches from features made in the training process: it takes no part in the
        job's barriers, logs nothing, and gets the tokenizer's special token ids (`TokenizerFacts`,
        what `collate` asks for: pad_token_id) instead of the tokenizer, whose import would load
        paddlenlp and Paddle into every worker (seconds and hundreds of MiB each)."""
        state = dict(self.__dict__)
        state.update(barrier=_no_barrier, log=_no_log)
        if self._tokenizer is not None:
            key, tokenizer = self._tokenizer
            state["_tokenizer"] = (key, TokenizerFacts.of(tokenizer))
        return state

    def tokenizer(self, do_lower_case: bool = True):
        """paddlenlp's tokenizer of the model's vocab (ErnieTokenizer or BertTokenizer), cached. In a
        data-loading worker: the `TokenizerFacts` of the training process's tokenizer."""
        if self._tokenizer is not None and isinstance(self._tokenizer[1], TokenizerFacts):
            return self._tokenizer[1]  # special token ids do not depend on do_lower_case
        key = (self.model_type, do_lower_case)
        if self._tokenizer is None or self._tokenizer[0] != key:
            cls = model_family(self.model_type).classes()[3]
            self._tokenizer = (key, cls(vocab_file=self.vocab_file, do_lower_case=do_lower_case))
        return self._tokenizer[1]


class TokenizerFacts:
    """A tokenizer's special token ids and vocabulary size, without the tokenizer: what a task's
    `collate` may ask of `ctx.tokenizer()` in a data-loading worker. Tokenizing belongs in `load`,
    which runs in the training process."""

    FACTS = ("pad_token_id", "cls_token_id", "sep_token_id", "mask_token_id", "unk_token_id", "vocab_size")

    def __init__(self, **facts):
        self.__dict__.update(facts)

    @classmethod
    def of(cls, tokenizer) -> "TokenizerFacts":
        return cls(**{name: getattr(tokenizer, name, None) for name in cls.FACTS})

    def __getattr__(self, name):
        raise AttributeError(f"tokenizer.{name}: in a data-loading worker (--num_workers > 0) the tokenizer answers "
                             f"only {', '.join(self.FACTS)}; tokenize in the task type's load(), which runs in the "
                             "training process, or run with --num_workers 0")


@dataclass
class TaskData:
    """One split of one task: `features` are what `collate` takes (model inputs and labels, one per
    model example), `examples` whatever `evaluate`/`predictions` need to map features back to the
    file's rows (e.g. MRC contexts and ids). `features` may be any sequence (a lazily computed
    dataset for pretraining)."""

    split: str
    features: Sequence[Any]
    examples: Optional[Sequence[Any]] = None
    has_labels: bool = True
    # Optional per-epoch view: (feature, index, epoch) -> feature, e.g. dynamic masking that draws a
    # new mask every epoch, deterministically from (seed, index, epoch). None: features as they are.
    transform: Optional[Callable[[Any, int, int], Any]] = None

    def __len__(self) -> int:
        return len(self.features)

    def get(self, index: int, epoch: int = 0) -> Any:
        """Feature `index` as seen in `epoch` (the trainer's only way to read features)."""
        feature = self.features[index]
        return feature if self.transform is None else self.transform(feature, index, epoch)


@dataclass
class Encoded:
    """What the backbone hands to the heads while the program is built."""

    sequence_output: Any  # [batch, seq, hidden]
    pooled_output: Any  # [batch, hidden]
    backbone: Any  # the paddlenlp ErnieModel / BertModel (for tied embeddings)
    config: Any  # its paddlenlp config (hidden_size, vocab_size, hidden_act, ...)
    feeds: Mapping[str, Any]  # the shared BACKBONE_FEEDS variables


@dataclass
class HeadOutputs:
    """A head's contribution to the program: its loss and the variables prediction fetches."""

    loss: Any  # float32 scalar
    predictions: Dict[str, Any]  # name -> variable (exported to the inference model in this order)
    scalars: Dict[str, Any] = field(default_factory=dict)  # extra float32 scalars fetched for the training log


class TaskType(abc.ABC):
    """Base class of a task type; see the module docstring for the contract."""

    name: ClassVar[str] = ""
    options: ClassVar[Dict[str, Option]] = {}
    main_metric: ClassVar[str] = ""
    higher_is_better: ClassVar[bool] = True
    # False: evaluate only `eval_iters` batches of the dev split (a pretraining corpus's valid split
    # is far larger than a fine-tuning dev file)
    full_dev_eval: ClassVar[bool] = True
    # False: predictions need more than the backbone inputs (masked positions), so no inference model
    exportable: ClassVar[bool] = True
    # True: load("train") generates `ctx.extra["num_samples"]["train"]` samples when set (pretraining
    # corpora); the trainer sets it to what the planned run reads
    sized_by_run: ClassVar[bool] = False
    # False: read the training examples in their stored order every epoch (a corpus whose sample
    # index is already shuffled); True: a seeded permutation per epoch (ernie_mtl/schedule.TaskStream)
    shuffle_examples: ClassVar[bool] = True
    # "cls.": the head is PaddleNLP's pretraining head, whose weights a PaddleNLP model directory
    # (--model_name_or_path) holds under that prefix; they are loaded when present
    pretrained_head_prefix: ClassVar[Optional[str]] = None

    def __init__(self, spec: TaskSpec, ctx: TaskContext):
        self.spec = spec
        self.ctx = ctx

    # -- data ----------------------------------------------------------------------------------
    @abc.abstractmethod
    def load(self, split: str) -> TaskData:
        """Read and featurize `split` (train/dev/test/pred). Errors name the file and line."""

    @abc.abstractmethod
    def collate(self, features: Sequence[Any]) -> Dict[str, np.ndarray]:
        """One micro-batch: BACKBONE_FEEDS (see `pad_backbone_inputs`) + this task's label feeds."""

    @abc.abstractmethod
    def label_feeds(self) -> Tuple[FeedSpec, ...]:
        """This task's own inputs (labels, positions, lengths), un-prefixed."""

    @abc.abstractmethod
    def dummy_labels(self, batch_size: int, seq_len: int) -> Dict[str, np.ndarray]:
        """Placeholder values of `label_feeds()` for a micro-batch of another task: shapes that fit a
        [batch_size, seq_len] batch and give a finite loss."""

    def num_train_examples(self, data: TaskData) -> int:
        """Examples counted by epochs and sampling (default: features)."""
        return len(data.features)

    # -- model ---------------------------------------------------------------------------------
    @abc.abstractmethod
    def create_head(self, enc: Encoded) -> Any:
        """The head's parameters, as a paddle.nn.Layer (shared by a reuse group)."""

    @abc.abstractmethod
    def head_forward(self, head: Any, enc: Encoded, feeds: Mapping[str, Any]) -> HeadOutputs:
        """Loss and prediction variables for this task (`feeds`: its label feeds by un-prefixed name)."""

    def head_signature(self) -> Tuple[Any, ...]:
        """Tasks sharing a head must agree on this (type and output sizes)."""
        return (self.name,)

    def shared_encoder(self) -> Optional[Callable[[Mapping[str, Any]], Tuple["Encoded", Dict[str, str], List[str]]]]:
        """None (the default): the run's backbone is PaddleNLP's ERNIE/BERT. Otherwise a function that
        builds the shared encoder instead, from the program's feed variables, returning (Encoded, its
        parameters' name map structured -> static, recompute checkpoints): how the PALM face runs a
        user-defined backbone (ernie_mtl/palm/adaptor.py). Every task that supplies one supplies the same."""
        return None

    # -- evaluation and prediction -------------------------------------------------------------
    @abc.abstractmethod
    def evaluate(self, data: TaskData, outputs: Mapping[str, List[np.ndarray]]) -> Dict[str, float]:
        """Metrics of a labelled split; must contain `main_metric`."""

    @abc.abstractmethod
    def predictions(self, data: TaskData, outputs: Mapping[str, List[np.ndarray]]) -> Any:
        """Records for `--do_predict` (a list of dicts; a dict keyed by id for MRC)."""

    def example_source(self, index: int) -> str:
        """Where training example `index` comes from, for an error raised while building a batch
        (default: its position among the features read from `train_file`)."""
        return f"example {index} of {self.spec.train_file}"

    def describe_data(self) -> List[str]:
        """Lines for the start-of-run log about the training data (e.g. a corpus mixture's plan)."""
        return []

    def data_scalars(self, consumed: int) -> Dict[str, float]:
        """Scalars for VisualDL after `consumed` training examples were read (e.g. samples per corpus)."""
        return {}

    def train_sources(self) -> Optional[List[Tuple[str, int, int]]]:
        """(source name, samples planned, samples per epoch) of each source of the training data, for
        a task that generates exactly the samples the run reads (`sized_by_run`: per corpus of a
        mixture, whose small corpora may repeat far more often than the task as a whole). None (the
        default): the plan's warnings use the task's examples and the schedule's epochs."""
        return None

    def manifest(self) -> Dict[str, Any]:
        """Extra facts for the exported model's manifest (label map, ...)."""
        return {}


_REGISTRY: Dict[str, Type[TaskType]] = {}


def register_task_type(name: str) -> Callable[[Type[TaskType]], Type[TaskType]]:
    """Class decorator: make a TaskType usable as `reader: <name>` in task YAMLs."""

    def wrap(cls: Type[TaskType]) -> Type[TaskType]:
        if not (isinstance(cls, type) and issubclass(cls, TaskType)):
            raise TypeError(f"@register_task_type({name!r}) decorates {cls!r}, which is not a TaskType subclass")
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"task type {name!r} is already registered by {_REGISTRY[name].__module__}."
                             f"{_REGISTRY[name].__qualname__}; choose another name")
        if not cls.main_metric:
            raise TypeError(f"task type {name!r} ({cls.__qualname__}) must set main_metric")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return wrap


def get_task_type(name: str) -> Type[TaskType]:
    """The registered class of `reader: name` (built-ins are imported on first use)."""
    import ernie_mtl.tasks  # noqa: F401  (registers the built-in types)

    if name not in _REGISTRY:
        if name == "palm":  # ernie_mtl/palm/adaptor.py registers it in the process of a PaddlePALM script
            raise ConfigError(["reader 'palm': this model's task runs a PaddlePALM script's own head, reader or "
                               "backbone (Python objects of that script); predict or evaluate it from the script "
                               "with ernie_mtl.palm (Trainer.build_predict_forward, load_ckpt or load_predict_model, "
                               "predict)"])
        raise ConfigError([f"unknown reader {name!r}; known task types: {sorted(_REGISTRY)} (a custom type is "
                           "registered with @register_task_type in a file listed under `plugins:`)"])
    return _REGISTRY[name]


def registered_task_types() -> Dict[str, Type[TaskType]]:
    import ernie_mtl.tasks  # noqa: F401

    return dict(_REGISTRY)


# -- helpers shared by the built-in readers ------------------------------------------------------------
def padded_length(lengths: Sequence[int], multiple: int = PAD_MULTIPLE) -> int:
    """Batch sequence length: the longest sample rounded up to `multiple`."""
    longest = max(lengths) if len(lengths) else 1
    return -(-longest // multiple) * multiple


def pad_backbone_inputs(input_ids: Sequence[Sequence[int]], segment_ids: Sequence[Sequence[int]], *,
                        pad_id: int, seq_len: Optional[int] = None) -> Dict[str, np.ndarray]:
    """BACKBONE_FEEDS for a batch of token-id lists: right-padded ids and segments, additive mask."""
    seq_len = seq_len or padded_length([len(x) for x in input_ids])
    batch = len(input_ids)
    ids = np.full((batch, seq_len), pad_id, dtype=np.int64)
    seg = np.zeros((batch, seq_len), dtype=np.int64)
    mask = np.full((batch, 1, 1, seq_len), ATTENTION_PAD, dtype=np.float32)
    for i, (tokens, segments) in enumerate(zip(input_ids, segment_ids)):
        n = len(tokens)
        ids[i, :n] = tokens
        seg[i, :n] = segments
        mask[i, 0, 0, :n] = 0.0
    return {"input_ids": ids, "segment_ids": seg, "input_mask": mask}


def read_label_map(path: str, task: str, *, item: str, id_word: str, example: str) -> Dict[str, int]:
    """A label map file: a JSON object {label: id} with distinct ids 0..n-1 (errors name the task,
    file and line; `item`/`id_word`/`example` word them for the task type: "tag", "id", '{"B": 0}')."""
    import json

    try:
        with open(path, "rb"):
            pass
    except OSError as e:
        raise ConfigError([f"task {task!r}: label_map {path}: cannot read it ({e.strerror}); give the path of a "
                           f"JSON file {{{item}: id}}"]) from None
    text = "\n".join(line for _, line in text_lines(path))
    try:
        mapping = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError([f"{path}:{e.lineno}: label_map is not valid JSON ({e.msg}); write an object like "
                           f"{example}"]) from None
    if (not isinstance(mapping, dict) or not mapping
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in mapping.values())
            or sorted(mapping.values()) != list(range(len(mapping)))):
        raise ConfigError([f"{path}: label_map must be a JSON object mapping each {item} to a distinct {id_word} "
                           f"0..n-1, got {json.dumps(mapping, ensure_ascii=False)[:200]}; write e.g. {example}"])
    return mapping


def text_lines(path: str):
    """(line number, line without its newline) of a UTF-8 text file; a UTF-8 byte-order mark at the
    start is accepted. ConfigError naming the file and line for undecodable bytes, and the file for
    read errors."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise ConfigError([f"{path}: cannot read it ({e.strerror})"]) from None
    with f:
        for number, raw in enumerate(f, start=1):
            if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ConfigError([f"{path}:{number}: not UTF-8 text (byte {e.start + 1} of the line, "
                                   f"{raw[e.start:e.start + 4]!r}); save the file as UTF-8"]) from None
            yield number, line.rstrip("\r\n")


def read_json_file(path: str, what: str, example: str):
    """A UTF-8 JSON document (a BOM accepted); ConfigError naming the file, line and column."""
    import json

    text = "\n".join(line for _, line in text_lines(path))
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError([f"{path}:{e.lineno}:{e.colno}: not valid JSON ({e.msg}); {what} is {example}"]) from None


def read_tsv(path: str, required_columns: Sequence[str], *, optional_columns: Sequence[str] = (),
             other_columns: str = "refuse") -> List[Tuple[int, Dict[str, str]]]:
    """Rows of a PALM-style TSV file with a header row: [(line number, {column: value})].

    The header names the columns (e.g. `label<TAB>text_a`); `required_columns` must all be there
    (a pred file may lack `label`: pass it in `optional_columns`). A row with another number of
    fields than the header is reported as `path:line`; so are bytes that are not UTF-8. A UTF-8
    byte-order mark before the header is accepted. `other_columns="ignore"` accepts columns beyond
    the required and optional ones (their values are read and left unused).
    """
    rows: List[Tuple[int, Dict[str, str]]] = []
    lines = text_lines(path)
    _, header_line = next(lines, (1, None))
    header = (header_line or "").split("\t")
    missing = [c for c in required_columns if c not in header]
    allowed = set(required_columns) | set(optional_columns)
    if header_line is None or missing:
        raise ConfigError([f"{path}:1: the header row must name the columns {list(required_columns)} "
                           f"(tab-separated), found {header!r}; add a first line like "
                           f"'{'<TAB>'.join(required_columns)}'"])
    unknown = [c for c in header if c not in allowed]
    if unknown and other_columns != "ignore":
        raise ConfigError([f"{path}:1: unknown column(s) {unknown} in the header; expected "
                           f"{list(required_columns) + list(optional_columns)}"])
    for number, line in lines:
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != len(header):
            raise ConfigError([f"{path}:{number}: {len(fields)} tab-separated fields but the header has "
                               f"{len(header)} ({'<TAB>'.join(header)})"])
        rows.append((number, dict(zip(header, fields))))
    return rows


def remove_variable(name: str, programs) -> None:
    """Remove variable `name` and the ops that write it from the global blocks of `programs`: a program
    edit task types may make on the programs they help build (e.g. the tied MLM decoder's orphan)."""
    for program in programs:
        block = program.global_block()
        for idx in reversed(range(len(block.ops))):
            if name in block.ops[idx].output_arg_names:
                block._remove_op(idx, sync=False)
        if block.has_var(name):
            block._remove_var(name, sync=False)
        block._sync_with_cpp()
