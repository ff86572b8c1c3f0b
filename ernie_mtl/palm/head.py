"""PaddlePALM's task heads (`palm.head.*`): the output layer and loss of a task, as options of the
engine's task types (docs/palm.md lists what differs from PALM's heads).

A head keeps PALM's constructor; the trainer turns it into the task type's options (`n_classes`,
`dropout`, `use_crf`, ...). After `Trainer.predict`, `get_results()` returns what the head wrote
(PALM's heads only wrote files): the records, in input order.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple


class Head:
    """PALM's `Head` base."""

    readers: Tuple[str, ...] = ()  # the reader classes this head reads from (PALM names)

    def __init__(self, phase: str = "train"):
        if phase not in ("train", "predict"):
            raise ValueError(f"phase {phase!r}: a head's phase is 'train' or 'predict'")
        self._phase = phase
        self._results: Optional[Any] = None

    @property
    def phase(self) -> str:
        return self._phase

    @property
    def inputs_attrs(self) -> Dict[str, Any]:
        return {"reader": {}, "backbone": {}}

    @property
    def outputs_attr(self) -> Dict[str, Any]:
        return {"loss": [[1], "float32"]} if self._phase == "train" else {}

    @property
    def epoch_inputs_attrs(self) -> Dict[str, Any]:
        return {}

    def build(self, inputs, scope_name=""):
        raise NotImplementedError("ernie_mtl builds the heads itself (one engine for every face): hand the head "
                                  "to Trainer.build_forward / build_predict_forward")

    def batch_postprocess(self, rt_outputs):
        return None

    def epoch_postprocess(self, post_inputs=None, output_dir=None):
        return self._results

    def reset(self) -> None:
        self._results = None

    def get_results(self):
        """The predictions of the latest `Trainer.predict` with this head (None before)."""
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
        if dim is not None and backbone is not None and dim != backbone.hidden_size:
            raise ValueError(f"{type(self).__name__}: input_dim {dim} differs from the backbone's hidden_size "
                             f"{backbone.hidden_size}")

    def _set_results(self, results) -> None:
        self._results = results


class Classify(Head):
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


class Match(Head):
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


class SequenceLabel(Head):
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


class MRC(Head):
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


class MaskLM(Head):
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


__all__ = ["Head", "Classify", "Match", "SequenceLabel", "MRC", "MaskLM"]
