"""ERNIE 1.0 / PaddlePALM static parameter directories (one file per variable, static names) as
pretrained weights: the name table, the files, the architecture from ernie_config.json, the loaded
values, and one clear error naming every missing or extra variable. The directories are built here
from a tiny model's weights (nothing is downloaded)."""
import zlib  # noqa: F401  (before paddle)

import json

import numpy as np
import pytest

from ernie_mtl.config import ARCHITECTURES, ConfigError, ModelConfig
from ernie_mtl.program.static_params import (read_static_params, static_name, structured_name, to_static_names,
                                             write_static_params)
from helpers import scope_and_exe

pytestmark = pytest.mark.usefixtures("static_mode")

TINY = {k: v for k, v in ARCHITECTURES["ernie-tiny-test"].items() if k != "model_type"}
# ernie_config.json as ERNIE 1.0 / PALM write it: sent_type_vocab_size, no intermediate_size (4 x hidden)
PALM_CONFIG = {"attention_probs_dropout_prob": 0.0, "hidden_act": "relu", "hidden_dropout_prob": 0.0,
               "hidden_size": 32, "initializer_range": 0.02, "max_position_embeddings": 128,
               "num_attention_heads": 2, "num_hidden_layers": 2, "sent_type_vocab_size": 2, "vocab_size": 1000}


def ernie_1_0_params(folder, seed=3):
    """A PALM pretrain folder: params/ (a tiny ERNIE's weights and pretraining heads under ERNIE 1.0's
    static names), ernie_config.json beside it; returns (params dir, {static name: array})."""
    import paddle

    with paddle.base.dygraph.guard():
        from paddlenlp.transformers import ErnieConfig, ErnieForPretraining

        paddle.seed(seed)
        arch = {**TINY, "intermediate_size": 4 * TINY["hidden_size"]}
        state = {k: v.numpy() for k, v in ErnieForPretraining(ErnieConfig(**arch)).state_dict().items()}
    arrays = to_static_names(state)
    write_static_params(folder / "params", arrays)
    (folder / "ernie_config.json").write_text(json.dumps(PALM_CONFIG))
    return folder / "params", arrays


def test_the_name_table_covers_erniemodel_both_ways():
    import paddle

    with paddle.base.dygraph.guard():
        from paddlenlp.transformers import ErnieConfig, ErnieForPretraining

        keys = list(ErnieForPretraining(ErnieConfig(**TINY)).state_dict())
    untied = [k for k in keys if k != "cls.predictions.decoder.weight" and k != "cls.predictions.decoder.bias"]
    for key in untied:
        name = static_name(key)
        assert name is not None, key
        assert structured_name(name) == key.split(".", 1)[1] if key.startswith("ernie.") else key
    assert (static_name("ernie.encoder.layers.1.self_attn.q_proj.weight")
            == "encoder_layer_1_multi_head_att_query_fc.w_0")
    assert static_name("ernie.encoder.layers.0.norm2.bias") == "encoder_layer_0_post_ffn_layer_norm_bias"
    assert structured_name("encoder_layer_11_ffn_fc_1.b_0") == "encoder.layers.11.linear2.bias"
    assert structured_name("pre_encoder_layer_norm_scale") == "embeddings.layer_norm.weight"
    assert structured_name("encoder_layer_0_multi_head_att_query_fc.w_0_moment1_0") is None
    assert structured_name("@LR_DECAY_COUNTER@") is None


def test_files_are_paddle_tensors_read_back_exactly(tmp_path):
    params, arrays = ernie_1_0_params(tmp_path)
    assert (params / "word_embedding").is_file() and (params / "encoder_layer_1_ffn_fc_0.w_0").is_file()
    back = read_static_params(params)
    assert sorted(back) == sorted(arrays)
    assert all(np.array_equal(back[k], arrays[k]) and back[k].dtype == arrays[k].dtype for k in arrays)
    (params / "notes.txt").write_text("not a tensor")
    with pytest.raises(ConfigError, match="notes.txt: not a Paddle parameter file"):
        read_static_params(params)


def test_the_architecture_comes_from_ernie_config_json_beside_the_params(tmp_path):
    params, _ = ernie_1_0_params(tmp_path)
    r = ModelConfig(model_name_or_path=str(params)).resolve()
    assert r.weights == params
    assert {k: r.arch[k] for k in ("hidden_size", "num_hidden_layers", "type_vocab_size", "intermediate_size",
                                   "hidden_act", "vocab_size")} == {
        "hidden_size": 32, "num_hidden_layers": 2, "type_vocab_size": 2, "intermediate_size": 128,
        "hidden_act": "relu", "vocab_size": 1000}
    with pytest.raises(ConfigError, match="--num_hidden_layers 3 differs from 2"):
        ModelConfig(model_name_or_path=str(params), num_hidden_layers=3).resolve()
    (tmp_path / "ernie_config.json").unlink()
    with pytest.raises(ConfigError, match="without an ernie_config.json / bert_config.json / config.json in it or "
                                          "beside it"):
        ModelConfig(model_name_or_path=str(params)).resolve()
    flags = {k: TINY[k] for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                                  "max_position_embeddings", "type_vocab_size", "hidden_act")}
    assert ModelConfig(model_name_or_path=str(params), intermediate_size=128, **flags).resolve().weights == params


def test_load_pretrain_from_a_static_directory_gives_the_saved_values(build_programs, tmp_path):
    params, arrays = ernie_1_0_params(tmp_path)
    p = build_programs(model=ModelConfig(model_name_or_path=str(params), hidden_dropout_prob=0.0,
                                         attention_probs_dropout_prob=0.0))
    scope, _ = scope_and_exe(p)  # initialize() loads the weights, the pretraining head's too
    loaded = 0
    for structured, static in p.paddlenlp_name_map.items():
        name = static_name(structured)
        if name in arrays:
            np.testing.assert_array_equal(np.array(scope.find_var(static).get_tensor()), arrays[name])
            loaded += 1
    assert loaded == len(arrays)  # every file went somewhere: backbone, MLM head, next-sentence head


def test_missing_and_extra_variables_are_named_and_nothing_is_written(build_programs, tmp_path):
    from ernie_mtl.program.builder import load_pretrained_into_scope
    from helpers import params as values_of

    folder, arrays = ernie_1_0_params(tmp_path)
    p = build_programs(model=ModelConfig(model_name_or_path="ernie-tiny-test", intermediate_size=128))
    scope, _ = scope_and_exe(p)
    before = values_of(p, scope)
    (folder / "encoder_layer_1_post_ffn_layer_norm_scale").unlink()
    write_static_params(folder, {"encoder_layer_2_ffn_fc_0.w_0": np.zeros((32, 128), "float32"),
                                 "encoder_layer_0_ffn_fc_0.w_0_moment1_0": np.zeros((32, 128), "float32")})
    with pytest.raises(ConfigError) as e:
        load_pretrained_into_scope(folder, p.paddlenlp_name_map, scope)
    assert e.value.problems == [
        f"{folder} lacks 1 of the model's parameters: ernie.encoder.layers.1.norm2.weight (variables named as in "
        "ERNIE 1.0 / PALM: encoder_layer_1_post_ffn_layer_norm_scale); the architecture (flags or "
        "ernie_config.json) does not match these weights",
        f"{folder} holds 2 variable(s) the model has no parameter for: encoder_layer_0_ffn_fc_0.w_0_moment1_0, "
        "encoder_layer_2_ffn_fc_0.w_0; the architecture (flags or ernie_config.json: layers, task embedding) does "
        "not match these weights, or the directory holds other files (it must hold the model's parameters only)"]
    assert all(np.array_equal(v, values_of(p, scope)[k]) for k, v in before.items())


def test_pretraining_heads_in_the_directory_are_skipped_by_a_fine_tuning_model(tmp_path):
    """ERNIE's published params/ hold its pretraining heads (mask_lm_*, next_sent_fc): a model without a
    pretraining head loads the backbone and leaves them, as every ERNIE fine-tuning does."""
    from ernie_mtl.program.builder import _static_state

    folder, arrays = ernie_1_0_params(tmp_path)
    assert "mask_lm_trans_fc.w_0" in arrays and "next_sent_fc.w_0" in arrays
    backbone = {f"ernie.{structured_name(n)}": n for n in arrays if not structured_name(n).startswith("cls.")}
    state, extra = _static_state(folder, backbone, optional=None)
    assert extra == [] and "cls.seq_relationship.weight" in state
