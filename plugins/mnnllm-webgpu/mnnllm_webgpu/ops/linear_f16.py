"""Convolution 1x1 as a linear layer over fp16 weights kept fp16 on the device (linear_f16.wgsl,
computed in f32), where the backend stores weights in f16 (`f16_weights`: the adapter has
shader-f16): a weight the file stores as fp16 at any precision (f16 -> f32 is exact, so the
outputs are those of its fp32 copy summed in this kernel's order), an fp32 one only under
precision "low" (`f16_lossy`). Half the bytes of the fp32 copy, which a decode step reads whole.
Everything else (quantized weights, ic not a multiple of 4) goes to linear.py's creator."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from mnnllm_core.backend_api import ConvolutionWeights, FloatWeight, Refused, linear_weights

from ..device import Program, StepsExecution, pack_params
from . import linear

LOCAL = 64  # invocations (output rows) of a work-group
PREFILL_TILE = 4  # tokens per invocation when there is more than one (decode: 1)


@dataclass(eq=False)
class HalfChunk:
    """Output rows [row0, row0 + rows): their fp16 weights and fp32 bias."""

    row0: int
    rows: int
    weight: object
    bias: object


@dataclass(eq=False)
class HalfLinear:
    oc: int
    ic: int
    has_bias: bool
    chunks: list[HalfChunk]

    @property
    def nbytes(self) -> int:
        return sum(c.weight.size + c.bias.size for c in self.chunks)


def half_weight(backend, weights: ConvolutionWeights) -> np.ndarray | None:
    """The [oc, ic] fp16 weight this backend keeps in f16, or None (it takes the other kernels)."""
    w = weights.quantized
    if not backend.f16_weights or not isinstance(w, FloatWeight) or w.ic % 4:
        return None
    if w.data.dtype == np.float16:
        return np.ascontiguousarray(w.dequantize(np.float16)).reshape(w.oc, w.ic)
    return np.ascontiguousarray(w.dequantize(np.float32), np.float16) if backend.f16_lossy else None


def pack_half(backend, weights: ConvolutionWeights, half: np.ndarray) -> HalfLinear | None:
    """Chunks of rows within one binding each; None when one row does not fit."""
    oc, ic = half.shape
    per_chunk = backend.device.max_binding // (ic * 2)
    if per_chunk == 0:
        return None
    bias = weights.nonzero_bias
    biases = bias if bias is not None else np.zeros(oc, np.float32)
    constant = backend.allocator.constant
    chunks = [HalfChunk(row0, min(per_chunk, oc - row0), constant(half[row0:row0 + per_chunk]),
                        constant(biases[row0:row0 + per_chunk])) for row0 in range(0, oc, per_chunk)]
    return HalfLinear(oc, ic, bias is not None, chunks)


class HalfLinearExecution(StepsExecution):
    def __init__(self, backend, packed: HalfLinear, act: int):
        super().__init__(backend)
        self.packed, self.act = packed, act
        self.packed_bytes = packed.nbytes

    def on_resize(self, inputs, outputs) -> None:
        p = self.packed
        tokens = inputs[0].size // p.ic
        tile = 1 if tokens == 1 else PREFILL_TILE
        self.steps = []
        for chunk in p.chunks:
            params = pack_params("7i", p.ic // 4, p.oc, chunk.row0, chunk.rows, tokens, int(p.has_bias), self.act)
            groups = (-(-chunk.rows // LOCAL), -(-tokens // tile), 1) if tokens else (0, 0, 0)
            self.steps.append(Program(self.backend.device, "linear_f16",
                                      [inputs[0].storage, chunk.weight, chunk.bias, outputs[0].storage], params,
                                      groups, (("TILE", tile),)))

    def on_clone(self, backend, op):
        return HalfLinearExecution(backend, self.packed, self.act)


class ReadWeights:
    """A WeightReader handing on weights already read, so linear.py's creator reads them once."""

    def __init__(self, weights: ConvolutionWeights):
        self.weights = weights

    def convolution(self) -> ConvolutionWeights:
        return self.weights


def create_linear(backend, inputs, outputs, op):
    weights = linear_weights(op)
    if isinstance(weights, Refused):
        return weights
    half = half_weight(backend, weights)
    if half is None:
        return linear.create_linear(backend, inputs, outputs, dataclasses.replace(op, weights=ReadWeights(weights)))
    if not backend.fits(inputs[0], outputs[0]):
        return Refused("an activation exceeds max_storage_buffer_binding_size")
    packed = pack_half(backend, weights, half)
    if packed is None:
        return Refused("one weight row exceeds max_storage_buffer_binding_size")
    return HalfLinearExecution(backend, packed, op.param.activation)


CREATORS = {"Convolution": create_linear}
