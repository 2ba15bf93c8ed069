"""Attention with a device-resident KV cache (causal scalar mask, float or int full mask, GQA):
three dispatches per run, scores (+ mask), softmax in place, context; scores live in a scratch
buffer of [seq, heads, capacity]. With the cache, k and v are first appended to the device cache
by a shader at the row the step buffer names (token-major rows, shared by the clones; a cache
doubled past maxStorageBufferRange or maxTexelBufferElements grows only to what it needs). On a
device with subgroups, head dims 16, 32, 48, 64, 80, 96 and 128 run all of it in one dispatch
with an online softmax over the keys (attn_fused.glsl): no scores buffer, so no depth limit.
The cache is kept in the runtime's KV format (kv_format.py: fp32, fp16 or int8) where the one
dispatch runs (attn_fused<dim>_half / _int8), else in fp32 (the three-dispatch path reads fp32
texels), which is logged once per shape. Nothing recorded depends on the token: past and total
live in the step buffer, so the dispatches replay unchanged.

A decode step (one query) on the one-dispatch path runs flash-decoding once the cache holds
`split_keys` keys (hint "vulkan_split_keys", default SPLIT_KEYS; 0: never): attn_split<dim>
(attn_fused.glsl with SPLIT) gives each (head, split) work-group an even share of the keys and
leaves its partial max, sum and unnormalised output, then attn_merge combines the splits. A
decode step of attn_fused is `heads` work-groups each walking every key; split, a long cache's
keys are spread over every thread the device has. One work-group per (split, kv head) serving
its query heads together reads each key once, but measured 2 to 5x slower on lavapipe (the
per-head running softmax in arrays indexed by head). Crossing the threshold re-records the
replay once (before_run says the dispatches changed); the split count is fixed per shape and
the shader spreads the keys over as many splits as the depth fills (SPLIT_MIN_KEYS a split)."""
from __future__ import annotations

import numpy as np

import logging

from mnnllm_core.backend_api import (AttentionParams, DeviceKVCache, Execution, KVFormat, UnsupportedError,
                                     attention_mask, float_attention_creator)

from ..device import Program, Texels, fold, pack_push

log = logging.getLogger(__name__)

LOCAL = 256  # local size of attn_scores.comp and attn_context.comp
MASK_MODES = {"float": 2, "int": 3}  # attn_scores.comp: 0 none, 1 causal, 2 added, 3 int (0 blocks)
FUSED_DIMS = (16, 32, 48, 64, 80, 96, 128)  # head dims with an attn_fused<dim> shader (a device with subgroups)
CACHE_TEXELS = {"float": "vec4", "fp16": "half4", "int8": "char4"}  # how attn_fused reads the cache
SHADER_SUFFIX = {"float": "", "fp16": "_half", "int8": "_int8"}
SPLIT_KEYS = 1024  # cache length from which a decode step splits its keys (measured on lavapipe: bench/README.md)
SPLIT_MIN_KEYS = 128  # keys a split takes at least: fewer splits at a shallower depth
SPLIT_GROUPS = 64  # (head, split) work-groups aimed at, at most
_FP32_LOGGED: set[tuple] = set()  # the (heads, kv heads, dim) whose fp32 fallback was logged


class AttentionExecution(Execution):
    """Per run, `before_run()` does the host's part (the cache's bookkeeping, growing it, and the
    step's past/total written into `step`, a mapped buffer the shaders read), the dispatches
    the device's (kv_write, scores, softmax, context): a replayed command buffer records them
    (`replay_steps`) once and calls only before_run per token."""

    def __init__(self, backend, params: AttentionParams, cache: DeviceKVCache | None = None):
        super().__init__(backend)
        self.params = params
        self.cache = cache if cache is not None else DeviceKVCache(backend.allocator.alloc, backend.recorder.copy,
                                                                   backend.device.fits_floats)
        self.shape = None
        self.fused = False
        self.format = KVFormat("float")
        self.kv_seq = 0
        self.mask = (0, 1, 1)
        self.scratch = None
        self.step = backend.allocator.alloc(8)  # int past, int total: this step's, for the shaders
        self.bound = None  # (keys, values, scratch, stride, split) the dispatches bind
        self.dispatches = ()
        self.splits = 0  # key splits of a decode step (0: this shape never splits)
        self.part = None  # the splits' partial results, attn_split -> attn_merge

    def on_resize(self, inputs, outputs) -> None:
        shape = self.params.layout(inputs[0].shape, inputs[1].shape)
        if shape is None or shape[1] % shape[2]:
            raise UnsupportedError(f"vulkan Attention needs known heads (a multiple of kv heads), got {shape}",
                                   field="heads")
        seq, heads, kv_heads, dim = shape
        self.shape = shape
        self.fused = self.backend.runtime.subgroups and dim in FUSED_DIMS  # one dispatch, no scores buffer
        self.kv_seq = inputs[1].size // (kv_heads * dim)
        self.format = self.backend.runtime.kv_format if self.params.kv_cache else KVFormat("float")
        if self.format.name != "float" and not self.fused:
            if shape[1:] not in _FP32_LOGGED:
                _FP32_LOGGED.add(shape[1:])
                log.info("vulkan Attention heads=%s keeps an fp32 KV cache, not %s: only the one-dispatch attention "
                         "(subgroups, head dims %s) reads other formats", shape[1:], self.format.name, FUSED_DIMS)
            self.format = KVFormat("float")
        self.cache.row_bytes = self.format.row_bytes(kv_heads, dim, 4)
        mask = attention_mask(inputs[3] if len(inputs) > 3 else None, seq)
        self.mask = (1 if seq > 1 else 0, 1, 1) if mask.kind == "causal" else (MASK_MODES[mask.kind], mask.rows,
                                                                               mask.cols)
        self.bound, self.dispatches = None, ()
        self.inputs, self.outputs = inputs, outputs
        self.splits, self.part = 0, None
        if self.fused and seq == 1 and self.split_keys():
            self.splits = max(1, SPLIT_GROUPS // heads)
            self.part = self.backend.allocator.alloc(heads * self.splits * (dim // 4 + 1) * 16)

    def split_keys(self) -> int:
        """The cache length from which a decode step splits its keys (0: never)."""
        forced = self.backend.runtime.hints.vulkan_split_keys
        return SPLIT_KEYS if forced is None else forced

    def before_run(self) -> bool:
        """This step's bookkeeping and past/total; True when the recorded dispatches no longer
        bind the right buffers (the cache grew, or the first run after a resize)."""
        if self.params.kv_cache:
            past = self.cache.begin_step(self.backend.kv_meta)
            self.cache.extend(self.kv_seq)
            keys, values, total, stride = self.cache.k, self.cache.v, self.cache.length, self.cache.capacity
        else:
            past, total = 0, self.kv_seq
            keys, values, stride = self.inputs[1].storage, self.inputs[2].storage, self.kv_seq
        seq, heads = self.shape[:2]
        if not self.fused and not self.backend.device.fits_floats(seq * heads * stride * 4):
            raise UnsupportedError(f"vulkan Attention: {seq}x{heads}x{stride} scores exceed maxStorageBufferRange "
                                   "or maxTexelBufferElements",
                                   field="attention")
        self.step.write(np.array([past, total], np.int32))
        split = bool(self.splits) and total >= self.split_keys()
        if self.bound == (keys, values, self.scratch, stride, split):
            return False
        self.dispatches = self._dispatches(keys, values, stride, split)
        return True

    def _dispatches(self, keys, values, stride, split: bool) -> tuple:
        device, inputs, outputs = self.backend.device, self.inputs, self.outputs
        seq, heads, kv_heads, dim = self.shape
        if self.fused:
            self.bound = (keys, values, self.scratch, stride, split)
            if split:
                return self._split(keys, values)
            return (self._fused(keys, values),) if seq and stride else ()
        if self.scratch is None or self.scratch.size < max(4, seq * heads * stride * 4):
            self.scratch = self.backend.allocator.alloc(seq * heads * stride * 4)
        self.bound = (keys, values, self.scratch, stride, split)
        if not seq or not stride:
            return ()
        mask = inputs[3].storage if len(inputs) > 3 else inputs[0].storage
        mode, rows, cols = self.mask
        q, out, step = inputs[0].storage, outputs[0].storage, Texels(self.step, "int")
        scores_groups, scores_row = fold(-(-(seq * heads * stride) // LOCAL), LOCAL)
        lanes = dim // 4 if dim % 4 == 0 else dim  # attn_context: invocations per (token, head)
        context_groups, context_row = fold(-(-(seq * heads * lanes) // LOCAL), LOCAL)
        found = [
            Program(device, "attn_scores", [Texels(q, "vec4"), Texels(keys, "vec4"), Texels(q, "float"),
                                            Texels(keys, "float"), Texels(mask, "uint"), self.scratch, step],
                    pack_push("5if3iI", seq, heads, kv_heads, dim, stride,
                              float(np.float32(self.params.scale_for(dim))), mode, rows, cols, scores_row),
                    scores_groups),
            self._softmax(seq * heads, stride, step),
            Program(device, "attn_context", [Texels(self.scratch, "float"), Texels(values, "vec4"),
                                             Texels(values, "float"), out, out, step],
                    pack_push("5iI", seq, heads, kv_heads, dim, stride, context_row), context_groups)]
        if self.params.kv_cache:
            count = self.kv_seq * kv_heads * dim
            groups, row = fold(-(-count // LOCAL), LOCAL)
            found.insert(0, Program(device, "kv_write", [inputs[1].storage, inputs[2].storage, keys, values, step],
                                    pack_push("2iI", count, kv_heads * dim, row), groups))
        return tuple(found)

    def _fused(self, keys, values) -> Program:
        """attn_fused<dim>: the whole op (cache append included) in one dispatch."""
        seq, heads = self.shape[:2]
        groups, groups_x = fold(seq * heads, 1)
        return self._fused_program("attn_fused", keys, values, self.outputs[0].storage, groups, groups_x, 0)

    def _split(self, keys, values) -> tuple:
        """Flash-decoding: attn_split<dim> (cache append included) into `part`, attn_merge out."""
        heads, dim = self.shape[1], self.shape[3]
        split = self._fused_program("attn_split", keys, values, self.part, (heads, 1, self.splits), heads,
                                    self.splits)
        groups, row = fold(-(-heads * dim // 4 // 64), 64)
        merge = Program(self.backend.device, "attn_merge", [Texels(self.part, "vec4"), self.outputs[0].storage],
                        pack_push("3iI", heads, dim // 4, self.splits, row), groups)
        return split, merge

    def _fused_program(self, shader: str, keys, values, out, groups, groups_x: int, splits: int) -> Program:
        """attn_fused<dim> or attn_split<dim> (attn_fused.glsl) of this shape and cache format."""
        inputs = self.inputs
        seq, heads, kv_heads, dim = self.shape
        mode, rows, cols = self.mask
        k, v = inputs[1].storage, inputs[2].storage
        mask = inputs[3].storage if len(inputs) > 3 else inputs[0].storage
        cached = self.params.kv_cache
        texels = CACHE_TEXELS[self.format.name]
        bindings = [Texels(inputs[0].storage, "vec4"), Texels(k, "vec4"), Texels(v, "vec4"), Texels(keys, texels),
                    Texels(values, texels), Texels(mask, "uint"), out, keys if cached else out,
                    values if cached else out, Texels(self.step, "int")]
        if self.format.name == "int8":
            bindings += [Texels(keys, "float"), Texels(values, "float")]
        return Program(self.backend.device, f"{shader}{dim}{SHADER_SUFFIX[self.format.name]}", bindings,
                       pack_push("4if4iI2i", seq, heads, kv_heads, self.kv_seq,
                                 float(np.float32(self.params.scale_for(dim))), mode, rows, cols, int(cached),
                                 groups_x, splits, SPLIT_MIN_KEYS), groups)

    def _softmax(self, rows: int, stride: int, step) -> Program:
        """attn_softmax: an invocation per row, or with subgroups a work-group of 8 per row."""
        bindings = [Texels(self.scratch, "float"), self.scratch, step]
        if self.backend.runtime.subgroups:
            groups, groups_x = fold(rows, 1)
            return Program(self.backend.device, "attn_softmax_subgroup", bindings,
                           pack_push("2iI", rows, stride, groups_x), groups)
        return Program(self.backend.device, "attn_softmax", bindings, pack_push("2i", rows, stride),
                       (-(-rows // 64), 1, 1))

    def replay_steps(self, inputs, outputs) -> list:
        """The dispatches the last before_run made."""
        return list(self.dispatches)

    def on_execute(self, inputs, outputs) -> None:
        self.before_run()
        recorder = self.backend.recorder
        for item in self.dispatches:
            recorder.dispatch(item)

    def on_clone(self, backend, op):
        return AttentionExecution(backend, self.params, self.cache)


CREATORS = {"Attention": float_attention_creator(AttentionExecution)}
