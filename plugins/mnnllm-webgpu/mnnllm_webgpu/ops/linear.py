"""Convolution 1x1 as a linear layer (linear.wgsl): block-quantized weights kept as their codes
(up to 4 bits with the linear map: 8 codes a word; other maps and 8 bits: 4 a word) and
dequantized in the kernel, fp16/fp32 weights as fp32 words. Packed once at load into chunks of
output rows, each within one storage binding (max_storage_buffer_binding_size); a larger weight
is split, each chunk one dispatch writing its rows of the output. 4-bit codes of the linear map
with ic and the block size multiples of 32 read 32 codes a load: on a GPU linear_q4.wgsl (8 lanes
per row summed by subgroup shuffles, or workgroup memory without subgroups; 8 tokens per
work-group in prefill), on a CPU adapter
linear_q4_rows.wgsl (eight rows of one token per invocation; a decode step's input read as a
uniform block), over several tokens linear_q4_tile.wgsl (four rows of four tokens per invocation,
the input read in windows of tokens as uniform blocks); the rest run linear.wgsl."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mnnllm_core.backend_api import ConvolutionWeights, QuantizedWeight, Refused, linear_creator

from ..device import Program, StepsExecution, pack_params
from ..shaders import SUM8_SHARED, SUM8_SUBGROUP

ROWS_PER_GROUP = 8  # output rows of a work-group in linear.wgsl (x 8 lanes)
PREFILL_TILE = 8  # tokens per work-group when there is more than one (decode: 1)


@dataclass(eq=False)
class Chunk:
    """Output rows [row0, row0 + rows) of a layer: their words, (scale, zero) pairs and bias."""

    row0: int
    rows: int
    weight: object
    scales: object
    bias: object


@dataclass(eq=False)
class PackedLinear:
    """A layer's device buffers, shared by every clone of its Execution."""

    oc: int
    ic: int
    bits: int  # 4 or 8: codes a word hold; 32: fp32 weights
    offset: int
    block: int
    words: int  # words of one output row
    has_bias: bool
    chunks: list[Chunk]

    @property
    def nbytes(self) -> int:
        return sum(c.weight.size + c.scales.size + c.bias.size for c in self.chunks)

    @property
    def fast(self) -> bool:
        """Whether linear_q4.wgsl takes it: 4-bit codes, 32 of them in each (scale, zero) block."""
        return self.bits == 4 and self.block % 32 == 0 and self.ic % 32 == 0

    @property
    def aligned(self) -> bool:
        """Whether every word's codes share one block (one (scale, zero) per word)."""
        per = 32 // self.bits
        return self.bits != 32 and self.block % per == 0 and self.ic % per == 0


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """uint32 [oc, ceil(ic / per)]: code n of word k of a row in bits [bits*n, bits*(n+1))."""
    per = 32 // bits
    oc, ic = codes.shape
    words = -(-ic // per)
    padded = np.zeros((oc, words * per), np.uint32)
    padded[:, :ic] = codes
    padded = padded.reshape(oc, words, per)
    packed = np.zeros((oc, words), np.uint32)
    for n in range(per):
        packed |= padded[:, :, n] << np.uint32(bits * n)
    return packed


def pack_linear(backend, weights: ConvolutionWeights) -> PackedLinear | None:
    """The layer's words in chunks of rows that fit one binding; None when one row does not."""
    w, bias = weights.quantized, weights.nonzero_bias
    if isinstance(w, QuantizedWeight):
        codes, offset = w.offset_codes()
        bits = 4 if w.bits <= 4 and w.is_linear else 8
        words, scales, block = pack_codes(codes, bits), w.scale_zero(), w.block_size
    else:
        bits, offset, block = 32, 0, 1
        words = np.ascontiguousarray(weights.dequantize(), np.float32).view(np.uint32)
        scales = np.zeros((w.oc, 1, 2), np.float32)
    device, constant = backend.device, backend.allocator.constant
    row_bytes = max(words.shape[1] * 4, scales.shape[1] * 8)
    per_chunk = device.max_binding // row_bytes
    if per_chunk == 0:
        return None
    biases = bias if bias is not None else np.zeros(w.oc, np.float32)
    chunks = [Chunk(row0, min(per_chunk, w.oc - row0), constant(words[row0:row0 + per_chunk]),
                    constant(scales[row0:row0 + per_chunk]), constant(biases[row0:row0 + per_chunk]))
              for row0 in range(0, w.oc, per_chunk)]
    return PackedLinear(w.oc, w.ic, bits, offset, block, words.shape[1], bias is not None, chunks)


def x_declaration(tokens: int, ic: int, max_uniform: int) -> str:
    """linear_q4_rows.wgsl's input: one token's row as a uniform block where it fits one
    (lavapipe loads a uniform value once for all lanes, a storage one lane by lane), else storage."""
    if tokens == 1 and ic * 4 <= max_uniform:
        return f"var<uniform> x: array<vec4<f32>, {ic // 4}>;"
    return "var<storage, read> x: array<vec4<f32>>;"


def tile_window(tokens: int, most: int) -> int:
    """Tokens per window of linear_q4_tile.wgsl (at most `most`, a uniform block's worth): the
    fewest windows, as even as multiples of 4 (an invocation's tokens) make them."""
    if tokens <= most:
        return tokens
    window = most - most % 4 if most >= 4 else most
    count = -(-tokens // window)
    even = -(-tokens // count)
    return min(window, even + -even % 4)


class LinearExecution(StepsExecution):
    def __init__(self, backend, packed: PackedLinear, act: int):
        super().__init__(backend)
        self.packed, self.act = packed, act
        self.packed_bytes = packed.nbytes

    def on_resize(self, inputs, outputs) -> None:
        p = self.packed
        tokens = inputs[0].size // p.ic
        lanes = self.backend.runtime.linear_lanes
        self.steps = []
        x_bytes = inputs[0].storage.size if tokens != 1 else p.ic * 4  # a uniform block: its size exactly
        device = self.backend.device
        if (lanes == 1 and p.fast and tokens > 1 and p.ic * 4 <= device.max_uniform
                and p.ic * 4 % device.uniform_alignment == 0):
            self.steps = [step for chunk in p.chunks for step in self._tiles(inputs[0].storage, chunk, tokens,
                                                                             outputs[0].storage)]
            return
        for chunk in p.chunks:
            tile = 1 if tokens == 1 else PREFILL_TILE  # tokens per work-group
            if p.fast:
                params = pack_params("10if", p.ic, p.oc, chunk.row0, chunk.rows, tokens, p.ic // 32, p.block // 32,
                                     p.ic // p.block, int(p.has_bias), self.act, float(p.offset))
                if lanes == 1:  # a CPU: 8 rows of one token per invocation
                    shader, rows_per_group, tile = "linear_q4_rows", 64 * 8, 1
                    defines = (("X_DECL", x_declaration(tokens, p.ic, self.backend.device.max_uniform)),)
                else:
                    shader, rows_per_group = "linear_q4", 64 // lanes
                    subgroups = self.backend.runtime.subgroups
                    defines = (("TILE", tile), ("LANES", lanes), ("ROWS", 1),
                               ("SUM8", SUM8_SUBGROUP if subgroups else SUM8_SHARED))
            else:
                shader, rows_per_group, defines = "linear", ROWS_PER_GROUP, (("TILE", tile),)
                params = pack_params("7if5i", p.ic, p.oc, chunk.row0, chunk.rows, tokens, p.words, p.bits,
                                     float(p.offset), p.block, max(1, p.ic // p.block), int(p.aligned),
                                     int(p.has_bias), self.act)
            groups = (-(-chunk.rows // rows_per_group), -(-tokens // tile), 1) if tokens else (0, 0, 0)
            self.steps.append(Program(self.backend.device, shader,
                                      [(inputs[0].storage, 0, x_bytes), chunk.weight, chunk.scales, chunk.bias,
                                       outputs[0].storage], params, groups, defines))

    def _tiles(self, x, chunk: Chunk, tokens: int, y) -> list:
        """linear_q4_tile.wgsl over windows of `window` tokens of x, each a uniform block (the
        last window ends at the last token, recomputing some rows of the one before)."""
        p = self.packed
        row_bytes = p.ic * 4
        window = tile_window(tokens, self.backend.device.max_uniform // row_bytes)
        steps = []
        for t0 in range(0, tokens, window):
            start = min(t0, tokens - window)
            params = pack_params("10ifi", p.ic, p.oc, chunk.row0, chunk.rows, window, p.ic // 32, p.block // 32,
                                 p.ic // p.block, int(p.has_bias), self.act, float(p.offset), start)
            groups = (-(-chunk.rows // (64 * 4)), -(-window // 4), 1)
            steps.append(Program(self.backend.device, "linear_q4_tile",
                                 [(x, start * row_bytes, window * row_bytes), chunk.weight, chunk.scales, chunk.bias,
                                  y], params, groups, (("XV", window * p.ic // 4),)))
        return steps

    def on_clone(self, backend, op):
        return LinearExecution(backend, self.packed, self.act)


@linear_creator
def create_linear(backend, inputs, outputs, op, weights):
    if not backend.fits(inputs[0], outputs[0]):
        return Refused("an activation exceeds max_storage_buffer_binding_size")
    packed = pack_linear(backend, weights)
    if packed is None:
        return Refused("one weight row exceeds max_storage_buffer_binding_size")
    return LinearExecution(backend, packed, op.param.activation)


CREATORS = {"Convolution": create_linear}
