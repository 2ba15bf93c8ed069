"""Reading HF configs: transformers 4 and 5 layouts give the same model; what is not understood is an error."""
from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from mnnllm_core.errors import ConfigError, UnsupportedError
from mnnllm_core.export import ARCHITECTURES
from mnnllm_core.export.config import FULL, SLIDING
from mnnllm_core.export.rope import RopeSpec
from paths import SHARED

BASE = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 300, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 256, "architectures": ["X"], "torch_dtype": "float32", "bos_token_id": 1}
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}


def args(model_type: str, **config):
    return ARCHITECTURES[model_type].ModelArgs.from_dict({"model_type": model_type, **BASE, **config}, file="cfg")


def model(model_type: str, **config):
    arch = ARCHITECTURES[model_type]
    return arch.Model(args(model_type, **config))


@pytest.mark.parametrize("model_type", sorted(ARCHITECTURES))
def test_transformers_own_full_default_config_is_accepted(model_type):
    pytest.importorskip("transformers")
    from transformers import AutoConfig

    config = json.loads(AutoConfig.for_model(model_type).to_json_string(use_diff=False))
    a = ARCHITECTURES[model_type].ModelArgs.from_dict(config)
    text = config.get("text_config", config)  # a vision-language config: its language model
    assert a.num_hidden_layers == text["num_hidden_layers"] and len(a.ropes) == a.num_hidden_layers


def test_rope_theta_under_rope_parameters_is_read_not_defaulted():
    a = args("llama", rope_parameters={"rope_type": "default", "rope_theta": 100000.0})
    assert a.ropes == [RopeSpec(100000.0)] * 4


def test_llama3_scaling_reads_the_same_from_both_layouts():
    t5 = args("llama", rope_parameters={**LLAMA3, "rope_theta": 500000.0})
    t4 = args("llama", rope_theta=500000.0, rope_scaling=dict(LLAMA3))
    assert t4 == t5 and t5.ropes[0].kind == "llama3" and t5.ropes[0].original_max_position_embeddings == 64


def test_gemma3_layer_types_and_rotaries_read_the_same_from_both_layouts():
    t5 = args("gemma3_text", sliding_window=16, query_pre_attn_scalar=16,
              layer_types=[SLIDING, FULL, SLIDING, FULL],
              rope_parameters={FULL: {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                               SLIDING: {"rope_type": "default", "rope_theta": 10000.0}})
    t4 = args("gemma3_text", sliding_window=16, query_pre_attn_scalar=16, sliding_window_pattern=2,
              rope_theta=1000000.0, rope_local_base_freq=10000.0, rope_scaling={"rope_type": "linear", "factor": 8.0})
    assert t4 == t5
    assert t5.ropes[0] == RopeSpec(10000.0) and t5.ropes[1] == RopeSpec(1000000.0, "linear", 8.0)
    m = ARCHITECTURES["gemma3_text"].Model(t5)
    assert [m.attention(i).window for i in range(4)] == [16, None, 16, None]
    assert m.llm_config() == {"attention_type": "mix", "sliding_window": 16}


@pytest.mark.parametrize("model_type,config,windows", [
    ("mistral", {"sliding_window": 8}, [8, 8, 8, 8]),
    ("mistral", {"sliding_window": None}, [None] * 4),
    ("qwen2", {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 2}, [None, None, 8, 8]),
    ("qwen2", {"use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 2}, [None] * 4),
    ("qwen3_moe", {"use_sliding_window": True, "sliding_window": 8, "num_experts": 4, "num_experts_per_tok": 2,
                   "moe_intermediate_size": 32}, [8] * 4),
    ("gemma2", {"sliding_window": 8}, [8, None, 8, None]),
    ("phi3", {"sliding_window": 8}, [8] * 4),
])
def test_sliding_windows_land_on_the_layers_transformers_puts_them(model_type, config, windows):
    m = model(model_type, **config)
    assert [m.attention(i).window for i in range(4)] == windows


def test_smollm3_nope_layers_have_no_rotary():
    m = model("smollm3", no_rope_layers=[1, 1, 1, 0])
    assert [m.attention(i).rope is None for i in range(4)] == [False, False, False, True]
    m = model("smollm3", no_rope_layer_interval=2)  # transformers 4: the rule instead of the list
    assert [m.attention(i).rope is None for i in range(4)] == [False, True, False, True]


@pytest.mark.parametrize("model_type,config,field", [
    ("llama", {"quantization_config": {"quant_method": "gptq"}}, "quantization_config"),
    ("llama", {"some_new_knob": 3}, "some_new_knob"),
    ("llama", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}}, "rope_parameters"),
    ("llama", {"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "rope_scaling"),
    ("llama", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
     "rope_parameters"),
    ("phi3", {"rope_scaling": {"type": "longrope", "short_factor": [1.0], "long_factor": [1.0]}}, "rope_scaling"),
    ("llama", {"hidden_act": "gelu"}, "hidden_act"),
    ("llama", {"mlp_bias": True}, "mlp_bias"),
    ("gemma2", {"hidden_activation": "relu"}, "hidden_activation"),
    ("gemma3_text", {"use_bidirectional_attention": True}, "use_bidirectional_attention"),
    ("llama", {"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0, "beta": 1}},
     "rope_parameters"),
])
def test_a_key_that_would_change_the_math_and_is_not_understood_is_an_error(model_type, config, field):
    with pytest.raises(UnsupportedError) as err:
        args(model_type, **config)
    assert err.value.field == field and err.value.file == "cfg"


@pytest.mark.parametrize("config,field", [
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4}}, "rope_parameters"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": "big"}}, "rope_parameters"),
    ({"layer_types": [FULL, SLIDING]}, "layer_types"),
])
def test_malformed_rope_or_layer_values_are_errors(config, field):
    with pytest.raises((ConfigError, UnsupportedError)) as err:
        args("qwen2", **config)
    assert err.value.field == field


def test_a_sliding_layer_without_a_window_size_is_a_config_error():
    with pytest.raises(ConfigError, match="sliding_window"):
        args("gemma2", sliding_window=None)


def test_gemma2_attention_softcap_is_left_out_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="mnnllm_core.export.gemma2"):
        args("gemma2", sliding_window=8, attn_logit_softcapping=50.0)
    assert "attn_logit_softcapping" in caplog.text


@pytest.mark.parametrize("rope", [{"rope_type": "default"}, {"rope_type": "linear", "factor": 4.0}, LLAMA3])
@pytest.mark.parametrize("theta,head_dim", [(10000.0, 16), (500000.0, 64), (1000000.0, 128)])
def test_inverse_frequencies_are_transformers_own(rope, theta, head_dim):
    pytest.importorskip("transformers")
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    spec = args("llama", head_dim=head_dim, rope_parameters={**rope, "rope_theta": theta}).ropes[0]
    config = LlamaConfig(**{k: v for k, v in BASE.items() if k != "architectures"}, rope_parameters={
        **rope, "rope_theta": theta})
    config.head_dim = head_dim
    if rope["rope_type"] == "default":
        ref = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / head_dim))
    else:
        ref = ROPE_INIT_FUNCTIONS[rope["rope_type"]](config, "cpu")[0].numpy()
    # a few float32 ulps (2^-23 = 1.2e-7 each): torch's vectorized pow rounds differently on some CPUs
    # (2.9e-7 measured on llama3 at theta 5e5, head_dim 64)
    np.testing.assert_allclose(spec.inv_freq(head_dim), ref, rtol=5e-7, atol=0)


@pytest.mark.parametrize("folder", ["tiny-gemma2-mnn-fp16", "tiny-gemma3_text-mnn-fp16", "tiny-qwen3_moe-mnn-fp16"])
def test_the_shared_transformers_5_configs_read_as_mnn_describes_them(folder):
    path = SHARED / "models" / "arch" / folder
    if not path.is_dir():
        pytest.skip(f"shared models not found at {path}")
    hf = json.loads((path / "hf_config.json").read_text())
    m = ARCHITECTURES[hf["model_type"]].Model(ARCHITECTURES[hf["model_type"]].ModelArgs.from_dict(hf))
    windows = [m.attention(i).window for i in range(hf["num_hidden_layers"])]
    if hf["model_type"] == "qwen3_moe":
        assert windows == [None] * 3 and m.mlp(0).experts == 4 and m.mlp(0).top_k == 2
    else:  # MNN writes "full" for gemma2 (its exporter drops the window); transformers slides
        assert windows == [16, None, 16, None] and m.llm_config() == {"attention_type": "mix", "sliding_window": 16}


@pytest.mark.parametrize("kind,error", [("yarn", "rope type 'yarn'"), ("freqs", "rope_freqs")])
def test_gguf_rope_scaling_is_read_or_refused(tmp_path, kind, error):
    import gguf

    from mnnllm_core.export import export_model
    from test_export import random_weights, write_gguf

    def extra(w):
        if kind == "freqs":
            w.add_tensor("rope_freqs.weight", np.ones(8, np.float32))
        else:
            w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
            w.add_rope_scaling_factor(4.0)

    write_gguf(tmp_path / "m.gguf", random_weights("llama", True), extra)
    with pytest.raises(UnsupportedError, match=error):
        export_model(str(tmp_path / "m.gguf"), str(tmp_path / "out"))


@pytest.mark.parametrize("model_type,config,field", [
    ("gemma4_text", {"use_bidirectional_attention": "all"}, "use_bidirectional_attention"),
    ("gemma4_text", {"per_layer_config": {"3": {"head_dim": 32, "sliding_window": 4}}}, "per_layer_config"),
    ("qwen3_5_text", {"attention_bias": True}, "attention_bias"),
    ("qwen3_5_text", {"layer_types": ["linear_attention"] * 3 + ["sliding_attention"]}, "layer_types"),
    ("llama4_text", {"moe_layers": [1], "num_local_experts": 4, "num_experts_per_tok": 2}, "num_experts_per_tok"),
    ("llama4_text", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 5e5, "factor": 8.0}}, "rope_parameters"),
])
def test_2026_architectures_refuse_what_mnn_cannot_express(model_type, config, field):
    with pytest.raises(UnsupportedError) as err:
        args(model_type, **config)
    assert err.value.field == field and err.value.file == "cfg"


def test_gemma4_kv_sharing_needs_an_earlier_layer_of_each_shared_type():
    with pytest.raises(ConfigError) as err:
        args("gemma4_text", num_kv_shared_layers=1, layer_types=[SLIDING, SLIDING, SLIDING, FULL])
    assert err.value.field == "num_kv_shared_layers"


@pytest.mark.parametrize("config,limit", [
    ({"attention_chunk_size": 8, "no_rope_layers": [1, 1, 1, 1]}, 8),
    ({"attention_chunk_size": None, "floor_scale": 100}, 99),
    ({"attention_chunk_size": None, "attn_temperature_tuning": False}, 256),
    ({"attention_chunk_size": 8192, "layer_types": ["full_attention"] * 4, "attn_temperature_tuning": False}, 256),
])
def test_llama4_caps_the_context_where_chunked_attention_or_temperature_tuning_would_act(config, limit):
    m = model("llama4_text", moe_layers=[], **config)
    assert m.runtime_config() == {"max_all_tokens": limit}


def test_proportional_rope_is_transformers_own():
    pytest.importorskip("transformers")
    from transformers import Gemma4TextConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6}
    a = args("gemma4_text", layer_types=[SLIDING, SLIDING, SLIDING, FULL], sliding_window=8, global_head_dim=64,
             rope_parameters={FULL: rope, SLIDING: {"rope_type": "default", "rope_theta": 1e4}})
    config = Gemma4TextConfig(**{k: v for k, v in BASE.items() if k != "architectures"}, global_head_dim=64,
                              layer_types=[SLIDING, SLIDING, SLIDING, FULL],
                              rope_parameters={FULL: rope, SLIDING: {"rope_type": "default", "rope_theta": 1e4}})
    ref = ROPE_INIT_FUNCTIONS["proportional"](config, "cpu", layer_type=FULL)[0].numpy()
    assert a.ropes[3].rotary_dim(64) == 64
    np.testing.assert_allclose(a.ropes[3].inv_freq(64), ref, rtol=2e-7, atol=0)


@pytest.mark.parametrize("folder", ["tiny-qwen3_5-mnn-fp16", "tiny-qwen3_5_moe-mnn-q4", "tiny-gemma4-mnn-fp16",
                                    "tiny-llama4_text_dense-mnn-q4"])
def test_the_shared_2026_configs_read_as_mnn_describes_them(folder):
    path = SHARED / "models" / "arch3" / folder
    if not path.is_dir():
        pytest.skip(f"shared models not found at {path}")
    hf = json.loads((path / "hf_config.json").read_text())
    m = ARCHITECTURES[hf["model_type"]].Model(ARCHITECTURES[hf["model_type"]].ModelArgs.from_dict(hf))
    layers = m.args.num_hidden_layers
    if hf["model_type"].startswith("qwen3_5"):
        assert [m.linear_attention(i) is None for i in range(layers)] == [False, False, False, True]
        assert m.attention(3).rope.rotary_dim(16) == 4 and m.base == "model.language_model"
        assert m.mlp(0).experts == (4 if "moe" in folder else 0)
    elif hf["model_type"] == "gemma4":
        assert [m.attention(i).head_dim for i in range(layers)] == [None, None, None, 32]
        assert m.llm_config() == {"attention_type": "mix", "sliding_window": 8, "attn_scale": 1.0,
                                  "ple_embed_file": "ple_embeddings_bf16.bin", "ple_embed_scale": 2.0,
                                  "ple_embed_dim": 16}
    else:
        assert [m.attention(i).rope is None for i in range(layers)] == [False, True, False, True]
        assert m.runtime_config() == {"max_all_tokens": 8}  # MNN writes full attention for chunks of 8
