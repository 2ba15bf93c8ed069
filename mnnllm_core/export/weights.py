"""Write llm.mnn.weight the way MNN's exporter does, one tensor at a time, in row chunks.

A linear layer's block is what `mnnllm_core.core.quant` reads back:

    u8 2 | oc, ic as 16-bit (32-bit when either exceeds 65535: shapeInt32)
    | u8 map count (0 means 256) | the map -2^(bits-1) .. 2^(bits-1)-1 as int8
    | codes, high nibble first for 4 bits | fp16 (zero, scale) per (row, block) | fp32 bias

Quantization is MNN's asymmetric min/max rule, computed in fp32 like its torch code:
scale = (max - min) / (2^bits - 1), code = clamp(round((w - min) / scale)),
zero = min + 2^(bits-1) * scale, so that w ~ zero + scale * (code - 2^(bits-1)).
A block that is constant (scale 0) gets code 0, which decodes to its value exactly.
16 bits stores the weight as fp16 with no header and no alpha (quanParameter type 3).
A LayerNorm stores fp32 gamma then fp32 beta (zeros for an RMSNorm).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import BinaryIO, Callable

import numpy as np

from mnnllm_core.errors import UnsupportedError

from .sources import LazyTensor

QUANT_BITS = (4, 8, 16)
QUANT_BLOCKS = (0, 32, 64, 128)
_CHUNK_ELEMENTS = 1 << 20


@dataclass(frozen=True)
class LinearInfo:
    """Where a linear layer's data went and how the Convolution op must describe it."""

    external: list[int]
    bits: int
    oc: int
    ic: int
    block_size: int
    header_len: int
    shape_int32: bool


def block_size_for(ic: int, quant_block: int) -> int:
    """MNN's rule: 0 means one block per row; a block that does not divide ic is halved until it does."""
    size = ic if quant_block == 0 else quant_block
    while ic % size:
        size //= 2
    return size


def quantize_rows(w: np.ndarray, bits: int, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """fp32 [rows, ic] -> (uint8 codes [rows, ic], fp16 alpha [rows, n_blocks, 2] as (zero, scale))."""
    rows, ic = w.shape
    blocks = w.reshape(rows, ic // block_size, block_size)
    top = np.float32((1 << bits) - 1)
    hi = blocks.max(axis=-1, keepdims=True)
    lo = blocks.min(axis=-1, keepdims=True)
    scale = (hi - lo) / top
    safe = np.where(scale == 0, np.float32(1), scale)
    codes = np.round((blocks - lo) / safe)
    codes[np.broadcast_to(scale == 0, codes.shape)] = 0
    codes = np.clip(codes, 0, top).astype(np.uint8).reshape(rows, ic)
    zero = lo + scale * np.float32(1 << (bits - 1))
    alpha = np.concatenate([zero, scale], axis=-1).astype(np.float16)
    return codes, alpha


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """Flat uint8 codes -> bytes, most significant bits first (for 4 bits: two codes per byte, high nibble first)."""
    flat = codes.reshape(-1)
    if bits == 8:
        return flat
    if flat.size % 2:
        flat = np.concatenate([flat, np.zeros(1, np.uint8)])
    pairs = flat.reshape(-1, 2)
    return (pairs[:, 0] << 4) | pairs[:, 1]


def weight_header(oc: int, ic: int, bits: int) -> tuple[bytes, bool]:
    """The IDST header: ndim, dims, value map. Returns it and whether dims are 32-bit."""
    shape_int32 = oc > 65535 or ic > 65535
    dims = np.array([oc, ic], dtype="<i4" if shape_int32 else "<u2").tobytes()
    offset = 1 << (bits - 1)
    count = (1 << bits) & 0xFF
    value_map = np.arange(-offset, offset, dtype=np.int8).tobytes()
    return bytes([2]) + dims + bytes([count]) + value_map, shape_int32


def to_bf16(w: np.ndarray) -> np.ndarray:
    """fp32 -> bf16 bits (uint16), rounding to nearest even like torch's `.bfloat16()`."""
    bits = np.ascontiguousarray(w, dtype=np.float32).view(np.uint32)
    rounded = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return (rounded >> np.uint32(16)).astype(np.uint16)


class WeightWriter:
    """Appends tensors to llm.mnn.weight and hands back the `external` fields for the ops."""

    def __init__(self, out: BinaryIO, bits: int, block: int, on_progress: Callable[[int], None]):
        if bits not in QUANT_BITS:
            raise UnsupportedError(f"quant bit {bits} (supported: {QUANT_BITS})", field="quant_bit")
        if block not in QUANT_BLOCKS:
            raise UnsupportedError(f"quant block {block} (supported: {QUANT_BLOCKS})", field="quant_block")
        self.out = out
        self.bits = bits
        self.block = block
        self.offset = 0
        self.on_progress = on_progress

    def _write(self, data: bytes | np.ndarray) -> int:
        raw = data if isinstance(data, bytes) else np.ascontiguousarray(data).tobytes()
        self.out.write(raw)
        return len(raw)

    def layernorm(self, gamma: LazyTensor, offset: float = 0.0, beta: LazyTensor | None = None) -> list[int]:
        """`offset` 1 for Gemma, whose RMSNorm multiplies by (1 + w); `beta` None writes zeros (RMSNorm)."""
        g = gamma.load().astype(np.float32).reshape(-1) + np.float32(offset)
        b = np.zeros_like(g) if beta is None else beta.load().astype(np.float32).reshape(-1)
        if b.size != g.size:
            raise UnsupportedError(f"tensor {beta.name!r}: {b.size} values for a norm of {g.size}", field=beta.name)
        start = self.offset
        g_len = self._write(g.astype("<f4"))
        b_len = self._write(b.astype("<f4"))
        self.offset += g_len + b_len
        self.on_progress(g.size + (0 if beta is None else b.size))
        return [start, g_len, b_len]

    def linear(self, weight: LazyTensor, bias: LazyTensor | None) -> LinearInfo:
        if len(weight.shape) != 2:
            raise UnsupportedError(f"tensor {weight.name!r}: a linear weight must be 2-D, got {weight.shape}",
                                   field=weight.name)
        oc, ic = weight.shape
        start = self.offset
        step = max(2, _CHUNK_ELEMENTS // ic // 2 * 2)
        if self.bits == 16:
            header_len, shape_int32, block_size = 0, False, ic
            w_len = 0
            for r0 in range(0, oc, step):
                rows = weight.rows(r0, min(r0 + step, oc))
                w_len += self._write(rows.astype("<f2"))
                self.on_progress(rows.size)
            a_len = 0
        else:
            block_size = block_size_for(ic, self.block)
            header, shape_int32 = weight_header(oc, ic, self.bits)
            header_len = w_len = self._write(header)
            alphas = []
            for r0 in range(0, oc, step):
                rows = weight.rows(r0, min(r0 + step, oc))
                codes, alpha = quantize_rows(rows, self.bits, block_size)
                w_len += self._write(pack_codes(codes, self.bits))
                alphas.append(alpha)
                self.on_progress(rows.size)
            a_len = sum(self._write(a.astype("<f2")) for a in alphas)
        b_len = 0
        if bias is not None:
            b = bias.load().astype("<f4").reshape(-1)
            if b.size != oc:
                raise UnsupportedError(f"tensor {bias.name!r}: bias of {b.size} values for {oc} outputs",
                                       field=bias.name)
            b_len = self._write(b)
        self.offset += w_len + a_len + b_len
        return LinearInfo([start, w_len, a_len, b_len, 0], self.bits, oc, ic, block_size, header_len, shape_int32)


def write_bf16_embedding(out: BinaryIO, table: LazyTensor, on_progress: Callable[[int], None]) -> int:
    """embeddings_bf16.bin: the raw bf16 [vocab, hidden] table, no header."""
    vocab, hidden = table.shape
    step = max(1, _CHUNK_ELEMENTS // hidden)
    written = 0
    for r0 in range(0, vocab, step):
        rows = table.rows(r0, min(r0 + step, vocab))
        raw = to_bf16(rows).astype("<u2").tobytes()
        out.write(raw)
        written += len(raw)
        on_progress(rows.size)
    return written
