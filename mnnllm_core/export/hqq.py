"""Half-Quadratic Quantization (`--hqq`): each block's zero point (asymmetric) or scale (symmetric) refined
by proximal steps on an l_p (p < 1) reconstruction error, instead of min/max alone.

The rule of MNN 3.6.1's exporter (`utils/hqq_quantizer.py`, applied through `utils/torch_utils.py`), in
the quantizer's own terms: w ~ (q - z) / s (asymmetric, q in 0 .. 2^b - 1) or w ~ q / s (symmetric,
q in -2^(b-1) .. 2^(b-1) - 1), per block of `block_size` values of a row.

- Start: asymmetric s = (2^b - 1) / (max - min), z = round(-min * s); symmetric s = (2^(b-1) - 1) / absmax.
  s is 1 where the range (absmax) is <= 1e-4, and at most 2e4.
- Up to 20 steps, with shrink(x) = sign(x) * max(|x| - |x|^(p-1) / beta, 0), p = 0.7, beta = 10:
  asymmetric (s fixed): q = clip(round(w s + z)), r = (q - z) / s, e = shrink(w - r), z = mean(q - (w - e) s);
  symmetric (no zero): q = clip(round(w s)), r = q / s, e = shrink(w - r), s = sum(q^2) / (sum((w - e) q) + 1e-8).
- After each step the mean |w - r| over the whole tensor (r of that step, before its update) is compared
  with the best so far; the first step that does not lower it ends the loop, its update kept.
  A tensor of more than 2^28 values is fitted in row chunks of at most 2^28 values, each on its own.
- Stored as MNN's layout: scale = 1 / s; asymmetric zero = scale * (2^(b-1) - z) with the code q as is,
  symmetric the code q + 2^(b-1).

One deliberate difference: a symmetric block whose codes are all 0 would get s = 0 (a stored scale of
inf, NaN in the reconstruction); here such a block keeps its s, so it decodes to zeros.
MNN's later in-place rewrite of the quantizer measures the asymmetric stop on an overwritten buffer;
the stop here is the one its first version and HQQ itself use (the reconstruction error).

The fit streams the rows: every step re-reads them through `read_rows` a chunk at a time, holding only
the per-block s and z, so a table of any size is fitted in the memory of one chunk.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

LP_NORM = 0.7
BETA = 10.0
ITERATIONS = 20
MAX_SCALE = 2e4
FLAT_RANGE = 1e-4
EPS = 1e-8
FIT_ELEMENTS = 1 << 28  # rows fitted together (MNN's _QUANT_MAX_ELEMENTS)


def _shrink(x: np.ndarray) -> np.ndarray:
    """The l_p proximal step: |x| pulled towards 0 by |x|^(p-1) / beta, never past it (x = 0 stays 0).
    |x|^(p-1) as exp((p-1) log|x|): numpy's float32 power with such an exponent is several times slower."""
    magnitude = np.abs(x)
    with np.errstate(divide="ignore"):
        pull = np.log(magnitude)
    pull *= np.float32(LP_NORM - 1)
    np.exp(pull, out=pull)
    pull *= np.float32(1 / BETA)
    np.subtract(magnitude, pull, out=pull)
    np.maximum(pull, np.float32(0), out=pull)
    return np.copysign(pull, x, out=pull)


class HqqFit:
    """The fitted s (and z) of every (row, block) of one tensor; `quantize` turns rows into codes + alphas."""

    def __init__(self, bits: int, block_size: int, symmetric: bool, inv_scale: np.ndarray,
                 zero: np.ndarray | None):
        self.bits, self.block_size, self.symmetric = bits, block_size, symmetric
        self.inv_scale, self.zero = inv_scale, zero
        self.low, self.high = ((-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if symmetric else (0, (1 << bits) - 1))

    @classmethod
    def fit(cls, read_rows: Callable[[int, int], np.ndarray], rows: int, ic: int, bits: int, block_size: int,
            symmetric: bool, step: int) -> "HqqFit":
        """Fit every (row, block) of the [rows, ic] tensor, reading `step` rows at a time."""
        blocks = ic // block_size
        inv_scale = np.empty((rows, blocks, 1), np.float32)
        zero = None if symmetric else np.empty((rows, blocks, 1), np.float32)
        this = cls(bits, block_size, symmetric, inv_scale, zero)
        chunk = max(1, FIT_ELEMENTS // ic)
        for c0 in range(0, rows, chunk):
            this._fit_chunk(read_rows, c0, min(c0 + chunk, rows), ic, step)
        return this

    def _blocks(self, w: np.ndarray) -> np.ndarray:
        return np.asarray(w, np.float32).reshape(w.shape[0], -1, self.block_size)

    def _fit_chunk(self, read_rows: Callable[[int, int], np.ndarray], c0: int, c1: int, ic: int, step: int) -> None:
        spans = [(r0, min(r0 + step, c1)) for r0 in range(c0, c1, step)]
        for r0, r1 in spans:
            self._start(r0, r1, self._blocks(read_rows(r0, r1)))
        best = np.inf
        for _ in range(ITERATIONS):
            total = 0.0
            for r0, r1 in spans:
                total += self._step(r0, r1, self._blocks(read_rows(r0, r1)))
            error = total / ((c1 - c0) * ic)
            if not error < best:
                break
            best = error

    def _start(self, r0: int, r1: int, w: np.ndarray) -> None:
        lo, hi = w.min(axis=-1, keepdims=True), w.max(axis=-1, keepdims=True)
        span = np.maximum(np.abs(lo), np.abs(hi)) if self.symmetric else hi - lo
        with np.errstate(divide="ignore"):
            s = np.where(np.abs(span) <= FLAT_RANGE, np.float32(1), np.float32(self.high) / span)
        s = np.minimum(s, np.float32(MAX_SCALE)).astype(np.float32)
        self.inv_scale[r0:r1] = s
        if self.zero is not None:
            self.zero[r0:r1] = np.round(-lo * s)

    def _step(self, r0: int, r1: int, w: np.ndarray) -> float:
        """One proximal step on rows [r0, r1); returns their sum of |w - r| (r before the update)."""
        s = self.inv_scale[r0:r1]
        z = 0 if self.zero is None else self.zero[r0:r1]
        q = w * s
        q += z
        np.round(q, out=q)
        np.clip(q, self.low, self.high, out=q)
        r = q - z
        r /= s
        np.subtract(w, r, out=r)  # w - r
        error = float(np.abs(r).sum(dtype=np.float64))
        moved = _shrink(r)
        np.subtract(w, moved, out=moved)  # w - e
        if self.symmetric:
            norm = (q * q).sum(axis=-1, keepdims=True)
            moved *= q
            new = norm / (moved.sum(axis=-1, keepdims=True) + np.float32(EPS))
            self.inv_scale[r0:r1] = np.where(norm == 0, s, new)
        else:
            moved *= s
            np.subtract(q, moved, out=moved)
            self.zero[r0:r1] = moved.mean(axis=-1, keepdims=True)
        return error

    def quantize(self, r0: int, w: np.ndarray, alpha_dtype: type = np.float16) -> tuple[np.ndarray, np.ndarray]:
        """Rows [r0, r0 + len(w)) -> (uint8 codes [rows, ic], alpha [rows, blocks, 2] (zero, scale) or
        [rows, blocks, 1] scales), in the layout of `weights.quantize_rows`."""
        blocks = self._blocks(w)
        r1 = r0 + blocks.shape[0]
        s = self.inv_scale[r0:r1]
        offset = np.float32(1 << (self.bits - 1))
        scale = np.float32(1) / s
        if self.symmetric:
            q = np.clip(np.round(blocks * s), self.low, self.high) + offset
            alpha = scale
        else:
            z = self.zero[r0:r1]
            q = np.clip(np.round(blocks * s + z), self.low, self.high)
            alpha = np.concatenate([scale * offset - scale * z, scale], axis=-1)
        return q.astype(np.uint8).reshape(w.shape), alpha.astype(alpha_dtype)
