"""PaddlePALM's task heads (`palm.head.*`) and PALM's contract for writing one (`palm.head.Head`).

A built-in head (`Classify`, `Match`, `SequenceLabel`, `MRC`, `MaskLM`) keeps PALM's constructor and
becomes the options of an engine task type (`n_classes`, `dropout`, `use_crf`, ...; docs/palm.md lists
what differs from PALM's heads). After `Trainer.predict`, its `get_results()` returns the records, in
input order (PALM's built-in heads only wrote files).

A user's head subclasses `Head` (or a built-in head) and implements `build(inputs, scope_name)` as in
PALM: `inputs['backbone'][name]` and `inputs['reader'][name]` are the static-graph variables it declared
in `inputs_attrs`; it returns `{'loss': ...}` in the train phase and its prediction variables in the
predict phase. The engine builds it inside its own programs (ernie_mtl/palm/adaptor.py: training,
evaluation, export, prediction), fetches what `build` returned, and calls `batch_postprocess` with each
prediction batch's fetched values and `epoch_postprocess` at the end, as PALM's trainer did.
docs/palm_extending.md is the guide.
"""
from __future__ import annotations

import copy
import json
import os
from typing import Any, Dict, Optional, Tuple


class Head:
    """PALM's `Head` base: subclass it and implement `build` (and optionally `inputs_attrs`,
    `outputs_attr`, `epoch_inputs_attrs`, `batch_postprocess`, `epoch_postprocess`)."""

    def __init__(self, phase: str = "train"):
        if phase not in ("train", "predict"):
            raise ValueError(f"phase {phase!r}: a head's phase is 'train' or 'predict'")
        self._phase = phase
        self._is_training = phase == "train"  # the attribute PALM's own heads read
        self._stop_gradient: Dict[str, Any] = {}
        self._prog = None
        self._results_buffer: list = []

    @property
    def phase(self) -> str:
        return phase_of(self)

    @property
    def inputs_attrs(self) -> Dict[str, Any]:
        """What `build` reads: {'reader': {name: [shape, dtype]}, 'backbone': {name: [shape, dtype]}}."""
        return {"reader": {}, "backbone": {}}

    @property
    def outputs_attr(self) -> Dict[str, Any]:
        """What `build` returns: 'loss' in the train phase, the prediction variables in the predict phase."""
        return {"loss": [[1], "float32"]} if phase_of(self) == "train" else {}

    @property
    def epoch_inputs_attrs(self) -> Dict[str, Any]:
        """Non-empty: `epoch_postprocess` receives `{'reader': reader.get_epoch_outputs()}`."""
        return {}

    def build(self, inputs, scope_name=""):
        """The head's graph: `inputs['backbone']`, `inputs['reader']` -> {'loss': ...} (train) or the
        prediction variables (predict), with Paddle's static API (paddle.static.nn, paddle.nn.functional)."""
        raise NotImplementedError(f"{type(self).__name__}.build(inputs, scope_name) is not implemented: a head "
                                  "written on palm.head.Head builds its graph there (docs/palm_extending.md)")

    def batch_postprocess(self, rt_outputs):
        """Each batch's fetched outputs (`{name: array}`); PALM's default keeps one record per row."""
        buffer = self.__dict__.setdefault("_results_buffer", [])
        if isinstance(rt_outputs, dict):
            keys = list(rt_outputs)
            values = [rt_outputs[k] for k in keys]
            if len({len(v) for v in values}) == 1:
                results = [dict(zip(keys, row)) for row in zip(*values)]
                buffer.extend(results)
                return results
            print("WARNING: irregular output results. visualize failed.")
            buffer.append(rt_outputs)
        return None

    def epoch_postprocess(self, post_inputs=None, output_dir=None):
        """After the last batch; PALM's default writes the kept records to `<output_dir>/<phase>` (one
        JSON per line) when `output_dir` is given, else returns them."""
        buffer = self.__dict__.setdefault("_results_buffer", [])
        if output_dir is None:
            return buffer
        os.makedirs(output_dir, exist_ok=True)
        with open(os.path.join(output_dir, phase_of(self)), "w", encoding="utf-8") as writer:
            for record in buffer:
                writer.write(json.dumps(record, default=_jsonable) + "\n")
        return None

    def reset(self) -> None:
        self._results_buffer = []

    def get_results(self):
        """What `batch_postprocess` kept (PALM's default), a copy."""
        return copy.deepcopy(self.__dict__.get("_results_buffer", []))


def phase_of(head) -> str:
    """A head's phase, also for heads written like PALM's own, which never called `Head.__init__` and set
    `_is_training` instead."""
    phase = head.__dict__.get("_phase")
    if phase in ("train", "predict"):
        return phase
    if "_is_training" in head.__dict__:
        return "train" if head.__dict__["_is_training"] else "predict"
    return "train"


def runs_own_build(head) -> bool:
    """Whether the engine builds `head`'s own graph (PALM's `build`): any head but the built-in ones
    used as they are (a subclass of a built-in head that overrides `build` runs its own)."""
    return not isinstance(head, _BuiltinHead) or type(head).build is not Head.build


def postprocesses_itself(head) -> bool:
    """Whether prediction calls the head's own `batch_postprocess`/`epoch_postprocess` (a user's head,
    or a built-in head whose subclass overrides them) instead of writing PALM's files for it."""
    if runs_own_build(head):
        return True
    base = next(c for c in type(head).__mro__ if c in _BUILTIN)
    return type(head).batch_postprocess is not base.batch_postprocess or \
        type(head).epoch_postprocess is not base.epoch_postprocess


def declared_outputs(head) -> Dict[str, Any]:
    """`outputs_attr`, or PALM's spelling `outputs_attrs` when a head defines that one."""
    own = getattr(type(head), "outputs_attrs", None)
    if own is not None:
        try:
            return dict(getattr(head, "outputs_attrs") or {})
        except Exception:  # noqa: BLE001  (a head's declaration that cannot be read is not used)
            return {}
    try:
        return dict(head.outputs_attr or {})
    except Exception:  # noqa: BLE001
        return {}


def _jsonable(value):
    import numpy as np

    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


class _BuiltinHead(Head):
    """A head the engine's task types implement: the trainer turns it into the task type's options."""

    readers: Tuple[str, ...] = ()  # the reader classes this head reads from (PALM names)

    def __init__(self, phase: str = "train"):
        super().__init__(phase)
        self._results: Optional[Any] = None

    def epoch_postprocess(self, post_inputs=None, output_dir=None):
        if runs_own_build(self):  # a subclass with its own graph: PALM's default postprocessing
            return super().epoch_postprocess(post_inputs, output_dir)
        return self._results

    def reset(self) -> None:
        super().reset()
        self._results = None

    def get_results(self):
        """The predictions of the latest `Trainer.predict` with this head (None before); a subclass that
        builds its own graph: what its batch_postprocess kept (PALM's default)."""
        if runs_own_build(self):
            return super().get_results()
        return self._results

    # -- the engine's view --------------------------------------------------------------------------
    def options(self, reader) -> Dict[str, Any]:
        """The engine task type's options this head sets (`reader`: the task's reader)."""
        return {}

    def check(self, reader, backbone) -> None:
        """Raise ValueError when this head cannot read from `reader` or `backbone`."""
        if self.readers and not any(c.__name__ in self.readers for c in type(reader).__mro__):
            raise ValueError(f"{type(self).__name__} head reads from {' or '.join(self.readers)}, not "
                             f"{type(reader).__name__}")
        dim = getattr(self, "_input_dim", None)
        hidden = getattr(backbone, "hidden_size", None)
        if dim is not None and hidden is not None and dim != hidden:
            raise ValueError(f"{type(self).__name__}: input_dim {dim} differs from the backbone's hidden_size "
                             f"{hidden}")

    def _set_results(self, results) -> None:
        self._results = results


class Classify(_BuiltinHead):
    """Softmax classifier over the pooled [CLS] vector (`logits`, `probs`)."""

    readers = ("ClassifyReader", "MatchReader")

    def __init__(self, num_classes, input_dim, dropout_prob=0.0, param_initializer_range=0.02, phase="train"):
        super().__init__(phase)
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(f"num_classes {num_classes!r} must be an integer >= 2")
        self.num_classes, self._input_dim, self._dropout = num_classes, input_dim, float(dropout_prob)

    @property
    def outputs_attr(self):
        if self._phase == "train":
            return {"loss": [[1], "float32"]}
        return {"logits": [[-1, self.num_classes], "float32"], "probs": [[-1, self.num_classes], "float32"]}

    def options(self, reader) -> Dict[str, Any]:
        return {"n_classes": self.num_classes, "dropout": self._dropout}

    def check(self, reader, backbone) -> None:
        super().check(reader, backbone)
        if type(reader).__name__ == "MatchReader" and reader.options().get("learning_strategy") == "pairwise":
            raise ValueError("Classify cannot train on a pairwise MatchReader; use Match(..., "
                             "learning_strategy='pairwise')")


class Match(_BuiltinHead):
    """Sentence-pair matching: a softmax classifier (pointwise) or a ranking score with a hinge loss
    (pairwise)."""

    readers = ("MatchReader",)

    def __init__(self, num_classes, input_dim, dropout_prob=0.0, param_initializer_range=0.02,
                 learning_strategy="pointwise", margin=0.5, phase="train"):
        super().__init__(phase)
        if learning_strategy not in ("pointwise", "pairwise"):
            raise ValueError(f"learning_strategy {learning_strategy!r}: 'pointwise' or 'pairwise'")
        self.num_classes, self._input_dim, self._dropout = num_classes, input_dim, float(dropout_prob)
        self.learning_strategy, self.margin = learning_strategy, float(margin)

    @property
    def outputs_attr(self):
        if self._phase == "train":
            return {"loss": [[1], "float32"]}
        if self.learning_strategy == "pairwise":
            return {"probs": [[-1, 1], "float32"]}
        return {"logits": [[-1, self.num_classes], "float32"], "probs": [[-1, self.num_classes], "float32"]}

    def options(self, reader) -> Dict[str, Any]:
        out = {"dropout": self._dropout, "learning_strategy": self.learning_strategy, "margin": self.margin}
        if self.learning_strategy == "pointwise":
            out["n_classes"] = self.num_classes
        return out

    def check(self, reader, backbone) -> None:
        super().check(reader, backbone)
        strategy = reader.options().get("learning_strategy", "pointwise")
        if reader.phase == "train" and strategy != self.learning_strategy:
            raise ValueError(f"Match head is {self.learning_strategy} but its MatchReader is {strategy}; "
                             "give both the same learning_strategy")
        if self.learning_strategy == "pairwise" and backbone is not None and backbone.phase == "train" \
                and not backbone.is_pairwise:
            raise ValueError("pairwise matching needs the backbone config key is_pairwise: True (as in PALM)")


class SequenceLabel(_BuiltinHead):
    """Token tagging with a linear-chain CRF (PALM's loss), decoded by Viterbi (PALM decoded with an
    argmax over the emissions)."""

    readers = ("SequenceLabelReader",)

    def __init__(self, num_classes, input_dim, dropout_prob=0.0, learning_rate=1e-3, param_initializer_range=0.02,
                 phase="train"):
        super().__init__(phase)
        self.num_classes, self._input_dim, self._dropout = num_classes, input_dim, float(dropout_prob)
        self.learning_rate = learning_rate  # PALM's LR multiplier of the CRF transitions: not applied (docs/palm.md)

    @property
    def outputs_attr(self):
        if self._phase == "train":
            return {"loss": [[1], "float32"]}
        return {"emission": [[-1, self.num_classes], "float32"]}

    def options(self, reader) -> Dict[str, Any]:
        return {"use_crf": True, "dropout": self._dropout}

    def check(self, reader, backbone) -> None:
        import json

        super().check(reader, backbone)
        with open(reader.label_map_path, encoding="utf-8") as f:
            size = len(json.load(f))
        if size != self.num_classes:
            raise ValueError(f"SequenceLabel: num_classes {self.num_classes} but {reader.label_map_path} has {size} "
                             "labels; they must agree")


class MRC(_BuiltinHead):
    """Span extraction: start and end logits over the window, decoded into answer text per question."""

    readers = ("MRCReader",)

    def __init__(self, max_query_len, input_dim, pred_output_path=None, verbose=False, with_negative=False,
                 do_lower_case=False, max_ans_len=None, null_score_diff_threshold=0.0, n_best_size=20,
                 phase="train"):
        super().__init__(phase)
        self.max_query_len, self._input_dim = max_query_len, input_dim
        self.pred_output_path, self.verbose = pred_output_path, verbose
        self.with_negative, self.do_lower_case = bool(with_negative), do_lower_case
        self.max_ans_len = max_ans_len
        self.null_score_diff_threshold, self.n_best_size = float(null_score_diff_threshold), int(n_best_size)

    @property
    def outputs_attr(self):
        if self._phase == "train":
            return {"loss": [[1], "float32"]}
        return {"start_logits": [[-1, -1, 1], "float32"], "end_logits": [[-1, -1, 1], "float32"],
                "unique_ids": [[-1], "int64"]}

    @property
    def epoch_inputs_attrs(self):
        return {} if self._phase == "train" else {"reader": {"examples": None, "features": None}}

    def options(self, reader) -> Dict[str, Any]:
        out = {"with_negative": self.with_negative, "null_score_diff_threshold": self.null_score_diff_threshold,
               "n_best_size": self.n_best_size}
        if self.max_ans_len is not None:  # PALM had no default (None failed at decoding); the engine's is 30
            out["max_answer_len"] = int(self.max_ans_len)
        return out

    def check(self, reader, backbone) -> None:
        super().check(reader, backbone)
        if reader.options()["max_query_len"] != self.max_query_len:
            raise ValueError(f"MRC head max_query_len {self.max_query_len} differs from its reader's "
                             f"{reader.options()['max_query_len']}")


class MaskLM(_BuiltinHead):
    """Masked language model head, its output layer tied to the word embedding."""

    readers = ("MaskLMReader",)

    def __init__(self, input_dim, vocab_size, hidden_act, dropout_prob=0.0, param_initializer_range=0.02,
                 phase="train"):
        super().__init__(phase)
        self._input_dim, self.vocab_size, self.hidden_act = input_dim, vocab_size, hidden_act

    @property
    def outputs_attr(self):
        if self._phase == "train":
            return {"loss": [[1], "float32"]}
        return {"logits": [[-1, self.vocab_size], "float32"]}


_BUILTIN = (Classify, Match, SequenceLabel, MRC, MaskLM)

__all__ = ["Head", "Classify", "Match", "SequenceLabel", "MRC", "MaskLM"]
