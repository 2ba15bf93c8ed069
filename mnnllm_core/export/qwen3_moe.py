"""Qwen3-MoE: Qwen3's attention; the MLP of each sparse layer is a softmax router, top-k experts
(renormalised when `norm_topk_prob`) and MNN's MoE op, whose experts are subgraphs `/expert/{layer}_{e}`
(each a fused gate_up Linear, SiLU, down). Layers in `mlp_only_layers`, or off the
`decoder_sparse_step` grid, keep a dense MLP."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import llama, qwen3
from .config import FULL, SLIDING, ConfigReader
from .sources import LazyTensor, Source, concat_rows


@dataclass
class ModelArgs(qwen3.ModelArgs):
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    sparse_layers: list[bool] = field(default_factory=list)

    @classmethod
    def read(cls, r: ConfigReader) -> dict[str, Any]:
        kw = super().read(r)
        layers = kw["num_hidden_layers"]
        experts = r.size("num_experts", r.get("num_local_experts"))
        r.ignore("num_local_experts")
        top_k = r.size("num_experts_per_tok")
        if top_k > experts:
            raise r.error(f"num_experts_per_tok {top_k} exceeds num_experts {experts}", "num_experts_per_tok")
        step = r.size("decoder_sparse_step", 1)
        dense = r.get("mlp_only_layers", [])
        kw.update(num_experts=experts, num_experts_per_tok=top_k, moe_intermediate_size=r.size("moe_intermediate_size"),
                  norm_topk_prob=r.flag("norm_topk_prob", False),
                  sparse_layers=[i not in dense and (i + 1) % step == 0 for i in range(layers)])
        return kw

    @classmethod
    def attention_layout(cls, r: ConfigReader, layers: int) -> dict[str, Any]:
        """transformers: `use_sliding_window` puts the window on every layer."""
        windowed = r.flag("use_sliding_window", False)
        r.ignore("max_window_layers", "layer_types")
        types = [SLIDING if windowed else FULL] * layers
        rope = r.rope(cls.default_theta)
        return dict(layer_types=types, sliding_window=cls.window_from(r, types, 4096), ropes=[rope] * layers)


class Model(qwen3.Model):
    style = "plain"

    def mlp(self, layer: int) -> llama.MlpSpec:
        a = self.args
        if not a.sparse_layers[layer]:
            return llama.MlpSpec(a.act)
        return llama.MlpSpec(a.act, a.num_experts, a.num_experts_per_tok, a.norm_topk_prob)

    def router(self, layer: int) -> str:
        return f"model.layers.{layer}.mlp.gate.weight"

    def expert_weight(self, source: Source, layer: int, expert: int, name: str) -> LazyTensor:
        """`name`: gate_up (gate rows then up rows, as MNN's expert subgraph slices them) or down."""
        base = f"model.layers.{layer}.mlp.experts.{expert}"
        if name == "down":
            return source.tensor(f"{base}.down_proj.weight")
        return concat_rows([source.tensor(f"{base}.gate_proj.weight"), source.tensor(f"{base}.up_proj.weight")],
                           f"{base}.gate_up_proj.weight")

    def layer_tensors(self, source: Source, layer: int) -> list[LazyTensor]:
        if not self.args.sparse_layers[layer]:
            return super().layer_tensors(source, layer)
        return (self.attention_tensors(source, layer) + [source.tensor(self.router(layer))] +
                self.expert_tensors(source, layer))
