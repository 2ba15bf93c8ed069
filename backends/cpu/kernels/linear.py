"""Linear layers on packed weights: a GEMV kernel for one token, dequantized panels + GEMM for more.

`gemv` reads every packed byte once (the decode roofline); `matmul` turns one group of rows
into an fp32 panel in a reused scratch buffer (the same values as `QuantizedWeight.dequantize`)
and multiplies it with the register-blocked core of `gemm.py`, so a prefill never holds a whole
fp32 copy of a weight.
"""
from __future__ import annotations

import os

import numpy as np
from numba import prange

from . import jit
from .calls import address_for, function_for
from .layout import PackedWeight
from .gemm import GEMM_ROWS, gemm_block, gemm_columns
from .simd import (FEW_TOKENS_MAX, GROUP_ROWS, PAIRED_GROUPS, q4_few_dot, q4_group_dequantize, q4_group_dot,
                   q4_group_pair_dot, q8_few_dot,
                   q8_group_dequantize, q8_group_dot)

FEW_TOKENS = FEW_TOKENS_MAX  # 2 up to this many rows run the few-token GEMV (each weight byte read once)
# Below these sizes a linear runs on the calling thread: waking the pool costs more than it saves.
# One token's GEMV is bound by memory (2 MiB read in ~160 us at ~13 GB/s, several pool wake-ups):
# at 512 KiB the shared model decoded at 137 tok/s with 2 threads, at 2 MiB at 158 (1 thread: 146).
# A few-token or prefill product does work per byte for every row, so it splits from less.
PARALLEL_BYTES = int(os.environ.get("MNNLLM_PARALLEL_BYTES", 2 << 20))
FEW_PARALLEL_BYTES = 1 << 19


def parallel_pays(nbytes: int, tokens: int) -> bool:
    """Whether a linear over `nbytes` of weights for `tokens` rows is worth splitting over threads."""
    return nbytes > PARALLEL_BYTES if tokens == 1 else nbytes * tokens > FEW_PARALLEL_BYTES
DEPTH = 256  # inner-dimension block of the GEMM: a panel block of 32 KiB stays in L1/L2
# From this many inputs a group's product walks its rows in the outer loop (each block of 6 rows
# through every depth block, its rows of x read end to end) rather than its depth blocks (each
# 32 KiB panel block kept in L1 for all rows): one thread, 512 tokens, medians of 9 alternating
# (a Xeon, 16 lanes): 2048 -> 2048 110 -> 116 GFLOP/s, 2048 -> 8192 101 -> 112, 8192 -> 2048
# 98 -> 114, but 576 -> 1536 121 -> 104. Each element's partial sums are added in the same order.
ROWS_FIRST_FROM = 1024


@jit(fastmath=False)
def _block_sums(x, n_blocks, block):
    """Each block's sum, added in order. Not under fastmath: the GEMV kernels (`_gemv`,
    `_gemv_parallel`, the team's `_gemv_part`) each hold a copy of this function, and which copy
    a call binds to depends on what the process loaded first (a kernel compiled in the process
    loads this one's own library, whose symbol then serves every kernel loaded after it); with
    reassociation the copies vectorized the sum differently, so the team's logits differed from
    the loop's after another GEMV signature was compiled. In order, every copy gives one sum."""
    sums = np.empty(n_blocks, np.float32)
    for b in range(n_blocks):
        total = np.float32(0.0)
        for j in range(b * block, (b + 1) * block):
            total += x[j]
        sums[b] = total
    return sums


@jit(fastmath=False)
def byte_weights(x_even, x_odd):
    """What the int4 GEMVs multiply a code byte and its low nibble by: for a byte u = 16 h + l
    (h weighs x_even, l x_odd), h x_even + l x_odd = u (x_even / 16) + l (x_odd - x_even / 16),
    so the kernels convert the byte itself and its low nibble, with no shift (6 vector operations
    per 8 bytes instead of 7: they are bound by those, `simd.q4_group_dot`). x_even / 16 is exact
    and the FMA of u by it carries h x_even whole; the one rounding more, of x_odd - x_even / 16,
    is of the order of the FMA's own. Not under fastmath, in order: every kernel's copy gives the
    same two numbers (the few-token rows equal the one-token GEMV bit for bit)."""
    part = x_even / np.float32(16.0)
    return part, x_odd - part


@jit(fastmath=False)
def _lanes(x):
    """x's element pairs (2j, 2j+1) as the int4 GEMV weighs a code byte and its low nibble
    (`byte_weights`)."""
    half = x.shape[0] // 2
    even = np.empty(half, np.float32)
    odd = np.empty(half, np.float32)
    for j in range(half):
        even[j], odd[j] = byte_weights(x[2 * j], x[2 * j + 1])
    return even, odd


MEMBERS = 3  # weights one GEMV call computes together (q, k, v); unused places hold empty arrays


@jit()
def _q4_rows(codes, alpha, x_even, x_odd, x_sum, out, n_blocks, block, g0, g1):
    group_bytes = x_even.shape[0] * GROUP_ROWS
    g = g0
    if PAIRED_GROUPS:
        while g + 1 < g1:
            q4_group_pair_dot(codes, g * group_bytes, alpha, g * n_blocks * 2 * GROUP_ROWS, x_even, x_odd, x_sum,
                              n_blocks, block // 2, out, g * GROUP_ROWS)
            g += 2
    for g in range(g, g1):
        q4_group_dot(codes, g * group_bytes, alpha, g * n_blocks * 2 * GROUP_ROWS, x_even, x_odd, x_sum,
                     n_blocks, block // 2, out, g * GROUP_ROWS)


@jit()
def _q8_rows(codes, alpha, x, x_sum, out, n_blocks, block, g0, g1):
    group_bytes = x.shape[0] * GROUP_ROWS
    for g in range(g0, g1):
        q8_group_dot(codes, g * group_bytes, alpha, g * n_blocks * 2 * GROUP_ROWS, x, x_sum, n_blocks, block,
                     out, g * GROUP_ROWS)


@jit()
def _rows(bits, codes, alphas, outs, starts, x, x_even, x_odd, x_sum, n_blocks, block, first, last):
    """Groups first..last of the members laid end to end (member m holds groups starts[m]..starts[m+1])."""
    for m in range(MEMBERS):
        g0 = max(first, starts[m]) - starts[m]
        g1 = min(last, starts[m + 1]) - starts[m]
        if g0 < g1:
            if bits == 4:
                _q4_rows(codes[m], alphas[m], x_even, x_odd, x_sum, outs[m], n_blocks, block, g0, g1)
            else:
                _q8_rows(codes[m], alphas[m], x, x_sum, outs[m], n_blocks, block, g0, g1)


@jit()
def _gemv(bits, codes, alphas, outs, starts, x, n_blocks, block):
    x_even, x_odd = _lanes(x)
    # np.int64(0), not 0: a literal would compile `_rows` a second time, beside the parallel kernel's
    _rows(bits, codes, alphas, outs, starts, x, x_even, x_odd, _block_sums(x, n_blocks, block), n_blocks, block,
          np.int64(0), starts[MEMBERS])


@jit(parallel=True)
def _gemv_parallel(bits, codes, alphas, outs, starts, x, n_blocks, block, parts):
    x_even, x_odd = _lanes(x)
    x_sum = _block_sums(x, n_blocks, block)
    total = starts[MEMBERS]
    per_part = (total + parts - 1) // parts
    for task in prange(parts):
        part = np.int64(task)  # prange counts unsigned; int64 keeps the arithmetic integral
        _rows(bits, codes, alphas, outs, starts, x, x_even, x_odd, x_sum, n_blocks, block, part * per_part,
              min(total, (part + 1) * per_part))


@jit()
def _gemv_part(bits, codes, alphas, outs, starts, x, n_blocks, block, part, parts):
    """Part `part` of `parts` of `_gemv_parallel`'s row ranges, on the calling thread (a rank of
    the replay's thread team, `team.py`): the same rows, computed by the same `_rows`."""
    x_even, x_odd = _lanes(x)
    total = starts[MEMBERS]
    per_part = (total + parts - 1) // parts
    _rows(bits, codes, alphas, outs, starts, x, x_even, x_odd, _block_sums(x, n_blocks, block), n_blocks, block,
          min(total, part * per_part), min(total, (part + 1) * per_part))


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


@jit()
def _matmul_group(bits, codes, alpha, n_blocks, block, g, x, out, column, width, panel, spill):
    """out[:, column:column + width] = x @ W[rows of group g].T, via the dequantized panel [ic, 32]."""
    tokens, ic = x.shape
    ldc = out.shape[1]
    _dequantize(bits, codes, alpha, n_blocks, block, g, g + 1, panel, g, GROUP_ROWS)
    flat_x = x.reshape(-1)
    flat_out = out.reshape(-1)
    # strides as int64, not literals: a literal argument compiles the GEMM once more beside the
    # attention's call (numba specializes a kernel per literal value)
    panel_stride, spill_stride = np.int64(GROUP_ROWS), np.int64(16)
    if width == GROUP_ROWS:  # a whole group: its 32 columns at once (`gemm_columns`)
        if ic >= ROWS_FIRST_FROM:  # each block of rows through all depth blocks: the same sums, in the same order
            for m0 in range(0, tokens, GEMM_ROWS):
                for k0 in range(0, ic, DEPTH):
                    gemm_columns(min(GEMM_ROWS, tokens - m0), flat_x, m0 * ic + k0, ic, panel, k0 * GROUP_ROWS,
                                 panel_stride, min(DEPTH, ic - k0), flat_out, m0 * ldc + column, ldc, panel_stride,
                                 k0 > 0)
            return
        for k0 in range(0, ic, DEPTH):
            depth = min(DEPTH, ic - k0)
            for m0 in range(0, tokens, GEMM_ROWS):
                gemm_columns(min(GEMM_ROWS, tokens - m0), flat_x, m0 * ic + k0, ic, panel, k0 * GROUP_ROWS,
                             panel_stride, depth, flat_out, m0 * ldc + column, ldc, panel_stride, k0 > 0)
        return
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
                    gemm_block(rows, flat_x, m0 * ic + k0, ic, panel, b_start, panel_stride, depth, flat_out,
                               m0 * ldc + left, ldc, k0 > 0)
                else:
                    gemm_block(rows, flat_x, m0 * ic + k0, ic, panel, b_start, panel_stride, depth, spill, m0 * 16,
                               spill_stride, k0 > 0)
        if not whole:
            valid = column + width - left
            for t in range(tokens):
                for n in range(valid):
                    out[t, left + n] = spill[t * 16 + n]


@jit()
def _matmul(bits, codes, alpha, n_blocks, block, x, out, g0, g1):
    """Groups g0..g1 of out's columns (32 each, the last possibly partial): `matmul`'s spans."""
    tokens, ic = x.shape
    panel = np.empty(ic * GROUP_ROWS, np.float32)
    spill = np.empty(tokens * 16, np.float32)
    rows = out.shape[1]
    for g in range(g0, g1):
        _matmul_group(bits, codes, alpha, n_blocks, block, g, x, out, g * GROUP_ROWS,
                      min(GROUP_ROWS, rows - g * GROUP_ROWS), panel, spill)


@jit(parallel=True)
def _matmul_parallel(span, bits, codes, alpha, n_blocks, block, x, out, parts):
    """`_matmul` at address `span` (`calls.address_for`) on `parts` equal spans of the groups at
    once (the groups cost the same). Called by address, `_matmul` is not compiled again into this
    kernel's gufunc modules; each group's columns come from its code on any thread, so the bits
    are the serial call's."""
    groups = -(-out.shape[1] // GROUP_ROWS)
    for task in prange(parts):
        part = np.int64(task)  # prange counts unsigned; int64 keeps the arithmetic integral
        args = (bits, codes, alpha, n_blocks, block, x, out, groups * part // parts, groups * (part + 1) // parts)
        function_for(span, args)(*args)


@jit(fastmath=False)
def _dequantize_all(bits, codes, alpha, n_blocks, block, groups, tile):
    _dequantize(bits, codes, alpha, n_blocks, block, 0, groups, tile, 0, groups * GROUP_ROWS)


@jit(fastmath=False)  # block sums added in order, whichever copy runs: see `_block_sums`
def _few_inputs(bits, x, n_blocks, block):
    """x [tokens, ic] as the few-token kernels read it: (even, odd: each row's element pairs as
    `_lanes` gives them; their row stride; block sums [tokens * n_blocks]); int8 reads x whole as
    the even part. Plain loops:
    a slice assignment would compile numba's shape-mismatch error formatting (seconds)."""
    tokens, ic = x.shape
    sums = np.empty(tokens * n_blocks, np.float32)
    for t in range(tokens):
        for b in range(n_blocks):
            total = np.float32(0.0)
            for j in range(b * block, (b + 1) * block):
                total += x[t, j]
            sums[t * n_blocks + b] = total
    if bits != 4:
        return np.ascontiguousarray(x).reshape(-1), np.empty(0, np.float32), ic, sums
    half = ic // 2
    even = np.empty(tokens * half, np.float32)
    odd = np.empty(tokens * half, np.float32)
    for t in range(tokens):
        for j in range(half):
            even[t * half + j], odd[t * half + j] = byte_weights(x[t, 2 * j], x[t, 2 * j + 1])
    return even, odd, half, sums


@jit()
def _few_rows(bits, tokens, codes, alphas, outs, starts, x_even, x_odd, x_stride, x_sum, n_blocks, block, first,
              last):
    """`_rows` for a few token rows: member m's results are [tokens][its groups * 32] flat."""
    block_bytes = block // 2 if bits == 4 else block
    group_bytes = n_blocks * block_bytes * GROUP_ROWS
    for m in range(MEMBERS):
        g0 = max(first, starts[m]) - starts[m]
        g1 = min(last, starts[m + 1]) - starts[m]
        stride = (starts[m + 1] - starts[m]) * GROUP_ROWS
        for g in range(g0, g1):
            if bits == 4:
                q4_few_dot(tokens, codes[m], g * group_bytes, alphas[m], g * n_blocks * 2 * GROUP_ROWS, x_even,
                           x_odd, x_stride, x_sum, n_blocks, block_bytes, outs[m], g * GROUP_ROWS, stride)
            else:
                q8_few_dot(tokens, codes[m], g * group_bytes, alphas[m], g * n_blocks * 2 * GROUP_ROWS, x_even,
                           x_odd, x_stride, x_sum, n_blocks, block_bytes, outs[m], g * GROUP_ROWS, stride)


@jit()
def _few_gemv(bits, codes, alphas, outs, starts, x, n_blocks, block):
    x_even, x_odd, x_stride, x_sum = _few_inputs(bits, x, n_blocks, block)
    _few_rows(bits, x.shape[0], codes, alphas, outs, starts, x_even, x_odd, x_stride, x_sum, n_blocks, block,
              np.int64(0), starts[MEMBERS])  # not a literal 0: see `_gemv`


@jit(parallel=True)
def _few_gemv_parallel(bits, codes, alphas, outs, starts, x, n_blocks, block, parts):
    x_even, x_odd, x_stride, x_sum = _few_inputs(bits, x, n_blocks, block)
    total = starts[MEMBERS]
    per_part = (total + parts - 1) // parts
    for task in prange(parts):
        part = np.int64(task)
        _few_rows(bits, x.shape[0], codes, alphas, outs, starts, x_even, x_odd, x_stride, x_sum, n_blocks, block,
                  part * per_part, min(total, (part + 1) * per_part))


@jit()
def _few_gemv_part(bits, codes, alphas, outs, starts, x, n_blocks, block, part, parts):
    """`_gemv_part` for the few-token GEMV."""
    x_even, x_odd, x_stride, x_sum = _few_inputs(bits, x, n_blocks, block)
    total = starts[MEMBERS]
    per_part = (total + parts - 1) // parts
    _few_rows(bits, x.shape[0], codes, alphas, outs, starts, x_even, x_odd, x_stride, x_sum, n_blocks, block,
              min(total, part * per_part), min(total, (part + 1) * per_part))


class Gemv:
    """One GEMV call over up to MEMBERS same-format weights that read the same x: result m =
    weights[m] @ x (float32, weights[m].groups * 32 values, padding rows included)."""

    def __init__(self, weights: list[PackedWeight]):
        if not 1 <= len(weights) <= MEMBERS or any(not w.same_format(weights[0]) for w in weights):
            raise ValueError(f"a GEMV takes 1 to {MEMBERS} weights of one format")
        first = self.first = weights[0]
        self.results = [np.zeros(w.groups * GROUP_ROWS, np.float32) for w in weights]
        pad = MEMBERS - len(weights)
        self.codes = tuple(w.codes for w in weights) + (first.codes[:0],) * pad
        self.alphas = tuple(w.alpha for w in weights) + (first.alpha[:0],) * pad
        self.targets = tuple(self.results) + (self.results[0][:0],) * pad
        self.starts = np.zeros(MEMBERS + 1, np.int64)
        self.starts[1:len(weights) + 1] = np.cumsum([w.groups for w in weights])
        self.starts[len(weights) + 1:] = self.starts[len(weights)]
        self.nbytes = sum(w.nbytes for w in weights)
        self.parallel_worth = parallel_pays(self.nbytes, 1)
        self.few_flat: list[np.ndarray] = []  # per member [capacity rows][padded rows] flat, grown on demand
        self.few_capacity = 0

    def __call__(self, x: np.ndarray, threads: int) -> list[np.ndarray]:
        first = self.first
        if threads > 1 and self.parallel_worth:
            _gemv_parallel(first.bits, self.codes, self.alphas, self.targets, self.starts, x, first.n_blocks,
                           first.block, threads)
        else:
            _gemv(first.bits, self.codes, self.alphas, self.targets, self.starts, x, first.n_blocks, first.block)
        return self.results

    def few_parallel_worth(self, tokens: int) -> bool:
        """Whether a few-token GEMV of `tokens` rows pays for waking the pool: its work grows with
        the rows (it is compute-bound), so smaller weights than a one-token GEMV's are worth it."""
        return self.parallel_worth or parallel_pays(self.nbytes, tokens)

    def few(self, x: np.ndarray, threads: int) -> list[np.ndarray]:
        """Result m = x @ weights[m].T, [tokens, weights[m].groups * 32], for x [tokens, ic] of
        2..FEW_TOKENS rows (float32, C-contiguous): each packed byte read once for all rows."""
        tokens = x.shape[0]
        targets = self.few_targets(tokens)
        first = self.first
        if threads > 1 and self.few_parallel_worth(tokens):
            _few_gemv_parallel(first.bits, self.codes, self.alphas, targets, self.starts, x, first.n_blocks,
                               first.block, threads)
        else:
            _few_gemv(first.bits, self.codes, self.alphas, targets, self.starts, x, first.n_blocks, first.block)
        return [t.reshape(tokens, -1) for t in targets[:len(self.results)]]

    def few_targets(self, tokens: int) -> tuple[np.ndarray, ...]:
        """The few-token kernels' MEMBERS result buffers for `tokens` rows (member m's
        [tokens][padded rows] flat; empty past the members), grown when more rows come."""
        if not 2 <= tokens <= FEW_TOKENS_MAX:
            raise ValueError(f"the few-token GEMV takes 2 to {FEW_TOKENS_MAX} rows, not {tokens}")
        if tokens > self.few_capacity:
            self.few_flat = [np.zeros(tokens * r.shape[0], np.float32) for r in self.results]
            self.few_capacity = tokens
        flat = [f[:tokens * r.shape[0]] for f, r in zip(self.few_flat, self.results)]
        return tuple(flat) + (flat[0][:0],) * (MEMBERS - len(flat))


def matmul(packed: PackedWeight, x: np.ndarray, out: np.ndarray, threads: int) -> None:
    """out[tokens, oc] = x[tokens, ic] @ W.T (float32, C-contiguous): each group of rows is
    dequantized into a panel that the register-blocked GEMM reuses for every token; with threads,
    one span of the groups a thread (`_matmul_parallel`)."""
    args = (packed.bits, packed.codes, packed.alpha, packed.n_blocks, packed.block, x, out)
    groups = -(-out.shape[1] // GROUP_ROWS)
    if threads > 1 and groups > 1:
        _matmul_parallel(address_for(_matmul, *args, np.int64(0), np.int64(0)), *args, min(threads, groups))
    else:
        _matmul(*args, np.int64(0), np.int64(groups))


def dequantize(packed: PackedWeight) -> np.ndarray:
    """float32 [oc, ic] as the GEMM's panels hold it (for tests against the reference)."""
    tile = np.empty(packed.ic * packed.groups * GROUP_ROWS, np.float32)
    _dequantize_all(packed.bits, packed.codes, packed.alpha, packed.n_blocks, packed.block, packed.groups, tile)
    return tile.reshape(packed.ic, -1)[:, :packed.oc].T.copy()
