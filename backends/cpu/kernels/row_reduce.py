"""Reductions over a row of float32 values in an order of their own, for the attention softmaxes:
LLVM keeps a plain loop's reduction as one chain (a compare or an add waiting on the last) or,
under fastmath, splits a sum into partial sums of its choosing. Each loop indexes from an
unsigned base (a signed index takes numba's negative-index wraparound, which keeps LLVM from
vectorizing) and runs eight chains, one vector of lanes."""
from __future__ import annotations

import numpy as np

from . import jit
from .exp import exp32


@jit(fastmath=False)
def ordered_sum(values, base, count, total):
    """total + the sum of values[base:base + count] in a fixed order: element i into chain i % 8,
    the chains added pairwise, then the tail past the last 8 in order. fastmath is off, so LLVM
    may not reassociate it wherever the caller is inlined (a plain loop under fastmath was split
    into partial sums as LLVM chose); the eight chains are one vector of adds."""
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = np.float32(0.0)
    i = 0
    while i + 8 <= count:
        p = base + np.uint64(i)
        s0 += values[p]
        s1 += values[p + np.uint64(1)]
        s2 += values[p + np.uint64(2)]
        s3 += values[p + np.uint64(3)]
        s4 += values[p + np.uint64(4)]
        s5 += values[p + np.uint64(5)]
        s6 += values[p + np.uint64(6)]
        s7 += values[p + np.uint64(7)]
        i += 8
    tail = np.float32(0.0)
    for k in range(i, count):
        tail += values[base + np.uint64(k)]
    return total + ((((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))) + tail)


@jit()
def row_max(values, base, count):
    """The largest of values[base:base + count] (count >= 1) in eight chains (element i into chain
    i % 8), which LLVM runs as one vector: a max is exact in any order, so this is the one loop's
    value (a NaN anywhere makes the softmax's whole row NaN either way); one chain waited on each
    compare (0.5 ns an element of the softmax's 1.0)."""
    m0 = m1 = m2 = m3 = m4 = m5 = m6 = m7 = values[base]
    i = 0
    while i + 8 <= count:
        p = base + np.uint64(i)
        m0 = max(m0, values[p])
        m1 = max(m1, values[p + np.uint64(1)])
        m2 = max(m2, values[p + np.uint64(2)])
        m3 = max(m3, values[p + np.uint64(3)])
        m4 = max(m4, values[p + np.uint64(4)])
        m5 = max(m5, values[p + np.uint64(5)])
        m6 = max(m6, values[p + np.uint64(6)])
        m7 = max(m7, values[p + np.uint64(7)])
        i += 8
    for k in range(i, count):
        m0 = max(m0, values[base + np.uint64(k)])
    return max(max(max(m0, m1), max(m2, m3)), max(max(m4, m5), max(m6, m7)))


@jit()
def exp_sum(values, base, count, top, total):
    """values[base:base + count] becomes exp(value - top); returns total + their sum in
    `ordered_sum`'s order: the exponentials and denominator of a softmax row (the prompt's and
    the split long-cache attention's, one code for both)."""
    for i in range(count):
        p = base + np.uint64(i)
        values[p] = exp32(values[p] - top)
    return ordered_sum(values, base, count, total)
