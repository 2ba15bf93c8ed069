"""Gemma 2: embeddings scaled by sqrt(hidden), RMSNorm weights stored as w - 1, norms before and after
both attention and MLP, GELU-tanh MLP, a query scale from `query_pre_attn_scalar`, sliding windows on
alternate layers (MNN's exporter drops them; here they become MNN's "mix" attention) and a final
logit soft-cap. The attention logit soft-cap cannot be expressed by MNN's fused Attention op: it is
left out with a warning (see the README)."""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from . import llama
from .config import FULL, SLIDING, ConfigReader

logger = logging.getLogger(__name__)


@dataclass
class ModelArgs(llama.ModelArgs):
    query_pre_attn_scalar: float | None = None
    final_logit_softcapping: float | None = None

    @classmethod
    def read(cls, r: ConfigReader) -> dict[str, Any]:
        kw = super().read(r)
        kw["head_dim"] = r.size("head_dim", 256)
        kw["tie_word_embeddings"] = r.flag("tie_word_embeddings", True)
        kw["query_pre_attn_scalar"] = r.number("query_pre_attn_scalar", 256)
        cap = r.get("final_logit_softcapping")
        kw["final_logit_softcapping"] = None if cap is None else r.number("final_logit_softcapping", 0.0)
        attn_cap = r.get("attn_logit_softcapping")
        if attn_cap is not None:
            logger.warning("%s: attn_logit_softcapping %s is left out: MNN's Attention op has no soft-cap, so the "
                           "export differs from transformers wherever |q.k| * scale approaches it",
                           kw["model_type"], attn_cap)
        r.require("use_bidirectional_attention", (None, False))
        r.ignore("cache_implementation")
        return kw

    @classmethod
    def activation(cls, r: ConfigReader) -> str:
        r.require("hidden_activation", ("gelu_pytorch_tanh",), "gelu_pytorch_tanh")
        r.ignore("hidden_act")  # transformers 4 wrote it as well, and never used it
        return "gelu_tanh"

    @classmethod
    def attention_layout(cls, r: ConfigReader, layers: int) -> dict[str, Any]:
        types = r.layer_types(layers, [SLIDING if (i + 1) % 2 else FULL for i in range(layers)])
        rope = r.rope(cls.default_theta)
        return dict(layer_types=types, sliding_window=cls.window_from(r, types, 4096), ropes=[rope] * layers)


class Model(llama.Model):
    style = "plain"
    norm_offset = 1.0
    sandwich_norms = True

    @property
    def embed_scale(self) -> float | None:
        return math.sqrt(self.args.hidden_size)

    @property
    def final_softcap(self) -> float | None:
        return self.args.final_logit_softcapping

    def attention(self, layer: int) -> llama.AttentionSpec:
        spec = super().attention(layer)
        scale = self.args.query_pre_attn_scalar ** -0.5
        return llama.AttentionSpec(spec.rope, spec.window, spec.q_norm, spec.k_norm,
                                   None if math.isclose(scale, self.args.head_dim ** -0.5) else scale)

    def mlp_norms(self, layer: int) -> tuple[str, str]:
        """(before, after) the MLP."""
        return (f"model.layers.{layer}.pre_feedforward_layernorm.weight",
                f"model.layers.{layer}.post_feedforward_layernorm.weight")

    def norms(self, layer: int) -> list[str]:
        return super().norms(layer) + list(self.mlp_norms(layer))
