"""Write llm.mnn.weight the way MNN's exporter does, one tensor at a time, in row chunks.

A linear layer's block is what `mnnllm_core.core.weights.quant` reads back:

    u8 2 | oc, ic as 16-bit (32-bit when either exceeds 65535: shapeInt32)
    | u8 map count (0 means 256) | the map -2^(bits-1) .. 2^(bits-1)-1 as int8
    | codes, most significant bits first (4 bits: high nibble first; 2/3 bits: a bit stream)
    | fp16 (zero, scale) per (row, block), or one fp16 scale when symmetric | fp32 bias

Quantization is MNN's asymmetric min/max rule, computed in fp32 like its torch code:
scale = (max - min) / (2^bits - 1), code = clamp(round((w - min) / scale)),
zero = min + 2^(bits-1) * scale, so that w ~ zero + scale * (code - 2^(bits-1)).
A block that is constant (scale 0) gets code 0, which decodes to its value exactly.
Symmetric (`--sym`): scale = absmax / (2^(bits-1) - 1), code = clamp(round(w / scale),
-(2^(bits-1)-1), 2^(bits-1)-1) + 2^(bits-1), so that w ~ scale * (code - 2^(bits-1)).
16 bits stores the weight as fp16 with no header and no alpha (quanParameter type 3).
A LayerNorm stores fp32 gamma then fp32 beta (zeros for an RMSNorm).
With `hqq`, the codes and alphas come from `hqq.HqqFit` instead of min/max (same layout), and a
`QuantConfig` (`--quant-config`) may give any linear its own bits, block and symmetry.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import BinaryIO, Callable

import numpy as np

from mnnllm_core.errors import UnsupportedError

from .hqq import HqqFit
from .quant_config import QUANT_BITS, QUANT_BLOCKS, QuantChoice, QuantConfig
from .sources import LazyTensor

EMBED_BITS = (4, 8, 16)
_CHUNK_ELEMENTS = 1 << 20


RowQuantizer = Callable[[int, np.ndarray], tuple[np.ndarray, np.ndarray]]


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
    symmetric: bool = False


def block_size_for(ic: int, quant_block: int) -> int:
    """MNN's rule: 0 means one block per row; a block that does not divide ic is halved until it does."""
    size = ic if quant_block == 0 else quant_block
    while ic % size:
        size //= 2
    return size


def quantize_rows(w: np.ndarray, bits: int, block_size: int, symmetric: bool = False,
                  alpha_dtype: type = np.float16) -> tuple[np.ndarray, np.ndarray]:
    """fp32 [rows, ic] -> (uint8 codes [rows, ic], alpha [rows, n_blocks, 2] as (zero, scale), or
    [rows, n_blocks, 1] scales when symmetric)."""
    rows, ic = w.shape
    blocks = w.reshape(rows, ic // block_size, block_size)
    if symmetric:
        return _quantize_symmetric(blocks, bits, alpha_dtype)
    top = np.float32((1 << bits) - 1)
    hi = blocks.max(axis=-1, keepdims=True)
    lo = blocks.min(axis=-1, keepdims=True)
    scale = (hi - lo) / top
    safe = np.where(scale == 0, np.float32(1), scale)
    codes = np.round((blocks - lo) / safe)
    codes[np.broadcast_to(scale == 0, codes.shape)] = 0
    codes = np.clip(codes, 0, top).astype(np.uint8).reshape(rows, ic)
    zero = lo + scale * np.float32(1 << (bits - 1))
    alpha = np.concatenate([zero, scale], axis=-1).astype(alpha_dtype)
    return codes, alpha


def _quantize_symmetric(blocks: np.ndarray, bits: int, alpha_dtype: type) -> tuple[np.ndarray, np.ndarray]:
    """One scale per block; a block of zeros gets scale 0 and the code of value 0."""
    rows = blocks.shape[0]
    top = np.float32((1 << (bits - 1)) - 1)
    scale = np.abs(blocks).max(axis=-1, keepdims=True) / top
    safe = np.where(scale == 0, np.float32(1), scale)
    values = np.clip(np.round(blocks / safe), -top, top)
    codes = (values + np.float32(1 << (bits - 1))).astype(np.uint8).reshape(rows, -1)
    return codes, scale.astype(alpha_dtype)


def row_quantizer(tensor: LazyTensor, bits: int, block_size: int, symmetric: bool, hqq: bool, step: int,
                  alpha_dtype: type = np.float16) -> RowQuantizer:
    """(first row, fp32 rows) -> (codes, alphas) for `tensor`: min/max per chunk, or HQQ fitted over the
    whole tensor first (reading it `step` rows at a time)."""
    if hqq:
        fit = HqqFit.fit(tensor.rows, tensor.shape[0], tensor.shape[1], bits, block_size, symmetric, step)
        return lambda r0, rows: fit.quantize(r0, rows, alpha_dtype)
    return lambda r0, rows: quantize_rows(rows, bits, block_size, symmetric, alpha_dtype)


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """Flat uint8 codes -> bytes, most significant bits first (4 bits: two codes per byte, high nibble
    first; 2 and 3 bits: one bit stream, zero-padded to a whole byte)."""
    flat = codes.reshape(-1)
    if bits == 8:
        return flat
    if bits == 4:
        if flat.size % 2:
            flat = np.concatenate([flat, np.zeros(1, np.uint8)])
        pairs = flat.reshape(-1, 2)
        return (pairs[:, 0] << 4) | pairs[:, 1]
    stream = np.unpackbits(flat[:, None], axis=1)[:, 8 - bits:]
    return np.packbits(stream.reshape(-1))


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

    def __init__(self, out: BinaryIO, bits: int, block: int, on_progress: Callable[[int], None],
                 symmetric: bool = False, lm_bits: int | None = None, *, hqq: bool = False,
                 quant_config: QuantConfig | None = None):
        """`lm_bits`: the lm_head's bits (`--lm-quant-bit`), by default `bits`; `hqq`: HQQ instead of
        min/max; `quant_config`: per-linear overrides, looked up by the name `linear` is given."""
        for name, value in (("quant_bit", bits), ("lm_quant_bit", lm_bits if lm_bits is not None else bits)):
            if value not in QUANT_BITS:
                raise UnsupportedError(f"{name} {value} (supported: {QUANT_BITS})", field=name)
        if block not in QUANT_BLOCKS:
            raise UnsupportedError(f"quant block {block} (supported: {QUANT_BLOCKS})", field="quant_block")
        self.out = out
        self.bits = bits
        self.lm_bits = lm_bits if lm_bits is not None else bits
        self.block = block
        self.symmetric = symmetric
        self.hqq = hqq
        self.quant_config = quant_config
        self.offset = 0
        self.on_progress = on_progress

    def choice(self, name: str | None, lm_head: bool = False) -> QuantChoice:
        """The bits, block and symmetry of the linear `name`: the writer's, overridden by the quant config."""
        default = QuantChoice(self.lm_bits if lm_head else self.bits, self.block, self.symmetric)
        if self.quant_config is None or name is None:
            return default
        return self.quant_config.choice(name, default)

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

    def linear(self, weight: LazyTensor, bias: LazyTensor | None, lm_head: bool = False,
               name: str | None = None) -> LinearInfo:
        choice = self.choice(name, lm_head)
        bits = choice.bits
        if len(weight.shape) != 2:
            raise UnsupportedError(f"tensor {weight.name!r}: a linear weight must be 2-D, got {weight.shape}",
                                   field=weight.name)
        oc, ic = weight.shape
        start = self.offset
        step = max(2, _CHUNK_ELEMENTS // ic // 2 * 2)
        if bits == 16:
            header_len, shape_int32, block_size = 0, False, ic
            w_len = 0
            for r0 in range(0, oc, step):
                rows = weight.rows(r0, min(r0 + step, oc))
                w_len += self._write(rows.astype("<f2"))
                self.on_progress(rows.size)
            a_len = 0
        else:
            block_size = block_size_for(ic, choice.block)
            header, shape_int32 = weight_header(oc, ic, bits)
            header_len = w_len = self._write(header)
            alphas = []
            step = step if bits in (4, 8) else max(8, step // 8 * 8)  # a 2/3-bit chunk ends on a whole byte
            quantize = row_quantizer(weight, bits, block_size, choice.symmetric, self.hqq, step)
            for r0 in range(0, oc, step):
                rows = weight.rows(r0, min(r0 + step, oc))
                codes, alpha = quantize(r0, rows)
                w_len += self._write(pack_codes(codes, bits))
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
        return LinearInfo([start, w_len, a_len, b_len, 0], bits, oc, ic, block_size, header_len, shape_int32,
                          choice.symmetric and bits != 16)


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


def write_int_embedding(out: BinaryIO, table: LazyTensor, bits: int, quant_block: int, symmetric: bool,
                        on_progress: Callable[[int], None], hqq: bool = False) -> dict[str, int | str]:
    """embeddings_int8.bin / embeddings_int4.bin (`--embed-bit 8|4`): the [vocab, hidden] table's codes
    (packed as a linear's), then its alphas as fp32; returns its `tie_embeddings` description."""
    vocab, hidden = table.shape
    block = block_size_for(hidden, quant_block)
    step = max(2, _CHUNK_ELEMENTS // hidden // 2 * 2)
    quantize = row_quantizer(table, bits, block, symmetric, hqq, step, np.float32)
    code_bytes, alphas = 0, []
    for r0 in range(0, vocab, step):
        rows = table.rows(r0, min(r0 + step, vocab)).astype(np.float32)
        codes, alpha = quantize(r0, rows)
        packed = pack_codes(codes, bits)
        out.write(packed.tobytes())
        code_bytes += packed.size
        alphas.append(alpha)
        on_progress(rows.size)
    alpha_size = 0
    for alpha in alphas:
        raw = alpha.astype("<f4").tobytes()
        out.write(raw)
        alpha_size += len(raw)
    return {"weight_offset": 0, "alpha_offset": code_bytes, "alpha_size": alpha_size, "quant_bit": bits,
            "quant_block": 0 if quant_block == 0 else block, "alpha_dtype": "fp32"}
