"""RMSNorm / LayerNorm over the last axis, and MNN's fused residual form, in one pass per row.

The numpy reference (`ops/norm.py`) costs a dozen array calls per norm; at decode each norm is
one row of a few thousand values, so the calls, not the arithmetic, were the cost.
"""
from __future__ import annotations

import numpy as np

from . import jit


@jit(inline=True)
def _normalized(value, mean, inv, gamma, beta, j):
    y = (value - mean) * inv
    if gamma.shape[0]:
        y *= gamma[j]
    if beta.shape[0]:
        y += beta[j]
    return y


@jit()
def _scale_row(x, mean, inv, gamma, beta, out):
    for j in range(x.shape[0]):
        out[j] = _normalized(x[j], mean, inv, gamma, beta, j)


@jit()
def _scale_row_in_place(x, mean, inv, gamma, beta):
    for j in range(x.shape[0]):
        x[j] = _normalized(x[j], mean, inv, gamma, beta, j)


@jit()
def normalize_rows(x, n, gamma, beta, eps, rms, out):
    """Each row of n values of the flat float32 x into out; gamma/beta empty when absent. `out`
    may be `x` (`LayerNormExecution.output_may_share`, a RoPE head normalized in place): that case
    has a loop of its own, since LLVM vectorizes a loop only after a run-time check that the array
    it writes does not overlap those it reads, and a shared buffer fails it (the scalar loop: 1.04
    against 0.33 ms for 512 rows of 2048, as `activation.mul_silu` found)."""
    in_place = out.ctypes.data == x.ctypes.data
    for r in range(x.shape[0] // n):
        row = x[r * n:(r + 1) * n]
        mean = np.float32(0.0)
        if not rms:
            for j in range(n):
                mean += row[j]
            mean /= n
        square = np.float32(0.0)
        for j in range(n):
            d = row[j] - mean
            square += d * d
        inv = np.float32(1.0) / np.sqrt(square / n + eps)
        if in_place:
            _scale_row_in_place(row, mean, inv, gamma, beta)
        else:
            _scale_row(row, mean, inv, gamma, beta, out[r * n:(r + 1) * n])


@jit()
def add_normalize_rows(a, b, n, gamma, beta, eps, rms, total, out):
    """total = a + b; out = norm(total) row by row (flat float32 arrays). `total` may be `a` (the
    same reason as `normalize_rows`: a loop of its own)."""
    if total.ctypes.data == a.ctypes.data:
        for i in range(a.shape[0]):
            a[i] += b[i]
    else:
        for i in range(a.shape[0]):
            total[i] = a[i] + b[i]
    normalize_rows(total, n, gamma, beta, eps, rms, out)
