"""Qwen2 / Qwen2.5: the llama layout with a bias on q, k and v (kept in fp32 as the Convolution's bias)."""
from __future__ import annotations

from dataclasses import dataclass

from . import llama


@dataclass
class ModelArgs(llama.ModelArgs):
    rope_theta: float = 1000000.0


class Model(llama.Model):
    @property
    def qkv_bias(self) -> bool:
        return True
