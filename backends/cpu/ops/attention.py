"""Fused Attention with its own KV cache, driven by the KV meta the LLM sets each step.

q [seq, heads*dim, 1, 1] (packed, as MNN's transformer-fused export emits) or [1, seq, heads, dim];
k and v likewise with kv heads. Grouped-query heads share kv heads. A scalar mask means
"causal"; a full float mask is added to the scores; an int mask zeroes where it is 0.
With memory "low" and the causal mask, numba kernels attend (`kernels/attention.py`), over a
cache that holds keys transposed.
"""
from __future__ import annotations

import numpy as np

from mnnllm_core.core.backend import Execution

FEW_TOKENS = 8  # up to this many new tokens attend on the calling thread (memory "low")
PANEL = 16  # the cache grows in whole panels of the low-memory GEMM


class KVCache:
    """Keys and values, [kv_heads, capacity, dim] each (keys [kv_heads, dim, capacity] when
    `keys_transposed`); grows by doubling, never re-copied per step."""

    def __init__(self, keys_transposed: bool = False) -> None:
        self.k: np.ndarray | None = None
        self.v: np.ndarray | None = None
        self.length = 0
        self.keys_transposed = keys_transposed

    @property
    def capacity(self) -> int:
        return 0 if self.v is None else self.v.shape[1]

    def truncate(self, length: int) -> None:
        self.length = max(0, min(self.length, length))

    def append(self, k: np.ndarray, v: np.ndarray) -> None:
        """k, v: [seq, kv_heads, dim]."""
        seq, heads, dim = k.shape
        need = self.length + seq
        if need > self.capacity:
            capacity = -(-max(need, 2 * (self.capacity or 32)) // PANEL) * PANEL
            grown_v = np.zeros((heads, capacity, dim), np.float32)
            grown_k = np.zeros((heads, dim, capacity) if self.keys_transposed else grown_v.shape, np.float32)
            if self.v is not None:
                grown_v[:, :self.length] = self.v[:, :self.length]
                if self.keys_transposed:
                    grown_k[:, :, :self.length] = self.k[:, :, :self.length]
                else:
                    grown_k[:, :self.length] = self.k[:, :self.length]
            self.k, self.v = grown_k, grown_v
        if self.keys_transposed:
            self.k[:, :, self.length:need] = k.transpose(1, 2, 0)
        else:
            self.k[:, self.length:need] = k.transpose(1, 0, 2)
        self.v[:, self.length:need] = v.transpose(1, 0, 2)
        self.length = need


def softmax_last(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    np.exp(x, out=x)
    x /= x.sum(axis=-1, keepdims=True)
    return x


class AttentionExecution(Execution):
    def __init__(self, backend, use_cache: bool, scale: float, heads: tuple[int, int, int] | None,
                 cache: KVCache | None = None):
        super().__init__(backend)
        self.use_cache = use_cache
        self.scale = scale
        self.heads = heads  # (num_head, kv_num_head, head_dim) when q/k/v are packed
        self.cache = cache if cache is not None else KVCache(keys_transposed=use_cache and backend.low_memory())
        self.kernel_call = None  # (kernel, q, out, scale) bound at resize for the key-transposed cache

    def on_resize(self, inputs, outputs) -> None:
        self.kernel_call = None
        q = self._split(inputs[0], False)
        seq, num_head, dim = q.shape
        if self.cache.keys_transposed and dim % PANEL == 0 and q.flags.c_contiguous:
            from ..kernels.attention import attend, attend_parallel
            kernel = attend if seq <= FEW_TOKENS or self.backend.runtime.thread_num == 1 else attend_parallel
            scale = np.float32(self.scale if self.scale else 1.0 / np.sqrt(dim))
            self.kernel_call = (kernel, q, outputs[0].storage.reshape(seq, num_head, dim), scale)

    def _split(self, tensor, kv: bool) -> np.ndarray:
        x = tensor.storage
        if x.ndim == 4 and x.shape[2] == 1 and x.shape[3] == 1:
            if self.heads is None:
                raise ValueError("packed attention inputs need the head configuration")
            num_head, kv_num_head, dim = self.heads
            return x.reshape(x.shape[0], kv_num_head if kv else num_head, dim)
        return x.reshape(x.shape[-3], x.shape[-2], x.shape[-1])

    def on_execute(self, inputs, outputs) -> None:
        q = self._split(inputs[0], False)
        k = self._split(inputs[1], True)
        v = self._split(inputs[2], True)
        seq, num_head, dim = q.shape
        kv_heads = k.shape[1]
        group = num_head // kv_heads
        mask = inputs[3].storage if len(inputs) > 3 else None
        if self.use_cache:
            meta = self.backend.runtime.hints.get("kv_meta")
            past = meta.previous - meta.remove if meta is not None else self.cache.length
            self.cache.truncate(past)
            past = self.cache.length
            self.cache.append(k, v)
            length = self.cache.length
            if self.cache.keys_transposed:
                if self.kernel_call is not None and (mask is None or mask.size == 1):
                    kernel, queries, out, scale = self.kernel_call
                    kernel(queries, self.cache.k, self.cache.v, past, scale, out)
                    return
                keys = self.cache.k[:, :, :length].transpose(0, 2, 1)
            else:
                keys = self.cache.k[:, :length]
            values = self.cache.v[:, :length]
        else:
            past = 0
            keys, values = k.transpose(1, 0, 2), v.transpose(1, 0, 2)
        total = keys.shape[1]
        scale = self.scale if self.scale else 1.0 / np.sqrt(dim)
        queries = q.reshape(seq, kv_heads, group, dim).transpose(1, 2, 0, 3)  # [kvh, group, seq, dim]
        scores = np.matmul(queries, keys.transpose(0, 2, 1)[:, None]) * np.float32(scale)
        self._mask(scores, mask, past, seq, total)
        probs = softmax_last(scores)
        context = np.matmul(probs, values[:, None])  # [kvh, group, seq, dim]
        outputs[0].storage.reshape(seq, kv_heads, group, dim)[...] = context.transpose(2, 0, 1, 3)

    @staticmethod
    def _mask(scores: np.ndarray, mask: np.ndarray | None, past: int, seq: int, total: int) -> None:
        if mask is None or mask.size == 1:
            if seq > 1:
                allowed = np.arange(total)[None, :] <= (past + np.arange(seq))[:, None]
                scores[..., ~allowed] = -np.inf
            return
        m = mask.reshape(mask.shape[-2], mask.shape[-1])[-seq:]
        if np.issubdtype(m.dtype, np.integer):
            m = np.where(m == 0, -np.inf, 0.0).astype(np.float32)
        if m.shape[-1] == total:
            scores += m
        else:
            scores[..., total - m.shape[-1]:] += m

    def on_clone(self, backend, op):
        return AttentionExecution(backend, self.use_cache, self.scale, self.heads, self.cache)


def create_attention(backend, inputs, outputs, op):
    p = op.param
    heads = op.extra.get("heads")
    scale = float(getattr(p, "attnScale", 0.0) or 0.0) if p is not None else 0.0
    use_cache = bool(getattr(p, "kvCache", True)) if p is not None else True
    return AttentionExecution(backend, use_cache, scale, heads)


CREATORS = {"Attention": create_attention}
