"""LFM2: llama-like blocks (RMSNorm, SwiGLU `feed_forward` w1/w3/w2) whose token mixer is either
attention (per-head q/k RMSNorms before RoPE, `out_proj`) or a gated short convolution: in_proj to
(B, C, x), a causal depthwise conv over B * x of `conv_L_cache` taps, times C, out_proj; MNN's
LinearAttention op "short_conv" computes the middle. `layer_types` (transformers 5) or
`full_attn_idxs` (transformers 4) say which layer is which."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from . import llama
from .config import FULL, ConfigReader
from .sources import LazyTensor, Source

CONV = "conv"
_MLP = {"gate_proj": "feed_forward.w1", "up_proj": "feed_forward.w3", "down_proj": "feed_forward.w2"}


@dataclass
class ModelArgs(llama.ModelArgs):
    default_theta = 1000000.0

    @classmethod
    def read(cls, r: ConfigReader) -> dict[str, Any]:
        kw = super().read(r)
        kw["rms_norm_eps"] = r.number("norm_eps", 1e-5)
        kw["tie_word_embeddings"] = r.flag("tie_word_embeddings", r.flag("tie_embedding", True))
        r.require("conv_bias", (False,), False)  # MNN's short_conv has no bias input
        r.size("conv_L_cache", 3)  # the taps: the conv weight's last dimension says it too
        r.require("block_use_swiglu", (True,), True)
        r.require("use_pos_enc", (True,), True)
        # Sizes the tensors carry (transformers derives w1/w3's rows from the first three), a duplicate
        # head count, init-only settings, and an eps that transformers never reads (it uses norm_eps).
        r.ignore("block_auto_adjust_ff_dim", "block_ffn_dim_multiplier", "block_multiple_of", "block_dim",
                 "block_ff_dim", "conv_dim", "conv_dim_out", "num_heads", "block_mlp_init_scale",
                 "block_out_init_scale", "block_use_xavier_init", "conv_use_xavier_init", "block_norm_eps")
        return kw

    @classmethod
    def attention_layout(cls, r: ConfigReader, layers: int) -> dict[str, Any]:
        types = r.get("layer_types")
        if types is None:
            full = r.get("full_attn_idxs", list(range(layers)))
            if not isinstance(full, list) or any(not isinstance(i, int) or not 0 <= i < layers for i in full):
                raise r.error(f"full_attn_idxs must list layer indices below {layers}, got {full!r}", "full_attn_idxs")
            types = [FULL if i in full else CONV for i in range(layers)]
        else:
            r.ignore("full_attn_idxs")
        if not isinstance(types, list) or len(types) != layers or any(t not in (FULL, CONV) for t in types):
            raise r.unsupported(f"layer_types must list {layers} of {FULL!r}/{CONV!r}, got {types!r}", "layer_types")
        rope = r.rope(cls.default_theta)
        return dict(layer_types=list(types), sliding_window=None, ropes=[rope] * layers)


class Model(llama.Model):
    def mixer(self, layer: int) -> str:
        return "short_conv" if self.args.layer_types[layer] == CONV else "attention"

    def attention(self, layer: int) -> llama.AttentionSpec:
        base = f"model.layers.{layer}.self_attn"
        return replace(super().attention(layer), q_norm=f"{base}.q_layernorm.weight",
                       k_norm=f"{base}.k_layernorm.weight")

    def final_norm(self) -> str:
        return "model.embedding_norm.weight"

    def input_norm(self, layer: int) -> str:
        return f"model.layers.{layer}.operator_norm.weight"

    def post_attention_norm(self, layer: int) -> str:
        return f"model.layers.{layer}.ffn_norm.weight"

    def linear(self, layer: int, name: str) -> str:
        if name in _MLP:
            return f"model.layers.{layer}.{_MLP[name]}"
        return f"model.layers.{layer}.self_attn.{'out_proj' if name == 'o_proj' else name}"

    def conv_weight(self, source: Source, layer: int, name: str) -> LazyTensor:
        """`name`: in_proj or out_proj of a short-conv layer."""
        return source.tensor(f"model.layers.{layer}.conv.{name}.weight")

    def conv_kernel(self, source: Source, layer: int) -> np.ndarray:
        """The depthwise conv weight [hidden, 1, taps], fp32 (an inline constant of the graph)."""
        tensor = source.tensor(f"model.layers.{layer}.conv.conv.weight")
        return tensor.load().astype(np.float32).reshape(self.args.hidden_size, 1, -1)

    def norms(self, layer: int) -> list[str]:
        if self.mixer(layer) == "attention":
            return super().norms(layer)
        return [self.input_norm(layer), self.post_attention_norm(layer)]

    def layer_tensors(self, source: Source, layer: int) -> list[LazyTensor]:
        return [source.tensor(n) for n in self.norms(layer)] + self.mixer_tensors(source, layer) + \
            self.mlp_tensors(source, layer)

    def mixer_tensors(self, source: Source, layer: int) -> list[LazyTensor]:
        """The token mixer's weights that go to the weight file (the conv kernel is inline)."""
        if self.mixer(layer) == "attention":
            return [self.linear_weight(source, layer, p) for p in ("q_proj", "k_proj", "v_proj", "o_proj")]
        return [self.conv_weight(source, layer, p) for p in ("in_proj", "out_proj")]

    def mlp_tensors(self, source: Source, layer: int) -> list[LazyTensor]:
        return [self.linear_weight(source, layer, p) for p in ("gate_proj", "up_proj", "down_proj")]
