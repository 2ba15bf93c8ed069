"""Causal attention over the KV cache, grouped-query heads, for the low-memory path.

The cache holds keys transposed, [kv_heads, dim, capacity] (values [kv_heads, capacity, dim]).
For one kv head, the queries of its heads for every new token are rows r = t * group + j of
a matrix A (scaled by `scale`); scores = A @ K^T and context = softmax(scores) @ V are both
products of the GEMM core (`gemm.py`) reading the cache contiguously, for one token as for
a prefill. Row r (token t) sees cache positions < past + t + 1. `sinks` (one logit per head, or
empty) join each row's softmax denominator, as MNN's Attention fifth input, and are then dropped.
One token over a long cache (`decode_attend_deep`, from SPLIT_FROM cached tokens) instead splits
the keys across the threads (`decode_attention.py`): one thread would read the whole cache alone;
a cache too small for that takes kernels without the split (`splits_keys`).
"""
from __future__ import annotations

import numpy as np
from numba import prange

from . import jit
from .calls import address_for, function_for
from .decode_attention import (attend_split, attend_split_heads, group_rows, heads_of, kv_heads_of,
                               parts_write_own_rows, splits_for)
from .exp import exp32
from .gemm import GEMM_ROWS, OVERWRITE, gemm_columns
from .row_reduce import exp_sum, row_max

PANEL = 16  # columns per GEMM block; the cache capacity is a multiple of it
ROWS_PER_TASK = 8 * GEMM_ROWS  # rows of one task of a prefill
# cached tokens from which a decode step splits its keys over the threads (`decode_attend`):
# below, a parallel launch costs about what the split saves (on a loaded 2-core machine the
# split lost at 1024 tokens: 20.6 against 30.4 tok/s, and drew even at 4096)
SPLIT_FROM = 2048


@jit()
def _softmax(scores, at, visible, width, has_sink, sink):
    """scores[at:at+visible] becomes its softmax (with the sink logit in the denominator when
    `has_sink`); scores[at+visible:at+width] becomes 0.

    The loops index from an unsigned base: a signed index takes numba's negative-index
    wraparound, whose select an element kept LLVM from vectorizing them (the exp loop ran
    scalar: 5.3 -> 1.35 ns an element of a 512-wide row, a 512-token attention layer of 9/3
    heads of 64 8.6 -> 4.8 ms on Zen 4); the row max and the sum run eight chains each
    (`row_max`, `exp_sum`: -> 3.9 ms)."""
    base = np.uint64(at)
    best = row_max(scores, base, visible)
    total = np.float32(0.0)
    if has_sink:
        best = max(best, sink)
        total = exp32(sink - best)
    total = exp_sum(scores, base, visible, best, total)
    inverse = np.float32(1.0) / total
    for i in range(visible):
        scores[base + np.uint64(i)] *= inverse
    for i in range(visible, width):
        scores[base + np.uint64(i)] = 0.0


@jit()
def _scratch(q, keys_t, past, rows):
    """The scratch of `_attend_rows` for blocks of up to `rows` rows: queries and context [rows *
    dim] each and scores [rows * width], one array (allocated once a call, not once a kv head)."""
    tokens, heads, dim = q.shape
    capacity = keys_t.shape[2]
    width = min(capacity, -(-(past + tokens) // PANEL) * PANEL)
    return np.empty(rows * (2 * dim + width), np.float32)


@jit()
def _attend_rows(q, flat_k, flat_v, capacity, past, scale, sinks, out, kv, kv_heads, r0, r1, scratch):
    """Rows r0..r1 of kv head `kv`'s query matrix (flat_k, flat_v: the cache's keys [kv_heads,
    dim, capacity] and values [kv_heads, capacity, dim], flattened; scratch from `_scratch`).
    Indexes q and out rather than taking a view a row: each array made or passed costs numba's
    reference counting (atomic adds, a quarter of a hot one-token attention's time in perf)."""
    tokens, heads, dim = q.shape
    group = heads // kv_heads
    count = r1 - r0
    has_sinks = sinks.shape[0] > 0
    width = -(-(past + (r1 - 1) // group + 1) // PANEL) * PANEL
    queries, context, scores = 0, count * dim, 2 * count * dim  # where each lies in the scratch
    for i in range(count):
        t, j = divmod(r0 + i, group)
        h = kv * group + j
        for d in range(dim):
            scratch[queries + i * dim + d] = q[t, h, d] * scale
    for m0 in range(0, count, GEMM_ROWS):
        rows = min(GEMM_ROWS, count - m0)
        visible = past + (r0 + m0 + rows - 1) // group + 1  # the block's last row sees the most
        columns = -(-visible // PANEL) * PANEL
        gemm_columns(rows, scratch, queries + m0 * dim, dim, flat_k, kv * dim * capacity, capacity, dim, scratch,
                     scores + m0 * width, width, columns, OVERWRITE)
        for i in range(m0, m0 + rows):
            t, j = divmod(r0 + i, group)
            sink = sinks[kv * group + j] if has_sinks else np.float32(0.0)
            _softmax(scratch, scores + i * width, past + t + 1, columns, has_sinks, sink)
        gemm_columns(rows, scratch, scores + m0 * width, width, flat_v, kv * capacity * dim, dim, visible, scratch,
                     context + m0 * dim, dim, dim, OVERWRITE)
    for i in range(count):
        t, j = divmod(r0 + i, group)
        h = kv * group + j
        for d in range(dim):
            out[t, h, d] = scratch[context + i * dim + d]


@jit()
def attend_tasks(q, keys_t, values, past, scale, sinks, out, first, step):
    """Tasks first, first + step, ... of `attend` (task k: block k % blocks of ROWS_PER_TASK rows
    of kv head k // blocks), on the calling thread: one thread's share in `attend_parallel`."""
    tokens, heads, _ = q.shape
    kv_heads, _, capacity = keys_t.shape
    rows = tokens * (heads // kv_heads)
    blocks = -(-rows // ROWS_PER_TASK)
    flat_k, flat_v = keys_t.reshape(-1), values.reshape(-1)
    scratch = _scratch(q, keys_t, past, min(rows, ROWS_PER_TASK))
    for task in range(first, kv_heads * blocks, step):
        kv, block = divmod(task, blocks)
        _attend_rows(q, flat_k, flat_v, capacity, past, scale, sinks, out, kv, kv_heads, block * ROWS_PER_TASK,
                     min(rows, (block + 1) * ROWS_PER_TASK), scratch)


@jit()
def attend(q, keys_t, values, past, scale, sinks, out):
    """q, out [tokens, heads, dim] with dim a multiple of 16, on the calling thread, in tasks of
    ROWS_PER_TASK rows of one kv head (the scores of a block, not of the whole prompt); sinks
    float32 [heads], or empty for none."""
    attend_tasks(q, keys_t, values, past, scale, sinks, out, np.int64(0), np.int64(1))


@jit(parallel=True)
def _attend_shares(share, q, keys_t, values, past, scale, sinks, out, shares):
    """`attend_tasks` at address `share` (`calls.address_for`) for each of `shares` threads at
    once, share k taking tasks k, k + shares, ...: so each gets early and late rows of a causal
    prompt (the later see more keys) and the shares cost about the same. Called by address,
    `attend_tasks` is not compiled again into this kernel's gufunc modules."""
    for task in prange(shares):
        args = (q, keys_t, values, past, scale, sinks, out, np.int64(task), shares)
        function_for(share, args)(*args)


def attend_parallel(q, keys_t, values, past, scale, sinks, out, threads: int) -> None:
    """`attend` on `threads` threads (`_attend_shares`): each task is computed by the same code
    on any thread, so the bits are `attend`'s."""
    tokens, heads, _ = q.shape
    kv_heads = keys_t.shape[0]
    tasks = kv_heads * -(-tokens * (heads // kv_heads) // ROWS_PER_TASK)  # `attend_tasks`'s
    shares = np.int64(min(threads, tasks))
    args = (q, keys_t, values, past, scale, sinks, out)
    _attend_shares(address_for(attend_tasks, *args, shares, shares), *args, shares)


@jit()
def append_attend(q, k, v, keys_t, values, past, scale, sinks, out):
    """A replayed step's attention (`attend`, on the calling thread): the step's k and v
    [tokens, kv_heads, dim] written into the cache at row past[0] first (the cache's
    bookkeeping ran before the step and left past[0] there)."""
    start = past[0]
    tokens, kv_heads, dim = k.shape
    for t in range(tokens):
        for h in range(kv_heads):
            for d in range(dim):
                keys_t[h, d, start + t] = k[t, h, d]
                values[h, start + t, d] = v[t, h, d]
    attend(q, keys_t, values, start, scale, sinks, out)


def splits_keys(capacity: int, threads: int) -> bool:
    """Whether a one-token step over a cache of `capacity` rows can reach SPLIT_FROM cached tokens
    with threads, and so takes the kernels that split the keys there (`decode_attend_deep`,
    `append_decode_deep`, `append_decode_deep_part`). Those are compiled apart, the warm-up part
    "deep_decode", loaded when a cache first grows that far: the split's parallel kernel is most
    of a first run's attention compile, and most chats never reach it. Below SPLIT_FROM both
    kinds run `attend`'s code, so the bits do not depend on which one a cache's size chose."""
    return threads > 1 and capacity >= SPLIT_FROM


@jit()
def decode_attend(q, keys_t, values, past, scale, sinks, out, threads):
    """One token (q, out [1, heads, dim]) after `past` cached ones, on the calling thread, by
    `attend`: for a cache that cannot reach SPLIT_FROM tokens with threads (`splits_keys`)."""
    attend(q, keys_t, values, past, scale, sinks, out)


@jit()
def decode_attend_deep(q, keys_t, values, past, scale, sinks, out, threads):
    """`decode_attend` for any cache: from SPLIT_FROM cached tokens on, with threads, split over
    keys across the threads (`attend_split`, flash-decoding); below, `attend`."""
    length = past + 1
    if threads > 1 and length >= SPLIT_FROM:
        attend_split(q[0], keys_t, values, length, scale, sinks, out[0], splits_for(length, threads))
    else:
        attend(q, keys_t, values, past, scale, sinks, out)


@jit()
def _append_row(k, v, keys_t, values, at, h0, h1):
    """One token's k and v [1, kv_heads, dim] as cache row `at`, kv heads h0..h1."""
    dim = k.shape[2]
    for h in range(h0, h1):
        for d in range(dim):
            keys_t[h, d, at] = k[0, h, d]
            values[h, at, d] = v[0, h, d]


@jit()
def append_decode(q, k, v, keys_t, values, past, scale, sinks, out, threads):
    """`append_attend` for one token with `decode_attend` (a cache below SPLIT_FROM rows, or one thread)."""
    start = past[0]
    _append_row(k, v, keys_t, values, start, 0, k.shape[1])
    decode_attend(q, keys_t, values, start, scale, sinks, out, threads)


@jit()
def append_decode_deep(q, k, v, keys_t, values, past, scale, sinks, out, threads):
    """`append_attend` for one token with `decode_attend_deep` (any cache)."""
    start = past[0]
    _append_row(k, v, keys_t, values, start, 0, k.shape[1])
    decode_attend_deep(q, keys_t, values, start, scale, sinks, out, threads)


@jit()
def _part_rows(k, v, keys_t, values, start, heads, part, parts):
    """Part `part` of `parts` of a one-token step's cache append, and its query heads (h0, h1):
    part -1 writes every kv head's new row (and has no heads); a part writes those of the kv heads
    it reads where the parts write their own rows (`parts_write_own_rows`), else part -1 did."""
    kv_heads = k.shape[1]
    if part < 0:
        _append_row(k, v, keys_t, values, start, 0, kv_heads)
        return 0, 0
    h0, h1 = heads_of(part, parts, heads)
    if parts_write_own_rows(heads, kv_heads, parts):
        kv0, kv1 = kv_heads_of(h0, h1, heads // kv_heads)
        _append_row(k, v, keys_t, values, start, kv0, kv1)
    return h0, h1


@jit()
def _attend_heads(q, keys_t, values, start, scale, sinks, out, h0, h1):
    """The code `attend` runs for one token's query heads h0..h1: `_attend_rows` over those heads'
    rows of each kv head's group (the GEMM core's rows are independent)."""
    heads, kv_heads = q.shape[1], keys_t.shape[0]
    group = heads // kv_heads
    capacity = keys_t.shape[2]
    flat_k, flat_v = keys_t.reshape(-1), values.reshape(-1)
    scratch = _scratch(q, keys_t, start, min(group, ROWS_PER_TASK))
    for kv in range(kv_heads):
        j0, j1 = group_rows(kv, group, h0, h1)
        for r0 in range(0, group, ROWS_PER_TASK):  # `attend`'s blocks of rows, cut to these heads
            r1 = min(group, r0 + ROWS_PER_TASK)
            if max(r0, j0) < min(r1, j1):
                _attend_rows(q, flat_k, flat_v, capacity, start, scale, sinks, out, kv, kv_heads, max(r0, j0),
                             min(r1, j1), scratch)


@jit()
def append_decode_part(q, k, v, keys_t, values, past, scale, sinks, out, threads, part, parts):
    """Part `part` of `parts` of `append_decode` (a thread team's rank): its query heads by the
    code `attend` runs for them, after the new rows (`_part_rows`)."""
    start = past[0]
    h0, h1 = _part_rows(k, v, keys_t, values, start, q.shape[1], part, parts)
    if h0 < h1:
        _attend_heads(q, keys_t, values, start, scale, sinks, out, h0, h1)


@jit()
def append_decode_deep_part(q, k, v, keys_t, values, past, scale, sinks, out, threads, part, parts):
    """Part `part` of `parts` of `append_decode_deep`: its query heads by the code
    `decode_attend_deep` runs for them, `attend_split_heads` where it splits the keys (the same
    spans), else `attend`'s, after the new rows (`_part_rows`)."""
    start = past[0]
    h0, h1 = _part_rows(k, v, keys_t, values, start, q.shape[1], part, parts)
    if h0 >= h1:
        return
    length = start + 1
    if threads > 1 and length >= SPLIT_FROM:
        attend_split_heads(q[0], keys_t, values, length, scale, sinks, out[0], splits_for(length, threads), h0, h1)
    else:
        _attend_heads(q, keys_t, values, start, scale, sinks, out, h0, h1)
