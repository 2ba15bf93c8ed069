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

from mnnllm_core.backend_api import ConvolutionWeights, QuantizedWeight, Refused, linear_creator

from ..device import Program, ProgramExecution, Recorder, Texels, pack_push

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
PAIRED_TEXEL = "linear_q4_texel2"  # two texel layers on one input in one dispatch (VulkanReplay pairs them)
PREFILL_Q4 = {"texel": ("linear_q4_texel_tile", 8 * 8, 4)}
# fewer texel tokens than the prefill tile (a batch's few decode rows): the decode shader, one
# work-group row per token (2 rows on lavapipe: ~130 against ~165 ms a forward of the shared model)
FEW_TEXEL_TOKENS = 4
PREFILL_WORDS = ("linear_q4_tile", 64, Q4_TILE)


@dataclass(eq=False)
class PackedLinear:
    """Device buffers of one linear layer, shared by every clone of its Execution."""

    variant: str  # a key of DECODE_Q4 (4-bit weights: "texel" packs texels, the others words) | "float"
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

    def bindings(self, x, y) -> list:
        """The shader's bindings for input x and output y (device Buffers)."""
        if self.variant == "texel":
            return [Texels(x, "vec4"), Texels(self.weight, "uvec4"), Texels(self.scales, "vec2"),
                    Texels(self.bias, "float"), y]
        return [x, self.weight, self.scales, self.bias, y]

    def launch(self, rows: int) -> tuple[str, tuple[int, int, int]]:
        """The shader and work-groups for `rows` tokens."""
        if self.variant == "float":
            shader, per_group, tile = "linear_f", 64, 1
        elif rows > 1 and not (self.variant == "texel" and rows < FEW_TEXEL_TOKENS):
            shader, per_group, tile = PREFILL_Q4.get(self.variant, PREFILL_WORDS)
        else:
            shader, per_group, tile = (*DECODE_Q4[self.variant], 1)
        return shader, (-(-self.oc // per_group), -(-rows // tile), 1) if rows else (0, 0, 0)


def q4_words(w: QuantizedWeight) -> np.ndarray:
    """[oc, ic / 8] words of a 4-bit weight, code 8k+n of row o in bits 4n of word k."""
    codes = w.unpack().astype(np.uint32).reshape(w.oc, w.ic // 8, 8)
    words = np.zeros((w.oc, w.ic // 8), np.uint32)
    for n in range(8):
        words |= codes[:, :, n] << np.uint32(4 * n)
    return words


def pack_linear(backend, weights: ConvolutionWeights) -> PackedLinear | None:
    """The layer's weights in its shader's layout, uploaded once; None when a buffer would
    exceed maxStorageBufferRange (or maxTexelBufferElements). A 4-bit weight gets the decode
    kernel the runtime picks for its shape (forced, tuned or by device class)."""
    device, allocator = backend.device, backend.allocator
    w, bias = weights.quantized, weights.nonzero_bias
    bias_buffer = allocator.constant(bias if bias is not None else np.zeros(1, np.float32))
    if isinstance(w, QuantizedWeight) and w.bits == 4 and w.is_linear and w.block_size % 8 == 0 \
            and w.ic % w.block_size == 0:
        if not device.fits_texels(w.oc * w.ic // 2, "uvec4") or not device.fits_texels(w.oc * w.n_blocks * 8, "vec2"):
            return None
        words = q4_words(w)
        scales = allocator.constant(np.ascontiguousarray(w.scale_zero().transpose(1, 0, 2)))
        layouts: dict[bool, object] = {}  # texels? -> the weight buffer in that layout

        def packed(variant: str) -> PackedLinear:
            texels = variant == "texel"
            if texels not in layouts:
                array = words.reshape(w.oc, w.ic // 32, 4).transpose(1, 0, 2) if texels else words.T
                layouts[texels] = allocator.constant(np.ascontiguousarray(array))
            return PackedLinear(variant, w.oc, w.ic, w.block_size, layouts[texels], scales, bias_buffer,
                                bias is not None)

        variants = [v for v in DECODE_Q4 if v != "texel" or w.block_size % 32 == 0]
        variant = backend.runtime.linear_variant_for(f"q4 {w.oc}x{w.ic} block {w.block_size}", variants,
                                                     lambda v: run_decode(backend, packed(v)))
        return packed(variant)
    if not device.fits(w.oc * w.ic * 4):
        return None
    return PackedLinear("float", w.oc, w.ic, w.ic, allocator.constant(weights.dequantize()),
                        allocator.constant(np.zeros(2, np.float32)), bias_buffer, bias is not None)


def run_decode(backend, packed: PackedLinear) -> None:
    """One token through the layer's decode kernel, waited for (what gpu_tuning times)."""
    device = backend.device
    x, y = backend.allocator.alloc(packed.ic * 4), backend.allocator.alloc(packed.oc * 4)
    shader, groups = packed.launch(1)
    recorder = Recorder(device)
    recorder.dispatch(Program(device, shader, packed.bindings(x, y),
                              pack_push("6i", packed.ic, packed.oc, 1, packed.block, int(packed.has_bias), 0),
                              groups))
    recorder.flush()


class LinearExecution(ProgramExecution):
    def __init__(self, backend, packed: PackedLinear, act: int):
        super().__init__(backend)
        self.packed, self.act = packed, act
        self.packed_bytes = packed.nbytes

    def on_resize(self, inputs, outputs) -> None:
        p = self.packed
        rows = inputs[0].size // p.ic
        shader, groups = p.launch(rows)
        push = pack_push("6i", p.ic, p.oc, rows, p.block, int(p.has_bias), self.act)
        self.io = (inputs[0].storage, outputs[0].storage, rows)
        self.pair = None  # (the other layer's own Program, the paired one): made by _pair
        self.program = Program(self.backend.device, shader, p.bindings(inputs[0].storage, outputs[0].storage),
                               push, groups)

    def fused_with(self, following) -> tuple[int, list] | None:
        """This layer and the next as one dispatch (`_pair`); None when they do not pair."""
        pair = self._pair(following[0].execution) if following else None
        return None if pair is None else (1, [pair])

    def _pair(self, other) -> Program | None:
        """One dispatch computing this layer and `other` (the next command's), when both are texel
        decode layers of one input x; None otherwise. Kept until either resizes."""
        if not isinstance(other, LinearExecution) or self.io[2] != 1 or other.io[2] != 1 \
                or self.io[0] is not other.io[0] or self.packed.variant != "texel" \
                or other.packed.variant != "texel" or (self.packed.ic, self.packed.block) != \
                (other.packed.ic, other.packed.block):
            return None
        if self.pair is None or self.pair[0] is not other.program:  # made for what both were resized to
            a, b = self.packed, other.packed
            first, second = a.bindings(self.io[0], self.io[1]), b.bindings(other.io[0], other.io[1])
            groups0 = self.program.groups[0]
            push = pack_push("10i", a.ic, a.oc, 1, a.block, int(a.has_bias), self.act, b.oc, int(b.has_bias),
                             other.act, groups0)
            self.pair = (other.program, Program(self.backend.device, PAIRED_TEXEL, first + second[1:], push,
                                                (groups0 + other.program.groups[0], 1, 1)))
        return self.pair[1]

    def on_clone(self, backend, op):
        return LinearExecution(backend, self.packed, self.act)


@linear_creator
def create_linear(backend, inputs, outputs, op, weights):
    packed = pack_linear(backend, weights)
    if packed is None:
        log.debug("vulkan refused %s: a weight buffer exceeds maxStorageBufferRange or maxTexelBufferElements",
                  op.name)
        return Refused("a weight buffer exceeds maxStorageBufferRange or maxTexelBufferElements")
    return LinearExecution(backend, packed, op.param.activation)


CREATORS = {"Convolution": create_linear}
