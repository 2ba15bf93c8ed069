"""Fused Attention with its KV cache resident on the device, driven by the KV meta.

q [seq, heads*dim, 1, 1] (packed) or [1, seq, heads, dim], k/v likewise with kv heads: both
are token-major [seq, heads, dim] in memory. The cache keeps that layout ([capacity, kv_heads,
dim] per k and v), so a step appends with one device-side copy per tensor and growing the cache
(capacity doubles) is one device-side copy of the used part; nothing goes back to the host.
"""
from __future__ import annotations

import numpy as np

from mnnllm_core.core.backend import Execution
from mnnllm_core.errors import UnsupportedError

MIN_CAPACITY = 256  # tokens


class DeviceKVCache:
    """Keys and values of one layer, shared by the clones (prefill and decode) of its Execution."""

    def __init__(self) -> None:
        self.k = self.v = None
        self.capacity = 0
        self.length = 0

    def truncate(self, length: int) -> None:
        self.length = max(0, min(self.length, length))

    def append(self, allocator, k, v, seq: int, row_bytes: int) -> None:
        """Append `seq` token rows of `row_bytes` from the device buffers k and v."""
        need = self.length + seq
        if need > self.capacity:
            capacity = max(need, 2 * self.capacity, MIN_CAPACITY)
            grown_k, grown_v = allocator.alloc(capacity * row_bytes), allocator.alloc(capacity * row_bytes)
            if self.k is not None:
                allocator.copy(grown_k, self.k, self.length * row_bytes)
                allocator.copy(grown_v, self.v, self.length * row_bytes)
            self.k, self.v, self.capacity = grown_k, grown_v, capacity
        allocator.copy(self.k, k, seq * row_bytes, dst_offset=self.length * row_bytes)
        allocator.copy(self.v, v, seq * row_bytes, dst_offset=self.length * row_bytes)
        self.length = need


class AttentionExecution(Execution):
    def __init__(self, backend, use_cache: bool, scale: float, heads: tuple[int, int, int] | None,
                 cache: DeviceKVCache | None = None):
        super().__init__(backend)
        self.use_cache, self.scale, self.heads = use_cache, scale, heads
        self.cache = cache if cache is not None else DeviceKVCache()
        self.kernel = None
        self.bound = None  # the cache buffer the kernel's k argument points at
        self.kv_seq = self.row_bytes = 0

    def on_resize(self, inputs, outputs) -> None:
        shape = layout(inputs[0], inputs[1], self.heads)
        if shape is None or shape[3] % 4:
            raise UnsupportedError(f"opencl Attention needs known heads and head_dim % 4 == 0, got {shape}",
                                   field="heads")
        seq, heads, kv_heads, dim = shape
        kv_seq = inputs[1].size // (kv_heads * dim)  # keys of this step: q's length only for self-attention
        mask = inputs[3] if len(inputs) > 3 else None
        mask_mode = 0 if mask is None or mask.size == 1 else 1
        if mask_mode and (len(mask.shape) < 2 or mask.shape[-2] < seq):
            raise UnsupportedError(f"opencl Attention: a mask of shape {mask.shape} has fewer rows than the "
                                   f"{seq} queries", field="attention_mask")
        defines = {"HEAD_DIM": dim}
        if mask_mode and mask.dtype.kind in "iu":
            defines["MASK_INT"] = 1
        rows, cols = (mask.shape[-2], mask.shape[-1]) if mask_mode else (1, 1)
        scale = self.scale or 1.0 / np.sqrt(dim)
        self.kv_seq, self.bound = kv_seq, None
        self.row_bytes = kv_heads * dim * self.backend.storage_dtype(inputs[1]).itemsize
        mask_buffer = mask.storage if mask is not None else inputs[0].storage
        self.kernel = self.backend.program("attention.cl", "attention", **defines).bind(
            (seq, heads), None, inputs[0].storage, inputs[1].storage, inputs[2].storage, mask_buffer,
            outputs[0].storage, np.int32(seq), np.int32(heads), np.int32(kv_heads), np.int32(0), np.int32(kv_seq),
            np.float32(scale), np.int32(mask_mode), np.int32(rows), np.int32(cols))

    def on_execute(self, inputs, outputs) -> None:
        if self.use_cache:
            meta = self.backend.runtime.hints.get("kv_meta")
            if meta is not None:
                self.cache.truncate(meta.previous - meta.remove)
            past = self.cache.length
            self.cache.append(self.backend.allocator, inputs[1].storage, inputs[2].storage, self.kv_seq,
                              self.row_bytes)
            kernel = self.kernel.kernel
            if self.bound is not self.cache.k:  # the cache grew (or a clone grew it): rebind
                kernel.set_arg(1, self.cache.k)
                kernel.set_arg(2, self.cache.v)
                self.bound = self.cache.k
            kernel.set_arg(8, np.int32(past))
            kernel.set_arg(9, np.int32(self.cache.length))
        self.kernel(self.backend.queue)

    def on_clone(self, backend, op):
        return AttentionExecution(backend, self.use_cache, self.scale, self.heads, self.cache)


def layout(q, k, heads: tuple[int, int, int] | None) -> tuple[int, int, int, int] | None:
    """(seq, heads, kv_heads, dim) from the input shapes (and the op's heads when packed)."""
    if len(q.shape) == 4 and q.shape[2] == 1 and q.shape[3] == 1:
        if heads is None:
            return None
        num_head, kv_num_head, dim = heads
        return q.shape[0], num_head, kv_num_head, dim
    return q.shape[-3], q.shape[-2], k.shape[-2], q.shape[-1]


def create_attention(backend, inputs, outputs, op):
    """None (cpu fallback) when the shapes are known and the heads are not, or head_dim is not a
    multiple of 4. The core creates Attention before shapes are known (so that clones share its
    cache): then the op's heads decide, and on_resize checks again."""
    heads = op.extra.get("heads")
    if heads is not None and heads[2] % 4:
        return None
    if inputs[0].shape:
        shape = layout(inputs[0], inputs[1], heads)
        if shape is None or shape[3] % 4:
            return None
    p = op.param
    scale = float(getattr(p, "attnScale", 0.0) or 0.0) if p is not None else 0.0
    use_cache = bool(getattr(p, "kvCache", True)) if p is not None else True
    return AttentionExecution(backend, use_cache, scale, heads)


CREATORS = {"Attention": create_attention}
