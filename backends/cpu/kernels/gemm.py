"""The register-blocked GEMM core (6 rows x 16 columns of C in 12 <8 x float> registers), an
LLVM-IR intrinsic like `simd.py`, used by the prefill linears and attention.

Written here rather than taken from BLAS so that a low-memory run uses one thread pool
(numba's): OpenBLAS's spinning threads and numba's fight over the cores of a busy machine.
"""
from __future__ import annotations

from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from . import jit
from .simd import FAST, LANES, VF, array_data, fma, i64, load_vector, splat, store_vector, zero_slots


def _gemm_rows(rows: int):
    """C[rows, 16] (+)= A[rows, k] @ B[k, 16]: the register-blocked core of the GEMMs (float32,
    flat arrays, row strides lda, ldb, ldc); accumulate adds to C instead of overwriting it.
    """

    @intrinsic
    def gemm(typingctx, a, a_start, lda, b, b_start, ldb, depth, c, c_start, ldc, accumulate):
        sig = types.void(a, a_start, lda, b, b_start, ldb, depth, c, c_start, ldc, accumulate)

        def codegen(context, builder, signature, args):
            tys = signature.args
            a_p, b_p, c_p = (array_data(context, builder, tys[i], args[i]) for i in (0, 3, 7))
            a_start_v, lda_v, b_start_v, ldb_v, k_count, c_start_v, ldc_v, add = (args[i] for i in
                                                                                    (1, 2, 4, 5, 6, 8, 9, 10))
            acc = zero_slots(builder, 2 * rows)
            with cgutils.for_range(builder, k_count) as k_loop:
                k = k_loop.index
                b_index = builder.add(b_start_v, builder.mul(k, ldb_v))
                b0 = load_vector(builder, b_p, b_index, VF, 4)
                b1 = load_vector(builder, b_p, builder.add(b_index, i64(LANES)), VF, 4)
                for i in range(rows):
                    a_index = builder.add(builder.add(a_start_v, builder.mul(i64(i), lda_v)), k)
                    a_i = splat(builder, builder.load(builder.gep(a_p, [a_index])))
                    builder.store(fma(builder, a_i, b0, builder.load(acc[2 * i])), acc[2 * i])
                    builder.store(fma(builder, a_i, b1, builder.load(acc[2 * i + 1])), acc[2 * i + 1])
            for i in range(rows):
                row = builder.add(c_start_v, builder.mul(i64(i), ldc_v))
                for h in range(2):
                    index = builder.add(row, i64(h * LANES))
                    value = builder.load(acc[2 * i + h])
                    old = load_vector(builder, c_p, index, VF, 4)
                    total = builder.select(add, builder.fadd(old, value, flags=FAST), value)
                    store_vector(builder, total, c_p, index)
            return context.get_dummy_value()

        return sig, codegen

    return gemm



GEMM_ROWS = 6  # rows of A per register block: 12 accumulators + 2 B vectors + 1 broadcast
_gemm_1, _gemm_2, _gemm_3, _gemm_4, _gemm_5, _gemm_6 = (_gemm_rows(r) for r in range(1, GEMM_ROWS + 1))


@jit()
def gemm_block(rows, a, a_start, lda, b, b_start, ldb, depth, c, c_start, ldc, accumulate):
    """C[rows, 16] (+)= A[rows, depth] @ B[depth, 16] for 1 <= rows <= GEMM_ROWS."""
    if rows == 6:
        _gemm_6(a, a_start, lda, b, b_start, ldb, depth, c, c_start, ldc, accumulate)
    elif rows == 5:
        _gemm_5(a, a_start, lda, b, b_start, ldb, depth, c, c_start, ldc, accumulate)
    elif rows == 4:
        _gemm_4(a, a_start, lda, b, b_start, ldb, depth, c, c_start, ldc, accumulate)
    elif rows == 3:
        _gemm_3(a, a_start, lda, b, b_start, ldb, depth, c, c_start, ldc, accumulate)
    elif rows == 2:
        _gemm_2(a, a_start, lda, b, b_start, ldb, depth, c, c_start, ldc, accumulate)
    else:
        _gemm_1(a, a_start, lda, b, b_start, ldb, depth, c, c_start, ldc, accumulate)
