"""Convolution 1x1 as a linear layer: 4-bit weights packed on the device and dequantized in the
shader; other weights as fp32. Refused (cpu fallback) when a buffer would exceed the device's
maxStorageBufferRange: one binding must cover a whole tensor.

Packed q4 layouts, both column-interleaved so that neighbouring invocations read neighbouring
words; value = code - 8; w = value * scale + zero with float (scale, zero) at [block, o]:
  words   word k of row o at [k, o] holds the row's codes 8k..8k+7 (code 8k+n in bits 4n);
  texels  for the "texel" kernels (a CPU device): texel k4 of row o at [k4, o] holds its words
          4k4..4k4+3 (codes 32k4..32k4+31), read through a uvec4 texel buffer.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from mnnllm_core.backend_api import ConvolutionWeights, QuantizedWeight, Refused, linear_weights

from ..device import Dispatch, DispatchExecution, Texels, pack_push

log = logging.getLogger(__name__)

Q4_TILE = 8  # tokens per invocation in linear_q4_tile.comp (prefill: a tiled GEMM on the packed words)
# 4-bit kernels by device class (VulkanRuntime.linear_variant): decode (one token) shader and the
# output rows of one work-group; prefill shader, rows per work-group and tokens per invocation.
#   texel  linear_q4_texel.comp: texel-buffer reads, 16 rows x 8 lanes per group; prefill
#          linear_q4_texel_tile.comp, 8 rows x 8 lanes x 4 tokens (a CPU: lavapipe)
#   group  linear_q4_group.comp: 8 rows per 64-invocation group, a shared-memory reduction (a GPU)
#   lanes  linear_q4.comp: one invocation per row, 64 per group
# group and lanes prefill with linear_q4_tile.comp (64 rows x 8 tokens per group).
DECODE_Q4 = {"texel": ("linear_q4_texel", 16 * 8), "group": ("linear_q4_group", 8), "lanes": ("linear_q4", 64)}
PREFILL_Q4 = {"texel": ("linear_q4_texel_tile", 8 * 8, 4)}
PREFILL_WORDS = ("linear_q4_tile", 64, Q4_TILE)


@dataclass(eq=False)
class PackedLinear:
    """Device buffers of one linear layer, shared by every clone of its Execution."""

    shader: str  # "linear_q4" (layout "words"), "linear_q4_texel" (layout "texels") | "linear_f"
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


def q4_words(w: QuantizedWeight) -> np.ndarray:
    """[oc, ic / 8] words of a 4-bit weight, code 8k+n of row o in bits 4n of word k."""
    codes = w.unpack().astype(np.uint32).reshape(w.oc, w.ic // 8, 8)
    words = np.zeros((w.oc, w.ic // 8), np.uint32)
    for n in range(8):
        words |= codes[:, :, n] << np.uint32(4 * n)
    return words


def pack_linear(backend, weights: ConvolutionWeights) -> PackedLinear | None:
    """The layer's weights in its shader's layout, uploaded once; None when a buffer would
    exceed maxStorageBufferRange (or maxTexelBufferElements)."""
    device = backend.device
    w, bias = weights.quantized, weights.nonzero_bias
    bias_buffer = device.constant(bias if bias is not None else np.zeros(1, np.float32))
    if isinstance(w, QuantizedWeight) and w.bits == 4 and w.is_linear and w.block_size % 8 == 0 \
            and w.ic % w.block_size == 0:
        texels = backend.runtime.linear_variant == "texel" and w.block_size % 32 == 0
        if not device.fits_texels(w.oc * w.ic // 2, "uvec4") or not device.fits_texels(w.oc * w.n_blocks * 8, "vec2"):
            return None
        words = q4_words(w)
        scales = device.constant(np.ascontiguousarray(w.scale_zero().transpose(1, 0, 2)))
        if texels:
            packed = words.reshape(w.oc, w.ic // 32, 4).transpose(1, 0, 2)
            return PackedLinear("linear_q4_texel", w.oc, w.ic, w.block_size, device.constant(np.ascontiguousarray(packed)),
                                scales, bias_buffer, bias is not None)
        return PackedLinear("linear_q4", w.oc, w.ic, w.block_size, device.constant(np.ascontiguousarray(words.T)),
                            scales, bias_buffer, bias is not None)
    if not device.fits(w.oc * w.ic * 4):
        return None
    return PackedLinear("linear_f", w.oc, w.ic, w.ic, device.constant(weights.dequantize()),
                        device.constant(np.zeros(2, np.float32)), bias_buffer, bias is not None)


class LinearExecution(DispatchExecution):
    def __init__(self, backend, packed: PackedLinear, act: int):
        super().__init__(backend)
        self.packed, self.act = packed, act
        self.packed_bytes = packed.nbytes

    def on_resize(self, inputs, outputs) -> None:
        p = self.packed
        rows = inputs[0].size // p.ic
        variant = self.backend.runtime.linear_variant
        shader, per_group, tile = p.shader, 64, 1
        bindings = [inputs[0].storage, p.weight, p.scales, p.bias, outputs[0].storage]
        if shader == "linear_q4_texel":
            shader, per_group, tile = PREFILL_Q4[variant] if rows > 1 else (*DECODE_Q4[variant], 1)
            bindings = [Texels(inputs[0].storage, "vec4"), Texels(p.weight, "uvec4"), Texels(p.scales, "vec2"),
                        Texels(p.bias, "float"), outputs[0].storage]
        elif shader == "linear_q4":  # (a "texel" device runs a block size that is no multiple of 32 as "lanes")
            shader, per_group, tile = PREFILL_WORDS if rows > 1 else (*DECODE_Q4[variant if variant != "texel" else "lanes"], 1)
        push = pack_push("6i", p.ic, p.oc, rows, p.block, int(p.has_bias), self.act)
        groups = (-(-p.oc // per_group), -(-rows // tile), 1) if rows else (0, 0, 0)
        self.dispatch = Dispatch(self.backend.device, shader, bindings, push, groups)

    def on_clone(self, backend, op):
        return LinearExecution(backend, self.packed, self.act)


def create_linear(backend, inputs, outputs, op):
    weights = linear_weights(op)
    if isinstance(weights, Refused):
        return weights
    packed = pack_linear(backend, weights)
    if packed is None:
        log.debug("vulkan refused %s: a weight buffer exceeds maxStorageBufferRange or maxTexelBufferElements",
                  op.name)
        return Refused("a weight buffer exceeds maxStorageBufferRange or maxTexelBufferElements")
    return LinearExecution(backend, packed, op.param.activation)


CREATORS = {"Convolution": create_linear}
