"""Qwen2 / Qwen2.5: the llama layout with a bias on q, k and v (kept in fp32 as the Convolution's bias),
and optional sliding windows on the layers from `max_window_layers` on."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import llama
from .config import FULL, SLIDING, ConfigReader


@dataclass
class ModelArgs(llama.ModelArgs):
    default_theta = 1000000.0

    @classmethod
    def biases(cls, r: ConfigReader) -> tuple[bool, bool]:
        return True, False

    @classmethod
    def attention_layout(cls, r: ConfigReader, layers: int) -> dict[str, Any]:
        """transformers: a window only with `use_sliding_window`, on layers >= `max_window_layers`."""
        windowed = r.flag("use_sliding_window", False)
        first = r.size("max_window_layers", layers) if windowed else r.get("max_window_layers")
        default = [SLIDING if windowed and i >= first else FULL for i in range(layers)]
        types = r.layer_types(layers, default)
        if not windowed:
            types = [FULL] * layers
        rope = r.rope(cls.default_theta)
        return dict(layer_types=types, sliding_window=cls.window_from(r, types, 4096), ropes=[rope] * layers)


class Model(llama.Model):
    pass
