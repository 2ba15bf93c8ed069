"""gpt-oss: attention with biases and a learned sink logit per head (MNN's Attention takes the sinks as
a fifth input), sliding windows on alternate layers ("mix"), and a mixture of experts on every layer:
a router with a bias, the top-k logits chosen and softmaxed, experts with biases whose gate and up
columns interleave (gate_up[..., ::2], [..., 1::2]) and whose activation is the clamped swiglu
(clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g), g = min(gate, limit).

transformers 5 keeps the experts stacked and input-major ([experts, hidden, 2 * ffn]): each expert's
Linear is its slice transposed, gate rows first then up rows, as the expert subgraph slices them.
Its YaRN rope (the released models') is written as the frequencies transformers computes and a
cos/sin table scaled by the attention factor. Checkpoints in MXFP4 (`quantization_config`) are
refused by the config reader, naming the field."""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache
from typing import Any

import numpy as np

from . import llama
from .config import FULL, SLIDING, ConfigReader
from .sources import LazyTensor, Source


@dataclass
class ModelArgs(llama.ModelArgs):
    default_theta = 150000.0
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0

    @classmethod
    def read(cls, r: ConfigReader) -> dict[str, Any]:
        kw = super().read(r)
        experts, top_k = r.size("num_local_experts", r.get("num_experts")), r.size("num_experts_per_tok")
        r.ignore("num_experts", "experts_per_token")  # the same counts under other names
        if top_k > experts:
            raise r.error(f"num_experts_per_tok {top_k} exceeds num_local_experts {experts}", "num_experts_per_tok")
        kw.update(num_experts=experts, num_experts_per_tok=top_k, moe_intermediate_size=kw["intermediate_size"],
                  swiglu_alpha=r.number("swiglu_alpha", 1.702), swiglu_limit=r.number("swiglu_limit", 7.0))
        r.ignore("initial_context_length")  # the original training length; transformers reads it nowhere
        return kw

    @classmethod
    def activation(cls, r: ConfigReader) -> str:
        r.ignore("hidden_act")  # the experts' activation is their own clamped swiglu, whatever this says
        return "clamped_swiglu"

    @classmethod
    def biases(cls, r: ConfigReader) -> tuple[bool, bool]:
        bias = r.flag("attention_bias", True)
        return bias, bias

    @classmethod
    def attention_layout(cls, r: ConfigReader, layers: int) -> dict[str, Any]:
        types = r.layer_types(layers, [SLIDING if (i + 1) % 2 else FULL for i in range(layers)])
        rope = r.rope(cls.default_theta, yarn=True)
        return dict(layer_types=types, sliding_window=cls.window_from(r, types, 128), ropes=[rope] * layers)


class Model(llama.Model):
    style = "plain"

    def attention(self, layer: int) -> llama.AttentionSpec:
        return replace(super().attention(layer), sinks=f"model.layers.{layer}.self_attn.sinks")

    def mlp(self, layer: int) -> llama.MlpSpec:
        a = self.args
        return llama.MlpSpec("clamped_swiglu", a.num_experts, a.num_experts_per_tok, scoring="topk_softmax",
                             glu_alpha=a.swiglu_alpha, glu_limit=a.swiglu_limit)

    def router(self, layer: int) -> str:
        return f"model.layers.{layer}.mlp.router.weight"

    def router_bias(self, layer: int) -> str | None:
        return f"model.layers.{layer}.mlp.router.bias"

    def expert_weight(self, source: Source, layer: int, expert: int, name: str) -> LazyTensor:
        """`name`: gate_up ([2 * ffn, hidden], gate rows then up rows) or down ([hidden, ffn])."""
        stacked = source.tensor(f"model.layers.{layer}.mlp.experts.{name}_proj")
        return _expert_slice(stacked, expert, name == "gate_up", transpose=True)

    def expert_bias(self, source: Source, layer: int, expert: int, name: str) -> LazyTensor | None:
        stacked = source.tensor(f"model.layers.{layer}.mlp.experts.{name}_proj_bias")
        return _expert_slice(stacked, expert, name == "gate_up", transpose=False)

    def norms(self, layer: int) -> list[str]:
        return [self.input_norm(layer), self.post_attention_norm(layer)]

    def layer_tensors(self, source: Source, layer: int) -> list[LazyTensor]:
        return (self.attention_tensors(source, layer) + [source.tensor(self.router(layer))] +
                self.expert_tensors(source, layer))


def _expert_slice(stacked: LazyTensor, expert: int, interleaved: bool, transpose: bool) -> LazyTensor:
    """Expert `expert` of a stacked tensor, transposed to [out, in] for a weight, the interleaved
    gate/up outputs regrouped (even ones, then odd ones); read when first asked for."""
    tail = stacked.shape[1:][::-1] if transpose else stacked.shape[1:]
    name = f"{stacked.name}.{expert}"

    @cache
    def matrix() -> np.ndarray:
        m = stacked.rows(expert, expert + 1)[0]
        m = m.T if transpose else m
        return np.ascontiguousarray(np.concatenate([m[0::2], m[1::2]]) if interleaved else m)

    return LazyTensor(name, tuple(tail), lambda start, stop: matrix()[start:stop])
