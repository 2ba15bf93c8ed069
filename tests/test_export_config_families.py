"""Reading the configs of phi, lfm2, lfm2_moe, hunyuan_v1_dense and gpt_oss: both layouts, the
rotaries transformers computes, and a refusal naming the field for what MNN's graph cannot express."""
from __future__ import annotations

import numpy as np
import pytest

from mnnllm_core.errors import ConfigError, UnsupportedError
from mnnllm_core.export import ARCHITECTURES
from mnnllm_core.export.config import FULL, SLIDING

BASE = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 300, "max_position_embeddings": 256}
MOE = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}
YARN = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
        "original_max_position_embeddings": 4096, "rope_theta": 150000.0}


def args(model_type: str, **config):
    return ARCHITECTURES[model_type].ModelArgs.from_dict({"model_type": model_type, **BASE, **config}, file="cfg")


def model(model_type: str, **config):
    return ARCHITECTURES[model_type].Model(args(model_type, **config))


def transformers_inv_freq(model_type: str, **config) -> tuple[np.ndarray, float]:
    """(inv_freq, attention scaling) of transformers' own rotary embedding for this config."""
    pytest.importorskip("transformers")
    from transformers import AutoConfig, AutoModelForCausalLM

    hf = AutoConfig.for_model(model_type, **{**BASE, "num_hidden_layers": 1, **config})
    rotary = AutoModelForCausalLM.from_config(hf).model.rotary_emb
    return rotary.inv_freq.numpy(), float(rotary.attention_scaling)


def test_phi_partial_rotary_reads_the_same_from_both_layouts_and_rotates_a_quarter_of_each_head():
    t5 = args("phi", rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25})
    t4 = args("phi", rope_theta=10000.0, partial_rotary_factor=0.25)
    assert t4 == t5 and t5.ropes[0].rotary_dim(16) == 4
    inv, _ = transformers_inv_freq("phi", rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                          "partial_rotary_factor": 0.25})
    np.testing.assert_array_equal(t5.ropes[0].inv_freq(16), inv)


@pytest.mark.parametrize("model_type,config,field", [
    ("phi", {"qk_layernorm": True}, "qk_layernorm"),
    ("phi", {"hidden_act": "gelu"}, "hidden_act"),
    ("lfm2", {"conv_bias": True}, "conv_bias"),
    ("lfm2", {"layer_types": ["conv", "mamba", "conv", "full_attention"]}, "layer_types"),
    ("lfm2", {"block_use_swiglu": False}, "block_use_swiglu"),
    ("lfm2_moe", {**MOE, "some_new_router_knob": 1}, "some_new_router_knob"),
    ("hunyuan_v1_dense", {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}},
     "rope_parameters"),
    ("gpt_oss", {"num_local_experts": 4, "num_experts_per_tok": 2, "quantization_config": {"quant_method": "mxfp4"}},
     "quantization_config"),
    ("gpt_oss", {"num_local_experts": 4, "num_experts_per_tok": 2,
                 "rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}}, "rope_parameters"),
])
def test_what_the_graph_cannot_express_is_refused_naming_the_field(model_type, config, field):
    with pytest.raises(UnsupportedError) as err:
        args(model_type, **config)
    assert err.value.field == field and err.value.file == "cfg"


def test_phi_head_dim_other_than_hidden_over_heads_is_a_config_error():
    with pytest.raises(ConfigError, match="head_dim"):
        args("phi", head_dim=32)


def test_lfm2_full_attn_idxs_and_layer_types_give_the_same_layers():
    t4 = args("lfm2", full_attn_idxs=[1, 3])
    t5 = args("lfm2", layer_types=["conv", FULL, "conv", FULL])
    assert t4 == t5
    assert [model("lfm2", full_attn_idxs=[1, 3]).mixer(i) for i in range(4)] == ["short_conv", "attention"] * 2


def test_lfm2_moe_routes_by_sigmoid_with_the_bias_for_the_choice_only():
    m = model("lfm2_moe", **MOE, num_dense_layers=2, routed_scaling_factor=2.5)
    assert [m.mlp(i).experts for i in range(4)] == [0, 0, 4, 4]
    spec = m.mlp(3)
    assert (spec.scoring, spec.selection_bias, spec.norm_eps, spec.routed_scale) == (
        "sigmoid", "model.layers.3.feed_forward.expert_bias", 1e-6, 2.5)
    assert model("lfm2_moe", **MOE, use_expert_bias=False).mlp(3).selection_bias is None


def test_hunyuan_ntk_alpha_rope_is_transformers_static_theta_in_both_layouts():
    rope = {"rope_type": "dynamic", "alpha": 1000.0, "factor": 1.0, "rope_theta": 10000.0}
    spec = args("hunyuan_v1_dense", rope_parameters=rope).ropes[0]
    t4 = args("hunyuan_v1_dense", rope_theta=10000.0, rope_scaling={"type": "dynamic", "alpha": 1000.0, "factor": 1.0})
    assert t4.ropes[0] == spec
    inv, _ = transformers_inv_freq("hunyuan_v1_dense", rope_parameters=rope)
    np.testing.assert_allclose(spec.inv_freq(16), inv, rtol=2e-7, atol=0)


@pytest.mark.parametrize("rope", [YARN, {**YARN, "truncate": True, "factor": 4.0, "beta_fast": 16.0}])
def test_yarn_frequencies_and_attention_factor_are_transformers_own(rope):
    spec = args("gpt_oss", num_local_experts=4, num_experts_per_tok=2, rope_parameters=rope).ropes[0]
    inv, scaling = transformers_inv_freq("gpt_oss", num_local_experts=4, num_experts_per_tok=2,
                                         rope_parameters=rope)
    np.testing.assert_allclose(spec.inv_freq(16), inv, rtol=2e-7, atol=0)
    assert spec.attention_factor == pytest.approx(scaling, rel=1e-12)


def test_gpt_oss_alternates_windows_and_carries_sinks_router_bias_and_the_clamped_swiglu():
    m = model("gpt_oss", num_local_experts=4, num_experts_per_tok=2, sliding_window=8, swiglu_limit=3.0)
    assert [m.attention(i).window for i in range(4)] == [8, None, 8, None]
    assert m.attention(0).sinks == "model.layers.0.self_attn.sinks"
    assert m.router_bias(1) == "model.layers.1.mlp.router.bias"
    spec = m.mlp(0)
    assert (spec.act, spec.scoring, spec.glu_limit, spec.experts) == ("clamped_swiglu", "topk_softmax", 3.0, 4)
    assert m.llm_config() == {"attention_type": "mix", "sliding_window": 8}
    assert [t for t in args("gpt_oss", num_local_experts=4, num_experts_per_tok=2).layer_types] == [
        SLIDING, FULL, SLIDING, FULL]
