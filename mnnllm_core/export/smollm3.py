"""SmolLM3: the llama layout with NoPE layers (`no_rope_layers[i] == 0`: no rotary at all) and optional
sliding windows on them. MNN's own exporter rotates every layer; here a NoPE layer's RoPE op gets the
angle-0 table (cos 1, sin 0), which leaves q and k exactly as they are."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import llama
from .config import FULL, SLIDING, ConfigReader


@dataclass
class ModelArgs(llama.ModelArgs):
    default_theta = 2000000.0

    @classmethod
    def attention_layout(cls, r: ConfigReader, layers: int) -> dict[str, Any]:
        interval = r.size("no_rope_layer_interval", 4)
        uses_rope = r.get("no_rope_layers", [int((i + 1) % interval != 0) for i in range(layers)])
        if not isinstance(uses_rope, list) or len(uses_rope) != layers or any(v not in (0, 1) for v in uses_rope):
            raise r.error(f"no_rope_layers must list {layers} values 0/1, got {uses_rope!r}", "no_rope_layers")
        windowed = r.flag("use_sliding_window", False) and r.has("sliding_window")
        default = [SLIDING if windowed and not rope else FULL for rope in uses_rope]
        types = r.layer_types(layers, default)
        if not r.flag("use_sliding_window", False):
            types = [FULL] * layers
        rope = r.rope(cls.default_theta)
        return dict(layer_types=types, sliding_window=cls.window_from(r, types),
                    ropes=[rope if uses else None for uses in uses_rope])


class Model(llama.Model):
    pass
