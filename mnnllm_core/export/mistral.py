"""Mistral: the llama layout; a `sliding_window` (when set) applies to every layer."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import llama
from .config import FULL, SLIDING, ConfigReader


@dataclass
class ModelArgs(llama.ModelArgs):
    @classmethod
    def attention_layout(cls, r: ConfigReader, layers: int) -> dict[str, Any]:
        types = [SLIDING if r.has("sliding_window") else FULL] * layers
        rope = r.rope(cls.default_theta)
        return dict(layer_types=types, sliding_window=cls.window_from(r, types), ropes=[rope] * layers)


class Model(llama.Model):
    pass
