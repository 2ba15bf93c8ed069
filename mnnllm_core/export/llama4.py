"""Llama 4 (text): the llama layout with

- RoPE on adjacent pairs (transformers rotates (2i, 2i+1) as complex numbers): q_proj / k_proj rows are
  reordered per head to [even dims, odd dims], which turns it into MNN's half-split RoPE; q.k is unchanged;
- NoPE layers (`no_rope_layers` 0, every `no_rope_layer_interval`-th by default): an angle-0 table;
- `use_qk_norm`: a weightless RMSNorm on q and k of the RoPE layers after rotation. A rotation keeps a
  head's norm, so it is the same before it: RoPEParam's q/k norm with gamma 1;
- dense MLPs of `intermediate_size_mlp` (under `feed_forward`); MoE layers (`moe_layers`): top-1 routing
  on the router logits, the token scaled by sigmoid(logit) *before* its expert (so MNN's MoE op gets the
  scaled token and weight 1; top-k > 1 is refused), plus an ungated shared expert.

MNN's runtime cannot follow chunked attention (it builds only full and sliding masks) nor the NoPE
layers' query temperature (`attn_temperature_tuning`, which departs from 1 at position floor_scale - 1).
Both leave the first tokens alone: the export caps the context there (config.json's `max_all_tokens`:
attention_chunk_size, floor_scale - 1 or max_position_embeddings, the least), so it never runs a model
other than transformers'.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from . import llama
from .config import FULL, ConfigReader
from .sources import LazyTensor, Source, expert_matrix, permute_rows

logger = logging.getLogger(__name__)

CHUNKED = "chunked_attention"


@dataclass
class ModelArgs(llama.ModelArgs):
    qk_norm: bool = False
    moe_layers: list[int] = field(default_factory=list)
    num_experts: int = 0
    moe_intermediate_size: int = 0
    context_limit: int = 0         # tokens the export is exact for (config.json's max_all_tokens)
    context_reason: str = "max_position_embeddings"

    default_theta = 500000.0

    @classmethod
    def read(cls, r: ConfigReader) -> dict[str, Any]:
        kw = super().read(r)
        layers, limit = kw["num_hidden_layers"], r.size("max_position_embeddings", 131072)
        kw["intermediate_size"] = r.size("intermediate_size_mlp", 16384)
        r.ignore("intermediate_size")  # the experts' width
        step = r.size("interleave_moe_layer_step", 1)
        moe = r.get("moe_layers", list(range(step - 1, layers, step)))
        if not isinstance(moe, list) or any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < layers
                                            for i in moe):
            raise r.error(f"moe_layers must list layer indices below {layers}, got {moe!r}", "moe_layers")
        kw["moe_layers"] = sorted(set(moe))
        if moe:
            kw["num_experts"] = r.size("num_local_experts", 16)
            kw["moe_intermediate_size"] = r.size("intermediate_size", 8192)
            if r.size("num_experts_per_tok", 1) != 1:
                raise r.unsupported(f"num_experts_per_tok {r.get('num_experts_per_tok')}: Llama 4 scales each chosen "
                                    "expert's input by its own router score, and MNN's MoE op gives every chosen "
                                    "expert one input (exact only for top-1)", "num_experts_per_tok")
        r.ignore("num_local_experts", "num_experts_per_tok")
        kw["qk_norm"] = r.flag("use_qk_norm", True)
        chunk = r.config.get("attention_chunk_size", 8192)  # null (not missing) means no chunking
        r.ignore("attention_chunk_size")
        types = r.get("layer_types")
        chunked = CHUNKED in types if isinstance(types, list) else chunk is not None
        exact = {"max_position_embeddings": limit}
        if chunked and chunk is not None:
            if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
                raise r.error(f"attention_chunk_size must be a positive integer, got {chunk!r}",
                              "attention_chunk_size")
            exact["attention_chunk_size"] = chunk
        if any(use is None for use in kw["ropes"]) and r.flag("attn_temperature_tuning", True):
            exact["attn_temperature_tuning"] = r.size("floor_scale", 8192) - 1
        r.ignore("floor_scale", "attn_scale")
        kw["context_limit"] = min(exact.values())
        kw["context_reason"] = min(exact, key=exact.get)
        return kw

    @classmethod
    def attention_layout(cls, r: ConfigReader, layers: int) -> dict[str, Any]:
        interval = r.size("no_rope_layer_interval", 4)
        flags = r.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(layers)]
        if not isinstance(flags, list) or len(flags) != layers or any(f not in (0, 1) for f in flags):
            raise r.error(f"no_rope_layers must list {layers} of 0/1, got {flags!r}", "no_rope_layers")
        types = r.get("layer_types", [FULL] * layers)
        if not isinstance(types, list) or len(types) != layers or any(t not in (FULL, CHUNKED) for t in types):
            raise r.unsupported(f"layer_types must list {layers} of {FULL!r}/{CHUNKED!r}, got {types!r}", "layer_types")
        rope = r.rope(cls.default_theta)
        return dict(layer_types=[FULL] * layers, sliding_window=None,
                    ropes=[rope if flag else None for flag in flags])


class Model(llama.Model):
    def __init__(self, args: ModelArgs):
        super().__init__(args)
        if args.moe_layers:
            self.style = "plain"  # the MoE op's graph shape (as for qwen3_moe)

    def runtime_config(self) -> dict[str, Any]:
        a = self.args
        logger.info("llama4_text: context capped at %d tokens (max_all_tokens), where %s still leaves the "
                    "attention exact", a.context_limit, a.context_reason)
        return {"max_all_tokens": a.context_limit}

    def mlp(self, layer: int) -> llama.MlpSpec:
        a = self.args
        if layer not in a.moe_layers:
            return llama.MlpSpec(a.act)
        return llama.MlpSpec(a.act, a.num_experts, 1, shared=a.moe_intermediate_size, sigmoid_input=True)

    def router(self, layer: int) -> str:
        return f"{self.base}.layers.{layer}.feed_forward.router.weight"

    def expert_weight(self, source: Source, layer: int, expert: int, name: str) -> LazyTensor:
        """`name`: gate_up ([gate; up] rows) or down, from the fused [E, in, out] checkpoint tensors."""
        fused = source.tensor(f"{self.base}.layers.{layer}.feed_forward.experts.{name}_proj")
        return expert_matrix(fused, expert, f"{fused.name}[{expert}]", transpose=True)

    def shared_weight(self, source: Source, layer: int, name: str) -> LazyTensor:
        """`name`: shared_expert/{gate,up,down}_proj."""
        return source.tensor(f"{self.base}.layers.{layer}.feed_forward.{name.replace('/', '.')}.weight")

    def layer_tensors(self, source: Source, layer: int) -> list[LazyTensor]:
        if layer not in self.args.moe_layers:
            return super().layer_tensors(source, layer)
        shared = [self.shared_weight(source, layer, f"shared_expert/{p}") for p in ("gate_proj", "up_proj", "down_proj")]
        return (self.attention_tensors(source, layer) + [source.tensor(self.router(layer))] + shared +
                self.expert_tensors(source, layer))

    def attention(self, layer: int) -> llama.AttentionSpec:
        spec = super().attention(layer)
        if spec.rope is None or not self.args.qk_norm:
            return spec
        return replace(spec, unit_qk_norm=True)

    def linear(self, layer: int, name: str) -> str:
        group = "feed_forward" if name in ("gate_proj", "up_proj", "down_proj") else "self_attn"
        return f"{self.base}.layers.{layer}.{group}.{name}"

    def linear_weight(self, source: Source, layer: int, name: str) -> LazyTensor:
        tensor = super().linear_weight(source, layer, name)
        return self._pairs_to_halves(tensor) if name in ("q_proj", "k_proj") else tensor

    def linear_bias(self, source: Source, layer: int, name: str) -> LazyTensor | None:
        bias = super().linear_bias(source, layer, name)
        return self._pairs_to_halves(bias) if bias is not None and name in ("q_proj", "k_proj") else bias

    def _pairs_to_halves(self, tensor: LazyTensor) -> LazyTensor:
        """Per head, rows (0, 2, 4, ..., 1, 3, 5, ...): adjacent rotary pairs become MNN's (i, i + d/2)."""
        d = self.args.head_dim
        within = np.concatenate([np.arange(0, d, 2), np.arange(1, d, 2)])
        order = (np.arange(tensor.shape[0] // d)[:, None] * d + within[None, :]).reshape(-1)
        return permute_rows(tensor, order, f"{tensor.name}:halves")
