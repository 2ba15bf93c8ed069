"""Decode attention, one token over a long cache: one pass over the keys, split over keys across
the threads and merged (flash-decoding). Two layouts: a StoredKVCache's rows read as stored
(`attend_stored`, `kv_storage.py`) and the low-memory fp32 cache, keys transposed (`attend_split`).

Stored keys and values are token-major [kv_heads, capacity, dim], float32 or int8 codes; int8
rows carry a scale and zero each (x = code * scale + zero), so a score is scale * (q . code) +
zero * sum(q) and a value sum is sum(w * scale * code) + sum(w * zero): the codes are never
widened to a copy. Each task (a kv head and a span of keys) keeps, per query head of its group,
its running max, its sum of weights and its weighted values; the spans merge by rescaling to the
common max. `sinks` (one logit per head, or empty) join each head's denominator, as MNN's fifth
input. One span (a short cache) runs on the calling thread: a parallel launch would cost more
than the keys.

`append_attend_stored` is a replayed decode step's whole attention over a StoredKVCache: the
new k and v rows quantized into the cache as `RowStore.write` does (bit for bit: no fastmath),
then `attend_stored`. A thread team splits one token's attention by query heads
(`append_attend_stored_part`, `attend_stored_heads`, `attend_split_heads`): each rank computes
all the spans of its heads, the spans and the arithmetic of each head being the serial kernel's,
after the new rows of the kv heads they read (stored by the rank itself where no kv head's group
straddles two ranks, `parts_write_own_rows`, else by one rank before the others start).
"""
from __future__ import annotations

import numpy as np
from numba import prange

from . import jit
from .exp import exp32
from .gemm import GEMM_ROWS, OVERWRITE, gemm_columns
from .row_reduce import exp_sum, row_max

PANEL = 16  # keys of one GEMM block: the fp32 cache's capacity, and a span's start, in whole panels
SPAN = 256  # keys of one task at least: fewer would spend more on merging than on the keys
# a 0 argument that is not a literal: numba compiles a kernel once more for each literal value
# it is called with (`_stored_span`'s j0 = 0 beside the thread team's j0)
NO_LITERAL = np.int64(0)


@jit()
def splits_for(length, threads):
    """Spans of at least SPAN keys, two per thread at most (a thread done early takes another)."""
    return max(1, min(2 * threads, -(-length // SPAN)))


@jit()
def _partials(splits, heads, dim):
    """Per span and head: running max, sum of weights, weighted values."""
    return (np.full((splits, heads), -np.inf, np.float32), np.zeros((splits, heads), np.float32),
            np.zeros((splits, heads, dim), np.float32))


@jit()
def _task_keys(task, kv_heads, span, length):
    """A parallel task's span and kv head, and the keys p0..p1 it reads (none when p0 >= p1)."""
    part, kv = divmod(np.int64(task), kv_heads)  # prange counts unsigned; int64 keeps the arithmetic integral
    p0 = part * span
    return part, kv, p0, min(length, p0 + span)


@jit()
def _merge(best, total, acc, sinks, out):
    """Each head's spans rescaled to their common max (and the sink's) into out[head]."""
    for h in range(out.shape[0]):
        _merge_head(best, total, acc, sinks, out, h)


@jit()
def _merge_head(best, total, acc, sinks, out, h):
    splits, _, dim = acc.shape
    has_sinks = sinks.shape[0] > 0
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


# -- stored rows: [kv_heads, capacity, dim], float32 or int8 codes -----------------------------
@jit()
def _stored_span(q, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero, kv, j0, j1, p0, p1, scale, best, total, acc,
                 part):
    """Keys p0..p1 for query heads j0..j1 of kv head `kv`'s group (each head's arithmetic its own)."""
    heads, dim = q.shape
    group = heads // k_codes.shape[0]
    keys_quantized = k_scale.shape[0] > 0
    values_quantized = v_scale.shape[0] > 0
    scores = np.empty(p1 - p0, np.float32)
    for j in range(j0, j1):
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


@jit(parallel=True)
def _stored_parallel(q, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero, length, scale, sinks, out, splits):
    heads, dim = q.shape
    kv_heads = k_codes.shape[0]
    span = -(-length // splits)
    best, total, acc = _partials(splits, heads, dim)
    for task in prange(splits * kv_heads):
        part, kv, p0, p1 = _task_keys(np.int64(task), kv_heads, span, length)
        if p0 < p1:
            _stored_span(q, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero, kv, NO_LITERAL, heads // kv_heads, p0,
                         p1, scale, best, total, acc, part)
    _merge(best, total, acc, sinks, out)  # on this thread: a second parallel launch would cost more


@jit()
def attend_stored(q, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero, length, scale, sinks, out, splits):
    """q, out [heads, dim] (one token after `length` cached ones, itself included); k_scale,
    k_zero (v_scale, v_zero) [kv_heads, capacity] for int8 codes, empty for float32 ones."""
    if splits > 1:
        _stored_parallel(q, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero, length, scale, sinks, out, splits)
        return
    heads, dim = q.shape
    best, total, acc = _partials(np.int64(1), heads, dim)
    kv_heads = k_codes.shape[0]
    for kv in range(kv_heads):
        _stored_span(q, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero, kv, NO_LITERAL, heads // kv_heads,
                     NO_LITERAL, length, scale, best, total, acc, NO_LITERAL)
    _merge(best, total, acc, sinks, out)


@jit()
def heads_of(part, parts, heads):
    """The query heads h0..h1 of part `part` of `parts` (a thread team's rank)."""
    return part * heads // parts, (part + 1) * heads // parts


@jit()
def parts_write_own_rows(heads, kv_heads, parts):
    """Whether each of `parts` parts (`heads_of`) writes the new cache rows of the kv heads it
    reads: where no kv head's group straddles two parts. Where one does (the shared model's 9
    heads over 3 kv heads in two parts), both parts would write its rows at once, each line of
    them bouncing between the two ranks' caches, so part -1 writes every row first, alone."""
    group = heads // kv_heads
    for part in range(1, parts):
        if (part * heads // parts) % group:
            return False
    return True


@jit()
def kv_heads_of(h0, h1, group):
    """The kv heads kv0..kv1 whose groups hold query heads h0..h1 (none when h0 >= h1)."""
    if h0 >= h1:
        return 0, 0
    return h0 // group, (h1 - 1) // group + 1


@jit()
def group_rows(kv, group, h0, h1):
    """The query heads of kv head `kv`'s group among heads h0..h1, as rows j0..j1 of the group."""
    return max(h0 - kv * group, 0), min(h1 - kv * group, group)


@jit()
def attend_stored_heads(q, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero, length, scale, sinks, out, splits,
                        h0, h1):
    """`attend_stored`'s query heads h0..h1 on the calling thread: each head's spans (the same
    `splits` spans as `attend_stored`, by the same code) and merge, so its bits are the serial
    kernel's; a thread team's ranks compute disjoint heads of one token."""
    heads, dim = q.shape
    kv_heads = k_codes.shape[0]
    group = heads // kv_heads
    span = -(-length // splits)
    best, total, acc = _partials(splits, heads, dim)
    for task in range(splits * kv_heads):
        part, kv, p0, p1 = _task_keys(task, kv_heads, span, length)
        j0, j1 = group_rows(kv, group, h0, h1)
        if p0 < p1 and j0 < j1:
            _stored_span(q, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero, kv, j0, j1, p0, p1, scale, best, total,
                         acc, part)
    for h in range(h0, h1):
        _merge_head(best, total, acc, sinks, out, h)


@jit(fastmath=False)
def _store_rows(x, codes, row_scale, row_zero, at, h0, h1):
    """x [kv_heads, dim] float32 as row `at` of codes [kv_heads, capacity, dim], kv heads h0..h1:
    copied into float32 codes, quantized into int8 ones (row_scale, row_zero [kv_heads,
    capacity]) in RowStore.write's float32 operations, in its order."""
    dim = x.shape[1]
    if row_scale.shape[0] == 0:
        for h in range(h0, h1):
            for d in range(dim):
                codes[h, at, d] = x[h, d]
        return
    for h in range(h0, h1):
        low = x[h, 0]
        high = x[h, 0]
        for d in range(1, dim):
            low = min(low, x[h, d])
            high = max(high, x[h, d])
        step = (high - low) / np.float32(255)
        zero = low + np.float32(128) * step
        inverse = np.float32(1) / step if step > 0 else np.float32(0)
        for d in range(dim):
            code = np.rint((x[h, d] - zero) * inverse)
            codes[h, at, d] = min(max(code, np.float32(-128)), np.float32(127))
        row_scale[h, at] = step
        row_zero[h, at] = zero


@jit()
def append_attend_stored(q, k, v, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero, past, scale, sinks, out,
                         threads):
    """A replayed decode step over a StoredKVCache: q, k, v, out [1, heads or kv_heads, dim];
    the new rows stored at row past[0] (the cache's bookkeeping ran before the step and left
    past[0] there), then `attend_stored` over past[0] + 1 rows, split for `threads`."""
    at = past[0]
    kv_heads = k.shape[1]
    _store_rows(k[0], k_codes, k_scale, k_zero, at, NO_LITERAL, kv_heads)
    _store_rows(v[0], v_codes, v_scale, v_zero, at, NO_LITERAL, kv_heads)
    attend_stored(q[0], k_codes, k_scale, k_zero, v_codes, v_scale, v_zero, at + 1, scale, sinks, out[0],
                  splits_for(at + 1, threads))


@jit()
def append_attend_stored_part(q, k, v, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero, past, scale, sinks, out,
                              threads, part, parts):
    """Part `part` of `parts` of `append_attend_stored` (a thread team's rank): its query heads
    (`attend_stored_heads`) with the spans `threads` gives the serial kernel, after the new rows
    of the kv heads they read, stored as the serial kernel stores them: by this part where the
    parts write their own rows (`parts_write_own_rows`: no part then waits on another's, and each
    rank's rows are in its own cache), else by part -1, every row, before any part runs."""
    at = past[0]
    heads, kv_heads = q.shape[1], k.shape[1]
    if part < 0:
        _store_rows(k[0], k_codes, k_scale, k_zero, at, NO_LITERAL, kv_heads)
        _store_rows(v[0], v_codes, v_scale, v_zero, at, NO_LITERAL, kv_heads)
        return
    h0, h1 = heads_of(part, parts, heads)
    if parts_write_own_rows(heads, kv_heads, parts):
        kv0, kv1 = kv_heads_of(h0, h1, heads // kv_heads)
        _store_rows(k[0], k_codes, k_scale, k_zero, at, kv0, kv1)
        _store_rows(v[0], v_codes, v_scale, v_zero, at, kv0, kv1)
    attend_stored_heads(q[0], k_codes, k_scale, k_zero, v_codes, v_scale, v_zero, at + 1, scale, sinks, out[0],
                        splits_for(at + 1, threads), h0, h1)


# -- fp32 rows of the low-memory cache: keys [kv_heads, dim, capacity], values [kv_heads, capacity, dim]
@jit()
def _transposed_span(q, keys_t, values, kv, j0, j1, p0, p1, scale, best, total, acc, part):
    """Keys p0..p1 (p0 a whole panel) for query heads j0..j1 of kv head `kv`'s group: the scores
    and the weighted values as products of the GEMM core (`attention.py`'s way, over one span;
    the core's rows are independent, so a head's bits do not depend on the heads beside it)."""
    heads, dim = q.shape
    kv_heads, _, capacity = keys_t.shape
    group = j1 - j0
    first = kv * (heads // kv_heads) + j0  # the first query head
    count = p1 - p0
    width = -(-count // PANEL) * PANEL  # within the capacity: it is in whole panels too
    flat_k, flat_v = keys_t.reshape(-1), values.reshape(-1)
    queries = np.empty(group * dim, np.float32)
    scores = np.empty(group * width, np.float32)
    context = np.empty(group * dim, np.float32)
    for j in range(group):
        for d in range(dim):
            queries[j * dim + d] = q[first + j, d] * scale
    for m0 in range(0, group, GEMM_ROWS):
        rows = min(GEMM_ROWS, group - m0)
        gemm_columns(rows, queries, m0 * dim, dim, flat_k, kv * dim * capacity + p0, capacity, dim, scores,
                     m0 * width, width, width, OVERWRITE)
    for j in range(group):
        row = scores[j * width:j * width + count]
        top = row_max(row, np.uint64(0), count)
        best[part, first + j] = top
        total[part, first + j] = exp_sum(row, np.uint64(0), count, top, np.float32(0.0))
    for m0 in range(0, group, GEMM_ROWS):
        rows = min(GEMM_ROWS, group - m0)
        gemm_columns(rows, scores, m0 * width, width, flat_v, (kv * capacity + p0) * dim, dim, count, context,
                     m0 * dim, dim, dim, OVERWRITE)
    for j in range(group):
        for d in range(dim):
            acc[part, first + j, d] = context[j * dim + d]


@jit(parallel=True)
def attend_split(q, keys_t, values, length, scale, sinks, out, splits):
    """q, out [heads, dim] (head size a multiple of PANEL): one token over `length` cached rows
    (itself included) of the key-transposed fp32 cache, in `splits` spans of whole panels of keys
    across the threads."""
    heads, dim = q.shape
    kv_heads = keys_t.shape[0]
    span = _panel_span(length, splits)
    best, total, acc = _partials(splits, heads, dim)
    for task in prange(splits * kv_heads):
        part, kv, p0, p1 = _task_keys(np.int64(task), kv_heads, span, length)
        if p0 < p1:
            _transposed_span(q, keys_t, values, kv, NO_LITERAL, heads // kv_heads, p0, p1, scale, best, total, acc,
                             part)
    _merge(best, total, acc, sinks, out)  # on this thread: a second parallel launch would cost more


@jit()
def _panel_span(length, splits):
    """Keys of one span of `attend_split`: a whole number of panels."""
    return -(-(-(-length // splits)) // PANEL) * PANEL


@jit()
def attend_split_heads(q, keys_t, values, length, scale, sinks, out, splits, h0, h1):
    """`attend_split`'s query heads h0..h1 on the calling thread (as `attend_stored_heads`)."""
    heads, dim = q.shape
    kv_heads = keys_t.shape[0]
    group = heads // kv_heads
    span = _panel_span(length, splits)
    best, total, acc = _partials(splits, heads, dim)
    for task in range(splits * kv_heads):
        part, kv, p0, p1 = _task_keys(task, kv_heads, span, length)
        j0, j1 = group_rows(kv, group, h0, h1)
        if p0 < p1 and j0 < j1:
            _transposed_span(q, keys_t, values, kv, j0, j1, p0, p1, scale, best, total, acc, part)
    for h in range(h0, h1):
        _merge_head(best, total, acc, sinks, out, h)
