"""Convolution 1x1 as a linear layer, on weights packed once into device memory at creation.

Packed layouts (kernels/linear.cl reads them; nothing is expanded to fp32 on the host):
  q4  4-bit codes with the linear value map and block % 32 == 0: per row ic/2 bytes; in each
      block byte j holds code j (low nibble) and code j + block/2 (high nibble), so one
      16-byte load feeds two contiguous 16-wide runs of x. Value = code - 8.
  q8  any other quantized weight (8-bit, other bit widths, other block sizes, a non-linear
      value map): one uint8 per weight, row-major; value = code - offset (offset 128 for a
      value map, whose int8 values are stored shifted by 128).
  scales for q4/q8: float2 (scale, zero) per (row, block), row-major; w = value*scale + zero.
  f   unquantized weights: [oc, ic] fp16 when the file holds fp16 or precision is "low",
      else fp32.

Kernels: decode (one token) runs linear.cl with TILE 1, or on a CPU device (variant.cpu_kernels)
for q4 gemv_cpu.cl (x staged once per work-group, the zero term factored out; two layers on
one input paired into one launch by the replay); a prefill on a GPU runs linear.cl with
TILE tokens per work-item and the split (linear_split_for); a prefill on a CPU device
(variant.cpu_kernels) of at least CPU_MIN_ROWS tokens runs linear_cpu.cl, which dequantizes each
slice of a work-group's rows once into local memory and reuses it for every token of the group
(shapes it cannot take, `cpu_kernel_fits`, stay on linear.cl).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pyopencl as cl

from mnnllm_core.backend_api import ConvolutionWeights, QuantizedWeight, linear_creator

from ..device import ProgramExecution
from .elementwise import BinaryExecution
from .variant import cpu_kernels

log = logging.getLogger(__name__)

PREFILL_TILE = 8  # tokens per work-item in the prefill GEMM of linear.cl
CPU_ROWS = 16  # linear_cpu.cl: output rows per work-group (a multiple of 8)
CPU_TOKENS = 6  # linear_cpu.cl: tokens per work-item (6 x 2 float8 accumulators fit AVX2's 16 registers)
CPU_GROUP = 64  # linear_cpu.cl: most work-items per work-group
CPU_SLICE = 128  # linear_cpu.cl: ic per dequantized slice (rounded up to a multiple of the q4 block)
CPU_MIN_ROWS = 16  # fewer tokens than this: dequantizing a slice per group costs more than it saves (pocl);
# 2 to 15 q4 tokens run gemv_cpu.cl per token (linear.cl's tiles measured ~8x slower at 2 rows)
GEMV_GROUP = 64  # gemv_cpu.cl: rows per work-group (pocl's own choice of group sometimes left a core idle)


@dataclass(eq=False)
class PackedLinear:
    """Device buffers of one linear layer; shared by every clone of its Execution."""

    format: str  # "q4" | "q8" | "f"
    oc: int
    ic: int
    block: int
    offset: int
    weight: object  # cl.Buffer
    scales: object  # cl.Buffer of float2, a placeholder for "f"
    bias: object  # cl.Buffer of float32, a placeholder when has_bias is false
    has_bias: bool
    weight_half: bool = False


def pack(backend, weights: ConvolutionWeights) -> PackedLinear:
    """The layer's weights in the layout of its kernel, uploaded once."""
    alloc = backend.allocator
    w, bias = weights.quantized, weights.nonzero_bias
    bias_buffer = alloc.constant(bias if bias is not None else np.zeros(1, np.float32))
    if isinstance(w, QuantizedWeight):
        scales = alloc.constant(w.scale_zero())
        if w.bits == 4 and w.is_linear and w.block_size % 32 == 0:
            blocks = w.unpack().reshape(w.oc, w.n_blocks, 2, w.block_size // 2)
            packed = blocks[:, :, 0] | (blocks[:, :, 1] << 4)
            return PackedLinear("q4", w.oc, w.ic, w.block_size, 8, alloc.constant(packed.reshape(-1)),
                                scales, bias_buffer, bias is not None)
        codes, offset = w.offset_codes()
        return PackedLinear("q8", w.oc, w.ic, w.block_size, offset, alloc.constant(codes.reshape(-1)),
                            scales, bias_buffer, bias is not None)
    half = w.data.dtype == np.float16 or backend.config.precision == "low"
    data = np.ascontiguousarray(w.data, np.float16 if half else np.float32)
    return PackedLinear("f", w.oc, w.ic, w.ic, 0, alloc.constant(data.reshape(-1)),
                        alloc.constant(np.zeros(2, np.float32)), bias_buffer, bias is not None, half)


def cpu_slice(p: PackedLinear) -> int:
    """ic per slice linear_cpu.cl dequantizes: whole q4 blocks, else runs of 16."""
    return -(-CPU_SLICE // p.block) * p.block if p.format == "q4" else CPU_SLICE


def cpu_kernel_fits(p: PackedLinear, local_bytes: int) -> bool:
    """linear_cpu.cl dequantizes runs of 16 weights (q8, f) or whole blocks (q4), into a local
    slice of cpu_slice(p) x CPU_ROWS floats that the device's local memory must hold."""
    if cpu_slice(p) * CPU_ROWS * 4 > local_bytes:
        return False
    if p.format == "q8":
        return p.block % 16 == 0 and p.ic % p.block == 0
    return p.format == "q4" or p.ic % 16 == 0


def gemv_stage(p: PackedLinear) -> cl.LocalMemory:
    """gemv_cpu.cl's local argument: x as floats and its block sums."""
    return cl.LocalMemory(4 * (p.ic + p.ic // p.block))


def gemv_sizes(rows: int) -> tuple[tuple[int], tuple[int]]:
    """gemv_cpu.cl's global and local size for `rows` output rows (one work-item each)."""
    return (-(-rows // GEMV_GROUP) * GEMV_GROUP,), (GEMV_GROUP,)


class LinearExecution(ProgramExecution):
    def __init__(self, backend, packed: PackedLinear, act: int):
        super().__init__(backend)
        self.packed, self.act = packed, act
        self.packed_bytes = sum(getattr(b, "size", 0) for b in (packed.weight, packed.scales, packed.bias))

    def on_resize(self, inputs, outputs) -> None:
        p, backend = self.packed, self.backend
        rows = inputs[0].size // p.ic
        self.gemv = self.pair = None  # set below for a one-token q4 GEMV (what _pair pairs)
        if rows >= CPU_MIN_ROWS and cpu_kernels(backend) and cpu_kernel_fits(p, backend.runtime.device.device.local_mem_size):
            self.program = self.bind_cpu(inputs, outputs, rows)
            return
        if rows == 1 and p.format == "q4" and cpu_kernels(backend) and \
                gemv_stage(p).size <= backend.runtime.device.device.local_mem_size:
            self.program = self.bind_gemv(inputs, outputs)
            self.gemv = (inputs[0].storage, outputs[0].storage)
            return
        if 1 < rows < CPU_MIN_ROWS and p.format == "q4" and cpu_kernels(backend) and \
                gemv_stage(p).size <= backend.runtime.device.device.local_mem_size:
            self.program = self.bind_gemv_tokens(inputs, outputs, rows)
            return
        tile = 1 if rows == 1 else PREFILL_TILE

        def bind(split: int):
            defines = {"TILE": tile, "SPLIT": split}
            if p.weight_half:
                defines["WEIGHT_HALF"] = 1
            return backend.program("linear.cl", f"linear_{p.format}", **defines).bind(
                (p.oc * split, -(-rows // tile)), (split, 1) if split > 1 else None,
                inputs[0].storage, p.weight, p.scales, p.bias, outputs[0].storage,
                *(np.int32(v) for v in (p.ic, p.oc, rows, p.block, p.offset, p.has_bias, self.act)))

        def run(split: int) -> None:  # on this resize's buffers: their values are not live yet
            bind(split)(backend.queue)
            backend.queue.finish()

        problem = f"{p.format} ic={p.ic} oc={p.oc} block={p.block} rows={rows}" \
                  f"{' fp16' if backend.half else ''}{' fp16-weights' if p.weight_half else ''}"
        split = backend.runtime.linear_split_for(problem, run)
        self.program = bind(split)

    def bind_gemv(self, inputs, outputs):
        """gemv_cpu.cl's gemv_q4: one work-item per row, GEMV_GROUP rows per work-group."""
        p = self.packed
        return self.backend.program("gemv_cpu.cl", "gemv_q4").bind(
            *gemv_sizes(p.oc),
            inputs[0].storage, p.weight, p.scales, p.bias, outputs[0].storage,
            *(np.int32(v) for v in (p.ic, p.oc, p.block, p.has_bias, self.act)), gemv_stage(p))

    def bind_gemv_tokens(self, inputs, outputs, rows: int):
        """gemv_cpu.cl's gemv_q4_tokens: gemv_q4 for each of a few tokens (a batch's decode rows
        are then each what the token's decode step alone gives)."""
        p = self.packed
        (items,), (group,) = gemv_sizes(p.oc)
        return self.backend.program("gemv_cpu.cl", "gemv_q4_tokens").bind(
            (items, rows), (group, 1),
            inputs[0].storage, p.weight, p.scales, p.bias, outputs[0].storage,
            *(np.int32(v) for v in (p.ic, p.oc, p.block, p.has_bias, self.act)), gemv_stage(p))

    def fused_with(self, following) -> tuple[int, list] | None:
        """This layer and the next as one launch (`_pair`), with the MUL_SILU after them where
        `_gated` allows it; None when the next layer does not pair."""
        pair = self._pair(following[0].execution) if following else None
        if pair is None:
            return None
        gated = self._gated(following[1]) if len(following) > 1 else None
        return (2, gated) if gated is not None else (1, pair)

    def _pair(self, other) -> list | None:
        """One launch for this layer and `other` (the next command's) when both are one-token q4
        GEMVs of gemv_cpu.cl on the same x, ic and block; None otherwise."""
        if not isinstance(other, LinearExecution) or self.gemv is None or other.gemv is None \
                or self.gemv[0] is not other.gemv[0] or (self.packed.ic, self.packed.block) != \
                (other.packed.ic, other.packed.block):
            return None
        if self.pair is None or self.pair[0] is not other or self.pair[1] is not other.program:
            a, b = self.packed, other.packed  # (made for what both were resized to)
            program = self.backend.program("gemv_cpu.cl", "gemv_q4_pair").bind(
                *gemv_sizes(a.oc + b.oc), self.gemv[0],
                a.weight, a.scales, a.bias, self.gemv[1], b.weight, b.scales, b.bias, other.gemv[1],
                *(np.int32(v) for v in (a.ic, a.block, a.oc, b.oc, a.has_bias, b.has_bias, self.act, other.act)),
                gemv_stage(a))
            self.pair = (other, other.program, program)
        return [self.pair[2]]

    def _gated(self, binary) -> list | None:
        """After _pair gave a pair: one launch for the two layers and `binary` (the command
        after them) when that is MUL_SILU of exactly their outputs (gate and up); the kernel
        stores all three outputs. None otherwise."""
        other = self.pair[0]
        reads = [t.storage for t in binary.inputs]
        if not isinstance(binary.execution, BinaryExecution) or binary.execution.name != "MUL_SILU" \
                or not self.packed.oc == other.packed.oc == binary.outputs[0].size or len(reads) != 2 \
                or {id(r) for r in reads} != {id(self.gemv[1]), id(other.gemv[1])}:
            return None
        up, gate = (self, other) if reads[0] is self.gemv[1] else (other, self)
        a, b = up.packed, gate.packed
        return [self.backend.program("gemv_cpu.cl", "gemv_q4_gated").bind(
            *gemv_sizes(a.oc), self.gemv[0], a.weight, a.scales, a.bias,
            up.gemv[1], b.weight, b.scales, b.bias, gate.gemv[1], binary.outputs[0].storage,
            *(np.int32(v) for v in (a.ic, a.block, a.oc, a.has_bias, b.has_bias, up.act, gate.act,
                                    binary.execution.act)), gemv_stage(a))]

    def bind_cpu(self, inputs, outputs, rows: int):
        """linear_cpu.cl: ceil(rows / CPU_TOKENS) work-items in balanced groups of at most CPU_GROUP."""
        p, backend = self.packed, self.backend
        defines = {"T": CPU_TOKENS, "OB": CPU_ROWS, "KB": cpu_slice(p)}
        if p.weight_half:
            defines["WEIGHT_HALF"] = 1
        items = -(-rows // CPU_TOKENS)
        group = -(-items // -(-items // CPU_GROUP))
        return backend.program("linear_cpu.cl", f"linear_cpu_{p.format}", **defines).bind(
            (-(-items // group) * group, -(-p.oc // CPU_ROWS)), (group, 1),
            inputs[0].storage, p.weight, p.scales, p.bias, outputs[0].storage,
            *(np.int32(v) for v in (p.ic, p.oc, rows, p.block, p.offset, p.has_bias, self.act)))

    def on_clone(self, backend, op):
        return LinearExecution(backend, self.packed, self.act)


@linear_creator
def create_linear(backend, inputs, outputs, op, weights):
    packed = pack(backend, weights)
    log.debug("packed %s as %s [%d, %d]", op.name, packed.format, packed.oc, packed.ic)
    return LinearExecution(backend, packed, op.param.activation)


CREATORS = {"Convolution": create_linear}
