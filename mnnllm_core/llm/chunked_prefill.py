"""A long prompt prefilled in chunks (MNN's `chunk` and `chunk_limits`): each chunk runs as one
step that appends its keys and values to the cache and attends to the cache so far, so the
activations a step holds (and the attention scores) grow with the chunk, not with the prompt.

`chunk` > 0 is the chunk's size; else `chunk_limits` [max, min] (an NPU export's fixed prefill
and decode lengths) chunks by its max; neither (the defaults) runs a prompt at once.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .config import LlmConfig


def prefill_chunk(config: LlmConfig) -> int:
    """The most tokens one prefill step runs; 0 for no limit."""
    if config.chunk > 0:
        return config.chunk
    limits = config.chunk_limits
    return limits[0] if limits and limits[0] > 0 else 0


def run_in_chunks(step: Callable[[list[int], bool], np.ndarray], ids: list[int], all_logits: bool,
                  size: int) -> np.ndarray:
    """`step` (the Llm's one forward) over `ids` in chunks of `size`: the last chunk's logits, or
    every token's (all_logits) stacked as one step would give them."""
    parts = []
    for start in range(0, len(ids), size):
        logits = step(ids[start:start + size], all_logits)
        if all_logits:
            parts.append(logits)
    return np.concatenate(parts) if all_logits else logits
