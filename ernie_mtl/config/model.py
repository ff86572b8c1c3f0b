"""Which network to build: known architectures (random initialisation) or a local PaddleNLP directory."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple

from ernie_mtl.config.errors import ConfigError, raise_if as _raise_if
from ernie_mtl.config.values import cfg_field as _f

# Architectures known by name: PaddleNLP's configurations (`pretrained_init_configuration`) plus tiny
# sizes for tests and CPU demos. A name always means random initialisation: weights are never
# downloaded; pretrained weights come from a local PaddleNLP directory.
_ERNIE_1_0_BASE = dict(model_type="ernie", vocab_size=18000, hidden_size=768, num_hidden_layers=12,
                       num_attention_heads=12, intermediate_size=3072, max_position_embeddings=513,
                       type_vocab_size=2, hidden_act="relu", initializer_range=0.02, pad_token_id=0)
ARCHITECTURES: Dict[str, Dict[str, Any]] = {
    "ernie-1.0-base-zh": _ERNIE_1_0_BASE,
    "ernie-1.0": _ERNIE_1_0_BASE,
    "ernie-small": dict(_ERNIE_1_0_BASE, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                        intermediate_size=1024),
    "ernie-mini": dict(_ERNIE_1_0_BASE, hidden_size=128, num_hidden_layers=4, num_attention_heads=2,
                       intermediate_size=512),
    "ernie-tiny-test": dict(_ERNIE_1_0_BASE, vocab_size=1000, hidden_size=32, num_hidden_layers=2,
                            num_attention_heads=2, intermediate_size=64, max_position_embeddings=128),
    "bert-base-chinese": dict(model_type="bert", vocab_size=21128, hidden_size=768, num_hidden_layers=12,
                              num_attention_heads=12, intermediate_size=3072, max_position_embeddings=512,
                              type_vocab_size=2, hidden_act="gelu", initializer_range=0.02, pad_token_id=0),
    "bert-tiny-test": dict(model_type="bert", vocab_size=1000, hidden_size=32, num_hidden_layers=2,
                           num_attention_heads=2, intermediate_size=64, max_position_embeddings=128,
                           type_vocab_size=2, hidden_act="gelu", initializer_range=0.02, pad_token_id=0),
}


@dataclass(frozen=True)
class ModelFamily:
    """A model family: the names of its paddlenlp classes (the one table every layer reads)."""

    name: str
    config: str
    model: str
    pretraining: str
    tokenizer: str

    def classes(self):
        """(config, model, pretraining, tokenizer) classes from paddlenlp.transformers."""
        import paddlenlp.transformers as transformers

        return tuple(getattr(transformers, n) for n in (self.config, self.model, self.pretraining, self.tokenizer))


MODEL_FAMILIES = {
    "ernie": ModelFamily("ernie", "ErnieConfig", "ErnieModel", "ErnieForPretraining", "ErnieTokenizer"),
    "bert": ModelFamily("bert", "BertConfig", "BertModel", "BertForPretraining", "BertTokenizer"),
}
MODEL_TYPES = tuple(MODEL_FAMILIES)


def model_family(model_type: str) -> ModelFamily:
    if model_type not in MODEL_FAMILIES:
        raise ValueError(f"model_type {model_type!r} is not one of {list(MODEL_FAMILIES)}")
    return MODEL_FAMILIES[model_type]
# Fields of ModelConfig that describe the architecture (None = take it from the name or directory).
ARCH_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
               "max_position_embeddings", "type_vocab_size", "hidden_act")
WEIGHTS_FILE = "model_state.pdparams"
CONFIG_FILES = ("config.json", "model_config.json")  # PaddleNLP >= 2.5, older PaddleNLP
# A static parameter directory (ERNIE 1.0's / PaddlePALM's `params/`: one file per variable) holds this
# file; its architecture is an ERNIE config JSON in the directory or beside it (PALM's
# pretrain/<model>/{params/, ernie_config.json, vocab.txt}); ernie_mtl/program/static_params.py reads it.
STATIC_PARAMS_MARKER = "word_embedding"
STATIC_CONFIG_FILES = ("ernie_config.json", "bert_config.json", "config.json")


def is_static_params_dir(path: os.PathLike) -> bool:
    """Whether `path` is an ERNIE 1.0 / PALM static parameter directory (it holds `word_embedding`)."""
    return os.path.isfile(os.path.join(path, STATIC_PARAMS_MARKER))


def static_config_file(path: os.PathLike) -> Optional[Path]:
    """The ERNIE config JSON of a static parameter directory: in it, else in its parent folder."""
    for folder in (Path(path), Path(path).parent):
        for name in STATIC_CONFIG_FILES:
            if (folder / name).is_file():
                return folder / name
    return None


def palm_arch(config: Mapping[str, Any], where: str) -> Dict[str, Any]:
    """The architecture of an ERNIE/BERT config JSON as ERNIE 1.0 and PaddlePALM write it
    (`ernie_config.json`), in PaddleNLP's keys: `sent_type_vocab_size` is `type_vocab_size`, and an
    absent `intermediate_size` is 4 x hidden_size (the FFN those models build). Dropout rates are not
    architecture (they are flags). ConfigError for keys of the wrong type."""
    raw = dict(config)
    if "type_vocab_size" not in raw and "sent_type_vocab_size" in raw:
        raw["type_vocab_size"] = raw["sent_type_vocab_size"]
    if "intermediate_size" not in raw and isinstance(raw.get("hidden_size"), int):
        raw["intermediate_size"] = 4 * raw["hidden_size"]
    arch = {k: raw[k] for k in ARCH_FIELDS if raw.get(k) is not None}
    bad = [f"{k}: {v!r}" for k, v in arch.items() if (k == "hidden_act") != isinstance(v, str)
           or isinstance(v, bool)]
    if bad:
        raise ConfigError([f"{where}: {', '.join(bad)} (integers, and a string for hidden_act, expected)"])
    for key in ("initializer_range", "pad_token_id", "task_type_vocab_size"):
        if raw.get(key) is not None:
            arch[key] = raw[key]
    return arch


@dataclass(frozen=True)
class ModelConfig:
    """Which network to build and from what."""

    model_type: str = _f("ernie", 'Model family: "ernie" or "bert" (paddlenlp ErnieForPretraining / '
                                  'BertForPretraining).')
    model_name_or_path: str = _f("ernie-1.0-base-zh",
                                 "A local PaddleNLP model directory (config.json + model_state.pdparams: "
                                 "weights are loaded) or a known architecture name (initialised randomly).")
    vocab_size: Optional[int] = _f(None, "Vocabulary size; default: from the architecture (set it to the "
                                         "tokenizer's size for a new vocabulary).")
    hidden_size: Optional[int] = _f(None, "Hidden size; default: from the architecture.")
    num_hidden_layers: Optional[int] = _f(None, "Number of encoder layers; default: from the architecture.")
    num_attention_heads: Optional[int] = _f(None, "Attention heads per layer; default: from the architecture.")
    intermediate_size: Optional[int] = _f(None, "Feed-forward inner size; default: from the architecture.")
    max_position_embeddings: Optional[int] = _f(None, "Position-embedding rows (longest sequence); default: "
                                                      "from the architecture.")
    type_vocab_size: Optional[int] = _f(None, "Segment (token type) vocabulary; default: from the architecture.")
    hidden_act: Optional[str] = _f(None, 'Feed-forward activation ("relu", "gelu"); default: from the '
                                         'architecture.')
    hidden_dropout_prob: float = _f(0.1, "Dropout on embeddings and every sub-layer output.")
    attention_probs_dropout_prob: float = _f(0.1, "Dropout on attention probabilities.")
    binary_head: bool = _f(True, "Train the sentence-pair head (NSP/SOP loss) besides masked LM.")

    def validate(self) -> None:
        """Raise ConfigError listing every problem (the directory/name itself is checked by resolve())."""
        problems = []
        if self.model_type not in MODEL_TYPES:
            problems.append(f"--model_type {self.model_type!r} is not supported; use one of {list(MODEL_TYPES)}")
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "intermediate_size", "max_position_embeddings", "type_vocab_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                problems.append(f"--{name} {value} must be a positive integer (or unset to take the "
                                "architecture's value)")
        if self.hidden_size and self.num_attention_heads and self.hidden_size % self.num_attention_heads:
            problems.append(f"--hidden_size {self.hidden_size} must be divisible by --num_attention_heads "
                            f"{self.num_attention_heads}")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                problems.append(f"--{name} {value} must be within [0, 1), e.g. 0.1")
        _raise_if(problems)

    def resolve(self) -> "ResolvedModel":
        """The architecture to build and the weights to load, from the name or local directory.

        Never downloads: a name that is neither known here nor a local directory is an error that
        says how to provide the weights.
        """
        self.validate()
        source = self.model_name_or_path
        weights: Optional[Path] = None
        if os.path.isdir(source) and is_static_params_dir(source):  # ERNIE 1.0 / PALM params/
            arch, weights = _read_static_dir(Path(source)), Path(source)
        elif os.path.isdir(source):  # a directory wins over a same-named architecture: it has weights
            arch, weights = _read_model_dir(Path(source))
        elif source in ARCHITECTURES:
            arch = dict(ARCHITECTURES[source])
        elif os.sep in source or source.startswith((".", "~")):
            raise ConfigError([f"--model_name_or_path {source!r}: no such directory; give a PaddleNLP model "
                               f"directory ({' or '.join(CONFIG_FILES)} + {WEIGHTS_FILE}) or one of the known "
                               f"architectures {sorted(ARCHITECTURES)}"])
        else:
            raise ConfigError([
                f"--model_name_or_path {source!r} is neither a local directory nor a known architecture "
                f"{sorted(ARCHITECTURES)}. Pretrained weights are never downloaded at run time: on a machine "
                f"with network access run `{model_family(self.model_type).pretraining}.from_pretrained({source!r})"
                f".save_pretrained('DIR')` (paddlenlp), copy DIR here and pass --model_name_or_path DIR"])
        if arch.get("model_type", self.model_type) != self.model_type:
            raise ConfigError([f"--model_type {self.model_type!r} does not match {source!r}, which is a "
                               f"{arch['model_type']!r} model; pass --model_type {arch['model_type']}"])
        problems = []
        for name in ARCH_FIELDS:
            value = getattr(self, name)
            if value is None:
                continue
            if weights is not None and arch.get(name) is not None and arch[name] != value:
                problems.append(f"--{name} {value} differs from {arch[name]} in {source} whose weights are "
                                f"loaded; drop --{name} (or start from a name to train from scratch)")
            arch[name] = value
        _raise_if(problems)
        arch.update(model_type=self.model_type, hidden_dropout_prob=self.hidden_dropout_prob,
                    attention_probs_dropout_prob=self.attention_probs_dropout_prob)
        missing = [n for n in ARCH_FIELDS if arch.get(n) is None]
        if missing and weights is not None and is_static_params_dir(source) and static_config_file(source) is None:
            raise ConfigError([f"--model_name_or_path {source}: a static parameter directory without an "
                               f"{' / '.join(STATIC_CONFIG_FILES)} in it or beside it, so its architecture is unknown; "
                               f"put the model's ernie_config.json beside it or pass {missing} as flags"])
        if missing:
            raise ConfigError([f"--model_name_or_path {source}: its config lacks {missing}; add them to the "
                               "config file or pass them as flags"])
        if arch["hidden_size"] % arch["num_attention_heads"]:
            raise ConfigError([f"hidden size {arch['hidden_size']} of {source} is not divisible by "
                               f"{arch['num_attention_heads']} attention heads"])
        return ResolvedModel(arch=arch, weights=weights, source=source)


@dataclass(frozen=True)
class ResolvedModel:
    """A buildable architecture (paddlenlp config keys, plus model_type) and, for a local directory,
    its weights file."""

    arch: Dict[str, Any]
    weights: Optional[Path]
    source: str


def _read_static_dir(path: Path) -> Dict[str, Any]:
    """The architecture of a static parameter directory, from its ERNIE config JSON ({} without one:
    the flags must then give it)."""
    config_file = static_config_file(path)
    if config_file is None:
        return {}
    try:
        raw = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConfigError([f"--model_name_or_path {path}: cannot read {config_file}: {e}"]) from e
    if not isinstance(raw, dict):
        raise ConfigError([f"--model_name_or_path {path}: {config_file} is not a JSON object"])
    return palm_arch(raw, str(config_file))


def _read_model_dir(path: Path) -> Tuple[Dict[str, Any], Path]:
    config_file = next((path / n for n in CONFIG_FILES if (path / n).is_file()), None)
    if config_file is None:
        raise ConfigError([f"--model_name_or_path {path}: no {' or '.join(CONFIG_FILES)} in that directory; "
                           "it must be a PaddleNLP model directory as written by save_pretrained()"])
    weights = path / WEIGHTS_FILE
    if not weights.is_file():
        raise ConfigError([f"--model_name_or_path {path}: {WEIGHTS_FILE} is missing, so there are no weights "
                           f"to load. Copy the PaddleNLP weights file there (save_pretrained() writes it), or "
                           f"pass a known architecture name {sorted(ARCHITECTURES)} to start from random weights"])
    try:
        raw = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConfigError([f"--model_name_or_path {path}: cannot read {config_file.name}: {e}"]) from e
    if isinstance(raw.get("init_args"), list) and raw["init_args"] and isinstance(raw["init_args"][0], dict):
        raw = {**raw["init_args"][0], **{k: v for k, v in raw.items() if k != "init_args"}}  # older layout
    # keep every key (use_task_id, layer_norm_eps, ...): the weights were trained with them
    return {k: v for k, v in raw.items() if k not in ("init_class", "architectures", "paddlenlp_version")}, weights
