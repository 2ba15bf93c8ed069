"""Decode attention over a StoredKVCache's rows (`kv_storage.py`), read as stored: one pass over
the cache, split over keys across the threads and merged (flash-decoding).

Keys and values are token-major [kv_heads, capacity, dim], float32 or int8 codes; int8 rows carry
a scale and zero each (x = code * scale + zero), so a score is scale * (q . code) + zero * sum(q)
and a value sum is sum(w * scale * code) + sum(w * zero): the codes are never widened to a copy.
Each task (a kv head and a span of keys) keeps, per query head of its group, its running max,
its sum of weights and its weighted values; the spans merge by rescaling to the common max.
`sinks` (one logit per head, or empty) join each head's denominator, as MNN's fifth input.
"""
from __future__ import annotations

import numpy as np
from numba import prange

from . import jit
from .exp import exp32

SPAN = 256  # keys of one task at least: fewer would spend more on merging than on the keys


@jit(parallel=True)
def attend_stored(q, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero, length, scale, sinks, out, splits):
    """q, out [heads, dim] (one token after `length` cached ones, itself included); k_scale,
    k_zero (v_scale, v_zero) [kv_heads, capacity] for int8 codes, empty for float32 ones."""
    heads, dim = q.shape
    kv_heads = k_codes.shape[0]
    group = heads // kv_heads
    span = -(-length // splits)
    keys_quantized = k_scale.shape[0] > 0
    values_quantized = v_scale.shape[0] > 0
    best = np.full((splits, heads), -np.inf, np.float32)
    total = np.zeros((splits, heads), np.float32)
    acc = np.zeros((splits, heads, dim), np.float32)
    for task in prange(splits * kv_heads):
        part, kv = divmod(np.int64(task), kv_heads)
        p0 = part * span
        p1 = min(length, p0 + span)
        if p0 >= p1:
            continue
        scores = np.empty(p1 - p0, np.float32)
        for j in range(group):
            h = kv * group + j
            q_sum = np.float32(0.0)
            for d in range(dim):
                q_sum += q[h, d]
            top = np.float32(-np.inf)
            for p in range(p0, p1):
                dot = np.float32(0.0)
                for d in range(dim):
                    dot += q[h, d] * np.float32(k_codes[kv, p, d])
                if keys_quantized:
                    dot = dot * k_scale[kv, p] + k_zero[kv, p] * q_sum
                x = dot * scale
                scores[p - p0] = x
                top = max(top, x)
            weight_sum = np.float32(0.0)
            zero_sum = np.float32(0.0)
            row = acc[part, h]
            for p in range(p0, p1):
                w = exp32(scores[p - p0] - top)
                weight_sum += w
                if values_quantized:
                    zero_sum += w * v_zero[kv, p]
                    w = w * v_scale[kv, p]
                for d in range(dim):
                    row[d] += w * np.float32(v_codes[kv, p, d])
            for d in range(dim):
                row[d] += zero_sum
            best[part, h] = top
            total[part, h] = weight_sum
    has_sinks = sinks.shape[0] > 0
    for h in prange(heads):
        top = np.float32(-np.inf)
        for part in range(splits):
            top = max(top, best[part, h])
        if has_sinks:
            top = max(top, sinks[h])
        denominator = exp32(sinks[h] - top) if has_sinks else np.float32(0.0)
        for d in range(dim):
            out[h, d] = 0.0
        for part in range(splits):
            if total[part, h] == 0.0:
                continue
            factor = exp32(best[part, h] - top)
            denominator += factor * total[part, h]
            for d in range(dim):
                out[h, d] += factor * acc[part, h, d]
        inverse = np.float32(1.0) / denominator
        for d in range(dim):
            out[h, d] *= inverse


def splits_for(length: int, threads: int) -> int:
    """Spans of at least SPAN keys, two per thread at most (a thread done early takes another)."""
    return max(1, min(2 * threads, -(-length // SPAN)))
