"""The int8 path's input quantization (`int8_dot.quantize_rows`, loops that vectorize) against the
scalar loops it replaced, kept here as they were: the same bytes (codes, scales, zero points, block
sums) for both rules, on rows of many widths and of every kind of value: signed zeros, constant
rows, ties on the grid and values an ulp from them, tiny (subnormal) and huge magnitudes, infinities and NaN."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba")

from mnnllm_backends.cpu.kernels import int8_dot, jit  # noqa: E402

FIELDS = ("xq", "ds", "zp", "qsum", "xsum")
# (ic, block): widths that are and are not multiples of 16 and 64, one block a row among them
SHAPES = [(8, 8), (24, 8), (40, 8), (72, 8), (80, 80), (96, 32), (192, 64), (200, 8), (576, 64), (1000, 40),
          (1536, 64)]


@jit(fastmath=False)
def _former_round_half_away(value):
    return np.floor(value + 0.5) if value >= 0 else np.ceil(value - 0.5)


@jit(fastmath=False)
def former_quantize_rows(x, block, symmetric, xq, ds, zp, qsum, xsum):
    """`int8_dot.quantize_rows` before its loops vectorized (scalar min/max from x[t, 0], ds[t]
    and zp[t] read back inside the loops)."""
    tokens, ic = x.shape
    n_blocks = ic // block
    for t in range(tokens):
        low = x[t, 0]
        high = x[t, 0]
        for j in range(ic):
            low = min(low, x[t, j])
            high = max(high, x[t, j])
        top = max(high, -low)
        span = high - low
        if symmetric or span == 0:
            scale = np.float32(127.0) / top if top > 0 else np.float32(0.0)
            ds[t] = top / np.float32(127.0)
            zp[t] = np.float32(0.0)
            for j in range(ic):
                xq[t, j] = min(127, max(-127, np.int32(np.rint(x[t, j] * scale))))
        else:
            scale = np.float32(255.0) / span
            ds[t] = span / np.float32(255.0)
            zp[t] = -low * np.float32(255.0) / span - np.float32(128.0)
            for j in range(ic):
                value = min(np.float32(127.0), max(np.float32(-128.0), x[t, j] * scale + zp[t]))
                xq[t, j] = np.int32(_former_round_half_away(value))
        for b in range(n_blocks):
            total = np.int32(0)
            for j in range(b * block, (b + 1) * block):
                total += np.int32(xq[t, j])
            qsum[t, b] = total
            xsum[t, b] = ds[t] * (np.float32(total) - zp[t] * np.float32(block))


def _signed_zeros(rng, ic: int, first: float) -> np.ndarray:
    row = np.where(rng.random(ic) < 0.5, np.float32(-0.0), np.float32(0.0)).astype(np.float32)
    row[0] = first
    return row


def _ties(rng, ic: int) -> np.ndarray:
    """Values on half steps of the grid: min -128 and max 127 make the asymmetric scale 1 and zp 0,
    and a row under 127 in magnitude the symmetric scale 1."""
    row = (rng.integers(-128, 127, ic) + 0.5).astype(np.float32)
    row[rng.integers(ic)], row[rng.integers(ic)] = -128, 127
    return row


def _near_ties(rng, ic: int) -> np.ndarray:
    """`_ties` moved one ulp up or down (0.49999997 + 0.5 is 1.0 in float32: a rounding that adds
    0.5 in float32 would give 1 there)."""
    row = _ties(rng, ic)
    toward = np.where(rng.random(ic) < 0.5, np.float32(np.inf), np.float32(-np.inf))
    inner = (row > -128) & (row < 127)
    row[inner] = np.nextafter(row[inner], toward[inner])
    return row


def _with(row: np.ndarray, rng, value: float, at: int | None = None) -> np.ndarray:
    row = row.copy()
    row[rng.integers(1, row.size) if at is None else at] = value
    return row


def rows(rng, ic: int) -> np.ndarray:
    """One row of each kind, [kinds, ic] float32."""
    normal = rng.standard_normal(ic).astype(np.float32)
    negative_nan = np.array([0xFFC00000], np.uint32).view(np.float32)[0]
    with np.errstate(over="ignore"):  # 3e38 a scale: some values overflow to +-inf
        kinds = [normal * np.float32(scale) for scale in (1e-40, 1e-30, 1e-3, 1.0, 30.0, 1e4, 1e30, 3e38)]
    kinds += [
        normal + np.float32(5.0),  # min > 0
        -np.abs(normal),  # max < 0
        _signed_zeros(rng, ic, -0.0), _signed_zeros(rng, ic, 0.0), np.zeros(ic, np.float32),
        np.where(rng.random(ic) < 0.3, _signed_zeros(rng, ic, -0.0), -np.abs(normal)),  # max a signed zero
        np.where(rng.random(ic) < 0.3, _signed_zeros(rng, ic, 0.0), np.abs(normal)),  # min a signed zero
        np.full(ic, 0.7, np.float32), np.full(ic, -3.0, np.float32),
        _with(np.zeros(ic, np.float32), rng, -2.5), _with(_signed_zeros(rng, ic, -0.0), rng, 1e-45),
        _ties(rng, ic), _ties(rng, ic) / np.float32(2.0), _near_ties(rng, ic),
        _with(normal, rng, np.inf), _with(normal, rng, -np.inf), _with(normal, rng, np.inf, at=0),
        _with(normal, rng, np.nan), _with(normal, rng, negative_nan), _with(normal, rng, np.nan, at=0),
        _with(normal, rng, negative_nan, at=0),
    ]
    return np.ascontiguousarray(np.stack(kinds).astype(np.float32))


def quantized(quantize, x: np.ndarray, block: int, symmetric: bool) -> tuple[np.ndarray, ...]:
    tokens, ic = x.shape
    scratch = np.zeros(int8_dot.scratch_bytes(tokens, ic, ic // block), np.uint8)
    fields = int8_dot.quantized_rows(scratch, tokens, ic, ic // block)
    quantize(x, block, symmetric, *fields)
    return fields


@pytest.mark.parametrize("symmetric", [False, True], ids=["asymmetric", "symmetric"])
@pytest.mark.parametrize("ic, block", SHAPES)
def test_quantize_rows_gives_the_former_scalar_loops_bytes(ic, block, symmetric):
    """Every field's bytes equal (a NaN's too), row by row, for rows of every kind together and
    each row alone (a call's row count changes no row's bits)."""
    rng = np.random.default_rng(ic * 31 + block)
    for _ in range(3):
        x = rows(rng, ic)
        expected = quantized(former_quantize_rows, x, block, symmetric)
        for name, want, got in zip(FIELDS, expected, quantized(int8_dot.quantize_rows, x, block, symmetric)):
            differ = [t for t in range(x.shape[0]) if want[t].tobytes() != got[t].tobytes()]
            assert not differ, f"{name} differs on rows {differ}"
        for t in (0, 10, 12, x.shape[0] - 1):
            alone = quantized(int8_dot.quantize_rows, x[t:t + 1], block, symmetric)
            assert all(a.tobytes() == e[t:t + 1].tobytes() for a, e in zip(alone, expected))


def test_the_range_takes_the_scalar_loops_zero_sign_and_skips_nan_after_the_first_value():
    """`_row_range` on the rows whose order keys disagree with the scalar loop's first-come
    order: a row of zeros keeps row[0]'s sign; a NaN after row[0] is skipped, one at row[0] wins."""
    minus_first = np.array([-0.0, 0.0, -0.0, 0.0], np.float32)
    for row in (minus_first, -minus_first):
        low, high = int8_dot._row_range(row)
        assert np.signbit(low) == np.signbit(high) == np.signbit(row[0]) and low == high == 0
    assert int8_dot._row_range(np.array([1.0, np.nan, -2.0, 3.0], np.float32)) == (-2.0, 3.0)
    assert all(np.isnan(int8_dot._row_range(np.array([np.nan, -2.0, 3.0], np.float32))))
