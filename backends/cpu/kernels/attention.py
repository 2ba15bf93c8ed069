"""Causal attention over the KV cache, grouped-query heads, for the low-memory path.

The cache holds keys transposed, [kv_heads, dim, capacity] (values [kv_heads, capacity, dim]),
so both the scores of one query (a sum of key rows scaled by q[d]) and a block of queries
(the GEMM core with the key rows as B) read it contiguously. Token t of the new ones sees
cache positions < past + t + 1.
"""
from __future__ import annotations

import numpy as np
from numba import prange

from . import jit
from .gemm import GEMM_ROWS, gemm_block

PANEL = 16  # columns per GEMM block


@jit()
def _softmax(scores, visible, width):
    """scores[:visible] becomes its softmax; scores[visible:width] becomes 0."""
    best = -np.inf
    for p in range(visible):
        best = max(best, scores[p])
    total = np.float32(0.0)
    for p in range(visible):
        weight = np.exp(scores[p] - best)
        scores[p] = weight
        total += weight
    inverse = np.float32(1.0) / total
    for p in range(visible):
        scores[p] *= inverse
    for p in range(visible, width):
        scores[p] = 0.0


@jit()
def _attend_one(query, keys_t, values, kv, visible, scale, out, scores):
    dim = query.shape[0]
    row_scores = scores[:visible]
    row_scores[:] = 0.0
    for d in range(dim):
        weight = query[d] * scale
        key_row = keys_t[kv, d]
        for p in range(visible):
            row_scores[p] += weight * key_row[p]
    _softmax(row_scores, visible, visible)
    out[:] = 0.0
    for p in range(visible):
        weight = row_scores[p]
        value = values[kv, p]
        for d in range(dim):
            out[d] += weight * value[d]


@jit()
def attend_few(q, keys_t, values, past, scale, out, scores):
    """q, out [tokens, heads, dim]; scores: scratch of at least past + tokens floats."""
    tokens, heads, _ = q.shape
    group = heads // keys_t.shape[0]
    for t in range(tokens):
        for h in range(heads):
            _attend_one(q[t, h], keys_t, values, h // group, past + t + 1, scale, out[t, h], scores)


@jit(parallel=True)
def attend_many(q, keys_t, values, past, scale, out):
    """q, out [tokens, heads, dim] (dim a multiple of 16); one head per task, scores through the GEMM core."""
    tokens, heads, dim = q.shape
    kv_heads, _, capacity = keys_t.shape
    group = heads // kv_heads
    width = -(-(past + tokens) // PANEL) * PANEL  # <= capacity (the cache grows in panels)
    flat_q, flat_out = q.reshape(-1), out.reshape(-1)
    flat_k, flat_v = keys_t.reshape(-1), values.reshape(-1)
    stride = heads * dim
    for h in prange(heads):
        kv = h // group
        scores = np.empty(tokens * width, np.float32)
        for m0 in range(0, tokens, GEMM_ROWS):
            rows = min(GEMM_ROWS, tokens - m0)
            visible = past + m0 + rows  # the last row of the block sees the most
            columns = -(-visible // PANEL) * PANEL
            for n0 in range(0, columns, PANEL):
                gemm_block(rows, flat_q, m0 * stride + h * dim, stride, flat_k, kv * dim * capacity + n0, capacity,
                           dim, scores, m0 * width + n0, width, False)
            for r in range(rows):
                row = scores[(m0 + r) * width:(m0 + r) * width + columns]
                for p in range(columns):
                    row[p] *= scale
                _softmax(row, past + m0 + r + 1, columns)
            for n0 in range(0, dim, PANEL):
                gemm_block(rows, scores, m0 * width, width, flat_v, kv * capacity * dim + n0, dim, visible, flat_out,
                           m0 * stride + h * dim + n0, stride, False)
