"""The gated delta rule's recurrence over a run of tokens, heads in parallel (`ops/gated_delta_rule.py`
has the math and the numpy reference).

Per token the numpy loop costs a handful of array calls, each a pass over S; here each head's S
is read twice per token (decay with S^T k, then the rank-one update with S^T q) and stays in cache.
"""
from __future__ import annotations

import numpy as np
from numba import prange

from . import jit


PARALLEL_WORK = 1 << 16  # multiply-adds of a run (tokens x H x dk x dv) from which threads pay off


@jit()
def _scan_head(q, k, v, decay, beta, state, out, out_from, h):
    s = state[h]
    n, _, dk = k.shape
    dv = v.shape[2]
    predicted = np.empty(dv, np.float32)
    delta = np.empty(dv, np.float32)
    for t in range(n):
        d = decay[t, h]
        for j in range(dv):
            predicted[j] = 0.0
        for i in range(dk):
            ki = k[t, h, i]
            for j in range(dv):
                s[i, j] *= d
                predicted[j] += s[i, j] * ki
        for j in range(dv):
            delta[j] = beta[t, h] * (v[t, h, j] - predicted[j])
        emit = t >= out_from
        if emit:
            for j in range(dv):
                out[t - out_from, h, j] = 0.0
        for i in range(dk):
            ki, qi = k[t, h, i], q[t, h, i]
            for j in range(dv):
                s[i, j] += ki * delta[j]
                if emit:
                    out[t - out_from, h, j] += s[i, j] * qi


@jit()
def _scan(q, k, v, decay, beta, state, out, out_from):
    for h in range(k.shape[1]):
        _scan_head(q, k, v, decay, beta, state, out, out_from, h)


@jit(parallel=True)
def _scan_parallel(q, k, v, decay, beta, state, out, out_from):
    for h in prange(k.shape[1]):  # prange counts unsigned: as int64 the serial kernel's `_scan_head` serves
        _scan_head(q, k, v, decay, beta, state, out, out_from, np.int64(h))


def delta_rule_scan(q, k, v, decay, beta, state, out, out_from) -> None:
    """q, k [n, H, dk], v [n, H, dv], decay (exp(g)) and beta [n, H], state [H, dk, dv] (updated);
    out [n - out_from, H, dv]: S^T q of the tokens from `out_from` on. Heads in parallel when the
    run is big enough (a decode step of a small model is not: waking the threads costs more)."""
    n, heads, dk = k.shape
    work = n * heads * dk * v.shape[2]
    kernel = _scan_parallel if heads > 1 and work >= PARALLEL_WORK else _scan
    kernel(q, k, v, decay, beta, state, out, out_from)
