"""RMSNorm / LayerNorm over the last axis, and MNN's fused residual form, in one pass per row.

The numpy reference (`ops/norm.py`) costs a dozen array calls per norm; at decode each norm is
one row of a few thousand values, so the calls, not the arithmetic, were the cost.
"""
from __future__ import annotations

import numpy as np

from . import jit


@jit()
def _normalize_row(x, gamma, beta, eps, rms, out):
    n = x.shape[0]
    mean = np.float32(0.0)
    if not rms:
        for j in range(n):
            mean += x[j]
        mean /= n
    square = np.float32(0.0)
    for j in range(n):
        d = x[j] - mean
        square += d * d
    inv = np.float32(1.0) / np.sqrt(square / n + eps)
    for j in range(n):
        y = (x[j] - mean) * inv
        if gamma.shape[0]:
            y *= gamma[j]
        if beta.shape[0]:
            y += beta[j]
        out[j] = y


@jit()
def normalize_rows(x, n, gamma, beta, eps, rms, out):
    """Each row of n values of the flat float32 x into out; gamma/beta empty when absent."""
    for r in range(x.shape[0] // n):
        _normalize_row(x[r * n:(r + 1) * n], gamma, beta, eps, rms, out[r * n:(r + 1) * n])


@jit()
def add_normalize_rows(a, b, n, gamma, beta, eps, rms, total, out):
    """total = a + b; out = norm(total) row by row (flat float32 arrays)."""
    for i in range(a.shape[0]):
        total[i] = a[i] + b[i]
    normalize_rows(total, n, gamma, beta, eps, rms, out)
