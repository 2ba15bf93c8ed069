"""HunYuan dense v1: the llama layout whose per-head q/k RMSNorms (`query_layernorm`, `key_layernorm`)
come after the rotation, so the RoPE op (which normalises first) cannot carry them: the rotation is
written from plain ops as MNN's exporter does. Its checkpoints label their rope "dynamic" with a fixed
`alpha`, which transformers turns into a static base theta * alpha^(d / (d - 2)) (`ntk_alpha`)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from . import llama
from .config import FULL, ConfigReader
from .rope import RopeSpec


@dataclass
class ModelArgs(llama.ModelArgs):
    @classmethod
    def read(cls, r: ConfigReader) -> dict[str, Any]:
        kw = super().read(r)
        r.ignore("eod_token_id")
        return kw

    @classmethod
    def attention_layout(cls, r: ConfigReader, layers: int) -> dict[str, Any]:
        return dict(layer_types=[FULL] * layers, sliding_window=None, ropes=[cls.ntk_alpha_rope(r)] * layers)

    @classmethod
    def ntk_alpha_rope(cls, r: ConfigReader) -> RopeSpec:
        """rope type "dynamic" with an `alpha`: a static theta (the other keys of such a rope are not read
        by transformers then); anything else goes through the usual rope reading."""
        key = "rope_parameters" if r.has("rope_parameters") else "rope_scaling"
        params = r.get(key)
        if not (isinstance(params, dict) and params.get("rope_type", params.get("type")) == "dynamic"
                and params.get("alpha")):
            return r.rope(cls.default_theta)
        heads = r.size("num_attention_heads")
        dim = r.size("head_dim", r.size("hidden_size") // heads)
        theta, alpha = params.get("rope_theta", r.get("rope_theta", cls.default_theta)), params["alpha"]
        if any(isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0 for v in (theta, alpha)):
            raise r.error(f"rope_theta and alpha must be positive numbers, got {theta!r}, {alpha!r}", key)
        return RopeSpec(float(theta) * float(alpha) ** (dim / (dim - 2)))


class Model(llama.Model):
    style = "plain"

    def attention(self, layer: int) -> llama.AttentionSpec:
        base = f"model.layers.{layer}.self_attn"
        return replace(super().attention(layer), q_norm=f"{base}.query_layernorm.weight",
                       k_norm=f"{base}.key_layernorm.weight", norm_after_rope=True)
