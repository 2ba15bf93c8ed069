"""Attention owning its KV cache on the device (DeviceKVCache: token-major rows, shared by the
prefill and decode clones; fp32, or fp16 where the backend's kv_format says so and a row is
whole 4-byte words: WebGPU copies no less), grouped-query heads, the scalar causal mask, float
and int full masks and sinks. Per run kv_write (the step's k/v rows at `past`), then on a GPU
the fused attention (attention.wgsl: scores into a scratch row, softmax, the weighted values; one
work-group per query and head), on a CPU adapter whose subgroups hold 8 invocations (lavapipe)
attention_online.wgsl (decode: a work-group per query head) or attention_online_group.wgsl
(prefill: a work-group per kv head's query heads): the whole op, cache append included, in one
dispatch of 8-invocation work-groups with an online softmax (no scores buffer, no barrier; the 4
dispatches a layer it replaces were a sixth of lavapipe's decode step); on another CPU adapter three
barrier-free dispatches (attention_split.wgsl: scores, softmax, weighted values). With a scores
buffer the queries go in blocks whose scores fit one storage binding (a 4,096-token prefill's do not: 9 heads
x 4096 x 4096 floats are 604 MB, lavapipe binds 128 MiB), each block its own dispatches over one
scratch buffer, in order. Nothing recorded depends on the token: past and total live in a small
storage buffer the host writes in `before_run`, so a replay encodes the same steps every token."""
from __future__ import annotations

import numpy as np

from mnnllm_core.backend_api import (AttentionParams, DeviceKVCache, KVFormat, Refused, UnsupportedError,
                                     attention_mask, float_attention_creator)

from ..device import Program, StepsExecution, fold, pack_params, wgsl

LOCAL = 256  # work-group size of kv_write.wgsl
SPLIT_LOCAL = 64  # work-group size of attention_split.wgsl
MASK_MODES = {"float": 2, "int": 3}  # attention.wgsl: 0 none, 1 causal, 2 added, 3 int (0 blocks)
ONLINE_DIM4 = 64  # attention_online.wgsl: head dims up to 256, multiples of 4
ONLINE_HEADS = 4  # attention_online_group.wgsl: query heads of one kv head a prefill's work-group takes, at most
SCORES_LIMIT = 1 << 27  # bytes of one block's scores at most (also the device's binding limit)
# the WGSL a cache format's rows take: (enable directive, element type)
KV_TYPES = {"float": ("", "f32"), "fp16": ("enable f16;", "f16")}


def cache_format(wanted: KVFormat, row_values: int) -> KVFormat:
    """The backend's KV format, but float where fp16 rows would not be whole 4-byte words
    (WebGPU copies, hence the cache's appends, moves and growth, go in multiples of 4 bytes)."""
    return wanted if wanted.name != "fp16" or row_values % 2 == 0 else KVFormat("float")


def online_heads(seq: int, group: int) -> int:
    """Query heads of one kv head a work-group takes: in a prefill the largest divisor of the
    group up to ONLINE_HEADS (attention_online_group.wgsl: each key and value read once for all
    of them), in decode 1 (attention_online.wgsl: a step's few work-groups spread over the
    threads; lavapipe, a decode step after 256 tokens: ~6.1 ms of CPU against ~8.5 for the
    group kernel with one head)."""
    if seq == 1:
        return 1
    return max(d for d in range(1, min(group, ONLINE_HEADS) + 1) if group % d == 0)


def query_block(seq: int, heads: int, stride: int, limit: int) -> int:
    """Queries per block: as many as keep a block's scores (block x heads x stride floats) within
    `limit` bytes; 0 when not even one query's do."""
    return min(seq, limit // (heads * stride * 4))


def online(device, dim: int) -> bool:
    """Whether attention_online.wgsl runs this head dim on this device: a CPU adapter with
    subgroups of at least 8 (its work-groups of 8 use subgroup ops), dim a multiple of 4."""
    return device.is_cpu and device.subgroup_size >= 8 and dim % 4 == 0 and dim // 4 <= ONLINE_DIM4


def device_kv_cache(backend) -> DeviceKVCache:
    """A DeviceKVCache on this backend's buffers; its copies are encoded into the runtime's recorder."""
    recorder, allocator = backend.runtime.recorder, backend.allocator

    def read(buffer, nbytes: int) -> np.ndarray:
        recorder.flush()
        return allocator.copyout(buffer, nbytes)

    def write(buffer, data: np.ndarray) -> None:
        recorder.flush()
        allocator.copyin(buffer, data)

    return DeviceKVCache(allocator.alloc, recorder.copy, backend.device.fits, read, write)


class AttentionExecution(StepsExecution):
    """Per run `before_run()` is the host's part (the cache's bookkeeping, growing it, past/total
    into `step`); the steps are the device's."""

    def __init__(self, backend, params: AttentionParams, cache: DeviceKVCache | None = None):
        super().__init__(backend)
        self.params = params
        self.cache = cache if cache is not None else device_kv_cache(backend)
        self.step = backend.allocator.alloc(8)  # int past, int total
        self.shape = (0, 0, 0, 0)
        self.kv_seq = 0
        self.mask = (0, 1, 1)
        self.kv_format = backend.kv_format
        self.scratch = None
        self.no_cache = None  # attention_online's cache bindings where there is no cache
        self.bound = None  # (keys, values, stride) the steps bind
        self.tensors = ((), ())

    def on_resize(self, inputs, outputs) -> None:
        shape = self.params.layout(inputs[0].shape, inputs[1].shape)
        if shape is None or shape[1] % shape[2]:
            raise UnsupportedError(f"webgpu Attention needs known heads (a multiple of kv heads), got {shape}",
                                   field="heads")
        seq, heads, kv_heads, dim = self.shape = shape
        if len(inputs) > 4 and inputs[4].size != heads:
            raise UnsupportedError(f"Attention: {inputs[4].size} sinks for {heads} heads", field="sinks")
        self.kv_seq = inputs[1].size // (kv_heads * dim)
        self.kv_format = cache_format(self.backend.kv_format, kv_heads * dim)
        self.cache.row_bytes = self.kv_format.row_bytes(kv_heads, dim, 4)
        mask = attention_mask(inputs[3] if len(inputs) > 3 else None, seq)
        self.mask = (1 if seq > 1 else 0, 1, 1) if mask.kind == "causal" else (MASK_MODES[mask.kind], mask.rows,
                                                                               mask.cols)
        self.tensors = (inputs, outputs)
        self.bound, self.steps = None, []

    def before_run(self) -> bool:
        """This step's bookkeeping and past/total; True when the steps no longer bind the right
        buffers (the cache grew, or the first run after a resize)."""
        inputs = self.tensors[0]
        if self.params.kv_cache:
            past = self.cache.begin_step(self.backend.kv_meta)
            self.cache.extend(self.kv_seq)
            keys, values, total, stride = self.cache.k, self.cache.v, self.cache.length, self.cache.capacity
        else:
            past, total = 0, self.kv_seq
            keys, values, stride = inputs[1].storage, inputs[2].storage, self.kv_seq
        self.backend.runtime.recorder.flush()  # what is encoded reads the step buffer as it was
        self.backend.allocator.copyin(self.step, np.array([past, total], np.int32))
        if self.bound == (keys, values, stride):
            return False
        self.steps = self._steps(keys, values, stride)
        self.bound = (keys, values, stride)
        return True

    def _steps(self, keys, values, stride) -> list:
        device, (inputs, outputs) = self.backend.device, self.tensors
        seq, heads, kv_heads, dim = self.shape
        if not seq or not stride:
            return []
        if online(device, dim) and self.kv_seq <= seq:  # a query's work-group appends its key row
            return [self._online(keys, values)]
        block = query_block(seq, heads, stride, min(device.max_binding, SCORES_LIMIT))
        if block == 0:
            raise UnsupportedError(f"webgpu Attention: one query's {heads}x{stride} scores exceed "
                                   "max_storage_buffer_binding_size", field="attention")
        scratch_bytes = block * heads * stride * 4
        if self.scratch is None or self.scratch.size < scratch_bytes:
            self.scratch = self.backend.allocator.alloc(scratch_bytes)
        q = inputs[0].storage
        mask = inputs[3].storage if len(inputs) > 3 else q
        sinks = inputs[4].storage if len(inputs) > 4 else q
        mode, rows, cols = self.mask
        buffers = [q, keys, values, mask, sinks, self.scratch, outputs[0].storage, self.step]
        scale = float(np.float32(self.params.scale_for(dim)))
        enable, kv_type = KV_TYPES[self.kv_format.name if self.params.kv_cache else "float"]
        typed = (("ENABLE", enable), ("KV", kv_type))

        def program(shader: str, t0: int, count: int, groups_row: tuple, defines: tuple = ()) -> Program:
            groups, row = groups_row
            params = pack_params("5if4iIii", seq, heads, kv_heads, dim, stride, scale, mode, rows, cols,
                                 int(len(inputs) > 4), row, t0, count)
            return Program(device, shader, buffers, params, groups, typed + defines)

        steps = []
        for t0 in range(0, seq, block):  # each block reuses the scratch after the one before
            count = min(block, seq - t0)
            if device.is_cpu:  # three barrier-free passes (attention_split.wgsl)
                steps += [program("attention_split", t0, count,
                                  fold(-(-count * heads * n // SPLIT_LOCAL), SPLIT_LOCAL), (("PASS", k),))
                          for k, n in enumerate((stride, 1, dim))]
            else:
                steps.append(program("attention", t0, count, fold(count * heads, 1)))
        if self.params.kv_cache:
            count = self.kv_seq * kv_heads * dim
            write_groups, write_row = fold(-(-count // LOCAL), LOCAL)
            steps.insert(0, Program(device, "kv_write", [inputs[1].storage, inputs[2].storage, keys, values,
                                                         self.step], pack_params("iiI", count, kv_heads * dim,
                                                                                 write_row), write_groups, typed))
        return steps

    def _online(self, keys, values) -> Program:
        """attention_online(_group).wgsl: the whole op in one dispatch, one 8-invocation work-group
        per (query, head) in decode, per (query, a kv head's query heads) in a prefill."""
        device, (inputs, outputs) = self.backend.device, self.tensors
        seq, heads, kv_heads, dim = self.shape
        if not self.params.kv_cache:  # every key is an input's; the cache bindings are unused
            if self.no_cache is None:
                self.no_cache = (self.backend.allocator.alloc(16), self.backend.allocator.alloc(16))
            keys, values = self.no_cache
        q = inputs[0].storage
        mask = inputs[3].storage if len(inputs) > 3 else q
        sinks = inputs[4].storage if len(inputs) > 4 else q
        mode, rows, cols = self.mask
        per_group = online_heads(seq, heads // kv_heads)
        groups, row = fold(seq * heads // per_group, 1)
        scale = float(np.float32(self.params.scale_for(dim)))
        params = pack_params("4if5iI", seq, heads, kv_heads, self.kv_seq, scale,
                             mode, rows, cols, int(len(inputs) > 4), int(self.params.kv_cache), row)
        enable, kv_type = KV_TYPES[self.kv_format.name if self.params.kv_cache else "float"]
        shader = "attention_online_group" if per_group > 1 else "attention_online"
        return Program(device, shader, [q, inputs[1].storage, inputs[2].storage, keys, values, mask, sinks,
                                        outputs[0].storage, self.step], params, groups,
                       (("COMMON", wgsl("attention_online_common")), ("ENABLE", enable), ("KV", kv_type),
                        ("DIM4", dim // 4), ("HEADS", per_group)))

    def on_execute(self, inputs, outputs) -> None:
        self.before_run()
        super().on_execute(inputs, outputs)

    def on_clone(self, backend, op):
        return AttentionExecution(backend, self.params, self.cache)


def create_attention(backend, inputs, outputs, op):
    mask = inputs[3] if len(inputs) > 3 else None
    if mask is not None and mask.dtype.itemsize != 4:
        return Refused("a mask of other than 4-byte elements")
    return float_attention_creator(AttentionExecution, sinks=True)(backend, inputs, outputs, op)


CREATORS = {"Attention": create_attention}
