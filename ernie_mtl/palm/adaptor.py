"""PALM's extension points on the engine: a user's head (its `build`), reader (its `_iterator`) and
backbone (its `build`) as the engine task type `palm`, which implements the task-type contract of
ernie_mtl/tasks/base.py around them. The engine then builds them into its own programs (training,
evaluation, export, prediction) with everything a run has: the gated multi-task loss, data
parallelism, sharding, accumulation, AMP, idle-head freezing, checkpoints and exact resume.

Binding. A task YAML cannot hold Python objects, so a `palm` task names a `Binding` of this process
(`binding: <key>`, the trainer's task name): the head of each phase, the readers, a user-defined
backbone, and the engine task type that reads a built-in reader's file or implements a built-in
head (`inner`). `components` records their classes in the configuration (checkpoints compare it on
resume). A `palm` task exists only in the process of the script that bound it.

A head's graph. `head_forward` calls the head's `build(inputs, scope_name)` under
`unique_name.guard(scope)` with `scope` = `<group>.` (the task's head group, its own name unless it
reuses another trainer's head), as PALM's trainer did, so parameter names are the same in every
program and phase: the train-phase head gives the loss, the predict-phase head (when known) the
prediction variables, both sharing parameters by name as in PALM. The parameters the builds created
are found by comparing the program's parameters before and after, and registered as
`heads.<group>.<name without the scope>` in the run's name map (so checkpoints hold them under
structured names); PALM's weight-decay rule by name (`layer_norm`, `_bias`, `_b`, `.b_0`) decides
which get no decay.

`inputs`. `inputs['backbone']`: what the backbone outputs (ERNIE/BERT: `encoder_outputs`,
`sentence_embedding`, `sentence_pair_embedding` = the pooled [CLS], `embedding_table` = the word
embedding parameter, `word_embedding` = the embedding layer's output, built on first use);
`inputs['reader']`: `token_ids`, `position_ids`, `segment_ids`, `input_mask` [B, L, 1], `task_ids`,
`seq_lens` (all computed from the backbone feeds), and the task's own fields: a built-in reader's
labels under PALM's names (`label_ids`, `start_positions`, `mask_pos`, ...), a user's reader's fields
as its head declares them in `inputs_attrs['reader']`.

A user's reader. Its `_iterator()` batches are the training data in the order it yields them (one
reader batch per micro-batch; a pass that ends starts a new one), read by stream position, so a run
resumes where it stopped when the reader yields the same batches on every pass from a fresh
`_iterator()` (`check_deterministic`; otherwise resume is refused with the reason). It runs in the
training process (`--num_workers 0`).

A user's backbone. `shared_encoder` builds it once per program in place of ERNIE/BERT, from the
backbone feeds (its `inputs_attr` may name PALM's fields above); its parameters are `backbone.<name>`.
Pretrained ERNIE/BERT weights, recompute, MaskLM's tied embedding and the converter to PaddleNLP do
not apply to it (refused with the reason).
"""
from __future__ import annotations

import dataclasses
import json
import weakref
from collections.abc import Mapping as MappingABC
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ernie_mtl.config import ConfigError
from ernie_mtl.palm.backbone import runs_own_build as backbone_builds
from ernie_mtl.palm.head import runs_own_build as head_builds
from ernie_mtl.palm.batches import PALM_FIELDS, ReaderBatch, palm_view  # noqa: F401  (re-exported)
from ernie_mtl.palm.reader import is_builtin_reader
from ernie_mtl.tasks.base import (ATTENTION_PAD, Encoded, HeadOutputs, Option, TaskData, TaskType, get_task_type,
                                  register_task_type)
from ernie_mtl.tasks.feeds import BACKBONE_FEEDS, TASK_TYPE_IDS, FeedSpec

TYPE = "palm"
# reader fields every head can read: computed in the program from the backbone feeds
DERIVED = ("token_ids", "position_ids", "segment_ids", "input_mask", "task_ids", "seq_lens")
BACKBONE_INPUTS = DERIVED[:5]  # what a user-defined backbone may read
# built-in heads a user's reader can feed (its `label_ids` is the engine's `label`)
READER_HEADS = {"Classify": "cls", "Match": "match"}


def palm_decay_exempt(name: str) -> bool:
    """PALM's weight-decay exclusion by parameter name (paddlepalm/trainer.py build_backward)."""
    return "layer_norm" in name or name.endswith(("_bias", "_b", ".b_0"))


# -- bindings -----------------------------------------------------------------------------------------
@dataclass
class Binding:
    """The Python objects of one `palm` task (module docstring)."""

    task: str
    head: Any = None  # train-phase head; None: a prediction program
    pred_head: Any = None  # built into the programs when given
    reader: Any = None  # the training reader
    pred_reader: Any = None
    backbone: Any = None  # a user-defined backbone; None: the engine's ERNIE/BERT
    inner: Optional[str] = None  # engine task type of a built-in reader (data) or built-in head (model)
    inner_options: Dict[str, Any] = field(default_factory=dict)
    scope: Optional[str] = None  # the heads' scope_name; None: the task's head group + "."

    @property
    def model_head(self):
        return self.head if self.head is not None else self.pred_head

    @property
    def custom_head(self) -> bool:
        head = self.model_head
        return head is not None and head_builds(head)

    @property
    def data_reader(self):
        return self.reader if self.reader is not None else self.pred_reader

    @property
    def builtin_reader(self) -> bool:
        reader = self.data_reader
        return reader is None or is_builtin_reader(reader)

    def components(self) -> str:
        """The classes (and built-in options) this task runs: recorded in the configuration."""
        def name(obj):
            return None if obj is None else f"{type(obj).__module__}.{type(obj).__qualname__}"

        return json.dumps({"head": name(self.head), "pred_head": name(self.pred_head), "reader": name(self.reader),
                           "backbone": name(self.backbone), "inner": self.inner,
                           "inner_options": {k: v for k, v in sorted(self.inner_options.items())}},
                          sort_keys=True, default=str)


BINDINGS: Dict[str, Binding] = {}


def bind(key: str, binding: Binding) -> str:
    """Make `binding` the one of `key` in this process (the latest trainer of a task name wins)."""
    BINDINGS[key] = binding
    return key


def needs_adaptor(head, reader, backbone) -> bool:
    """Whether a trainer's task runs through the `palm` task type: a user's head, reader or backbone."""
    return ((head is not None and head_builds(head)) or (reader is not None and not is_builtin_reader(reader))
            or (backbone is not None and backbone_builds(backbone)))


# -- the task type ------------------------------------------------------------------------------------
@register_task_type(TYPE)
class PalmTask(TaskType):
    """A PALM trainer's task whose head, reader or backbone is the user's (module docstring)."""

    options = {
        "binding": Option(None, "the PALM script's objects of this task (a key of this process: the trainer's task "
                                "name); only a PALM script can run a palm task", required=True),
        "components": Option("", "the classes of the task's head, reader and backbone (recorded for resume)"),
    }
    main_metric = "loss"

    def __init__(self, spec, ctx):
        super().__init__(spec, ctx)
        key = spec.options.get("binding")
        b = BINDINGS.get(key)
        if b is None:
            what = spec.options.get("components") or "Python objects"
            raise ConfigError([f"task {spec.name}: reader 'palm' runs a PaddlePALM script's own head, reader or "
                               f"backbone ({what}), which exist only in the process of that script: predict or "
                               "evaluate it from the script (palm's Trainer: "
                               "build_predict_forward, load_ckpt, fit_reader(..., phase='predict'), predict)"])
        self.binding = b
        self.inner: Optional[TaskType] = None
        if b.inner:
            cls = get_task_type(b.inner)
            options = {k: o.default for k, o in cls.options.items()}
            options.update(b.inner_options)
            self.inner = cls(dataclasses.replace(spec, reader=b.inner, options=options), ctx)
        self.data_inner = b.builtin_reader and self.inner is not None
        self.shuffle_examples = self.inner.shuffle_examples if self.data_inner else False
        self.full_dev_eval = self.inner.full_dev_eval if self.data_inner else True
        self.exportable = (self.inner.exportable if not b.custom_head and self.inner is not None else
                           b.pred_head is not None and set(_reader_fields(b.pred_head)) <= set(DERIVED))
        self._streams: Dict[str, "BatchStream"] = {}
        if b.custom_head and not self.exportable:
            self.unexportable_reason = (
                "no predict-phase head was given before training: build_predict_forward(backbone, head) before "
                "train() exports one; predict from a checkpoint meanwhile" if b.pred_head is None else
                f"its predict-phase head reads reader fields {sorted(set(_reader_fields(b.pred_head)) - set(DERIVED))} "
                "besides the backbone inputs")

    def __getstate__(self):
        """Pickled for data-loading workers (only with a built-in reader): the script's objects stay here."""
        if not self.data_inner:
            raise RuntimeError(f"task {self.spec.name}: a user-defined reader runs in the training process "
                               "(--num_workers 0)")
        state = dict(self.__dict__)
        state["binding"] = dataclasses.replace(self.binding, head=None, pred_head=None, reader=None, pred_reader=None,
                                         backbone=None)
        state["_label_specs"] = self.label_feeds()
        state["_streams"] = {}
        return state

    # -- data ------------------------------------------------------------------------------------
    def load(self, split: str) -> TaskData:
        if self.data_inner:
            return self.inner.load(split)
        reader = self.binding.reader if split == "train" else self.binding.pred_reader
        if reader is None:
            raise ConfigError([f"task {self.spec.name}: no {split} reader (fit_reader(reader, phase="
                               f"{'train' if split == 'train' else 'predict'!r}))"])
        if split != "train":
            return TaskData(split, features=list(one_pass(reader)), has_labels=False)
        n = batches_per_pass(reader)
        stream = self._streams["train"] = BatchStream(reader, self.spec.name)
        return TaskData("train", features=range(n), transform=_StreamView(stream, n))

    def num_train_examples(self, data: TaskData) -> int:
        return self.inner.num_train_examples(data) if self.data_inner else len(data.features)

    def collate(self, features: Sequence[Any]) -> Dict[str, np.ndarray]:
        if self.data_inner:
            return self.inner.collate(features)
        if len(features) != 1:
            raise ValueError(f"task {self.spec.name}: a user-defined reader's batch is one micro-batch (got "
                             f"{len(features)} batches)")
        fields = self._fields()
        return reader_batch_feed(features[0], [spec for spec, _ in fields.values()],
                                 optional={name for name, (_, required) in fields.items() if not required},
                                 where=_reader_name(self.binding.data_reader))

    def label_feeds(self) -> Tuple[FeedSpec, ...]:
        if "_label_specs" in self.__dict__:  # a data-loading worker's copy
            return self.__dict__["_label_specs"]
        if self.data_inner:
            return self.inner.label_feeds()
        return tuple(spec for spec, _ in self._fields().values())

    def _fields(self) -> Dict[str, Tuple[FeedSpec, bool]]:
        """A user's reader's fields the heads read: name -> (feed spec, required in a batch). The train
        head's fields are required in training; fields only the predict-phase head reads (or a built-in
        head's labels when predicting) are zeros when a batch lacks them."""
        training = self.binding.head is not None
        heads = [(self.binding.head, True)] if training else []
        if self.binding.pred_head is not None and (self.binding.custom_head or not training):
            heads.append((self.binding.pred_head, not training))
        reader_attrs = _reader_outputs(self.binding.data_reader)
        fields: Dict[str, Tuple[FeedSpec, bool]] = {}
        for head, required in heads:
            if head_builds(head):
                wanted = _reader_fields(head)
            else:  # a built-in head fed by a user's reader: its label
                wanted, required = {"label_ids": [[-1], "int64"]}, training
            for name, attr in wanted.items():
                if name in DERIVED:
                    continue
                if name in fields:
                    fields[name] = (fields[name][0], fields[name][1] or required)
                    continue
                shape, dtype = _attr(attr if attr is not None else reader_attrs.get(name), name, head)
                spec = FeedSpec(name, tuple(shape), dtype,
                                f"field {name!r} of {_reader_name(self.binding.data_reader)}")
                fields[name] = (spec, required)
        return fields

    def dummy_labels(self, batch_size: int, seq_len: int) -> Dict[str, np.ndarray]:
        if self.data_inner:
            return self.inner.dummy_labels(batch_size, seq_len)
        return {s.name: np.zeros(_concrete(s.shape, batch_size, seq_len), dtype=s.dtype) for s in self.label_feeds()}

    def example_source(self, index: int) -> str:
        if self.data_inner:
            return self.inner.example_source(index)
        return f"batch {index} of a pass of {_reader_name(self.binding.data_reader)}._iterator()"

    def describe_data(self) -> List[str]:
        return self.inner.describe_data() if self.data_inner else []

    def manifest(self) -> Dict[str, Any]:
        out = dict(self.inner.manifest()) if self.data_inner else {}
        out["palm_components"] = json.loads(self.spec.options.get("components") or "{}")
        return out

    # -- model -----------------------------------------------------------------------------------
    def head_signature(self) -> Tuple[Any, ...]:
        if not self.binding.custom_head:
            return self.inner.head_signature()
        return (TYPE, type(self.binding.model_head).__module__, type(self.binding.model_head).__qualname__)

    def shared_encoder(self):
        backbone = self.binding.backbone
        return None if backbone is None else encoder_of(backbone)

    def create_head(self, enc: Encoded) -> Any:
        if not self.binding.custom_head:
            return self.inner.create_head(enc)
        return _holder()

    def head_forward(self, head: Any, enc: Encoded, feeds: Mapping[str, Any]) -> HeadOutputs:
        if not self.binding.custom_head:
            if not self.data_inner:  # a user's reader feeding a built-in head: its label_ids is the head's label
                feeds = {"label": feeds["label_ids"]}
            return self.inner.head_forward(head, enc, feeds)
        import paddle

        program = paddle.static.default_main_program()
        before = {p.name for p in program.global_block().all_parameters()}
        scope = self.binding.scope or f"{self.spec.name}."
        inputs = {"backbone": backbone_outputs(enc), "reader": self._reader_inputs(enc, feeds)}
        loss, predictions = None, {}
        if self.binding.head is not None:  # its other outputs are not fetched: batch_postprocess gets the loss
            loss = build_head(self.binding.head, inputs, scope, "train")["loss"]
        if self.binding.pred_head is not None:
            predictions = dict(build_head(self.binding.pred_head, inputs, scope, "predict"))
        if loss is None:  # a prediction program: no loss to compute
            loss = paddle.zeros([], dtype="float32")
        else:
            loss = paddle.sum(paddle.cast(loss, "float32"))
        created = [p for p in program.global_block().all_parameters() if p.name not in before]
        register_parameters(head, created, scope)
        return HeadOutputs(loss=loss, predictions=predictions)

    def _reader_inputs(self, enc: Encoded, feeds: Mapping[str, Any]) -> "LazyFields":
        fields: Dict[str, Callable[[], Any]] = derived_fields(enc.feeds)
        if self.data_inner:
            for name, var in feeds.items():
                fields.setdefault(name, lambda v=var: v)
                palm = PALM_FIELDS.get(name)
                if palm == "mask_label":
                    fields.setdefault(palm, lambda v=var: _flat(v))
                elif palm is not None:
                    fields.setdefault(palm, lambda v=var: v)
        else:
            for name, var in feeds.items():
                fields[name] = lambda v=var: v
        return LazyFields(fields, f"inputs['reader'] of task {self.spec.name}",
                          "declare it in the head's inputs_attrs['reader'] (a field of the reader's outputs_attr)")

    # -- evaluation and prediction ---------------------------------------------------------------
    def evaluate(self, data: TaskData, outputs) -> Dict[str, float]:
        if self.data_inner and not self.binding.custom_head:
            return self.inner.evaluate(data, outputs)
        raise ConfigError([f"task {self.spec.name}: a user-defined head has no metrics here; predict (its "
                           "batch_postprocess/epoch_postprocess see every batch) and score get_results()"])

    def predictions(self, data: TaskData, outputs) -> Any:
        if self.data_inner and not self.binding.custom_head:
            return self.inner.predictions(data, outputs)
        return {name: [np.asarray(a).tolist() for a in arrays] for name, arrays in outputs.items()}


# -- the inputs of a head --------------------------------------------------------------------------------
class LazyFields(MappingABC):
    """A mapping whose variables are built on first use (in the program being built), with an error
    that names what exists when a key does not."""

    def __init__(self, makers: Dict[str, Callable[[], Any]], what: str, fix: str):
        self._makers, self._made = dict(makers), {}
        self._what, self._fix = what, fix

    def __getitem__(self, key):
        if key not in self._made:
            if key not in self._makers:
                raise KeyError(f"{self._what} has no {key!r} (it has {sorted(self._makers)}); {self._fix}")
            self._made[key] = self._makers[key]()
        return self._made[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._makers)

    def __len__(self) -> int:
        return len(self._makers)


def derived_fields(backbone_feeds: Mapping[str, Any]) -> Dict[str, Callable[[], Any]]:
    """PALM's reader fields computed from the engine's backbone feeds (input_ids, segment_ids and the
    additive mask [B, 1, 1, L])."""
    import paddle

    ids, seg, mask = (backbone_feeds[k] for k in ("input_ids", "segment_ids", "input_mask"))

    def keep():  # [B, L] 1.0 on tokens, 0.0 on padding
        return paddle.cast(paddle.reshape(mask, [0, -1]) > -1.0, "float32")

    def task_ids():
        block = paddle.static.default_main_program().global_block()
        if block.has_var(TASK_TYPE_IDS):  # the run's task embedding ids (use_task_id)
            return block.var(TASK_TYPE_IDS)
        return paddle.zeros_like(ids)

    def positions():
        row = paddle.arange(0, paddle.shape(ids)[1], dtype="int64")
        return paddle.unsqueeze(row, 0) + paddle.zeros_like(ids)

    return {"token_ids": lambda: ids, "segment_ids": lambda: seg, "position_ids": positions,
            "input_mask": lambda: paddle.unsqueeze(keep(), -1), "task_ids": task_ids,
            "seq_lens": lambda: paddle.cast(paddle.sum(keep(), axis=1), "int64")}


def backbone_outputs(enc: Encoded) -> Mapping[str, Any]:
    """`inputs['backbone']`: a user-defined backbone's own outputs, or PALM's ERNIE/BERT outputs."""
    if isinstance(enc, PalmEncoded):
        return LazyFields({k: (lambda v=v: v) for k, v in enc.outputs.items()}, "inputs['backbone'] (the backbone's "
                          "build)", "return it from the backbone's build")
    import paddle

    model = enc.backbone

    def word_embedding():  # the embedding layer's output (word + position + segment, norm, dropout)
        kwargs = {"token_type_ids": enc.feeds["segment_ids"]}
        block = paddle.static.default_main_program().global_block()
        if block.has_var(TASK_TYPE_IDS) and getattr(model.embeddings, "use_task_id", False):
            kwargs["task_type_ids"] = block.var(TASK_TYPE_IDS)
        return model.embeddings(input_ids=enc.feeds["input_ids"], **kwargs)

    return LazyFields({"encoder_outputs": lambda: enc.sequence_output,
                       "sentence_embedding": lambda: enc.pooled_output,
                       "sentence_pair_embedding": lambda: enc.pooled_output,
                       "embedding_table": lambda: model.embeddings.word_embeddings.weight,
                       "word_embedding": word_embedding},
                      "inputs['backbone'] (ERNIE/BERT)", "these are PALM's ERNIE outputs (docs/palm_extending.md)")


def build_head(head, inputs, scope: str, phase: str) -> Dict[str, Any]:
    """`head.build(inputs, scope_name=scope)` under PALM's `unique_name.guard(scope)`, checked."""
    from paddle.utils import unique_name

    with unique_name.guard(scope):
        out = head.build(inputs, scope_name=scope)
    what = f"{type(head).__name__}.build ({phase} phase)"
    if not isinstance(out, Mapping):
        raise TypeError(f"{what} returned {type(out).__name__}; return a dict of variables "
                        f"({{'loss': ...}} in the train phase)")
    if phase == "train" and "loss" not in out:
        raise ValueError(f"{what} returned {sorted(out)}; the train phase must return {{'loss': <loss variable>}} "
                         "(PALM's contract)")
    if phase == "predict" and not out:
        raise ValueError(f"{what} returned nothing; the predict phase returns the variables to fetch")
    return dict(out)


def register_parameters(holder, params: Sequence[Any], scope: str) -> None:
    """Put parameters a `build` created into `holder` (a paddle Layer) as `<name without the scope>`,
    nested at each dot, so the run's name map holds them as `heads.<group>.<name>`."""
    exempt = set(holder.__dict__.get("no_weight_decay", ()))
    for p in params:
        key = p.name
        while scope and key.startswith(scope) and len(key) > len(scope):
            key = key[len(scope):]
        parts = key.split(".")
        layer = holder
        try:
            for part in parts[:-1]:
                sub = layer._sub_layers.get(part)
                if sub is None:
                    if part in layer._parameters:
                        raise KeyError(part)
                    sub = _holder()
                    layer.add_sublayer(part, sub)
                layer = sub
            if parts[-1] in layer._parameters or parts[-1] in layer._sub_layers:
                raise KeyError(parts[-1])
            layer.add_parameter(parts[-1], p)
        except (KeyError, ValueError):  # a name that is both a prefix and a parameter: keep it flat
            holder.add_parameter(key.replace(".", "__"), p)
        if palm_decay_exempt(p.name):
            exempt.add(p.name)
    holder.no_weight_decay = exempt


def _holder():
    import paddle

    return paddle.nn.Layer()


def _flat(v):
    import paddle

    return paddle.reshape(v, [-1])


# -- a user-defined backbone -------------------------------------------------------------------------
@dataclass
class PalmEncoded(Encoded):
    """What a user-defined backbone hands to the heads: its outputs by name, besides Encoded's fields."""

    outputs: Mapping[str, Any] = field(default_factory=dict)


_ENCODERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def encoder_of(backbone) -> Callable:
    """The `shared_encoder` function of a user-defined backbone (one per backbone object)."""
    encoder = _ENCODERS.get(backbone)
    if encoder is None:
        encoder = _ENCODERS[backbone] = _Encoder(backbone)
    return encoder


class _Encoder:
    def __init__(self, backbone):
        self.backbone = weakref.ref(backbone)

    def __call__(self, feed_vars: Mapping[str, Any]):
        import paddle

        backbone = self.backbone()
        name = type(backbone).__name__
        wanted = dict(backbone.inputs_attr)
        unknown = sorted(set(wanted) - set(BACKBONE_INPUTS))
        if unknown:
            raise ConfigError([f"backbone {name}: inputs_attr names {unknown}; a user-defined backbone reads PALM's "
                               f"fields {list(BACKBONE_INPUTS)} (computed from the token ids, segments and mask every "
                               "reader gives)"])
        fields = derived_fields({k: feed_vars[k] for k in ("input_ids", "segment_ids", "input_mask")})
        inputs = {k: fields[k]() for k in wanted}
        program = paddle.static.default_main_program()
        before = {p.name for p in program.global_block().all_parameters()}
        with paddle.static.amp.fp16_guard():  # AMP O2 casts the guarded ops, as it does ERNIE's
            out = backbone.build(inputs)
        if not isinstance(out, Mapping):
            raise TypeError(f"{name}.build returned {type(out).__name__}; return a dict of output variables")
        declared = set(backbone.outputs_attr)
        missing = sorted(declared - set(out))
        if missing:
            raise ValueError(f"{name}.build did not return {missing}, which its outputs_attr declares")
        holder = _holder()
        register_parameters(holder, [p for p in program.global_block().all_parameters() if p.name not in before], "")
        name_map = {f"backbone.{k}": v.name for k, v in holder.state_dict().items()}
        hidden = next((int(out[k].shape[-1]) for k in ("sentence_embedding", "encoder_outputs") if k in out), None)
        enc = PalmEncoded(sequence_output=out.get("encoder_outputs"), pooled_output=out.get("sentence_embedding"),
                          backbone=holder, config=SimpleNamespace(hidden_size=hidden, initializer_range=0.02),
                          feeds={s.name: feed_vars[s.name] for s in BACKBONE_FEEDS}, outputs=dict(out))
        return enc, name_map, []


# -- a user-defined reader -----------------------------------------------------------------------------
def batches_per_pass(reader) -> int:
    """Batches of one pass: ceil(num_examples / batch size)."""
    size = reader.batch_size
    if not isinstance(size, int) or size < 1:
        raise ConfigError([f"{_reader_name(reader)}: its batch size is {size!r}; load_data(...) must set "
                           "self._batch_size (PALM's contract)"])
    try:
        examples = int(reader.num_examples)
    except NotImplementedError:
        raise ConfigError([f"{_reader_name(reader)}: num_examples is not implemented; return the rows of one pass "
                           "(the run's steps per epoch come from it)"]) from None
    if examples < 1:
        raise ConfigError([f"{_reader_name(reader)}: num_examples is {examples}; the reader has no data"])
    return -(-examples // size)


class BatchStream:
    """A user's reader read as one stream of batches: position p is the p-th batch of `_iterator()`
    passes, one after another (a pass that ends starts a fresh `_iterator()`). Asked in order it pulls
    each batch once; asked for an earlier position (a resumed run's first step) it starts over and
    skips to it, which is exact when every pass yields the same batches (`check_deterministic`)."""

    def __init__(self, reader, task: str):
        self.reader, self.task = reader, task
        self._it: Optional[Iterator] = None
        self._pos = 0  # position of the next batch the iterator yields

    def batch(self, position: int) -> Dict[str, Any]:
        if self._it is None or position < self._pos:
            self._it, self._pos = None, 0
        while self._pos < position:
            self._next()
        return self._next()

    def _next(self):
        for fresh in (False, True):
            if self._it is None or fresh:
                self._it = iter(self.reader._iterator())
            try:
                batch = next(self._it)
                self._pos += 1
                return batch
            except StopIteration:
                continue
        raise ConfigError([f"task {self.task}: {_reader_name(self.reader)}._iterator() yields no batch"])


class _StreamView:
    """TaskData.transform of a user's reader: (feature, index, epoch) -> the stream's batch."""

    def __init__(self, stream: BatchStream, per_pass: int):
        self.stream, self.per_pass = stream, per_pass

    def __call__(self, feature, index: int, epoch: int):
        return self.stream.batch(epoch * self.per_pass + index)


def one_pass(reader) -> Iterator[Dict[str, Any]]:
    """The batches of one pass of `reader._iterator()`: until it ends, or until `num_examples` rows
    (an iterator that restarts by itself, as PALM's contract allows)."""
    try:
        limit = int(reader.num_examples)
    except (NotImplementedError, TypeError, RuntimeError):
        limit = None
    rows = 0
    for batch in reader._iterator():
        yield batch
        first = next(iter(batch.values()), None) if isinstance(batch, Mapping) else None
        rows += len(first) if first is not None and np.ndim(first) else 1
        if limit is not None and rows >= limit:
            return


def check_deterministic(reader, batches: int = 2) -> Optional[str]:
    """None when two fresh `_iterator()` passes yield the same first `batches` batches (resume can
    find its position), else what differs."""
    first, second = iter(reader._iterator()), iter(reader._iterator())
    for k in range(batches):
        a, b = next(first, None), next(second, None)
        if a is None and b is None:
            return None
        if (a is None) != (b is None) or set(a) != set(b):
            return f"batch {k} has other fields or ends early on the second pass"
        for name in a:
            x, y = np.asarray(a[name]), np.asarray(b[name])
            if x.shape != y.shape or not np.array_equal(x, y):
                return f"batch {k}, field {name!r} differs between two passes"
    return None


def reader_batch_feed(batch: Mapping[str, Any], specs: Sequence[FeedSpec], *, where: str,
                      required: bool = True, optional: Sequence[str] = ()) -> Dict[str, np.ndarray]:
    """A PALM batch dict (token_ids, segment_ids, input_mask [B, L, 1], the task's fields) as the engine's
    micro-batch: input_ids, segment_ids, the additive mask [B, 1, 1, L] and the `specs` fields, checked
    like PALM's runtime check (dtype, rank). A missing field gets zeros when `required` is False or it
    is in `optional` (prediction); otherwise it is an error naming it."""
    if not isinstance(batch, Mapping):
        raise TypeError(f"{where}: a batch is a dict of arrays, got {type(batch).__name__}")
    missing = [k for k in ("token_ids", "input_mask") if k not in batch]
    if missing:
        raise ValueError(f"{where}: the batch lacks {missing} (it has {sorted(batch)}); a reader yields token_ids, "
                         "segment_ids and input_mask [batch, seq, 1] for the backbone")
    ids = _checked(batch["token_ids"], "int64", 2, "token_ids", where)
    b, s = ids.shape
    seg = (_checked(batch["segment_ids"], "int64", 2, "segment_ids", where) if "segment_ids" in batch
           else np.zeros_like(ids))
    mask = np.asarray(batch["input_mask"], dtype=np.float32).reshape(b, s)
    out = {"input_ids": ids, "segment_ids": seg,
           "input_mask": np.where(mask > 0.5, 0.0, ATTENTION_PAD).astype(np.float32).reshape(b, 1, 1, s)}
    absent = []
    for spec in specs:
        if spec.name not in batch:
            if required and spec.name not in optional:
                absent.append(spec.name)
            else:
                out[spec.name] = np.zeros(_concrete(spec.shape, b, s), dtype=spec.dtype)
            continue
        out[spec.name] = _checked(batch[spec.name], spec.dtype, len(spec.shape), spec.name, where)
    if absent:
        raise ValueError(f"{where}: the batch lacks {absent}, which the head reads (it has {sorted(batch)})")
    return out


def engine_batch(task: TaskType, batch: Mapping[str, Any], *, prefix: str, required: bool,
                 where: str) -> Dict[str, np.ndarray]:
    """A PALM batch dict (made by the script, or by a reader) as `task`'s collated batch: the backbone
    inputs and `task`'s label feeds, found under PALM's names, with or without `prefix` (`<name>.`)."""
    collated = getattr(batch, "collated", None)
    if collated is not None:
        return dict(collated)
    if isinstance(task, PalmTask) and not task.data_inner:
        view = {k[len(prefix):] if k.startswith(prefix) else k: v for k, v in batch.items()}
        return reader_batch_feed(view, task.label_feeds(), where=where, required=required)
    specs = task.label_feeds()
    view: Dict[str, Any] = {k: v for k, v in batch.items() if not k.startswith(prefix)}
    for spec in specs:
        for key in (prefix + PALM_FIELDS.get(spec.name, spec.name), prefix + spec.name,
                    PALM_FIELDS.get(spec.name, spec.name), spec.name):
            if key in batch:
                view[spec.name] = batch[key]
                break
    out = reader_batch_feed(view, specs, where=where, required=required)
    if not required:
        b, s = out["input_ids"].shape
        dummies = task.dummy_labels(b, s)
        for spec in specs:
            if spec.name not in view:
                out[spec.name] = dummies[spec.name]
    return out


# -- helpers ------------------------------------------------------------------------------------------
def _reader_name(reader) -> str:
    return f"reader {type(reader).__name__}"


def _reader_fields(head) -> Dict[str, Any]:
    try:
        attrs = head.inputs_attrs or {}
    except NotImplementedError:
        attrs = {}
    return dict(attrs.get("reader") or {})


def _reader_outputs(reader) -> Dict[str, Any]:
    try:
        return dict(reader.outputs_attr or {})
    except Exception:  # noqa: BLE001  (an undeclared reader: the head's declaration is used)
        return {}


def _attr(attr, name: str, head) -> Tuple[List[int], str]:
    if not (isinstance(attr, (list, tuple)) and len(attr) == 2):
        raise ConfigError([f"head {type(head).__name__}: inputs_attrs['reader'][{name!r}] is {attr!r}; declare "
                           f"[shape, dtype], e.g. [[-1], 'int64'] (PALM's form)"])
    shape, dtype = attr
    return [int(d) if d is not None else -1 for d in shape], str(dtype)


def _concrete(shape: Sequence[int], batch: int, seq: int) -> Tuple[int, ...]:
    """A declared shape with its first -1 the batch size, its second the sequence length, others 1."""
    out, unknown = [], 0
    for d in shape:
        if d is None or d < 0:
            out.append(batch if unknown == 0 else seq if unknown == 1 else 1)
            unknown += 1
        else:
            out.append(int(d))
    return tuple(out)


def _checked(value, dtype: str, ndim: int, name: str, where: str) -> np.ndarray:
    array = np.asarray(value)
    if array.dtype == np.float64 and dtype == "float32":
        array = array.astype(np.float32)
    if array.dtype != np.dtype(dtype):
        if np.issubdtype(array.dtype, np.integer) and np.issubdtype(np.dtype(dtype), np.integer):
            array = array.astype(dtype)
        else:
            raise ValueError(f"{where}: field {name!r} is {array.dtype}, expected {dtype}")
    if array.ndim != ndim:
        raise ValueError(f"{where}: field {name!r} has shape {list(array.shape)}, expected {ndim} dimensions")
    return array


__all__ = ["Binding", "PalmTask", "bind", "needs_adaptor", "palm_view", "engine_batch", "check_deterministic"]
