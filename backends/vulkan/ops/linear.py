"""Convolution 1x1 as a linear layer: 4-bit weights packed on the device and dequantized in the
shader; other weights as fp32. Refused (cpu fallback) when a buffer would exceed the device's
maxStorageBufferRange: one binding must cover a whole tensor.

Packed q4 layout (column-interleaved, so neighbouring invocations read neighbouring words):
word k of row o at [k, o] holds the row's codes 8k..8k+7 (code 8k+n in bits 4n); value =
code - 8; w = value * scale + zero with float (scale, zero) at [block, o].
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from mnnllm_core.backend_api import ConvolutionWeights, QuantizedWeight, Refused, linear_weights

from ..device import Dispatch, DispatchExecution, pack_push

log = logging.getLogger(__name__)

Q4_TILE = 8  # tokens per invocation in linear_q4_tile.comp (prefill: a tiled GEMM on the packed words)
# decode (one token) kernels on the same packed words, by device class (VulkanRuntime.linear_variant):
#   rows   linear_q4_rows.comp: 8 rows per invocation, 16 invocations per group (a CPU: lavapipe)
#   group  linear_q4_group.comp: 8 rows per 64-invocation group, a shared-memory reduction (a GPU)
#   lanes  linear_q4.comp: one invocation per row, 64 per group
DECODE_Q4 = {"rows": ("linear_q4_rows", 8 * 16), "group": ("linear_q4_group", 8), "lanes": ("linear_q4", 64)}


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


def pack_linear(backend, weights: ConvolutionWeights) -> PackedLinear | None:
    """The layer's weights in its shader's layout, uploaded once; None when a buffer would
    exceed maxStorageBufferRange."""
    device = backend.device
    w, bias = weights.quantized, weights.nonzero_bias
    bias_buffer = device.constant(bias if bias is not None else np.zeros(1, np.float32))
    if isinstance(w, QuantizedWeight) and w.bits == 4 and w.is_linear and w.block_size % 8 == 0 \
            and w.ic % w.block_size == 0:
        if not device.fits(w.oc * w.ic // 2) or not device.fits(w.oc * w.n_blocks * 8):
            return None
        codes = w.unpack().astype(np.uint32).reshape(w.oc, w.ic // 8, 8)
        words = np.zeros((w.oc, w.ic // 8), np.uint32)
        for n in range(8):
            words |= codes[:, :, n] << np.uint32(4 * n)
        scales = np.ascontiguousarray(w.scale_zero().transpose(1, 0, 2))
        return PackedLinear("linear_q4", w.oc, w.ic, w.block_size, device.constant(np.ascontiguousarray(words.T)),
                            device.constant(scales), bias_buffer, bias is not None)
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
        shader, tile, per_group = p.shader, 1, 64
        if shader == "linear_q4" and rows > 1:
            shader, tile = "linear_q4_tile", Q4_TILE
        elif shader == "linear_q4":
            shader, per_group = DECODE_Q4[self.backend.runtime.linear_variant]
        push = pack_push("6i", p.ic, p.oc, rows, p.block, int(p.has_bias), self.act)
        groups = (-(-p.oc // per_group), -(-rows // tile), 1) if rows else (0, 0, 0)
        self.dispatch = Dispatch(self.backend.device, shader,
                                 [inputs[0].storage, p.weight, p.scales, p.bias, outputs[0].storage], push, groups)

    def on_clone(self, backend, op):
        return LinearExecution(backend, self.packed, self.act)


def create_linear(backend, inputs, outputs, op):
    weights = linear_weights(op)
    if isinstance(weights, Refused):
        return weights
    packed = pack_linear(backend, weights)
    if packed is None:
        log.debug("vulkan refused %s: a weight buffer exceeds maxStorageBufferRange", op.name)
        return Refused("a weight buffer exceeds maxStorageBufferRange")
    return LinearExecution(backend, packed, op.param.activation)


CREATORS = {"Convolution": create_linear}
