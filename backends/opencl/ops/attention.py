"""Fused Attention with its KV cache resident on the device, driven by the KV meta.

q [seq, heads*dim, 1, 1] (packed) or [1, seq, heads, dim], k/v likewise with kv heads: both
are token-major [seq, heads, dim] in memory, as the cache (`DeviceKVCache`) keeps them, and
nothing goes back to the host. Decode and GPU devices run `attention`, which reads the step's
own keys from its inputs and stores them into the cache itself (a decode step is one kernel per
layer, no copies: pocl pays per enqueued command); a prefill on a CPU device
(variant.cpu_kernels) runs `attention_tiled` (8 queries per work-item in the lanes of a float8,
keys in chunks with a running softmax) after one device-side copy per tensor appends the rows.
A decode step with a cache on a GPU runs flash-decoding instead: `attention_split` (the keys
split evenly across work-items, each reading its keys once for all query heads of a kv head)
then `attention_merge` (the splits' partial max, sum and output combined); on a CPU device
(pocl, 2 cores) one work-item per head measured faster (0.40 against 0.56 ms a layer at 1024
keys, the same at 4096). The cache is stored in the
runtime's KV format (kv_format.py: as the activations, fp16 or int8); a prefill on a CPU device
stores a converted format with `kv_append` instead of the copy.
The step's past and total are read from the runtime's step buffer, written once per step for
every layer (`OpenCLRuntime.attention_step`), so the arguments are bound once and set again only
when the cache moves to a larger buffer (pyopencl's set_arg of a scalar costs ~17 us).
"""
from __future__ import annotations

import numpy as np

from mnnllm_core.backend_api import (SINKS_REFUSAL, AttentionParams, DeviceKVCache, Execution, KVFormat,
                                     KVStateError, Refused, UnsupportedError, attention_mask)

from .variant import cpu_kernels

QUERY_LANES = 8  # queries per work-item of attention_tiled (a float8's lanes)
MAX_SPLIT_GROUP = 8  # query heads per kv head that attention_split holds in registers
MAX_SPLITS = 64


def decode_splits(device, kv_heads: int) -> int:
    """Key splits of a decode step: enough (split, kv head) work-items for every compute unit
    twice over on a CPU device (pocl: one work-item each), eight times on a GPU."""
    units = device.max_compute_units * (2 if device.type & 2 else 8)  # CL_DEVICE_TYPE_CPU is 2
    return max(1, min(MAX_SPLITS, -(-units // kv_heads)))


class AttentionExecution(Execution):
    def __init__(self, backend, params: AttentionParams, cache: DeviceKVCache | None = None):
        super().__init__(backend)
        self.params = params
        allocator = backend.allocator
        self.cache = cache if cache is not None else DeviceKVCache(
            allocator.alloc, allocator.copy, read=lambda buffer, nbytes: allocator.copyout(np.empty(nbytes, np.uint8),
                                                                                          buffer),
            write=allocator.copyin)
        self.program = None
        self.bound = None  # the cache buffer the kernel's k argument points at
        self.kv_seq = 0
        self.appends = False  # whether the kernel stores the step's rows into the cache (`attention`)
        self.cache_args = (1, 2)  # where the cache buffers go in the kernel's arguments
        self.store = None  # kv_append, binding the cache at (2, 3), when the copy cannot append
        self.merge = None  # attention_merge after attention_split (a decode step)
        self.part = None  # the splits' partial results
        self.row_bytes = 0  # of one token's keys in the cache's format

    def on_resize(self, inputs, outputs) -> None:
        shape = self.params.layout(inputs[0].shape, inputs[1].shape)
        if shape is None or shape[3] % 4:
            raise UnsupportedError(f"opencl Attention needs known heads and head_dim % 4 == 0, got {shape}",
                                   field="heads")
        seq, heads, kv_heads, dim = shape
        kv_seq = inputs[1].size // (kv_heads * dim)  # keys of this step: q's length only for self-attention
        mask = inputs[3] if len(inputs) > 3 else None
        kind = attention_mask(mask, seq)
        defines = {"HEAD_DIM": dim}
        if kind.kind == "int":
            defines["MASK_INT"] = 1
        fmt = self.backend.runtime.kv_format if self.params.kv_cache else KVFormat("float")
        if fmt.name == "int8":
            defines["KV_INT8"] = 1
        elif fmt.name == "fp16" and not self.backend.half:
            defines["KV_HALF"] = 1
        self.row_bytes = fmt.row_bytes(kv_heads, dim, self.backend.storage_dtype(inputs[1]).itemsize)
        if self.cache.length:
            self.check_rows()
        self.cache.row_bytes = self.row_bytes
        self.kv_seq, self.bound, self.store, self.merge = kv_seq, None, None, None
        mask_buffer = mask.storage if mask is not None else inputs[0].storage
        scale = np.float32(self.params.scale_for(dim))
        masking = (np.int32(kind.kind != "causal"), np.int32(kind.rows), np.int32(kind.cols))
        scalars = (np.int32(seq), np.int32(heads), np.int32(kv_heads), scale, *masking)
        step = self.backend.runtime.step_buffer
        cpu = cpu_kernels(self.backend)
        if seq > 1 and cpu:  # one work-item per group: pocl's own choice leaves a core idle
            defines["QUERY_LANES"] = QUERY_LANES
            self.appends, self.cache_args = False, (1, 2)
            self.program = self.backend.program("attention.cl", "attention_tiled", **defines).bind(
                (-(-seq // QUERY_LANES), heads), (1, 1), inputs[0].storage, inputs[1].storage, inputs[2].storage,
                mask_buffer, outputs[0].storage, step, *scalars)
            if "KV_INT8" in defines or "KV_HALF" in defines:
                self.store = self.backend.program("attention.cl", "kv_append", **defines).bind(
                    (kv_seq, kv_heads), (1, 1), inputs[1].storage, inputs[2].storage,
                    inputs[1].storage, inputs[2].storage, step, np.int32(kv_heads))
        elif seq == 1 and self.params.kv_cache and heads // kv_heads <= MAX_SPLIT_GROUP and not cpu:
            self.appends, self.cache_args = True, (5, 6)
            splits = decode_splits(self.backend.runtime.device.device, kv_heads)
            # kept here: a kernel's argument does not keep its buffer alive
            part = self.part = self.backend.allocator.alloc(heads * splits * (dim + 2) * 4)
            defines["GROUP"] = heads // kv_heads
            # a CPU device (forced to these kernels): one work-item per group, as pocl's larger groups
            # overflow its stack with the work-item's GROUP x HEAD_DIM accumulators
            single = self.backend.runtime.device.is_cpu
            self.program = self.backend.program("attention.cl", "attention_split", **defines).bind(
                (splits, kv_heads), (1, 1) if single else None, inputs[0].storage, inputs[1].storage,
                inputs[2].storage, mask_buffer, part, inputs[1].storage, inputs[2].storage, step, np.int32(1),
                np.int32(heads), np.int32(kv_heads), scale, *masking)
            self.merge = self.backend.program("attention.cl", "attention_merge", **defines).bind(
                (heads,), (1,) if single else None, part, outputs[0].storage, np.int32(splits))
        else:
            self.appends, self.cache_args = self.params.kv_cache, (5, 6)
            # a CPU device: one work-item per group, so a decode step's few heads use both cores
            local = (1, 1) if cpu else None
            self.program = self.backend.program("attention.cl", "attention", **defines).bind(
                (seq, heads), local, inputs[0].storage, inputs[1].storage, inputs[2].storage, mask_buffer,
                outputs[0].storage, inputs[1].storage, inputs[2].storage, step, np.int32(self.appends), *scalars)

    def check_rows(self) -> None:
        """Rows the cache holds (a clone's, or a prefix cache file's) are of this format's size."""
        if self.cache.row_bytes != self.row_bytes:
            fmt = self.backend.runtime.kv_format.name
            raise KVStateError(f"the KV cache holds rows of {self.cache.row_bytes} bytes, but its {fmt} format "
                               f"makes rows of {self.row_bytes} (rows saved under another attention_mode or "
                               "KV precision?)", field="attention_mode")

    def on_execute(self, inputs, outputs) -> None:
        if self.params.kv_cache:
            self.check_rows()
            past = self.cache.begin_step(self.backend.kv_meta)
            if self.appends or self.store is not None:
                self.cache.extend(self.kv_seq)
            else:
                self.cache.append(inputs[1].storage, inputs[2].storage, self.kv_seq)
            if self.bound is not self.cache.k:  # the cache grew (or a clone grew it): rebind
                for program, at in ((self.program, self.cache_args), (self.store, (2, 3))):
                    if program is not None:
                        program.kernel.set_arg(at[0], self.cache.k)
                        program.kernel.set_arg(at[1], self.cache.v)
                self.bound = self.cache.k
            total = self.cache.length
        else:
            past, total = 0, self.kv_seq
        self.backend.runtime.attention_step(past, total)
        queue = self.backend.queue
        if self.store is not None:
            self.store(queue)
        self.program(queue)
        if self.merge is not None:
            self.merge(queue)

    def on_clone(self, backend, op):
        return AttentionExecution(backend, self.params, self.cache)


def create_attention(backend, inputs, outputs, op):
    """Refused (cpu fallback) when the shapes are known and the heads are not, or head_dim is not
    a multiple of 4, or with sinks. The core creates Attention before shapes are known (so that
    clones share its cache): then the op's heads decide, and on_resize checks again."""
    p = op.param
    if len(inputs) > 4:
        return Refused(SINKS_REFUSAL)
    if p.heads is not None and p.heads[2] % 4:
        return Refused("head_dim is not a multiple of 4")
    if inputs[0].shape:
        shape = p.layout(inputs[0].shape, inputs[1].shape)
        if shape is None or shape[3] % 4:
            return Refused("unknown heads, or head_dim not a multiple of 4")
    return AttentionExecution(backend, p)


CREATORS = {"Attention": create_attention}
