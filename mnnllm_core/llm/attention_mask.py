"""The float attention mask the LLM feeds each step, built as MNN's `Llm::gen_attention_mask` does.

`attention_type` "full": a scalar 0 (the causal mask is applied inside Attention).
"mix": two planes [2, 1, 1, seq, kv] over the whole KV length (the cached tokens and the new
ones), plane 0 causal, plane 1 causal within the last `sliding_window` keys (the query's own
key included); the graph picks a plane per layer with GatherV2.
"sliding": every layer slides; one windowed plane [1, 1, seq, kv] (MNN's engine has no
such mode: a graph exported for it takes a single plane).
"""
from __future__ import annotations

import numpy as np

from ..errors import ConfigError

ATTENTION_TYPES = ("full", "mix", "sliding")
BLOCKED = np.finfo(np.float32).min  # MNN writes numeric_limits<float>::lowest()


def check_attention_type(attention_type: str, sliding_window: int, file: str | None = None) -> None:
    """An unknown attention_type, or a window that is not positive where one applies, is a ConfigError."""
    if attention_type not in ATTENTION_TYPES:
        raise ConfigError(f"attention_type must be one of {', '.join(ATTENTION_TYPES)}, got {attention_type!r}",
                          file=file, field="attention_type")
    if attention_type != "full" and sliding_window < 1:
        raise ConfigError(f"attention_type {attention_type!r} needs sliding_window >= 1, got {sliding_window}",
                          file=file, field="sliding_window")


def check_mask_input(attention_type: str, dims: list[int], model: str, config: str | None) -> None:
    """The graph's float attention_mask must take what `attention_type` feeds: two planes
    [2, 1, 1, seq, kv] for "mix", one [1, 1, seq, kv] otherwise (a declared rank of 0: unknown)."""
    if not dims:
        return
    planes = 2 if attention_type == "mix" else 1
    if len(dims) != (5 if planes == 2 else 4) or dims[0] != planes:
        raise ConfigError(f"attention_type {attention_type!r} feeds a mask of {planes} plane(s), but {model} "
                          f"declares attention_mask {dims}", file=config, field="attention_type")


def causal_plane(past: int, seq: int) -> np.ndarray:
    """[seq, past + seq]: 0 where query i (at position past + i) may see key j, else BLOCKED."""
    keys = np.arange(past + seq)[None, :]
    queries = (past + np.arange(seq))[:, None]
    return np.where(keys <= queries, 0.0, BLOCKED).astype(np.float32)


def sliding_plane(past: int, seq: int, window: int) -> np.ndarray:
    """[seq, past + seq]: causal, and only the last `window` keys up to the query's own."""
    keys = np.arange(past + seq)[None, :]
    queries = (past + np.arange(seq))[:, None]
    allowed = (keys <= queries) & (keys > queries - window)
    return np.where(allowed, 0.0, BLOCKED).astype(np.float32)


def float_attention_mask(attention_type: str, sliding_window: int, past: int, seq: int) -> np.ndarray:
    """The mask input for `seq` new tokens after `past` cached ones."""
    if attention_type == "mix":
        planes = np.stack([causal_plane(past, seq), sliding_plane(past, seq, sliding_window)])
        return planes.reshape(2, 1, 1, seq, past + seq)
    if attention_type == "sliding":
        return sliding_plane(past, seq, sliding_window).reshape(1, 1, seq, past + seq)
    return np.zeros((1, 1, 1, 1), np.float32)
