"""The register-blocked GEMM core (6 rows x 16 columns of C in accumulator registers), an
LLVM-IR intrinsic like `simd.py`, used by the prefill linears and attention.

Written here rather than taken from BLAS so that a low-memory run uses one thread pool
(numba's): OpenBLAS's spinning threads and numba's fight over the cores of a busy machine.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from . import host_has, jit
from .simd import FAST, LANES, array_data, fma, i64, load_vector, splat, store_vector, zero_slots

# The GEMM's vectors have the kernels' LANES: 16 (zmm) where the registers are 512 bits, else 8.
# Each element of C is the same chain of FMAs over k whatever the width (the lanes run over
# columns), so the bits do not depend on it. On a core with two 512-bit FMA units (a Xeon, Emerald
# Rapids) the zmm core does twice the FLOPs a cycle: one thread, 480 x 576 @ 576 x 192, 91 -> 172
# GFLOP/s (the same bits); on Zen 4 a zmm FMA takes the two 256-bit halves' slots.


def _emit_block(builder, rows: int, vectors: int, lanes: int, a_p, b_p, c_p, a_start, lda, b_start, ldb, depth,
                c_start, ldc, add) -> None:
    """The IR of C[rows, lanes * vectors] (+)= A[rows, depth] @ B[depth, lanes * vectors]: the
    accumulators in registers, one chain of FMAs over k an element."""
    vector_type = ir.VectorType(ir.FloatType(), lanes)
    acc = zero_slots(builder, vectors * rows, lanes)
    with cgutils.for_range(builder, depth) as k_loop:
        k = k_loop.index
        b_index = builder.add(b_start, builder.mul(k, ldb))
        bs = [load_vector(builder, b_p, builder.add(b_index, i64(h * lanes)), vector_type, 4)
              for h in range(vectors)]
        for i in range(rows):
            a_index = builder.add(builder.add(a_start, builder.mul(i64(i), lda)), k)
            a_i = splat(builder, builder.load(builder.gep(a_p, [a_index])), lanes)
            for h in range(vectors):
                slot = acc[vectors * i + h]
                builder.store(fma(builder, a_i, bs[h], builder.load(slot)), slot)
    for i in range(rows):
        row = builder.add(c_start, builder.mul(i64(i), ldc))
        for h in range(vectors):
            index = builder.add(row, i64(h * lanes))
            value = builder.load(acc[vectors * i + h])
            old = load_vector(builder, c_p, index, vector_type, 4)
            total = builder.select(add, builder.fadd(old, value, flags=FAST), value)
            store_vector(builder, total, c_p, index)


def _block_arguments(context, builder, tys, args) -> tuple:
    """(a, b, c data pointers, then a_start, lda, b_start, ldb, depth, c_start, ldc, accumulate)
    from the GEMM intrinsics' arguments (a, a_start, lda, b, b_start, ldb, depth, c, c_start, ldc,
    accumulate)."""
    pointers = tuple(array_data(context, builder, tys[i], args[i]) for i in (0, 3, 7))
    return pointers + tuple(args[i] for i in (1, 2, 4, 5, 6, 8, 9, 10))


def gemm_rows(rows: int, vectors: int, lanes: int = LANES):
    """C[rows, lanes * vectors] (+)= A[rows, k] @ B[k, lanes * vectors]: the register-blocked core of
    the GEMMs (float32, flat arrays, row strides lda, ldb, ldc); accumulate adds to C instead of
    overwriting it. Each element is the same chain of FMAs over k whatever `vectors` and `lanes` are.
    """

    @intrinsic
    def gemm(typingctx, a, a_start, lda, b, b_start, ldb, depth, c, c_start, ldc, accumulate):
        sig = types.void(a, a_start, lda, b, b_start, ldb, depth, c, c_start, ldc, accumulate)

        def codegen(context, builder, signature, args):
            _emit_block(builder, rows, vectors, lanes, *_block_arguments(context, builder, signature.args, args))
            return context.get_dummy_value()

        return sig, codegen

    return gemm


GEMM_ROWS = 6  # rows of A per register block (16 columns at 8 lanes: 12 accumulators + 2 B vectors + 1 broadcast)
# `accumulate` = False (C overwritten) as a numpy bool, not a literal: numba compiles a kernel once
# more for each literal argument, and the linears pass a bool that varies
OVERWRITE = np.bool_(False)


def block_switch(blocks: dict[int, tuple[int, int]]):
    """An intrinsic (key, a, a_start, lda, b, b_start, ldb, depth, c, c_start, ldc, accumulate) that
    switches on `key` to the unrolled block blocks[key] = (rows, vectors), each `gemm_rows`' IR; a
    key not there does nothing. One call site per family of blocks, rather than an if-chain of
    one intrinsic per block."""

    @intrinsic
    def block(typingctx, key, a, a_start, lda, b, b_start, ldb, depth, c, c_start, ldc, accumulate):
        sig = types.void(key, a, a_start, lda, b, b_start, ldb, depth, c, c_start, ldc, accumulate)

        def codegen(context, builder, signature, args):
            arguments = _block_arguments(context, builder, signature.args[1:], args[1:])
            done = builder.append_basic_block("block_done")
            switch = builder.switch(context.cast(builder, args[0], signature.args[0], types.int64), done)
            for value, (rows, vectors) in blocks.items():
                case = builder.append_basic_block(f"block_{value}")
                switch.add_case(ir.Constant(ir.IntType(64), value), case)
                builder.position_at_end(case)
                _emit_block(builder, rows, vectors, LANES, *arguments)
                builder.branch(done)
            builder.position_at_end(done)
            return context.get_dummy_value()

        return sig, codegen

    return block


# gemm_block(rows, ...): C[rows, 16] (+)= A[rows, depth] @ B[depth, 16] for 1 <= rows <= GEMM_ROWS
gemm_block = block_switch({rows: (rows, 16 // LANES) for rows in range(1, GEMM_ROWS + 1)})


# With 32 vector registers (AVX-512VL) a block of GEMM_ROWS rows takes 32 columns at once (24
# accumulators of 8 lanes or 12 of 16, the B vectors, a broadcast): each broadcast of A feeds
# twice the FMAs, and a prefill linear reads its input once per group of 32 weight rows instead
# of twice. Zen4, one thread, 512 tokens, CPU time on a loaded machine (8 lanes): 576 -> 1536
# 92 -> 93-101 GFLOP/s, 1536 -> 576 97 -> 105; a 512-token attention layer (9/3 heads of 64)
# 5.05 -> 4.48 ms.
WIDE_COLUMNS = 32 if host_has("avx512vl") else 0
_gemm_wide = gemm_rows(GEMM_ROWS, 32 // LANES)


# A decode step's attention has few rows (the query heads of one kv head: 1 to 4 on most models):
# a 16-column block then holds one or two chains of dependent FMAs, and the core waits on their
# latency (4 cycles) where it could start two a cycle. Few rows take wider blocks, as many
# vectors as the registers hold beside the rows' accumulators (a power of two, 8 at most):
# AVX-512 one or two rows 128 columns, three to five 64; AVX2 one or two 32. One thread, an
# Emerald Rapids Xeon: a one-token attention layer of 32 heads of 64 over 64 cached rows, cache
# hot, 44.8 -> 36.8 us; the 1.7B shape's decode after a 500-token prompt (its attentions read
# the cache from memory) 17.1 -> 14.5 ms of attention a step (with `attention.py` taking its
# scratch once a call).
_REGISTERS = 32 if host_has("avx512vl") else 16


def _few_rows_vectors(rows: int) -> int:
    """Vectors of the widest block for `rows` rows: the largest power of two (8 at most) whose rows x
    vectors accumulators, vectors of B and one broadcast of A fit the registers."""
    vectors = 16 // LANES
    while vectors < 8 and rows * 2 * vectors + 2 * vectors + 1 <= _REGISTERS:
        vectors *= 2
    return vectors


_FEW_ROWS = GEMM_ROWS - 1  # rows that take the wider blocks (GEMM_ROWS rows take WIDE_COLUMNS)
# the widest block of each row count; half as wide where that is still over 16 columns (the
# width where a narrower C, a 64-wide head's context, stops the widest)
FEW_COLUMNS = tuple(_few_rows_vectors(rows) * LANES for rows in range(1, _FEW_ROWS + 1))


# _few_rows_block(2 * rows + half, ...): C[rows, w] (+)= A[rows, depth] @ B[depth, w] for 1 <= rows <=
# _FEW_ROWS, w = FEW_COLUMNS[rows - 1], or half that when `half` is 1
_few_rows_block = block_switch({2 * rows + half: (rows, max(1, _few_rows_vectors(rows) // (2 if half else 1)))
                                for rows in range(1, _FEW_ROWS + 1) for half in (0, 1)})


@jit()
def gemm_columns(rows, a, a_start, lda, b, b_start, ldb, depth, c, c_start, ldc, columns, accumulate):
    """C[rows, columns] (+)= A[rows, depth] @ B[depth, columns] for 1 <= rows <= GEMM_ROWS and
    columns a multiple of 16: WIDE_COLUMNS a block where the wide core fits (GEMM_ROWS rows),
    FEW_COLUMNS[rows - 1] or half that (fewer rows), else 16 (each element is the same chain of
    FMAs either way, so the values do not depend on the machine or the block)."""
    n0 = 0
    few = FEW_COLUMNS[min(rows, _FEW_ROWS) - 1]
    while n0 < columns:
        if rows < GEMM_ROWS and few > 16 and n0 + few <= columns:
            _few_rows_block(2 * rows, a, a_start, lda, b, b_start + n0, ldb, depth, c, c_start + n0, ldc,
                            accumulate)
            n0 += few
        elif rows < GEMM_ROWS and few > 32 and n0 + few // 2 <= columns:
            _few_rows_block(2 * rows + 1, a, a_start, lda, b, b_start + n0, ldb, depth, c, c_start + n0, ldc,
                            accumulate)
            n0 += few // 2
        elif WIDE_COLUMNS > 0 and rows == GEMM_ROWS and n0 + WIDE_COLUMNS <= columns:
            _gemm_wide(a, a_start, lda, b, b_start + n0, ldb, depth, c, c_start + n0, ldc, accumulate)
            n0 += WIDE_COLUMNS
        else:
            gemm_block(rows, a, a_start, lda, b, b_start + n0, ldb, depth, c, c_start + n0, ldc, accumulate)
            n0 += 16
