"""LFM2-MoE: LFM2's conv and attention layers; from layer `num_dense_layers` on, the MLP is a mixture
of SwiGLU experts (w1, w3, w2) routed by sigmoid scores, chosen by score + `expert_bias` and weighted
by the unbiased scores, renormalised (sum + 1e-6) when `norm_topk_prob`, times
`routed_scaling_factor`; written as MNN's MoE op over expert subgraphs like Qwen3-MoE."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import lfm2, llama
from .config import ConfigReader
from .sources import LazyTensor, Source, concat_rows

_NORM_EPS = 1e-6  # transformers' Lfm2MoeTopKRouter adds it to the sum it divides by


@dataclass
class ModelArgs(lfm2.ModelArgs):
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    num_dense_layers: int = 0
    norm_topk_prob: bool = True
    use_expert_bias: bool = True
    routed_scaling_factor: float = 1.0

    @classmethod
    def read(cls, r: ConfigReader) -> dict[str, Any]:
        kw = super().read(r)
        experts, top_k = r.size("num_experts"), r.size("num_experts_per_tok")
        if top_k > experts:
            raise r.error(f"num_experts_per_tok {top_k} exceeds num_experts {experts}", "num_experts_per_tok")
        dense = r.get("num_dense_layers", 2)
        if isinstance(dense, bool) or not isinstance(dense, int) or dense < 0:
            raise r.error(f"num_dense_layers must be a non-negative integer, got {dense!r}", "num_dense_layers")
        kw.update(num_experts=experts, num_experts_per_tok=top_k, moe_intermediate_size=r.size("moe_intermediate_size"),
                  num_dense_layers=dense, norm_topk_prob=r.flag("norm_topk_prob", True),
                  use_expert_bias=r.flag("use_expert_bias", True),
                  routed_scaling_factor=r.number("routed_scaling_factor", 1.0))
        return kw


class Model(lfm2.Model):
    style = "plain"

    def sparse(self, layer: int) -> bool:
        return layer >= self.args.num_dense_layers

    def mlp(self, layer: int) -> llama.MlpSpec:
        a = self.args
        if not self.sparse(layer):
            return llama.MlpSpec(a.act)
        bias = f"model.layers.{layer}.feed_forward.expert_bias" if a.use_expert_bias else None
        return llama.MlpSpec(a.act, a.num_experts, a.num_experts_per_tok, a.norm_topk_prob, scoring="sigmoid",
                             selection_bias=bias, norm_eps=_NORM_EPS if a.norm_topk_prob else 0.0,
                             routed_scale=a.routed_scaling_factor)

    def router(self, layer: int) -> str:
        return f"model.layers.{layer}.feed_forward.gate.weight"

    def expert_weight(self, source: Source, layer: int, expert: int, name: str) -> LazyTensor:
        """`name`: gate_up (w1 rows then w3 rows, as MNN's expert subgraph slices them) or down (w2)."""
        base = f"model.layers.{layer}.feed_forward.experts.{expert}"
        if name == "down":
            return source.tensor(f"{base}.w2.weight")
        return concat_rows([source.tensor(f"{base}.w1.weight"), source.tensor(f"{base}.w3.weight")],
                           f"{base}.gate_up_proj.weight")

    def mlp_tensors(self, source: Source, layer: int) -> list[LazyTensor]:
        if not self.sparse(layer):
            return super().mlp_tensors(source, layer)
        return [source.tensor(self.router(layer))] + self.expert_tensors(source, layer)
