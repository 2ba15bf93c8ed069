"""The weights a backend packs: block-quantized or float [oc, ic] matrices, as decoded from
the model (see `quant.py` for the byte layout), with the helpers every backend's packing shares.

A quantized weight keeps its codes packed as stored (a view of the weight file) with fp32
(zero, scale) per (row, block): w = zero + scale * value, value = code - 2^(bits-1) (or the
value map's entry). A backend computing on float weights calls `dequantize()`; one computing on
codes reads `unpack()` / `offset_codes()` and `scale_zero()` and lays them out for its kernels.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np
import numpy.typing as npt

from ...errors import FormatError
from ..expert_program import SILU_GLU, ExpertProgram
from .finite import convert_checked

if TYPE_CHECKING:
    from ..backend import Refused

# Rows are dequantized in chunks of about this many elements, to stay in cache.
_CHUNK_ELEMENTS = 1 << 18


@dataclass(eq=False)
class QuantizedWeight:
    """A block-quantized [oc, ic] weight: packed codes plus fp32 zero/scale per (row, block).

    `packed` holds the codes as stored (a view of the weight file when it came from one);
    backends that compute on quantized weights keep it, others call `dequantize`.
    `value_map` is MNN's sorted map (code c means value_map[c]); None means the linear
    map, value = code - 2^(bits-1).
    """

    bits: int
    block_size: int
    oc: int
    ic: int
    packed: np.ndarray = field(repr=False)
    zero: np.ndarray = field(repr=False)
    scale: np.ndarray = field(repr=False)
    value_map: np.ndarray | None = field(default=None, repr=False)
    file: str | None = field(default=None, repr=False)
    op_name: str | None = field(default=None, repr=False)

    @property
    def n_blocks(self) -> int:
        return self.ic // self.block_size

    @property
    def is_linear(self) -> bool:
        """Whether value = code - 2^(bits-1) (MNN's fast path), so backends can skip the map."""
        if self.value_map is None:
            return True
        offset = 1 << (self.bits - 1)
        return (len(self.value_map) == 1 << self.bits
                and np.array_equal(self.value_map, np.arange(-offset, offset)))

    def scale_zero(self) -> np.ndarray:
        """float32 [oc, n_blocks, 2]: (scale, zero) per (row, block), the pair device kernels read."""
        return np.stack([self.scale, self.zero], axis=-1).astype(np.float32)

    def offset_codes(self) -> tuple[np.ndarray, int]:
        """(uint8 [oc, ic], offset) with value = code - offset for every weight: the codes as
        stored for the linear map, else the mapped int8 values shifted by 128."""
        codes = self.unpack()
        if self.is_linear:
            return codes, 1 << (self.bits - 1)
        return (np.take(self.value_map, codes).astype(np.int16) + 128).astype(np.uint8), 128

    def unpack(self) -> np.ndarray:
        """The unsigned codes, uint8 [oc, ic]."""
        codes = _unpack_codes(self.packed, self.bits, self.oc * self.ic).reshape(self.oc, self.ic)
        self._check_codes(codes)
        return codes

    def dequantize(self, dtype: npt.DTypeLike = np.float32) -> np.ndarray:
        """The float weight [oc, ic], computed in fp32 exactly as MNN does, then cast to `dtype`."""
        codes = self.unpack()
        out = np.empty((self.oc, self.ic), np.float32)
        step = max(1, _CHUNK_ELEMENTS // self.ic)
        for r0 in range(0, self.oc, step):
            r1 = min(r0 + step, self.oc)
            self._dequantize_into(codes[r0:r1], self.zero[r0:r1], self.scale[r0:r1], out[r0:r1])
        return out if np.dtype(dtype) == np.float32 else out.astype(dtype)

    def dequantize_rows(self, rows: npt.ArrayLike) -> np.ndarray:
        """Rows `rows` of `dequantize()`, float32 [len(rows), ic], reading only those rows' bytes.

        This is the embedding lookup in the tied lm_head: the table stays on disk.
        """
        rows = _row_indices(rows, self.oc)
        codes = self._codes_for_rows(rows)
        self._check_codes(codes)
        out = np.empty((rows.size, self.ic), np.float32)
        self._dequantize_into(codes, self.zero[rows], self.scale[rows], out)
        return out

    def _codes_for_rows(self, rows: np.ndarray) -> np.ndarray:
        """Gather just the bytes that hold `rows` (one fancy index into `packed`) and unpack them."""
        row_bits = self.ic * self.bits
        if row_bits % 8 == 0:
            row_bytes = row_bits // 8
            raw = self.packed[rows[:, None] * row_bytes + np.arange(row_bytes)]
            return _unpack_codes(raw.reshape(-1), self.bits, rows.size * self.ic).reshape(rows.size, self.ic)
        # Rows that start inside a byte: take each row's byte span, then its bits from its own offset.
        start = rows * row_bits
        first, last = start // 8, (start + row_bits - 1) // 8
        span = int((last - first).max(initial=0)) + 1
        raw = self.packed[np.minimum(first[:, None] + np.arange(span), last[:, None])]
        bit_rows = np.unpackbits(raw, axis=1)
        columns = (start % 8)[:, None] + np.arange(row_bits)
        row_code_bits = np.take_along_axis(bit_rows, columns, axis=1)
        return _bits_to_codes(row_code_bits.reshape(rows.size, self.ic, self.bits))

    def _check_codes(self, codes: np.ndarray) -> None:
        if self.value_map is not None and len(self.value_map) < 1 << self.bits and codes.size:
            worst = int(codes.max())
            if worst >= len(self.value_map):
                raise FormatError(
                    f"op {self.op_name!r}: code {worst} is outside the value map of {len(self.value_map)} entries",
                    file=self.file, field="weight")

    def _values(self, codes: np.ndarray) -> np.ndarray:
        """int8 values of uint8 codes: code - 2^(bits-1) (wrapping in uint8), or the map lookup."""
        if self.is_linear:
            return (codes - np.uint8(1 << (self.bits - 1))).view(np.int8)
        return np.take(self.value_map, codes)

    def _dequantize_into(self, codes: np.ndarray, zero: np.ndarray, scale: np.ndarray,
                         out: np.ndarray) -> None:
        rows = codes.shape[0]
        values = self._values(codes).reshape(rows, self.n_blocks, self.block_size)
        blocks = out.reshape(rows, self.n_blocks, self.block_size)
        # float(value) * scale, rounded to fp32, then + zero, rounded: MNN's two fp32 operations.
        np.multiply(values, scale[:, :, None], out=blocks)
        blocks += zero[:, :, None]


@dataclass(eq=False)
class FloatWeight:
    """An unquantized [oc, ic] weight stored as fp16 (quanParameter type 3) or fp32 (no quanParameter)."""

    oc: int
    ic: int
    data: np.ndarray = field(repr=False)
    file: str | None = field(default=None, repr=False)
    op_name: str | None = field(default=None, repr=False)

    def dequantize(self, dtype: npt.DTypeLike = np.float32) -> np.ndarray:
        """A fresh [oc, ic] array (fp16 -> fp32 is exact); a NaN or infinite weight is a FormatError
        (checked on each chunk as it is converted)."""
        return convert_checked(self.data, dtype, "weight", self.op_name, self.file)

    def dequantize_rows(self, rows: npt.ArrayLike) -> np.ndarray:
        return convert_checked(self.data[_row_indices(rows, self.oc)], np.float32, "weight of the rows read",
                               self.op_name, self.file)


def _row_indices(rows: npt.ArrayLike, oc: int) -> np.ndarray:
    """Row numbers as a flat int64 array; a row outside [0, oc) is a caller's error, not a wrap-around."""
    rows = np.asarray(rows, dtype=np.int64).reshape(-1)
    if rows.size and (rows.min() < 0 or rows.max() >= oc):
        raise IndexError(f"rows must lie in [0, {oc}), got {rows.min()} .. {rows.max()}")
    return rows


ConvolutionWeight = QuantizedWeight | FloatWeight


@dataclass
class ConvolutionWeights:
    """What a Convolution's weight reader returns: the [oc, ic] weight and its fp32 bias (None
    when the op stores none)."""

    quantized: ConvolutionWeight
    bias: np.ndarray | None

    @property
    def dense(self) -> np.ndarray | None:
        """The float weight when it is stored unquantized, else None."""
        return self.quantized.dequantize() if isinstance(self.quantized, FloatWeight) else None

    def dequantize(self) -> np.ndarray:
        """The weight as contiguous fp32 [oc, ic], as MNN computes it."""
        return np.ascontiguousarray(self.quantized.dequantize(), dtype=np.float32)

    @property
    def nonzero_bias(self) -> np.ndarray | None:
        """The fp32 bias, or None when there is none or it is all zeros (nothing to add)."""
        if self.bias is None or not np.any(self.bias):
            return None
        return np.asarray(self.bias, np.float32)


@dataclass
class MoEExpert:
    """One expert of an MoE op, as its subgraph computes it: `gate_up` [2 * inter, hidden]
    (gate rows first), then `program` on the two halves (see expert_program.py; silu(gate) * up
    unless the subgraph says otherwise), then `down` [hidden, inter]."""

    gate_up: ConvolutionWeights
    down: ConvolutionWeights
    program: ExpertProgram = SILU_GLU

    @property
    def intermediate(self) -> int:
        return self.down.quantized.ic


def linear_weights(op) -> "ConvolutionWeights | Refused":
    """The weights of a Convolution a backend runs as a linear layer, or why it cannot: only
    1x1, stride-1, ungrouped convolutions are linear layers, and weights packed for another
    backend are gone."""
    from ..backend import Refused
    if op.param is None or not op.param.is_linear:
        return Refused("only 1x1, stride-1, ungrouped convolutions (linear layers)")
    if op.weights is None:
        return Refused("its weights were packed for another backend")
    return op.weights.convolution()


class WeightReader(Protocol):
    """`op.weights` of a weighted op until its Execution has packed them (then None)."""

    def convolution(self) -> ConvolutionWeights: ...

    def layernorm(self) -> tuple[np.ndarray | None, np.ndarray | None]: ...

    def experts(self) -> list[MoEExpert]: ...


def _unpack_codes(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """`count` unsigned codes of `bits` bits, packed most significant bit first."""
    if bits == 8:
        return np.array(packed[:count])
    if bits == 4:
        codes = np.empty((packed.size, 2), np.uint8)
        np.right_shift(packed, 4, out=codes[:, 0])
        np.bitwise_and(packed, 0x0F, out=codes[:, 1])
        return codes.reshape(-1)[:count]
    return _bits_to_codes(np.unpackbits(packed)[:count * bits].reshape(count, bits))


def _bits_to_codes(code_bits: np.ndarray) -> np.ndarray:
    """Codes from their bits (last axis, most significant first)."""
    bits = code_bits.shape[-1]
    return np.packbits(code_bits, axis=-1)[..., 0] >> np.uint8(8 - bits)
