"""Qwen3.5-MoE (text): Qwen3.5's hybrid attention; every MLP is a softmax router, top-k experts always
renormalised (MNN's MoE op over `/expert/{layer}_{e}` subgraphs) plus a shared expert scaled by
sigmoid(shared_expert_gate(x)). Experts are read per expert (mlp.experts.{e}.{gate,up,down}_proj, the
checkpoint layout) or from transformers 5's fused mlp.experts.gate_up_proj [E, 2I, H] (gate rows, then up)
and mlp.experts.down_proj [E, H, I]."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import llama, qwen3_5
from .config import ConfigReader
from .sources import LazyTensor, Source, concat_rows, expert_matrix


@dataclass
class ModelArgs(qwen3_5.ModelArgs):
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0

    @classmethod
    def with_defaults(cls, config: dict[str, Any]) -> dict[str, Any]:
        """No dense MLP: `intermediate_size` (which the reader requires) is the experts' width when absent."""
        config = super().with_defaults(config)
        if "intermediate_size" not in config and "moe_intermediate_size" in config:
            config = {**config, "intermediate_size": config["moe_intermediate_size"]}
        return config

    @classmethod
    def read(cls, r: ConfigReader) -> dict[str, Any]:
        kw = super().read(r)
        experts = r.size("num_experts", 256)
        top_k = r.size("num_experts_per_tok", 8)
        if top_k > experts:
            raise r.error(f"num_experts_per_tok {top_k} exceeds num_experts {experts}", "num_experts_per_tok")
        kw.update(num_experts=experts, num_experts_per_tok=top_k,
                  moe_intermediate_size=r.size("moe_intermediate_size", 512),
                  shared_expert_intermediate_size=r.size("shared_expert_intermediate_size", 512))
        return kw


class Model(qwen3_5.Model):
    style = "plain"

    def mlp(self, layer: int) -> llama.MlpSpec:
        a = self.args
        return llama.MlpSpec(a.act, a.num_experts, a.num_experts_per_tok, True, a.shared_expert_intermediate_size,
                             shared_gate=True)

    def router(self, layer: int) -> str:
        return f"{self.base}.layers.{layer}.mlp.gate.weight"

    def expert_weight(self, source: Source, layer: int, expert: int, name: str) -> LazyTensor:
        """`name`: gate_up ([gate; up] rows, as MNN's expert subgraph slices them) or down; from the
        checkpoint's per-expert tensors (what save_pretrained writes) or transformers' fused ones."""
        base = f"{self.base}.layers.{layer}.mlp.experts"
        fused = f"{base}.{'down' if name == 'down' else 'gate_up'}_proj"
        if source.has(fused):
            return expert_matrix(source.tensor(fused), expert, f"{fused}[{expert}]")
        if name == "down":
            return source.tensor(f"{base}.{expert}.down_proj.weight")
        return concat_rows([source.tensor(f"{base}.{expert}.{p}_proj.weight") for p in ("gate", "up")],
                           f"{base}.{expert}.gate_up_proj.weight")

    def shared_weight(self, source: Source, layer: int, name: str) -> LazyTensor:
        """`name`: shared_expert_gate or shared_expert/{gate,up,down}_proj."""
        return source.tensor(f"{self.base}.layers.{layer}.mlp.{name.replace('/', '.')}.weight")

    def layer_tensors(self, source: Source, layer: int) -> list[LazyTensor]:
        tensors = [source.tensor(n) for n in self.norms(layer)]
        spec = self.linear_attention(layer)
        if spec is None:
            tensors += [self.linear_weight(source, layer, p) for p in ("q_proj", "q_gate_proj", "k_proj", "v_proj",
                                                                       "o_proj")]
        else:
            tensors += [source.tensor(f"{spec.base}.{n}.weight") for n in spec.linears()]
            tensors += [source.tensor(f"{spec.base}.{n}") for n in spec.small_tensors()]
        tensors.append(source.tensor(self.router(layer)))
        tensors += [self.shared_weight(source, layer, n) for n in ("shared_expert_gate", "shared_expert/gate_proj",
                                                                   "shared_expert/up_proj", "shared_expert/down_proj")]
        return tensors + self.expert_tensors(source, layer)
