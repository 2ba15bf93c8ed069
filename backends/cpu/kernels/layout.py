"""The packed weight layout the low-memory kernels read, and packing into it from MNN's layout.

MNN stores a quantized [oc, ic] weight row-major, codes packed high nibble first, with one
(zero, scale) per (row, block). The kernels read it as groups of GROUP_ROWS (32) rows:

    codes  uint8, [groups][ic * bits / 8][32]: byte j of each of the group's 32 rows side by
           side, so 8 bytes load as 8 lanes of 8 rows (int4: the byte holds the codes of weights
           2j in its high nibble and 2j+1 in its low nibble, as in MNN; int8: the signed value
           of weight j)
    alpha  [groups][blocks][zero[32], scale[32]], fp16 bits (uint16) when the values are
           exactly fp16 (the exporter's default), else float32

and w = zero + scale * (code - 8) for int4, zero + scale * value for int8. Rows past oc are padding
with zero codes and alphas. Weights of 2, 3 or 4 bits with a linear value map, an even ic and an
even block run as 4-bit: a 2/3-bit code u (value u - 2^(b-1)) becomes the nibble u + 8 - 2^(b-1),
the same value for the int4 kernels; every other quantization (8 bits, a value map, odd sizes)
is re-coded to 8-bit codes holding the same values, still 4x smaller than fp32. Symmetric
weights are zero-point 0.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from mnnllm_core.backend_api import QuantizedWeight

from . import jit
from .simd import GROUP_ROWS

LAYOUT_VERSION = f"interleaved-{GROUP_ROWS}-rows-2"  # change it with the layout: cached packs are then made anew


@dataclass(eq=False)
class PackedWeight:
    bits: int  # 4 or 8: the width of one code in `codes`
    oc: int  # real rows (the groups hold groups * GROUP_ROWS)
    ic: int
    block: int  # weights per (zero, scale)
    codes: np.ndarray
    alpha: np.ndarray

    @property
    def groups(self) -> int:
        return -(-self.oc // GROUP_ROWS)

    @property
    def n_blocks(self) -> int:
        return self.ic // self.block

    @property
    def group_bytes(self) -> int:
        """Bytes of codes per group."""
        return self.ic * self.bits // 8 * GROUP_ROWS

    @property
    def nbytes(self) -> int:
        """What one GEMV reads."""
        return self.codes.nbytes + self.alpha.nbytes

    def arrays(self) -> dict[str, np.ndarray]:
        """The weight as plain arrays, what `runtime.weight_cache` keeps on disk."""
        return {"codes": self.codes, "alpha": self.alpha,
                "shape": np.array([self.bits, self.oc, self.ic, self.block], np.int64)}

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> "PackedWeight":
        bits, oc, ic, block = (int(x) for x in arrays["shape"])
        return cls(bits, oc, ic, block, arrays["codes"], arrays["alpha"])

    def same_format(self, other: "PackedWeight") -> bool:
        return (self.bits, self.ic, self.block, self.alpha.dtype) == (other.bits, other.ic, other.block,
                                                                      other.alpha.dtype)


# runs task(item) for each item, maybe on several threads (the cpu runtime's `HostThreads.run`)
Spread = Callable[[Callable[[Any], None], Iterable[Any]], None]
SPAN_BYTES = 2 << 20  # codes per packing task: a weight of a few MiB is shared by the threads too


def pack(weight: QuantizedWeight, spread: Spread | None = None) -> PackedWeight:
    """The kernels' layout of one quantized weight (a copy: the weight file's pages can go).

    `spread(task, items)` runs task(item) for every item, on the runtime's threads
    (`HostThreads.run`): the weight's groups are packed a span at a time, the spans at once
    (the kernels release the GIL); None packs them in order on the calling thread."""
    oc, ic, block = weight.oc, weight.ic, weight.block_size
    four_bit = weight.bits in (2, 3, 4) and weight.is_linear and ic % 2 == 0 and block % 2 == 0
    groups = -(-oc // GROUP_ROWS)
    if four_bit and weight.bits == 4:
        rows = np.asarray(weight.packed[:oc * ic // 2]).reshape(oc, ic // 2)
    elif four_bit:
        rows = _nibbles(weight.unpack() + np.uint8(8 - (1 << (weight.bits - 1))))
    else:
        rows = _eight_bit_codes(weight)
    width, blocks = rows.shape[1], ic // block
    codes = np.empty(groups * GROUP_ROWS * width, np.uint8)
    half = np.empty(groups * GROUP_ROWS * blocks * 2, np.uint16)
    zero_bits, scale_bits = (_float_bits(a) for a in (weight.zero, weight.scale))
    exact = []  # per span: whether its alphas are all exactly fp16

    def pack_span(span: tuple[int, int]) -> None:
        first, last = (g * GROUP_ROWS for g in span)
        interleave_rows(rows[first:last], codes[first * width:last * width])
        exact.append(interleave_half_alpha(zero_bits[first:last], scale_bits[first:last],
                                           half[first * blocks * 2:last * blocks * 2]))

    (spread or _in_order)(pack_span, _spans(groups, codes.nbytes))
    alpha = half if all(exact) else _alpha(weight.zero, weight.scale, groups)
    return PackedWeight(4 if four_bit else 8, oc, ic, block, codes, alpha)


def _in_order(task: Callable[[Any], None], items: Iterable[Any]) -> None:
    for item in items:
        task(item)


def _spans(groups: int, nbytes: int) -> list[tuple[int, int]]:
    """[first, last) group ranges of about SPAN_BYTES of codes each."""
    step = max(1, groups * SPAN_BYTES // max(nbytes, 1))
    return [(start, min(start + step, groups)) for start in range(0, groups, step)]


@jit()
def interleave_rows(rows, out):
    """rows uint8 [oc, n] -> out [groups][n][32]: byte j of each row of a group side by side, zero padded."""
    oc, n = rows.shape
    for g in range(out.shape[0] // (n * GROUP_ROWS)):
        block = out[g * n * GROUP_ROWS:(g + 1) * n * GROUP_ROWS]
        for r in range(GROUP_ROWS):
            row = g * GROUP_ROWS + r
            if row < oc:
                source = rows[row]
                for j in range(n):
                    block[j * GROUP_ROWS + r] = source[j]
            else:
                for j in range(n):
                    block[j * GROUP_ROWS + r] = 0


def _float_bits(values: np.ndarray) -> np.ndarray:
    """The float32 bits (uint32) of a [rows, blocks] array, contiguous and writable as the kernel
    was compiled for (a copy only when they are not already)."""
    return np.require(values, np.float32, ["C", "W"]).view(np.uint32)


def _nibbles(codes: np.ndarray) -> np.ndarray:
    """uint8 codes [oc, ic] (< 16, ic even) -> [oc, ic / 2] bytes, the even column in the high nibble."""
    return (codes[:, 0::2] << 4) | codes[:, 1::2]


def _eight_bit_codes(weight: QuantizedWeight) -> np.ndarray:
    """The int8 values [oc, ic] (as uint8 bytes) of the weight's codes."""
    codes = weight.unpack()
    if weight.is_linear:
        return codes - np.uint8(1 << (weight.bits - 1))  # wraps to the two's complement of the value
    return weight.value_map.view(np.uint8)[codes]


def _alpha(zero: np.ndarray, scale: np.ndarray, groups: int) -> np.ndarray:
    """[groups][blocks][zero[32], scale[32]]: fp16 bits when that is exact, else float32 (the
    reference `interleave_half_alpha` is tested against, and the float32 layout)."""
    oc, blocks = zero.shape
    as_half = all(np.array_equal(a.astype(np.float16).astype(np.float32), a, equal_nan=True) for a in (zero, scale))
    pairs = np.zeros((groups * GROUP_ROWS, blocks, 2), np.float16 if as_half else np.float32)
    pairs[:oc, :, 0], pairs[:oc, :, 1] = zero, scale
    grouped = pairs.reshape(groups, GROUP_ROWS, blocks, 2).transpose(0, 2, 3, 1)
    flat = np.ascontiguousarray(grouped).reshape(-1)
    return flat.view(np.uint16) if as_half else flat


@jit()
def interleave_half_alpha(zero, scale, out):
    """zero, scale: float32 bits (uint32) [rows, blocks] -> out uint16 [groups][blocks][zero[32],
    scale[32]], fp16 bits, rows past `rows` zero. One pass where numpy's exactness test and
    transpose took eight; False (out left unfinished) at the first value that is not exactly an
    fp16 (or not finite): the caller then takes `_alpha`'s way."""
    rows, blocks = zero.shape
    for g in range(out.shape[0] // (blocks * 2 * GROUP_ROWS)):
        for b in range(blocks):
            at = (g * blocks + b) * 2 * GROUP_ROWS
            for r in range(GROUP_ROWS):
                row = g * GROUP_ROWS + r
                if row < rows:
                    z, s = _half_bits(zero[row, b]), _half_bits(scale[row, b])
                    if z < 0 or s < 0:
                        return False
                    out[at + r], out[at + GROUP_ROWS + r] = z, s
                else:
                    out[at + r], out[at + GROUP_ROWS + r] = 0, 0
    return True


@jit()
def _half_bits(bits):
    """The fp16 bits of the float32 whose bits are `bits` when it is exactly an fp16, else -1
    (also for an infinity or a NaN)."""
    bits = np.int64(bits)
    sign, exponent, mantissa = (bits >> 16) & 0x8000, (bits >> 23) & 0xFF, bits & 0x7FFFFF
    if exponent == 0:  # zero; a float32 subnormal is below fp16's least subnormal (2^-24)
        return sign if mantissa == 0 else -1
    half_exponent = exponent - 112  # rebiased: 127 - 15
    if exponent == 0xFF or half_exponent >= 31:
        return -1
    if half_exponent >= 1:  # normal: the 13 mantissa bits fp16 lacks must be zero
        return sign | (half_exponent << 10) | (mantissa >> 13) if mantissa & 0x1FFF == 0 else -1
    shift = 14 - half_exponent  # an fp16 subnormal m * 2^-24: m = significand >> shift, nothing lost
    significand = mantissa | 0x800000
    if shift > 23 or significand & ((1 << shift) - 1):
        return -1
    return sign | (significand >> shift)


def dequantize(packed: PackedWeight) -> np.ndarray:
    """float32 [oc, ic] from the packed layout, in numpy: the reference the kernels are tested against."""
    groups, per_row = packed.groups, packed.ic * packed.bits // 8
    raw = packed.codes.reshape(groups, per_row, GROUP_ROWS).transpose(0, 2, 1).reshape(-1, per_row)
    if packed.bits == 4:
        codes = np.empty((raw.shape[0], packed.ic), np.float32)
        codes[:, 0::2], codes[:, 1::2] = raw >> 4, raw & 15
        codes -= 8
    else:
        codes = raw.view(np.int8).astype(np.float32)
    alpha = packed.alpha.view(np.float16) if packed.alpha.dtype == np.uint16 else packed.alpha
    pairs = alpha.astype(np.float32).reshape(groups, packed.n_blocks, 2, GROUP_ROWS).transpose(0, 3, 1, 2)
    pairs = pairs.reshape(-1, packed.n_blocks, 2)
    values = codes.reshape(-1, packed.n_blocks, packed.block) * pairs[:, :, 1:2] + pairs[:, :, 0:1]
    return values.reshape(-1, packed.ic)[:packed.oc]
