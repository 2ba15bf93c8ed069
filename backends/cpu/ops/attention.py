"""Fused Attention with its own KV cache, driven by the KV meta the LLM sets each step.

q [seq, heads*dim, 1, 1] (packed, as MNN's transformer-fused export emits) or [1, seq, heads, dim];
k and v likewise with kv heads. Grouped-query heads share kv heads. A scalar mask means
"causal"; a full float mask is added to the scores; an int mask blocks where it is 0.
"""
from __future__ import annotations

import numpy as np

from mnnllm_core.backend_api import AttentionParams, Execution, KVCache, Refused, UnsupportedError, attention_mask


class HostKVCache(KVCache):
    """[kv_heads, capacity, dim] keys and values in host memory."""

    min_capacity = 128

    def __init__(self) -> None:
        super().__init__()
        self.k: np.ndarray | None = None
        self.v: np.ndarray | None = None

    def grow(self, capacity: int) -> None:
        grown = []
        for old in (self.k, self.v):
            new = np.zeros((self._heads, capacity, self._dim), np.float32)
            if old is not None:
                new[:, :self.length] = old[:, :self.length]
            grown.append(new)
        self.k, self.v = grown

    def write(self, k: np.ndarray, v: np.ndarray, seq: int) -> None:
        """k, v: [seq, kv_heads, dim]."""
        self.k[:, self.length:self.length + seq] = k.transpose(1, 0, 2)
        self.v[:, self.length:self.length + seq] = v.transpose(1, 0, 2)

    def add(self, k: np.ndarray, v: np.ndarray) -> None:
        self._heads, self._dim = k.shape[1], k.shape[2]
        self.append(k, v, k.shape[0])

    def keys(self) -> tuple[np.ndarray, np.ndarray]:
        return self.k[:, :self.length], self.v[:, :self.length]


def softmax_last(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    np.exp(x, out=x)
    x /= x.sum(axis=-1, keepdims=True)
    return x


class AttentionExecution(Execution):
    def __init__(self, backend, params: AttentionParams, cache: HostKVCache | None = None):
        super().__init__(backend)
        self.params = params
        self.cache = cache if cache is not None else HostKVCache()

    def on_execute(self, inputs, outputs) -> None:
        layout = self.params.layout(inputs[0].shape, inputs[1].shape)
        if layout is None:
            raise UnsupportedError("packed attention inputs need the head configuration", field="heads")
        seq, num_head, kv_heads, dim = layout
        q = inputs[0].storage.reshape(seq, num_head, dim)
        k = inputs[1].storage.reshape(-1, kv_heads, dim)
        v = inputs[2].storage.reshape(-1, kv_heads, dim)
        group = num_head // kv_heads
        if self.params.kv_cache:
            past = self.cache.begin_step(self.backend.kv_meta)
            self.cache.add(k, v)
            keys, values = self.cache.keys()
        else:
            past = 0
            keys, values = k.transpose(1, 0, 2), v.transpose(1, 0, 2)
        total = keys.shape[1]
        queries = q.reshape(seq, kv_heads, group, dim).transpose(1, 2, 0, 3)  # [kvh, group, seq, dim]
        scores = np.matmul(queries, keys.transpose(0, 2, 1)[:, None]) * np.float32(self.params.scale_for(dim))
        mask = inputs[3] if len(inputs) > 3 else None
        self._mask(scores, mask, past, seq, total)
        probs = softmax_last(scores)
        context = np.matmul(probs, values[:, None])  # [kvh, group, seq, dim]
        outputs[0].storage.reshape(seq, kv_heads, group, dim)[...] = context.transpose(2, 0, 1, 3)

    @staticmethod
    def _mask(scores: np.ndarray, mask, past: int, seq: int, total: int) -> None:
        kind = attention_mask(mask, seq).kind
        if kind == "causal":
            if seq > 1:
                allowed = np.arange(total)[None, :] <= (past + np.arange(seq))[:, None]
                scores[..., ~allowed] = -np.inf
            return
        m = mask.storage.reshape(mask.shape[-2], mask.shape[-1])[-seq:]
        if kind == "int":
            m = np.where(m == 0, -np.inf, 0.0).astype(np.float32)
        if m.shape[-1] == total:
            scores += m
        else:
            scores[..., total - m.shape[-1]:] += m

    def on_clone(self, backend, op):
        return AttentionExecution(backend, self.params, self.cache)


def create_attention(backend, inputs, outputs, op):
    if inputs[0].shape and op.param.layout(inputs[0].shape, inputs[1].shape) is None:
        return Refused("the inputs do not say the head layout")
    return AttentionExecution(backend, op.param)


CREATORS = {"Attention": create_attention}
