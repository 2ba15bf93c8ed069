"""Llama (SmolLM2, TinyLlama, Llama 2/3 without rope scaling): RMSNorm, GQA attention with RoPE, SwiGLU MLP."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from mnnllm_core.errors import ConfigError, UnsupportedError

_SIZES = ("hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads", "vocab_size",
          "num_key_value_heads", "head_dim")


@dataclass
class ModelArgs:
    """The config.json fields the export needs; `from_dict` ignores the rest."""

    model_type: str
    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    vocab_size: int
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False

    @classmethod
    def from_dict(cls, config: dict[str, Any], file: str | None = None) -> "ModelArgs":
        """A ConfigError naming `file` and the field when a size is missing or not a positive integer."""
        fields = dataclasses.fields(cls)
        for f in fields:
            value = config.get(f.name)
            required = f.default is dataclasses.MISSING
            if f.name in _SIZES and (value is not None or required) and (
                    isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigError(f"{f.name} must be a positive integer, got {value!r}", file=file, field=f.name)
        names = {f.name for f in fields}
        return cls(**{k: v for k, v in config.items() if k in names})

    def __post_init__(self) -> None:
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        scaling = (self.rope_scaling or {}).get("rope_type", (self.rope_scaling or {}).get("type", "default"))
        if scaling != "default":
            raise UnsupportedError(f"{self.model_type}: rope_scaling {scaling!r}", field="rope_scaling")
        if self.mlp_bias:
            raise UnsupportedError(f"{self.model_type}: mlp_bias", field="mlp_bias")


class Model:
    """Names of the weights of one architecture, in the HF checkpoint's naming."""

    def __init__(self, args: ModelArgs):
        self.args = args

    @property
    def qkv_bias(self) -> bool:
        return self.args.attention_bias

    def embedding(self) -> str:
        return "model.embed_tokens.weight"

    def final_norm(self) -> str:
        return "model.norm.weight"

    def lm_head(self) -> str:
        return "model.embed_tokens.weight" if self.args.tie_word_embeddings else "lm_head.weight"

    def input_norm(self, layer: int) -> str:
        return f"model.layers.{layer}.input_layernorm.weight"

    def post_attention_norm(self, layer: int) -> str:
        return f"model.layers.{layer}.post_attention_layernorm.weight"

    def linear(self, layer: int, name: str) -> str:
        """`name` is one of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj."""
        group = "mlp" if name in ("gate_proj", "up_proj", "down_proj") else "self_attn"
        return f"model.layers.{layer}.{group}.{name}"
