"""The float attention mask the LLM feeds each step, built as MNN's `Llm::gen_attention_mask` does.

`attention_type` "full": a scalar 0 (the causal mask is applied inside Attention).
"mix": two planes [2, 1, 1, seq, kv] over the whole KV length (the cached tokens and the new
ones), plane 0 causal, plane 1 causal within the last `sliding_window` keys (the query's own
key included); the graph picks a plane per layer with GatherV2.
"sliding": every layer slides; one windowed plane [1, 1, seq, kv] (MNN's engine has no
such mode: a graph exported for it takes a single plane).

A token tree (speculative verification of a draft tree, MNN's Eagle) runs its nodes in one
step: each node sees the cached tokens, itself and its ancestors, at position past + depth.
"full" feeds MNN's [1, 1, nodes, nodes] (Attention takes the cached columns as visible); the
planes of "mix" and "sliding" span the whole KV length, the window measured in positions.
"""
from __future__ import annotations

import numpy as np

from ..errors import ConfigError, MnnllmError

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


def tree_depths(parents: list[int]) -> np.ndarray:
    """Each node's depth (a root, parent -1, is 0); parents come before their children."""
    depths = np.zeros(len(parents), np.int64)
    for node, parent in enumerate(parents):
        if not -1 <= parent < node:
            raise MnnllmError(f"tree node {node} has parent {parent}: parents must come before their children",
                              field="parents")
        depths[node] = depths[parent] + 1 if parent >= 0 else 0
    return depths


def tree_visible(parents: list[int]) -> np.ndarray:
    """bool [nodes, nodes]: node i sees node j (itself or an ancestor)."""
    seen = np.zeros((len(parents), len(parents)), bool)
    for node, parent in enumerate(parents):
        if parent >= 0:
            seen[node] = seen[parent]
        seen[node, node] = True
    return seen


def tree_allowed(parents: list[int], past: int, window: int | None = None) -> np.ndarray:
    """bool [nodes, past + nodes]: every cached key, the node's ancestors and itself; with a
    window only keys fewer than `window` positions back."""
    depths = tree_depths(parents)
    allowed = np.concatenate([np.ones((len(parents), past), bool), tree_visible(parents)], axis=1)
    if window is not None:
        keys = np.concatenate([np.arange(past), past + depths])[None, :]
        allowed &= keys > (past + depths)[:, None] - window
    return allowed


def tree_attention_mask(attention_type: str, sliding_window: int, past: int, parents: list[int]) -> np.ndarray:
    """The float mask input for a token tree of `len(parents)` nodes after `past` cached tokens."""
    nodes = len(parents)
    if attention_type == "full":
        plane = np.where(tree_visible(parents), 0.0, BLOCKED).astype(np.float32)
        return plane.reshape(1, 1, nodes, nodes)
    window = np.where(tree_allowed(parents, past, sliding_window), 0.0, BLOCKED).astype(np.float32)
    if attention_type == "sliding":
        return window.reshape(1, 1, nodes, past + nodes)
    causal = np.where(tree_allowed(parents, past), 0.0, BLOCKED).astype(np.float32)
    return np.stack([causal, window]).reshape(2, 1, 1, nodes, past + nodes)


def float_attention_mask(attention_type: str, sliding_window: int, past: int, seq: int) -> np.ndarray:
    """The mask input for `seq` new tokens after `past` cached ones."""
    if attention_type == "mix":
        planes = np.stack([causal_plane(past, seq), sliding_plane(past, seq, sliding_window)])
        return planes.reshape(2, 1, 1, seq, past + seq)
    if attention_type == "sliding":
        return sliding_plane(past, seq, sliding_window).reshape(1, 1, seq, past + seq)
    return np.zeros((1, 1, 1, 1), np.float32)


def step_mask(kind: str, attention_type: str, sliding_window: int, past: int, seq: int) -> np.ndarray:
    """The attention_mask input of a causal step, for the graph's mask `kind` ("float", or
    "int": 1 where a query sees a key, over the whole KV length)."""
    if kind == "float":
        return float_attention_mask(attention_type, sliding_window, past, seq)
    keys = np.arange(past + seq)[None, :]
    return (keys <= (past + np.arange(seq))[:, None]).astype(np.int32).reshape(1, 1, seq, -1)


def tree_mask(kind: str, attention_type: str, sliding_window: int, past: int, parents: list[int]) -> np.ndarray:
    """The attention_mask input of a token tree's step (see tree_attention_mask)."""
    if kind == "float":
        return tree_attention_mask(attention_type, sliding_window, past, parents)
    return tree_allowed(parents, past).astype(np.int32).reshape(1, 1, len(parents), -1)
