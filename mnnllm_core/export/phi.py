"""Phi (phi-1, phi-1.5, phi-2): one LayerNorm (with bias) per layer feeding attention and MLP in
parallel, x + attention(norm(x)) + mlp(norm(x)); q/k/v/dense, fc1/fc2 and the lm_head all carry a
bias; the MLP is fc1 -> GELU-tanh -> fc2; RoPE turns only the leading `partial_rotary_factor` of each
head (MNN's RoPE op: `ropeCutHeadDim`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from . import llama
from .config import FULL, ConfigReader
from .sources import LazyTensor, Source

_NAMES = {"o_proj": "self_attn.dense", "up_proj": "mlp.fc1", "down_proj": "mlp.fc2"}
_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj")


@dataclass
class ModelArgs(llama.ModelArgs):
    @classmethod
    def read(cls, r: ConfigReader) -> dict[str, Any]:
        kw = super().read(r)
        heads, hidden = kw["num_attention_heads"], kw["hidden_size"]
        if kw["head_dim"] * heads != hidden:
            raise r.error(f"head_dim {kw['head_dim']} is not hidden_size / num_attention_heads "
                          f"({hidden} / {heads}), which Phi uses", "head_dim")
        kw["rms_norm_eps"] = r.number("layer_norm_eps", 1e-5)
        r.require("qk_layernorm", (False,), False)
        return kw

    @classmethod
    def activation(cls, r: ConfigReader) -> str:
        r.require("hidden_act", ("gelu_new", "gelu_pytorch_tanh"), "gelu_new")
        return "gelu_tanh"

    @classmethod
    def biases(cls, r: ConfigReader) -> tuple[bool, bool]:
        return True, True

    @classmethod
    def attention_layout(cls, r: ConfigReader, layers: int) -> dict[str, Any]:
        rope = r.rope(cls.default_theta, partial=True)
        return dict(layer_types=[FULL] * layers, sliding_window=None, ropes=[rope] * layers)


class Model(llama.Model):
    style = "plain"
    rms_norm = False
    parallel = True

    def mlp(self, layer: int) -> llama.MlpSpec:
        return llama.MlpSpec(self.args.act, gated=False)

    def final_norm(self) -> str:
        return "model.final_layernorm.weight"

    def lm_head_bias(self) -> str | None:
        return "lm_head.bias"

    def norm_bias(self, weight: str) -> str | None:
        return weight.removesuffix("weight") + "bias"

    def linear(self, layer: int, name: str) -> str:
        return f"model.layers.{layer}.{_NAMES.get(name, f'self_attn.{name}')}"

    def linear_bias(self, source: Source, layer: int, name: str) -> LazyTensor | None:
        return source.tensor(f"{self.linear(layer, name)}.bias")

    def norms(self, layer: int) -> list[str]:
        return [self.input_norm(layer), self.norm_bias(self.input_norm(layer))]

    def layer_tensors(self, source: Source, layer: int) -> list[LazyTensor]:
        return [source.tensor(n) for n in self.norms(layer)] + [self.linear_weight(source, layer, p)
                                                                 for p in _LINEARS]

    def parameter_count(self, source: Source) -> int:
        bias = source.tensor(self.norm_bias(self.final_norm()))
        return super().parameter_count(source) + int(np.prod(bias.shape, dtype=np.int64))
