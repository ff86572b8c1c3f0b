"""ERNIE 1.0 / PaddlePALM static parameter directories: one file per variable, named by the static
graph (`word_embedding`, `encoder_layer_0_multi_head_att_query_fc.w_0`, ...), mapped by name onto
PaddleNLP's structured names (`embeddings.word_embeddings.weight`, `encoder.layers.0.self_attn.q_proj.weight`).

The format is what `fluid.io.save_params` / `save_persistables` wrote (ERNIE 1.0's `params/`, PALM's
`pretrain/<model>/params` and `ckpt.step<N>`): every file is one LoDTensor in Paddle's binary
serialization, read and written here with Paddle's own `load_lod_tensor` / `save_lod_tensor`. The
name table (ERNIE's `model/ernie.py` and PALM's `backbone/ernie.py` build the same names; PALM's BERT
too, without the task embedding):

    word_embedding / pos_embedding / sent_embedding / task_embedding
        -> embeddings.{word,position,token_type,task_type}_embeddings.weight
    pre_encoder_layer_norm_{scale,bias}                    -> embeddings.layer_norm.{weight,bias}
    encoder_layer_<i>_multi_head_att_{query,key,value,output}_fc.{w_0,b_0}
        -> encoder.layers.<i>.self_attn.{q,k,v,out}_proj.{weight,bias}
    encoder_layer_<i>_post_att_layer_norm_{scale,bias}    -> encoder.layers.<i>.norm1.{weight,bias}
    encoder_layer_<i>_ffn_fc_{0,1}.{w_0,b_0}               -> encoder.layers.<i>.linear{1,2}.{weight,bias}
    encoder_layer_<i>_post_ffn_layer_norm_{scale,bias}    -> encoder.layers.<i>.norm2.{weight,bias}
    pooled_fc.{w_0,b_0}                                    -> pooler.dense.{weight,bias}
    mask_lm_trans_fc.{w_0,b_0}, mask_lm_trans_layer_norm_{scale,bias}, mask_lm_out_fc.b_0, next_sent_fc.{w_0,b_0}
        -> cls.predictions.transform.*, cls.predictions.layer_norm.*, cls.predictions.decoder_bias,
           cls.seq_relationship.*  (ERNIE's pretraining heads: PaddleNLP's ErnieForPretraining)

No transposes: a static `fc` weight is [in, out] like `paddle.nn.Linear`, embeddings are [rows, hidden].
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Tuple

import numpy as np

from ernie_mtl.config import ConfigError
from ernie_mtl.config.model import STATIC_PARAMS_MARKER, is_static_params_dir  # noqa: F401  (re-exported)

_EMBEDDINGS = {"word_embedding": "embeddings.word_embeddings.weight",
               "pos_embedding": "embeddings.position_embeddings.weight",
               "sent_embedding": "embeddings.token_type_embeddings.weight",
               "task_embedding": "embeddings.task_type_embeddings.weight",
               "pre_encoder_layer_norm_scale": "embeddings.layer_norm.weight",
               "pre_encoder_layer_norm_bias": "embeddings.layer_norm.bias",
               "pooled_fc.w_0": "pooler.dense.weight", "pooled_fc.b_0": "pooler.dense.bias"}
_PRETRAINING_HEADS = {"mask_lm_trans_fc.w_0": "cls.predictions.transform.weight",
                      "mask_lm_trans_fc.b_0": "cls.predictions.transform.bias",
                      "mask_lm_trans_layer_norm_scale": "cls.predictions.layer_norm.weight",
                      "mask_lm_trans_layer_norm_bias": "cls.predictions.layer_norm.bias",
                      "mask_lm_out_fc.b_0": "cls.predictions.decoder_bias",
                      "next_sent_fc.w_0": "cls.seq_relationship.weight",
                      "next_sent_fc.b_0": "cls.seq_relationship.bias"}
_LAYER_PARTS = {"multi_head_att_query_fc": "self_attn.q_proj", "multi_head_att_key_fc": "self_attn.k_proj",
                "multi_head_att_value_fc": "self_attn.v_proj", "multi_head_att_output_fc": "self_attn.out_proj",
                "ffn_fc_0": "linear1", "ffn_fc_1": "linear2"}
_LAYER_NORMS = {"post_att_layer_norm": "norm1", "post_ffn_layer_norm": "norm2"}
_SUFFIX = {"w_0": "weight", "b_0": "bias", "scale": "weight", "bias": "bias"}
_LAYER = re.compile(r"^encoder_layer_(\d+)_(.+?)(?:\.(w_0|b_0)|_(scale|bias))$")


def structured_name(static: str) -> Optional[str]:
    """The PaddleNLP structured name of an ERNIE static variable, without the `ernie.`/`bert.` prefix
    (`cls.*` for the pretraining heads); None when the name is not one of the table's."""
    if static in _EMBEDDINGS:
        return _EMBEDDINGS[static]
    if static in _PRETRAINING_HEADS:
        return _PRETRAINING_HEADS[static]
    m = _LAYER.match(static)
    if not m:
        return None
    layer, part, fc_suffix, norm_suffix = m.groups()
    if fc_suffix and part in _LAYER_PARTS:
        return f"encoder.layers.{int(layer)}.{_LAYER_PARTS[part]}.{_SUFFIX[fc_suffix]}"
    if norm_suffix and part in _LAYER_NORMS:
        return f"encoder.layers.{int(layer)}.{_LAYER_NORMS[part]}.{_SUFFIX[norm_suffix]}"
    return None


def static_name(structured: str) -> Optional[str]:
    """The ERNIE static name of a structured name (with or without the `ernie.`/`bert.` prefix)."""
    key = structured.split(".", 1)[1] if structured.split(".", 1)[0] in ("ernie", "bert") else structured
    for table in (_EMBEDDINGS, _PRETRAINING_HEADS):
        for static, name in table.items():
            if name == key:
                return static
    m = re.match(r"^encoder\.layers\.(\d+)\.(.+)\.(weight|bias)$", key)
    if not m:
        return None
    layer, part, kind = m.groups()
    for static_part, name in _LAYER_PARTS.items():
        if name == part:
            return f"encoder_layer_{layer}_{static_part}.{'w_0' if kind == 'weight' else 'b_0'}"
    for static_part, name in _LAYER_NORMS.items():
        if name == part:
            return f"encoder_layer_{layer}_{static_part}_{'scale' if kind == 'weight' else 'bias'}"
    return None


# VarType codes of a TensorDesc (framework.proto) -> bytes per element
_ELEMENT_BYTES = {0: 1, 1: 2, 2: 4, 3: 8, 4: 2, 5: 4, 6: 8, 20: 1, 21: 1, 22: 2, 23: 8, 24: 16}


def tensor_file_problem(path: os.PathLike) -> Optional[str]:
    """What is wrong with a Paddle tensor file (`save_lod_tensor`'s format: version, LoD levels, a
    TensorDesc, then the raw data), judged from its header and size before Paddle reads it -- Paddle's
    loader fills a truncated file's missing bytes with zeros and trains on them -- or None."""
    import struct

    from paddle.base.proto import framework_pb2

    path = Path(path)
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            head = f.read(1 << 20)
        offset = 4  # the format version
        (levels,) = struct.unpack_from("<Q", head, offset)
        offset += 8
        if levels > 16:
            return f"not a Paddle parameter file (its header declares {levels} LoD levels)"
        for _ in range(levels):
            (n,) = struct.unpack_from("<Q", head, offset)
            offset += 8 + n
        offset += 4  # the tensor version
        (desc_size,) = struct.unpack_from("<i", head, offset)
        offset += 4
        if not 0 < desc_size <= len(head) - offset:
            return f"not a Paddle parameter file (its header is damaged: a tensor description of {desc_size} bytes)"
        desc = framework_pb2.VarType.TensorDesc()
        desc.ParseFromString(head[offset:offset + desc_size])
        offset += desc_size
    except Exception as e:  # noqa: BLE001  (struct.error, protobuf's DecodeError, ...)
        return f"not a Paddle parameter file (its header is damaged: {type(e).__name__})"
    dims = list(desc.dims)
    if desc.data_type not in _ELEMENT_BYTES or any(d < 0 for d in dims):
        return f"not a Paddle parameter file (its header is damaged: data type {desc.data_type}, shape {dims})"
    expected = offset + int(np.prod(dims, dtype=np.int64)) * _ELEMENT_BYTES[desc.data_type]
    if size < expected:
        return (f"it is truncated: {size:,} bytes, its header declares a {dims} tensor that needs {expected:,} (Paddle "
                "would fill the missing values with zeros)")
    if size > expected:
        return f"not a Paddle parameter file ({size - expected:,} bytes after the {dims} tensor its header declares)"
    return None


def read_static_params(path: os.PathLike) -> Dict[str, np.ndarray]:
    """{static name: array} of every file of the directory `path` (hidden files aside); ConfigError
    naming each file that is not a whole Paddle tensor file (a truncated one included: `tensor_file_problem`)."""
    from paddle.base import core

    path = Path(path)
    out: Dict[str, np.ndarray] = {}
    bad: List[str] = []
    for f in sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith(".")):
        problem = tensor_file_problem(f)
        if problem:
            bad.append(f"{f}: {problem}")
            continue
        tensor = core.LoDTensor()
        try:
            core.load_lod_tensor(tensor, str(f))
            out[f.name] = np.array(tensor)
        except Exception as e:  # noqa: BLE001  (Paddle raises generic errors for a foreign file)
            bad.append(f"{f}: not a Paddle parameter file ({type(e).__name__}: "
                       f"{str(e).strip().splitlines()[-1][:120] if str(e).strip() else 'unreadable'})")
    if bad:
        raise ConfigError(bad + [f"{path} should hold one whole Paddle tensor file per variable (ERNIE 1.0's or "
                                 "PALM's params/ directory): copy the damaged files again, and remove other files"])
    return out


def write_static_params(path: os.PathLike, arrays: Mapping[str, np.ndarray]) -> Path:
    """Write `arrays` ({static name: array}) as one tensor file each into the directory `path`
    (created): what `fluid.io.save_params` wrote, so PALM and ERNIE 1.0 code read it too."""
    import paddle
    from paddle.base import core

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    for name, array in arrays.items():
        tensor = core.LoDTensor()
        tensor.set(np.ascontiguousarray(array), paddle.CPUPlace())
        core.save_lod_tensor(tensor, str(path / name))
    return path


def to_static_names(state: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """A PaddleNLP state dict (ErnieModel / ErnieForPretraining / BertModel keys) under ERNIE's static
    names; keys without a static name (e.g. the tied `cls.predictions.decoder.weight`) are left out."""
    out = {}
    for key, value in state.items():
        name = static_name(key)
        if name is not None:
            out[name] = np.asarray(value)
    return out


def structured_state(path: os.PathLike) -> Tuple[Dict[str, np.ndarray], List[str]]:
    """(state under structured names without the family prefix, static names with no structured name)
    of the static parameter directory `path`."""
    state: Dict[str, np.ndarray] = {}
    unknown: List[str] = []
    for name, array in read_static_params(path).items():
        key = structured_name(name)
        if key is None:
            unknown.append(name)
        else:
            state[key] = array
    # PaddleNLP names the MLM decoder twice: its weight is tied to the word embedding, its bias is also
    # held as `decoder_bias`; ERNIE's static graph has each once.
    if "cls.predictions.decoder_bias" in state:
        state["cls.predictions.decoder.bias"] = state["cls.predictions.decoder_bias"]
        if "embeddings.word_embeddings.weight" in state:
            state["cls.predictions.decoder.weight"] = state["embeddings.word_embeddings.weight"]
    return state, unknown
