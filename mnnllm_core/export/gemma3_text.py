"""Gemma 3 (text): Gemma 2's layout with per-head q/k RMSNorms (stored as w - 1 like every Gemma norm),
a rotary table per layer type (local layers: `rope_local_base_freq`, default rope) and sliding windows
on all but every `sliding_window_pattern`-th layer."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import gemma2, llama
from .config import FULL, SLIDING, ConfigReader


@dataclass
class ModelArgs(gemma2.ModelArgs):
    default_theta = 1000000.0

    @classmethod
    def attention_layout(cls, r: ConfigReader, layers: int) -> dict[str, Any]:
        pattern = r.size("sliding_window_pattern", r.get("_sliding_window_pattern", 6))
        r.ignore("_sliding_window_pattern")
        types = r.layer_types(layers, [SLIDING if (i + 1) % pattern else FULL for i in range(layers)])
        full = r.rope(cls.default_theta, FULL)
        local = r.rope(10000.0, SLIDING, legacy_theta_key="rope_local_base_freq", legacy_scaling=False)
        return dict(layer_types=types, sliding_window=cls.window_from(r, types, 4096),
                    ropes=[local if t == SLIDING else full for t in types])


class Model(gemma2.Model):
    def attention(self, layer: int) -> llama.AttentionSpec:
        spec = super().attention(layer)
        base = f"model.layers.{layer}.self_attn"
        return llama.AttentionSpec(spec.rope, spec.window, f"{base}.q_norm.weight", f"{base}.k_norm.weight",
                                   spec.scale)
