"""Linear layers on packed weights: a GEMV kernel for one token, dequantized tiles + BLAS for more.

`gemv` reads every packed byte once (the decode roofline); `matmul` turns a tile of groups
into fp32 in a reused scratch buffer (the same values as `QuantizedWeight.dequantize`) and
lets BLAS multiply it, so a prefill never holds a whole fp32 copy of a weight.
"""
from __future__ import annotations

import numpy as np
from numba import prange

from . import jit
from .layout import PackedWeight
from .gemm import GEMM_ROWS, gemm_block
from .simd import GROUP_ROWS, q4_group_dequantize, q4_group_dot, q8_group_dequantize, q8_group_dot

FEW_TOKENS = 4  # up to this many rows run the GEMV kernel once per row
DEPTH = 256  # inner-dimension block of the GEMM: a panel block of 32 KiB stays in L1/L2


@jit()
def _block_sums(x, n_blocks, block):
    sums = np.empty(n_blocks, np.float32)
    for b in range(n_blocks):
        total = np.float32(0.0)
        for j in range(b * block, (b + 1) * block):
            total += x[j]
        sums[b] = total
    return sums


@jit()
def _lanes(x):
    """x split into its even and odd elements (the high and low nibbles of a byte)."""
    half = x.shape[0] // 2
    even = np.empty(half, np.float32)
    odd = np.empty(half, np.float32)
    for j in range(half):
        even[j] = x[2 * j]
        odd[j] = x[2 * j + 1]
    return even, odd


@jit()
def _q4_rows(codes, alpha, x_even, x_odd, x_sum, out, n_blocks, block, g0, g1, first):
    group_bytes = x_even.shape[0] * GROUP_ROWS
    for g in range(g0, g1):
        q4_group_dot(codes, g * group_bytes, alpha, g * n_blocks * 2 * GROUP_ROWS, x_even, x_odd, x_sum,
                     n_blocks, block // 2, out, (g - first) * GROUP_ROWS)


@jit()
def _q8_rows(codes, alpha, x, x_sum, out, n_blocks, block, g0, g1, first):
    group_bytes = x.shape[0] * GROUP_ROWS
    for g in range(g0, g1):
        q8_group_dot(codes, g * group_bytes, alpha, g * n_blocks * 2 * GROUP_ROWS, x, x_sum, n_blocks, block,
                     out, (g - first) * GROUP_ROWS)


@jit()
def _gemv_q4(codes, alpha, x, out, n_blocks, block, g0, g1):
    x_even, x_odd = _lanes(x)
    _q4_rows(codes, alpha, x_even, x_odd, _block_sums(x, n_blocks, block), out, n_blocks, block, g0, g1, g0)


@jit(parallel=True)
def _gemv_q4_parallel(codes, alpha, x, out, n_blocks, block, g0, g1, parts):
    x_even, x_odd = _lanes(x)
    x_sum = _block_sums(x, n_blocks, block)
    per_part = (g1 - g0 + parts - 1) // parts
    for part in prange(parts):
        _q4_rows(codes, alpha, x_even, x_odd, x_sum, out, n_blocks, block, g0 + part * per_part,
                 min(g1, g0 + (part + 1) * per_part), g0)


@jit()
def _gemv_q8(codes, alpha, x, out, n_blocks, block, g0, g1):
    _q8_rows(codes, alpha, x, _block_sums(x, n_blocks, block), out, n_blocks, block, g0, g1, g0)


@jit(parallel=True)
def _gemv_q8_parallel(codes, alpha, x, out, n_blocks, block, g0, g1, parts):
    x_sum = _block_sums(x, n_blocks, block)
    per_part = (g1 - g0 + parts - 1) // parts
    for part in prange(parts):
        _q8_rows(codes, alpha, x, x_sum, out, n_blocks, block, g0 + part * per_part,
                 min(g1, g0 + (part + 1) * per_part), g0)


@jit(fastmath=False)
def _dequantize(bits, codes, alpha, n_blocks, block, g0, g1, tile, first, stride):
    """Groups g0..g1 into the transposed tile, group g at column (g - first) * 32."""
    group_bytes = n_blocks * block * bits // 8 * GROUP_ROWS
    for g in range(g0, g1):
        if bits == 4:
            q4_group_dequantize(codes, g * group_bytes, alpha, g * n_blocks * 2 * GROUP_ROWS, n_blocks, block // 2,
                                tile, (g - first) * GROUP_ROWS, stride)
        else:
            q8_group_dequantize(codes, g * group_bytes, alpha, g * n_blocks * 2 * GROUP_ROWS, n_blocks, block,
                                tile, (g - first) * GROUP_ROWS, stride)


@jit(parallel=True, fastmath=False)
def _dequantize_parallel(bits, codes, alpha, n_blocks, block, g0, g1, tile, parts):
    per_part = (g1 - g0 + parts - 1) // parts
    for part in prange(parts):
        _dequantize(bits, codes, alpha, n_blocks, block, g0 + part * per_part, min(g1, g0 + (part + 1) * per_part),
                    tile, g0, (g1 - g0) * GROUP_ROWS)


@jit()
def _matmul_group(bits, codes, alpha, n_blocks, block, g, x, out, column, width, panel, spill):
    """out[:, column:column + width] = x @ W[rows of group g].T, via the dequantized panel [ic, 32]."""
    tokens, ic = x.shape
    ldc = out.shape[1]
    _dequantize(bits, codes, alpha, n_blocks, block, g, g + 1, panel, g, GROUP_ROWS)
    flat_x = x.reshape(-1)
    flat_out = out.reshape(-1)
    for half in range(2):
        left = column + half * 16
        if left >= column + width:
            break
        whole = left + 16 <= column + width  # else the block goes through `spill` and its valid part is copied
        for k0 in range(0, ic, DEPTH):
            depth = min(DEPTH, ic - k0)
            for m0 in range(0, tokens, GEMM_ROWS):
                rows = min(GEMM_ROWS, tokens - m0)
                b_start = k0 * GROUP_ROWS + half * 16
                if whole:
                    gemm_block(rows, flat_x, m0 * ic + k0, ic, panel, b_start, GROUP_ROWS, depth, flat_out,
                               m0 * ldc + left, ldc, k0 > 0)
                else:
                    gemm_block(rows, flat_x, m0 * ic + k0, ic, panel, b_start, GROUP_ROWS, depth, spill, m0 * 16, 16,
                               k0 > 0)
        if not whole:
            valid = column + width - left
            for t in range(tokens):
                for n in range(valid):
                    out[t, left + n] = spill[t * 16 + n]


@jit()
def _matmul(bits, codes, alpha, n_blocks, block, g0, x, out):
    tokens, ic = x.shape
    panel = np.empty(ic * GROUP_ROWS, np.float32)
    spill = np.empty(tokens * 16, np.float32)
    rows = out.shape[1]
    for gi in range(-(-rows // GROUP_ROWS)):
        _matmul_group(bits, codes, alpha, n_blocks, block, g0 + gi, x, out, gi * GROUP_ROWS,
                      min(GROUP_ROWS, rows - gi * GROUP_ROWS), panel, spill)


@jit(parallel=True)
def _matmul_parallel(bits, codes, alpha, n_blocks, block, g0, x, out):
    tokens, ic = x.shape
    rows = out.shape[1]
    for gi in prange(-(-rows // GROUP_ROWS)):
        panel = np.empty(ic * GROUP_ROWS, np.float32)
        spill = np.empty(tokens * 16, np.float32)
        _matmul_group(bits, codes, alpha, n_blocks, block, g0 + gi, x, out, gi * GROUP_ROWS,
                      min(GROUP_ROWS, rows - gi * GROUP_ROWS), panel, spill)


def gemv(packed: PackedWeight, x: np.ndarray, out: np.ndarray, g0: int, g1: int, threads: int) -> None:
    """out[:(g1 - g0) * 32] = rows of groups g0..g1 of W @ x (x float32 [ic], out float32)."""
    if threads > 1:
        kernel = _gemv_q4_parallel if packed.bits == 4 else _gemv_q8_parallel
        kernel(packed.codes, packed.alpha, x, out, packed.n_blocks, packed.block, g0, g1, threads)
    else:
        kernel = _gemv_q4 if packed.bits == 4 else _gemv_q8
        kernel(packed.codes, packed.alpha, x, out, packed.n_blocks, packed.block, g0, g1)


def dequantize_groups(packed: PackedWeight, g0: int, g1: int, tile: np.ndarray, threads: int) -> np.ndarray:
    """W[rows of groups g0..g1].T as float32 [ic, (g1 - g0) * 32], written into the flat scratch `tile`."""
    width = (g1 - g0) * GROUP_ROWS
    if threads > 1:
        _dequantize_parallel(packed.bits, packed.codes, packed.alpha, packed.n_blocks, packed.block, g0, g1, tile,
                             threads)
    else:
        _dequantize(packed.bits, packed.codes, packed.alpha, packed.n_blocks, packed.block, g0, g1, tile, g0, width)
    return tile[:packed.ic * width].reshape(packed.ic, width)


def matmul(packed: PackedWeight, x: np.ndarray, out: np.ndarray, g0: int, threads: int) -> None:
    """out[tokens, rows] = x[tokens, ic] @ W[out's rows from group g0].T (float32, C-contiguous): each group
    of rows is dequantized into a panel that the register-blocked GEMM reuses for every token."""
    kernel = _matmul_parallel if threads > 1 else _matmul
    kernel(packed.bits, packed.codes, packed.alpha, packed.n_blocks, packed.block, g0, x, out)
