"""Typed configuration slices for the static trainer.

Each component receives only its slice (design habit 1). Every field carries its `--help` text in
`field.metadata["help"]`; the command-line flag is `--<field name>`. `validate()` reports every
problem of a slice at once as one `ConfigError` whose `problems` a caller can merge with others.

Defaults follow PaddleNLP's ERNIE 1.0 reference launch (`run_gb512_s1m_static.sh`) where its
`args.py` defaults are not sane (it has `max_lr` 1e-5 below `min_lr` 5e-5).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from data_tools.cli_utils import UserError


class ConfigError(UserError):
    """Bad user configuration. Each problem names the flag, the bad value and the fix."""

    def __init__(self, problems: Sequence[str]):
        problems = [problems] if isinstance(problems, str) else list(problems)
        if len(problems) == 1:
            message = problems[0]
        else:
            message = f"{len(problems)} configuration problems:\n" + "\n".join(f"  - {p}" for p in problems)
        ValueError.__init__(self, message)
        self.problems = problems


def _f(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


def _raise_if(problems: List[str]) -> None:
    if problems:
        raise ConfigError(problems)


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
MODEL_TYPES = ("ernie", "bert")
# Fields of ModelConfig that describe the architecture (None = take it from the name or directory).
ARCH_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
               "max_position_embeddings", "type_vocab_size", "hidden_act")
WEIGHTS_FILE = "model_state.pdparams"
CONFIG_FILES = ("config.json", "model_config.json")  # PaddleNLP >= 2.5, older PaddleNLP


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
        if os.path.isdir(source):  # a directory wins over a same-named architecture: it has weights
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
                f"with network access run `{_class_for(self.model_type)}.from_pretrained({source!r})"
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


def _class_for(model_type: str) -> str:
    return {"bert": "BertForPretraining"}.get(model_type, "ErnieForPretraining")


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


@dataclass(frozen=True)
class ParallelConfig:
    """How the work is spread over processes and memory."""

    dp_degree: int = _f(-1, "Data-parallel degree; -1 = number of processes / sharding degree.")
    sharding_degree: int = _f(1, "Sharding degree (parameters, gradients and optimizer states split across "
                                 "this many ranks); needs --use_sharding.")
    use_sharding: bool = _f(False, "Enable fleet sharding (requires --sharding_degree >= 2).")
    sharding_stage: int = _f(1, "Sharding stage; Paddle 2.6's static ShardingOptimizer has a single mode, "
                                "so only 1 is accepted.")
    micro_batch_size: int = _f(8, "Samples per process per executor run (one micro-batch).")
    global_batch_size: Optional[int] = _f(None, "Samples per optimizer step over all processes; default: "
                                                "micro batch x data-parallel world (no accumulation).")
    use_recompute: bool = _f(False, "Recompute every encoder layer in the backward pass (less memory, "
                                    "about a third more compute).")

    def validate(self) -> None:
        """Raise ConfigError listing every problem (topology arithmetic is checked by Topology)."""
        problems = []
        if self.use_sharding and self.sharding_degree < 2:
            problems.append(f"--use_sharding with --sharding_degree {self.sharding_degree} shards nothing; "
                            "set --sharding_degree >= 2 or drop --use_sharding")
        if not self.use_sharding and self.sharding_degree != 1:
            problems.append(f"--sharding_degree {self.sharding_degree} needs --use_sharding; add it or set "
                            "--sharding_degree 1")
        if self.sharding_stage != 1:
            problems.append(f"--sharding_stage {self.sharding_stage} is not available in static graphs "
                            "(Paddle 2.6's static ShardingOptimizer has one mode); use --sharding_stage 1")
        _raise_if(problems)


AMP_DTYPES = ("float16", "bfloat16")
AMP_LEVELS = ("O1", "O2")


@dataclass(frozen=True)
class AmpConfig:
    """Automatic mixed precision (GPU only: CPU builds insert no casts)."""

    use_amp: bool = _f(False, "Train with automatic mixed precision.")
    amp_dtype: str = _f("float16", 'Low-precision type: "float16" (with loss scaling) or "bfloat16".')
    amp_level: str = _f("O1", '"O1": white-listed ops in low precision; "O2": the whole model in low '
                              'precision with fp32 master weights.')
    custom_white_list: Tuple[str, ...] = _f(("softmax", "layer_norm", "gelu"),
                                            "Extra ops to run in low precision (PaddleNLP ERNIE's list).")
    custom_black_list: Tuple[str, ...] = _f(("c_softmax_with_cross_entropy",),
                                            "Extra ops to keep in float32.")
    init_loss_scaling: float = _f(32768.0, "Initial loss scale (float16).")
    use_dynamic_loss_scaling: bool = _f(True, "Adapt the loss scale to overflows (float16).")

    def validate(self) -> None:
        """Raise ConfigError listing every problem."""
        problems = []
        if self.amp_dtype not in AMP_DTYPES:
            problems.append(f"--amp_dtype {self.amp_dtype!r} is not supported; use one of {list(AMP_DTYPES)}")
        if self.amp_level not in AMP_LEVELS:
            problems.append(f"--amp_level {self.amp_level!r} is not supported; use one of {list(AMP_LEVELS)}")
        overlap = sorted(set(self.custom_white_list) & set(self.custom_black_list))
        if overlap:
            problems.append(f"--custom_white_list and --custom_black_list both name {overlap}; keep each op in "
                            "one list")
        if self.init_loss_scaling <= 0:
            problems.append(f"--init_loss_scaling {self.init_loss_scaling} must be > 0, e.g. 32768")
        _raise_if(problems)


@dataclass(frozen=True)
class OptimConfig:
    """AdamW, gradient clipping and the learning-rate schedule (in optimizer steps)."""

    max_lr: float = _f(1e-4, "Peak learning rate, reached at the end of warm-up.")
    min_lr: float = _f(1e-5, "Final learning rate, reached at --decay_steps and held after.")
    warmup_rate: float = _f(0.01, "Fraction of --max_steps spent warming up linearly from 0 to --max_lr.")
    decay_steps: Optional[int] = _f(None, "Step at which linear decay reaches --min_lr; default: --max_steps.")
    max_steps: int = _f(500000, "Total optimizer steps.")
    weight_decay: float = _f(0.01, "AdamW decoupled weight decay (never applied to biases and norms).")
    grad_clip: float = _f(1.0, "Clip gradients to this global L2 norm; 0 disables clipping.")
    adam_beta1: float = _f(0.9, "AdamW beta1.")
    adam_beta2: float = _f(0.999, "AdamW beta2.")
    adam_epsilon: float = _f(1e-8, "AdamW epsilon.")

    @property
    def warmup_steps(self) -> int:
        """Warm-up length in optimizer steps."""
        return int(self.warmup_rate * self.max_steps)

    @property
    def resolved_decay_steps(self) -> int:
        """Step at which the learning rate reaches min_lr."""
        return self.max_steps if self.decay_steps is None else self.decay_steps

    def validate(self) -> None:
        """Raise ConfigError listing every problem."""
        problems = []
        if self.max_steps < 1:
            problems.append(f"--max_steps {self.max_steps} must be >= 1")
        if self.max_lr <= 0:
            problems.append(f"--max_lr {self.max_lr} must be > 0, e.g. 1e-4")
        if not 0 <= self.min_lr <= self.max_lr:
            problems.append(f"--min_lr {self.min_lr} must be within [0, --max_lr {self.max_lr}], e.g. 1e-5")
        if not 0 <= self.warmup_rate < 1:
            problems.append(f"--warmup_rate {self.warmup_rate} must be within [0, 1), e.g. 0.01")
        elif self.max_steps >= 1 and self.resolved_decay_steps <= self.warmup_steps:
            problems.append(f"--decay_steps {self.resolved_decay_steps} must be greater than the warm-up "
                            f"steps {self.warmup_steps} (--warmup_rate {self.warmup_rate} x --max_steps "
                            f"{self.max_steps})")
        if self.weight_decay < 0:
            problems.append(f"--weight_decay {self.weight_decay} must be >= 0, e.g. 0.01")
        if self.grad_clip < 0:
            problems.append(f"--grad_clip {self.grad_clip} must be >= 0 (0 disables clipping)")
        for name in ("adam_beta1", "adam_beta2"):
            value = getattr(self, name)
            if not 0 <= value < 1:
                problems.append(f"--{name} {value} must be within [0, 1)")
        if self.adam_epsilon <= 0:
            problems.append(f"--adam_epsilon {self.adam_epsilon} must be > 0, e.g. 1e-8")
        _raise_if(problems)


def field_help(cls: type) -> Dict[str, str]:
    """`{field name: help text}` of a config slice (for building the command line)."""
    return {f.name: f.metadata.get("help", "") for f in fields(cls)}
