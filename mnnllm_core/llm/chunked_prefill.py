"""A long prompt prefilled in chunks (MNN's `chunk` and `chunk_limits`): each chunk runs as one
step that appends its keys and values to the cache and attends to the cache so far, so the
activations a step holds (and the attention scores) grow with the chunk, not with the prompt.

`chunk` > 0 is the chunk's size; else `chunk_limits` [max, min] (an NPU export's fixed prefill
and decode lengths) chunks by its max; neither (the defaults) runs a prompt at once.

A step of more than RELEASED_STEP_ROWS rows gives its activations back when it ends: the module
pool's clone of that length (its resized buffers, placed by lifetime, the MLP in row slabs:
70 MiB at 8,192 rows on the shared model, cpu memory "low") is dropped and collected, so the
decode that follows holds the KV cache, not the prompt's activations too. A prompt of that
length again is resized afresh, a small cost beside its prefill.
"""
from __future__ import annotations

import gc
from typing import Callable

import numpy as np

from .config import LlmConfig
from .module_pool import ModulePool

RELEASED_STEP_ROWS = 1024


def release_long_step(pool: ModulePool, seq: int, all_logits: bool) -> None:
    """After a step of `seq` rows: drop its clone when the step was long. The clone's session
    holds reference cycles, so only a collection gives its buffers back now."""
    if seq > RELEASED_STEP_ROWS:
        pool.discard(seq, all_logits)
        gc.collect()


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
