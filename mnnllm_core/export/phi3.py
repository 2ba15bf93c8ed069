"""Phi-3: the llama computation with fused checkpoint tensors (qkv_proj, gate_up_proj), split into
MNN's separate q/k/v and gate/up Linears at export; a `sliding_window` (when set) on every layer."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mnnllm_core.errors import FormatError

from . import llama, mistral
from .config import ConfigReader
from .sources import LazyTensor, Source


@dataclass
class ModelArgs(mistral.ModelArgs):
    @classmethod
    def read(cls, r: ConfigReader) -> dict[str, Any]:
        kw = super().read(r)
        r.ignore("original_max_position_embeddings")  # only longrope reads it, and longrope is refused
        return kw

    biases = staticmethod(llama.ModelArgs.no_biases)


class Model(llama.Model):
    def linear_weight(self, source: Source, layer: int, name: str) -> LazyTensor:
        a = self.args
        q, kv = a.num_attention_heads * a.head_dim, a.num_key_value_heads * a.head_dim
        parts = {"q_proj": ("qkv_proj", 0, q), "k_proj": ("qkv_proj", q, q + kv),
                 "v_proj": ("qkv_proj", q + kv, q + 2 * kv),
                 "gate_proj": ("gate_up_proj", 0, a.intermediate_size),
                 "up_proj": ("gate_up_proj", a.intermediate_size, 2 * a.intermediate_size)}
        if name not in parts:
            return super().linear_weight(source, layer, name)
        fused, start, stop = parts[name]
        tensor = source.tensor(f"{self.linear(layer, fused)}.weight")
        rows = q + 2 * kv if fused == "qkv_proj" else 2 * a.intermediate_size
        if tensor.shape[0] != rows:
            raise FormatError(f"tensor {tensor.name!r} has {tensor.shape[0]} rows, the config implies {rows}",
                              file=source.path, field=tensor.name)
        return tensor.row_range(start, stop, f"{self.linear(layer, name)}.weight")

    def linear(self, layer: int, name: str) -> str:
        group = "mlp" if name in ("gate_proj", "up_proj", "down_proj", "gate_up_proj") else "self_attn"
        return f"model.layers.{layer}.{group}.{name}"
