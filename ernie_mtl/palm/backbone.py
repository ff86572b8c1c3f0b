"""PaddlePALM's backbones (`palm.backbone.ERNIE`, `palm.backbone.BERT`) and PALM's contract for writing one
(`palm.backbone.Backbone`).

ERNIE and BERT are the architecture of the one shared encoder, from PALM's constructor arguments or an
`ernie_config.json` (`from_config`). The engine builds PaddleNLP's ErnieModel / BertModel with these
sizes (ernie_mtl/program/forward.py); such a backbone object only carries them. Differences from PALM's
static ERNIE (docs/palm.md): the feed-forward size is the config's `intermediate_size` when given (PALM
always built 4 x hidden, which is what an ERNIE 1.0 config without the key means here too); no task
embedding is added unless `use_task_emb=True` (or the run sets `use_task_id`; PALM's ERNIE always added
one, random for ERNIE 1.0, which has none); LayerNorm epsilon is PaddleNLP's 1e-12 (PALM: 1e-5).

A user's backbone subclasses `Backbone` as in PALM: `inputs_attr` (the reader fields it reads),
`outputs_attr` and `build(inputs, scope_name)` returning its output variables; the engine builds it
once per program in place of ERNIE (ernie_mtl/palm/adaptor.py, docs/palm_extending.md).
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

_REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "max_position_embeddings",
             "hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob", "initializer_range")


class Backbone:
    """PALM's `Backbone` base: `inputs_attr` (the reader fields it reads), `outputs_attr` (what heads
    read) and `build(inputs, scope_name)` (its graph). ERNIE and BERT are built by the engine."""

    model_type = ""

    def __init__(self, phase: str = "train"):
        if phase not in ("train", "predict"):
            raise ValueError(f"phase {phase!r}: 'train' or 'predict'")
        self._phase = phase

    @property
    def phase(self) -> str:
        return self.__dict__.get("_phase", "train")

    @property
    def inputs_attr(self) -> Dict[str, Any]:
        raise NotImplementedError(f"{type(self).__name__}.inputs_attr is not implemented")

    @property
    def outputs_attr(self) -> Dict[str, Any]:
        raise NotImplementedError(f"{type(self).__name__}.outputs_attr is not implemented")

    def build(self, inputs, scope_name=""):
        raise NotImplementedError(f"{type(self).__name__}.build(inputs, scope_name) is not implemented: a backbone "
                                  "written on palm.backbone.Backbone builds its graph there (docs/palm_extending.md)")


def runs_own_build(backbone) -> bool:
    """Whether the engine builds `backbone`'s own graph: any backbone but ERNIE and BERT (also
    subclassed) used as they are."""
    return not isinstance(backbone, ERNIE) or type(backbone).build is not Backbone.build


class ERNIE(Backbone):
    """ERNIE's encoder: token, position, segment embeddings -> post-LN transformer -> pooled [CLS]."""

    model_type = "ernie"

    def __init__(self, hidden_size, num_hidden_layers, num_attention_heads, vocab_size, max_position_embeddings,
                 sent_type_vocab_size, task_type_vocab_size, hidden_act, hidden_dropout_prob,
                 attention_probs_dropout_prob, initializer_range, is_pairwise=False, phase="train",
                 intermediate_size=None, use_task_emb=None):
        super().__init__(phase)
        for name, value in (("hidden_size", hidden_size), ("num_hidden_layers", num_hidden_layers),
                            ("num_attention_heads", num_attention_heads), ("vocab_size", vocab_size),
                            ("max_position_embeddings", max_position_embeddings),
                            ("sent_type_vocab_size", sent_type_vocab_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{type(self).__name__}: {name} {value!r} must be a positive integer")
        if hidden_size % num_attention_heads:
            raise ValueError(f"{type(self).__name__}: hidden_size {hidden_size} is not divisible by "
                             f"num_attention_heads {num_attention_heads}")
        for name, value in (("hidden_dropout_prob", hidden_dropout_prob),
                            ("attention_probs_dropout_prob", attention_probs_dropout_prob)):
            if not 0.0 <= float(value) < 1.0:
                raise ValueError(f"{type(self).__name__}: {name} {value!r} must be within [0, 1)")
        self._hidden_size = hidden_size
        self._arch = {"hidden_size": hidden_size, "num_hidden_layers": num_hidden_layers,
                      "num_attention_heads": num_attention_heads, "vocab_size": vocab_size,
                      "max_position_embeddings": max_position_embeddings, "type_vocab_size": sent_type_vocab_size,
                      "hidden_act": str(hidden_act),
                      "intermediate_size": int(intermediate_size or 4 * hidden_size)}
        self._dropout = {"hidden_dropout_prob": float(hidden_dropout_prob),
                         "attention_probs_dropout_prob": float(attention_probs_dropout_prob)}
        self._task_type_vocab_size = task_type_vocab_size
        self._initializer_range = initializer_range
        self._is_pairwise = bool(is_pairwise)
        self._use_task_emb = None if use_task_emb is None else bool(use_task_emb)

    @classmethod
    def from_config(cls, config: Mapping[str, Any], phase: str = "train") -> "ERNIE":
        """The backbone of an `ernie_config.json` (a dict): PALM's required keys, `sent_type_vocab_size`
        or `type_vocab_size`, optional `task_type_vocab_size`, `is_pairwise`, `intermediate_size`."""
        missing = [k for k in _REQUIRED if k not in config]
        if "sent_type_vocab_size" not in config and "type_vocab_size" not in config:
            missing.append("sent_type_vocab_size (or type_vocab_size)")
        if missing:
            raise KeyError(f"{cls.__name__}.from_config: the config lacks {missing}")
        types = config.get("sent_type_vocab_size", config.get("type_vocab_size"))
        return cls(config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"],
                   config["vocab_size"], config["max_position_embeddings"], types,
                   config.get("task_type_vocab_size", types), config["hidden_act"], config["hidden_dropout_prob"],
                   config["attention_probs_dropout_prob"], config["initializer_range"],
                   is_pairwise=config.get("is_pairwise", False), phase=phase,
                   intermediate_size=config.get("intermediate_size"), use_task_emb=config.get("use_task_emb"))

    @property
    def inputs_attr(self) -> Dict[str, Any]:
        attrs = {"token_ids": [[-1, -1], "int64"], "position_ids": [[-1, -1], "int64"],
                 "segment_ids": [[-1, -1], "int64"], "input_mask": [[-1, -1, 1], "float32"]}
        if self.model_type == "ernie":
            attrs["task_ids"] = [[-1, -1], "int64"]
        if self._is_pairwise and self._phase == "train":
            attrs.update({f"{k}_neg": v for k, v in list(attrs.items())})
        return attrs

    @property
    def outputs_attr(self) -> Dict[str, Any]:
        h = self._hidden_size
        return {"word_embedding": [[-1, -1, h], "float32"], "embedding_table": [[-1, h], "float32"],
                "encoder_outputs": [[-1, -1, h], "float32"], "sentence_embedding": [[-1, h], "float32"],
                "sentence_pair_embedding": [[-1, h], "float32"]}

    @property
    def hidden_size(self) -> int:
        return self._hidden_size

    @property
    def is_pairwise(self) -> bool:
        return self._is_pairwise

    @property
    def use_task_emb(self) -> Optional[bool]:
        """PALM's task embedding: True adds it (the run's `use_task_id`), False or None (the default
        here) does not."""
        return self._use_task_emb

    def flags(self) -> Dict[str, Any]:
        """The engine's flags for this architecture (--model_type, --hidden_size, ..., dropout rates; a
        task embedding: --use_task_id)."""
        out = {"model_type": self.model_type, **self._arch, **self._dropout}
        if self._use_task_emb:
            out["use_task_id"] = True
        return out

    def same_model(self, other: "ERNIE") -> bool:
        """Whether `other` (e.g. the predict-phase backbone) is the same network."""
        return type(other) is type(self) and other._arch == self._arch


class BERT(ERNIE):
    """BERT's encoder: ERNIE's, without the task embedding input."""

    model_type = "bert"

    def __init__(self, hidden_size, num_hidden_layers, num_attention_heads, vocab_size, max_position_embeddings,
                 type_vocab_size, hidden_act, hidden_dropout_prob, attention_probs_dropout_prob, initializer_range,
                 is_pairwise=False, phase="train", intermediate_size=None, use_task_emb=None):
        if use_task_emb:
            raise ValueError("BERT(use_task_emb=True): BERT has no task embedding; use ERNIE")
        super().__init__(hidden_size, num_hidden_layers, num_attention_heads, vocab_size, max_position_embeddings,
                         type_vocab_size, None, hidden_act, hidden_dropout_prob, attention_probs_dropout_prob,
                         initializer_range, is_pairwise=is_pairwise, phase=phase, intermediate_size=intermediate_size)

    @classmethod
    def from_config(cls, config: Mapping[str, Any], phase: str = "train") -> "BERT":
        missing = [k for k in _REQUIRED if k not in config]
        if "sent_type_vocab_size" not in config and "type_vocab_size" not in config:
            missing.append("type_vocab_size (or sent_type_vocab_size)")
        if missing:
            raise KeyError(f"{cls.__name__}.from_config: the config lacks {missing}")
        return cls(config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"],
                   config["vocab_size"], config["max_position_embeddings"],
                   config.get("type_vocab_size", config.get("sent_type_vocab_size")), config["hidden_act"],
                   config["hidden_dropout_prob"], config["attention_probs_dropout_prob"], config["initializer_range"],
                   is_pairwise=config.get("is_pairwise", False), phase=phase,
                   intermediate_size=config.get("intermediate_size"))


__all__ = ["Backbone", "ERNIE", "BERT"]
