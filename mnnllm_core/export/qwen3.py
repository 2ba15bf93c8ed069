"""Qwen3: the Qwen2 layout without the q/k/v bias (`attention_bias` for all four), plus a per-head
RMSNorm on q and k before RoPE (MNN's RoPE op carries them as its q_norm/k_norm tables)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from . import llama, qwen2
from .config import ConfigReader


@dataclass
class ModelArgs(qwen2.ModelArgs):
    @classmethod
    def read(cls, r: ConfigReader) -> dict[str, Any]:
        kw = super().read(r)
        kw["head_dim"] = r.size("head_dim", 128)  # Qwen3's default, not hidden_size / heads
        return kw

    @classmethod
    def biases(cls, r: ConfigReader) -> tuple[bool, bool]:
        return llama.ModelArgs.biases(r)


class Model(llama.Model):
    def attention(self, layer: int) -> llama.AttentionSpec:
        base = f"model.layers.{layer}.self_attn"
        return replace(super().attention(layer), q_norm=f"{base}.q_norm.weight", k_norm=f"{base}.k_norm.weight")
