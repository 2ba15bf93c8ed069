"""Op creators of the vulkan backend (shaders in shaders/*.comp): Raster, float BinaryOp,
Convolution 1x1 as a linear layer (4-bit weights packed on the device and dequantized in the
shader; other weights as fp32), LayerNorm/RMSNorm, float UnaryOp (the ops in UNARY), Cast
int32 <-> float32, RoPE (cut dim, optional q/k norm tables) and Attention with a device-resident
KV cache (causal scalar mask, float or int full mask, GQA). Everything else runs on cpu.

Every creator returns None (cpu fallback) for a tensor or weight larger than the device's
maxStorageBufferRange: one binding must cover a whole tensor.

Packed q4 layout (column-interleaved, so neighbouring invocations read neighbouring words):
word k of row o at [k, o] holds the row's codes 8k..8k+7 (code 8k+n in bits 4n); value =
code - 8; w = value * scale + zero with float (scale, zero) at [block, o].
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from mnnllm_core.core.backend import Execution
from mnnllm_core.core.op_params import NormParams, layernorm_params, rope_params
from mnnllm_core.errors import FormatError, UnsupportedError
from mnnllm_core.express.quant import QuantizedWeight

from .device import Dispatch, fold, pack_push

log = logging.getLogger(__name__)

FLOAT = np.dtype(np.float32)
LOCAL = 256  # local size of the elementwise shaders (raster, binary)


# ------------------------------------------------------------------ Raster

def walks_contiguously(size, stride) -> bool:
    expected = 1
    for n, s in zip(reversed(list(size)), reversed(list(stride))):
        if n != 1 and s != expected:
            return False
        expected *= n
    return True


class RasterExecution(Execution):
    """Each region: a buffer copy when contiguous at both ends, else the strided copy shader."""

    def __init__(self, backend, param):
        super().__init__(backend)
        self.param = param
        self.steps: list = []

    def on_resize(self, inputs, outputs) -> None:
        device, out = self.backend.device, outputs[0]
        self.steps = []
        if self.param.zero_fill:
            self.steps.append(("fill", out.storage, out.size * 4))
        for region in self.param.regions:
            src = inputs[region.origin].storage
            size = [int(v) for v in region.size]
            count = int(np.prod(size))
            if count == 0:
                continue
            if walks_contiguously(size, region.src.stride) and walks_contiguously(size, region.dst.stride):
                self.steps.append(("copy", out.storage, src, count * 4, region.dst.offset * 4, region.src.offset * 4))
                continue
            groups, row = fold(-(-count // LOCAL), LOCAL)
            push = pack_push("4i4i4iI", *size, count, *region.src.stride, region.src.offset,
                             *region.dst.stride, region.dst.offset, row)
            self.steps.append(("dispatch", Dispatch(device, "raster", [src, out.storage], push, groups)))

    def on_execute(self, inputs, outputs) -> None:
        recorder = self.backend.recorder
        for step in self.steps:
            if step[0] == "dispatch":
                recorder.dispatch(step[1])
            elif step[0] == "copy":
                recorder.copy(*step[1:])
            else:
                recorder.fill_zero(step[1], step[2])

    def on_clone(self, backend, op):
        return RasterExecution(backend, op.param)


def create_raster(backend, inputs, outputs, op):
    tensors = (*inputs, outputs[0])
    if any(t.dtype.itemsize != 4 for t in tensors) or not backend.fits(*tensors):
        return None
    return RasterExecution(backend, op.param)


# ------------------------------------------------------------------ BinaryOp

BINARY = {"ADD": 0, "SUB": 1, "MUL": 2, "REALDIV": 3, "DIV": 3, "MUL_SILU": 4, "MAXIMUM": 5, "MAX_TEMP": 5,
          "MINIMUM": 6, "MIN_TEMP": 6}


def broadcast_strides(out_shape, in_shapes) -> tuple[list[int], list[list[int]]] | None:
    """The output walked as at most 4 dims, with each input's element stride per dim (0 where
    the input broadcasts): extent-1 dims dropped, neighbours merged when every input allows it."""
    rank = len(out_shape)
    per_input = []
    for shape in in_shapes:
        shape = (1,) * (rank - len(shape)) + tuple(shape)
        strides, step = [0] * rank, 1
        for d in range(rank - 1, -1, -1):
            strides[d] = 0 if shape[d] == 1 else step
            step *= shape[d]
        per_input.append(strides)
    dims: list[int] = []
    strides = [[] for _ in in_shapes]
    for d in range(rank):
        n = int(out_shape[d])
        if n == 1:
            continue
        if dims and all(s[-1] == own[d] * n for s, own in zip(strides, per_input)):
            dims[-1] *= n
            for s, own in zip(strides, per_input):
                s[-1] = own[d]
            continue
        dims.append(n)
        for s, own in zip(strides, per_input):
            s.append(own[d])
    if len(dims) > 4:
        return None
    pad = 4 - len(dims)
    return [1] * pad + dims, [[0] * pad + s for s in strides]


class BinaryExecution(Execution):
    def __init__(self, backend, code: int, act: int):
        super().__init__(backend)
        self.code, self.act = code, act
        self.dispatch = None

    def on_resize(self, inputs, outputs) -> None:
        view = broadcast_strides(outputs[0].shape, [t.shape for t in inputs])
        if view is None:
            raise ValueError(f"vulkan BinaryOp: {[t.shape for t in inputs]} need more than 4 dims")
        dims, (sa, sb) = view
        total = outputs[0].size
        groups, row = fold(-(-total // LOCAL), LOCAL)
        push = pack_push("4i4i4iiiiI", *dims, *sa, *sb, total, self.code, self.act, row)
        self.dispatch = Dispatch(self.backend.device, "binary",
                                 [inputs[0].storage, inputs[1].storage, outputs[0].storage], push,
                                 groups if total else (0, 0, 0))

    def on_execute(self, inputs, outputs) -> None:
        self.backend.recorder.dispatch(self.dispatch)

    def on_clone(self, backend, op):
        return BinaryExecution(backend, self.code, self.act)


def create_binary(backend, inputs, outputs, op):
    code = BINARY.get(op.extra.get("operation"))
    act = int(getattr(op.param, "activationType", 0) or 0)
    if code is None or len(inputs) != 2 or act not in (0, 1, 2):
        return None
    if any(t.dtype != FLOAT for t in (*inputs, outputs[0])) or not backend.fits(*inputs, outputs[0]):
        return None
    if broadcast_strides(outputs[0].shape, [t.shape for t in inputs]) is None:
        return None
    return BinaryExecution(backend, code, act)


# ------------------------------------------------------------------ Convolution 1x1 (linear)

@dataclass(eq=False)
class PackedLinear:
    """Device buffers of one linear layer, shared by every clone of its Execution."""

    shader: str  # "linear_q4" | "linear_f"
    oc: int
    ic: int
    block: int
    weight: object
    scales: object
    bias: object
    has_bias: bool

    @property
    def nbytes(self) -> int:
        return self.weight.size + self.scales.size + self.bias.size


def pack_linear(backend, weights) -> PackedLinear | None:
    """The layer's weights in its shader's layout, uploaded once; None when a buffer would
    exceed maxStorageBufferRange."""
    device = backend.device
    w, bias = weights.quantized, weights.bias
    has_bias = bias is not None and bool(np.any(bias))
    if isinstance(w, QuantizedWeight) and w.bits == 4 and w.is_linear and w.block_size % 8 == 0 \
            and w.ic % w.block_size == 0:
        if not device.fits(w.oc * w.ic // 2) or not device.fits(w.oc * w.n_blocks * 8):
            return None
        codes = w.unpack().astype(np.uint32).reshape(w.oc, w.ic // 8, 8)
        words = np.zeros((w.oc, w.ic // 8), np.uint32)
        for n in range(8):
            words |= codes[:, :, n] << np.uint32(4 * n)
        words = np.ascontiguousarray(words.T)
        scales = np.ascontiguousarray(np.stack([w.scale, w.zero], axis=-1).astype(np.float32).transpose(1, 0, 2))
        return PackedLinear("linear_q4", w.oc, w.ic, w.block_size, device.constant(words), device.constant(scales),
                            device.constant(np.asarray(bias if has_bias else np.zeros(1), np.float32)), has_bias)
    oc, ic = w.oc, w.ic
    if not device.fits(oc * ic * 4):
        return None
    dense = w.dequantize() if isinstance(w, QuantizedWeight) else np.asarray(w.data, np.float32)
    return PackedLinear("linear_f", oc, ic, ic, device.constant(np.ascontiguousarray(dense, np.float32)),
                        device.constant(np.zeros(2, np.float32)),
                        device.constant(np.asarray(bias if has_bias else np.zeros(1), np.float32)), has_bias)


Q4_TILE = 8  # tokens per invocation in linear_q4_tile.comp (linear_q4.comp: 1, for decode)


class LinearExecution(Execution):
    def __init__(self, backend, packed: PackedLinear, act: int):
        super().__init__(backend)
        self.packed, self.act = packed, act
        self.packed_bytes = packed.nbytes
        self.dispatch = None

    def on_resize(self, inputs, outputs) -> None:
        p = self.packed
        rows = inputs[0].size // p.ic
        shader, tile = p.shader, 1
        if shader == "linear_q4" and rows > 1:
            shader, tile = "linear_q4_tile", Q4_TILE
        push = pack_push("6i", p.ic, p.oc, rows, p.block, int(p.has_bias), self.act)
        groups = (-(-p.oc // 64), -(-rows // tile), 1) if rows else (0, 0, 0)
        self.dispatch = Dispatch(self.backend.device, shader,
                                 [inputs[0].storage, p.weight, p.scales, p.bias, outputs[0].storage], push, groups)

    def on_execute(self, inputs, outputs) -> None:
        self.backend.recorder.dispatch(self.dispatch)

    def on_clone(self, backend, op):
        return LinearExecution(backend, self.packed, self.act)


def create_linear(backend, inputs, outputs, op):
    common = op.param.common
    if int(common.kernelX or 1) != 1 or int(common.kernelY or 1) != 1 or int(common.group or 1) != 1:
        return None
    if op.weights is None:
        return None
    packed = pack_linear(backend, op.weights.convolution())
    if packed is None:
        log.debug("vulkan refused %s: a weight buffer exceeds maxStorageBufferRange", op.name)
        return None
    act = 2 if common.relu6 else 1 if common.relu else 0
    return LinearExecution(backend, packed, act)


# ------------------------------------------------------------------ LayerNorm / RMSNorm

class LayerNormExecution(Execution):
    """As the cpu backend: last `axis_count` dims, groups (every dim after the first), the
    channel axis of NC4HW4 tensors, and the fused residual form (two inputs, two outputs)."""

    def __init__(self, backend, gamma, beta, eps: float, rms: bool, axis_count: int, group: int,
                 channel_axis: bool):
        super().__init__(backend)
        self.gamma, self.beta = gamma, beta  # (Buffer, present)
        self.eps, self.rms = eps, rms
        self.axis_count, self.group, self.channel_axis = axis_count, group, channel_axis
        self.dispatch = None

    def on_resize(self, inputs, outputs) -> None:
        x = inputs[0]
        if self.channel_axis and len(x.shape) == 4:
            hw = x.shape[2] * x.shape[3]
            length, rows = x.shape[1], x.shape[0] * hw
        elif self.group > 1:
            hw, rows = 1, x.shape[0] * self.group
            length = x.size // rows
        else:
            hw = 1
            length = int(np.prod(x.shape[len(x.shape) - self.axis_count:], dtype=np.int64))
            rows = x.size // length if length else 0
        for name, (buffer, present) in (("gamma", self.gamma), ("beta", self.beta)):
            if present and buffer.size != 4 * length:
                raise FormatError(f"LayerNorm {name} has {buffer.size // 4} values for rows of {length}", field=name)
        residual = len(inputs) == 2
        flags = (1 if self.rms else 0) | (2 if self.gamma[1] else 0) | (4 if self.beta[1] else 0) | \
                (8 if residual else 0)
        target = outputs[1] if residual else outputs[0]
        second = inputs[1] if residual else inputs[0]
        push = pack_push("3ifi", rows, length, hw, self.eps, flags)
        self.dispatch = Dispatch(self.backend.device, "norm",
                                 [x.storage, second.storage, outputs[0].storage, target.storage,
                                  self.gamma[0], self.beta[0]], push, (-(-rows // 64), 1, 1) if rows else (0, 0, 0))

    def on_execute(self, inputs, outputs) -> None:
        self.backend.recorder.dispatch(self.dispatch)

    def on_clone(self, backend, op):
        return LayerNormExecution(backend, self.gamma, self.beta, self.eps, self.rms, self.axis_count,
                                  self.group, self.channel_axis)


def constant_or_placeholder(backend, values) -> tuple[object, bool]:
    if values is None:
        return backend.device.constant(np.zeros(1, np.float32)), False
    return backend.device.constant(np.asarray(values, np.float32).reshape(-1)), True


def create_layernorm(backend, inputs, outputs, op):
    if any(t.dtype != FLOAT for t in (*inputs, *outputs)) or not backend.fits(*inputs, *outputs):
        return None
    p = layernorm_params(op)
    return LayerNormExecution(backend, constant_or_placeholder(backend, p.gamma),
                              constant_or_placeholder(backend, p.beta), p.epsilon, p.rms, p.axis_count, p.group,
                              p.channel_axis)


CREATORS = {"Raster": create_raster, "BinaryOp": create_binary, "Convolution": create_linear,
            "LayerNorm": create_layernorm}


# ------------------------------------------------------------------ UnaryOp, Cast

UNARY = {"ABS": 0, "NEG": 1, "FLOOR": 2, "CEIL": 3, "SQUARE": 4, "SQRT": 5, "RSQRT": 6, "EXP": 7, "LOG": 8,
         "SIN": 9, "COS": 10, "TAN": 11, "ATAN": 12, "RECIPROCAL": 13, "SIGN": 14, "SIGMOID": 15, "TANH": 16,
         "HARDSWISH": 17, "SILU": 18, "GELU": 19}


class ElementwiseExecution(Execution):
    """One shader over every element: unary.comp (code: the op) or cast.comp (code: the mode)."""

    def __init__(self, backend, shader: str, code: int):
        super().__init__(backend)
        self.shader, self.code = shader, code
        self.dispatch = None

    def on_resize(self, inputs, outputs) -> None:
        total = outputs[0].size
        groups, row = fold(-(-total // LOCAL), LOCAL)
        self.dispatch = Dispatch(self.backend.device, self.shader, [inputs[0].storage, outputs[0].storage],
                                 pack_push("iiI", total, self.code, row), groups if total else (0, 0, 0))

    def on_execute(self, inputs, outputs) -> None:
        self.backend.recorder.dispatch(self.dispatch)

    def on_clone(self, backend, op):
        return ElementwiseExecution(backend, self.shader, self.code)


def create_unary(backend, inputs, outputs, op):
    code = UNARY.get(op.extra.get("operation"))
    if code is None or len(inputs) != 1:
        return None
    if any(t.dtype != FLOAT for t in (*inputs, outputs[0])) or not backend.fits(*inputs, outputs[0]):
        return None
    return ElementwiseExecution(backend, "unary", code)


INT = np.dtype(np.int32)


def create_cast(backend, inputs, outputs, op):
    pair = (inputs[0].dtype, outputs[0].dtype)
    mode = {(FLOAT, INT): 0, (INT, FLOAT): 1}.get(pair)
    if mode is None or not backend.fits(inputs[0], outputs[0]):
        return None
    return ElementwiseExecution(backend, "cast", mode)


CREATORS.update({"UnaryOp": create_unary, "Cast": create_cast})


# ------------------------------------------------------------------ RoPE

class HeadNorm:
    """A RoPEParam q_norm/k_norm LayerNorm table on the device: gamma, beta, eps, shader flags."""

    def __init__(self, backend, norm: NormParams | None):
        self.gamma = constant_or_placeholder(backend, None if norm is None else norm.gamma)[0]
        self.beta = constant_or_placeholder(backend, None if norm is None else norm.beta)[0]
        self.eps = norm.epsilon if norm is not None else 0.0
        self.flags = (1 | (2 if norm.rms else 0) | (4 if norm.beta is not None else 0)) if norm is not None else 0


class RoPEExecution(Execution):
    def __init__(self, backend, num_head: int, kv_num_head: int, head_dim: int, rope_dim: int,
                 q_norm: HeadNorm, k_norm: HeadNorm):
        super().__init__(backend)
        self.num_head, self.kv_num_head, self.head_dim, self.rope_dim = num_head, kv_num_head, head_dim, rope_dim
        self.q_norm, self.k_norm = q_norm, k_norm
        self.dispatch = None

    def on_resize(self, inputs, outputs) -> None:
        seq = inputs[0].size // (self.num_head * self.head_dim)
        cs_stride = inputs[2].size // seq if seq else 0
        if seq and cs_stride < self.rope_dim:
            raise FormatError(f"RoPE cos/sin rows of {cs_stride} values for rope_dim {self.rope_dim}", field="cos")
        q, k = self.q_norm, self.k_norm
        push = pack_push("6iffii", seq, self.num_head, self.kv_num_head, self.head_dim, self.rope_dim, cs_stride,
                         q.eps, k.eps, q.flags, k.flags)
        count = seq * (self.num_head + self.kv_num_head)
        self.dispatch = Dispatch(self.backend.device, "rope",
                                 [*(t.storage for t in inputs[:4]), outputs[0].storage, outputs[1].storage,
                                  q.gamma, q.beta, k.gamma, k.beta], push,
                                 (-(-count // 64), 1, 1) if count else (0, 0, 0))

    def on_execute(self, inputs, outputs) -> None:
        self.backend.recorder.dispatch(self.dispatch)

    def on_clone(self, backend, op):
        return RoPEExecution(backend, self.num_head, self.kv_num_head, self.head_dim, self.rope_dim,
                             self.q_norm, self.k_norm)


def create_rope(backend, inputs, outputs, op):
    p = rope_params(op)
    if p is None or len(inputs) < 4:
        return None
    tensors = (*inputs[:4], *outputs[:2])
    if any(t.dtype != FLOAT for t in tensors) or not backend.fits(*tensors):
        return None
    if any(n is not None and len(n.gamma) != p.head_dim for n in (p.q_norm, p.k_norm)):
        return None
    return RoPEExecution(backend, p.num_head, p.kv_num_head, p.head_dim, p.rope_dim,
                         HeadNorm(backend, p.q_norm), HeadNorm(backend, p.k_norm))


# ------------------------------------------------------------------ Attention

MIN_CAPACITY = 256  # tokens in a KV cache when it is first allocated


class DeviceKVCache:
    """Keys and values of one layer on the device, token-major [capacity, kv_heads, dim] (the
    layout of the k/v inputs, so a step appends with one buffer copy each). Shared by the clones
    (prefill and decode) of its Execution; grows by doubling with a device-side copy."""

    def __init__(self) -> None:
        self.k = self.v = None
        self.capacity = self.length = 0

    def truncate(self, length: int) -> None:
        self.length = max(0, min(self.length, length))

    def append(self, backend, k, v, seq: int, row_bytes: int) -> None:
        need = self.length + seq
        recorder, device = backend.recorder, backend.device
        if need > self.capacity:
            capacity = max(need, 2 * self.capacity, MIN_CAPACITY)
            if not device.fits(capacity * row_bytes):
                capacity = need
            grown_k, grown_v = device.alloc(capacity * row_bytes), device.alloc(capacity * row_bytes)
            if self.k is not None:
                recorder.copy(grown_k, self.k, self.length * row_bytes)
                recorder.copy(grown_v, self.v, self.length * row_bytes)
            self.k, self.v, self.capacity = grown_k, grown_v, capacity
        recorder.copy(self.k, k, seq * row_bytes, dst_offset=self.length * row_bytes)
        recorder.copy(self.v, v, seq * row_bytes, dst_offset=self.length * row_bytes)
        self.length = need


def attention_layout(q, k, heads) -> tuple[int, int, int, int] | None:
    """(seq, heads, kv_heads, dim) from the input shapes (and the op's heads when packed)."""
    if len(q.shape) == 4 and q.shape[2] == 1 and q.shape[3] == 1:
        if heads is None:
            return None
        num_head, kv_num_head, dim = heads
        return q.shape[0], num_head, kv_num_head, dim
    if len(q.shape) < 3 or len(k.shape) < 3:
        return None
    return q.shape[-3], q.shape[-2], k.shape[-2], q.shape[-1]


class AttentionExecution(Execution):
    """Three dispatches per run: scores (+ mask), softmax in place, context; scores live in a
    scratch buffer of [seq, heads, capacity]. With the cache, k and v are first appended."""

    def __init__(self, backend, use_cache: bool, scale: float, heads, cache: DeviceKVCache | None = None):
        super().__init__(backend)
        self.use_cache, self.scale, self.heads = use_cache, scale, heads
        self.cache = cache if cache is not None else DeviceKVCache()
        self.shape = None
        self.kv_seq = self.row_bytes = 0
        self.mask = (0, 1, 1)
        self.scratch = None
        self.bound = None  # (keys, values, scratch) the dispatches bind
        self.dispatches = None
        self.inputs = None

    def on_resize(self, inputs, outputs) -> None:
        shape = attention_layout(inputs[0], inputs[1], self.heads)
        if shape is None or shape[1] % shape[2]:
            raise UnsupportedError(f"vulkan Attention needs known heads (a multiple of kv heads), got {shape}",
                                   field="heads")
        seq, heads, kv_heads, dim = shape
        self.shape = shape
        self.kv_seq = inputs[1].size // (kv_heads * dim)
        self.row_bytes = kv_heads * dim * 4
        mask = inputs[3] if len(inputs) > 3 else None
        if mask is None or mask.size == 1:
            self.mask = (1 if seq > 1 else 0, 1, 1)
        else:
            if len(mask.shape) < 2 or mask.shape[-2] < seq:
                raise UnsupportedError(f"vulkan Attention: a mask of shape {mask.shape} has fewer rows than the "
                                       f"{seq} queries", field="attention_mask")
            self.mask = (3 if mask.dtype.kind in "iu" else 2, int(mask.shape[-2]), int(mask.shape[-1]))
        self.bound = self.dispatches = None

    def _dispatches(self, inputs, outputs, keys, values, stride):
        device = self.backend.device
        seq, heads, kv_heads, dim = self.shape
        if self.scratch is None or self.scratch.size < max(4, seq * heads * stride * 4):
            self.scratch = device.alloc(seq * heads * stride * 4)
        mask = inputs[3].storage if len(inputs) > 3 else inputs[0].storage
        if self.bound != (keys, values, self.scratch, stride):
            self.dispatches = (
                Dispatch(device, "attn_scores", [inputs[0].storage, keys, mask, self.scratch], pack_push("12i", *[0] * 12),
                         (0, 0, 0)),
                Dispatch(device, "attn_softmax", [self.scratch], pack_push("3i", 0, 0, 0), (0, 0, 0)),
                Dispatch(device, "attn_context", [self.scratch, values, outputs[0].storage], pack_push("7i", *[0] * 7),
                         (0, 0, 0)))
            self.bound = (keys, values, self.scratch, stride)
        return self.dispatches

    def on_execute(self, inputs, outputs) -> None:
        from .device import vk
        seq, heads, kv_heads, dim = self.shape
        if self.use_cache:
            meta = self.backend.runtime.hints.get("kv_meta")
            past = meta.previous - meta.remove if meta is not None else self.cache.length
            self.cache.truncate(past)
            past = self.cache.length
            self.cache.append(self.backend, inputs[1].storage, inputs[2].storage, self.kv_seq, self.row_bytes)
            keys, values, total, stride = self.cache.k, self.cache.v, self.cache.length, self.cache.capacity
        else:
            past, total = 0, self.kv_seq
            keys, values, stride = inputs[1].storage, inputs[2].storage, self.kv_seq
        if not self.backend.device.fits(seq * heads * stride * 4):
            raise UnsupportedError(f"vulkan Attention: {seq}x{heads}x{stride} scores exceed maxStorageBufferRange",
                                   field="attention")
        scores, softmax, context = self._dispatches(inputs, outputs, keys, values, stride)
        scale = self.scale or 1.0 / np.sqrt(dim)
        mode, rows, cols = self.mask
        count = seq * heads * total
        scores.groups, row = fold(-(-count // LOCAL), LOCAL)
        scores.push = vk.ffi.new("char[]", pack_push("7if3iI", seq, heads, kv_heads, dim, past, total, stride,
                                                     float(np.float32(scale)), mode, rows, cols, row))
        softmax.groups = (-(-(seq * heads) // 64), 1, 1)
        softmax.push = vk.ffi.new("char[]", pack_push("3i", seq * heads, total, stride))
        count = seq * heads * dim
        context.groups, row = fold(-(-count // LOCAL), LOCAL)
        context.push = vk.ffi.new("char[]", pack_push("6iI", seq, heads, kv_heads, dim, total, stride, row))
        if seq and total:
            recorder = self.backend.recorder
            for item in (scores, softmax, context):
                recorder.dispatch(item)

    def on_clone(self, backend, op):
        return AttentionExecution(backend, self.use_cache, self.scale, self.heads, self.cache)


def create_attention(backend, inputs, outputs, op):
    """The core may create Attention before shapes are known (so that clones share its cache):
    then the op's heads decide, and on_resize checks again."""
    heads = op.extra.get("heads")
    if heads is not None and heads[0] % heads[1]:
        return None
    if any(t.dtype != FLOAT for t in (*inputs[:3], outputs[0])):
        return None
    if len(inputs) > 3 and inputs[3].dtype not in (FLOAT, INT):
        return None
    if inputs[0].shape and attention_layout(inputs[0], inputs[1], heads) is None:
        return None
    p = op.param
    scale = float(getattr(p, "attnScale", 0.0) or 0.0) if p is not None else 0.0
    use_cache = bool(getattr(p, "kvCache", True)) if p is not None else True
    return AttentionExecution(backend, use_cache, scale, heads)


CREATORS.update({"RoPE": create_rope, "Attention": create_attention})
