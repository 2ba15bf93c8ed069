"""Feasibility of int8 activations x int4 weight codes (integer dot products) against the fp32 kernels.

    python bench/int8_activation_feasibility.py [-n 41]

The kernel here is a probe, not the engine's: x is quantized per token row to int8 (symmetric,
one scale), the int4 codes are repacked so that each 32-bit lane holds 4 codes of one weight row
at 4 consecutive inputs (a 64-byte chunk = 16 rows x 8 inputs, low nibbles inputs 0..3, high
nibbles 4..7), and `llvm.x86.avx512.vpdpbusd.512` (AVX512-VNNI: u8 codes x s8 activations, four
products summed into an int32 lane) accumulates each block exactly in int32; one float epilogue
per (block, row): out += scale * sx * (isum - 8 * xq_block_sum) + zero * x_block_sum.
The fp32 side is the engine's `Gemv` (one row: `__call__`, 2..8 rows: `Gemv.few`).

Prints, per matrix and row count, the median `time.thread_time` of one call (single thread) and the
ratio fp32 / int8, and the int8 kernel's largest error relative to max |float64 result|.

Findings (2026-12-04, Zen4 with AVX512-VNNI, numba 0.68 / LLVM 22, 2 loaded cores, -n 21; the
asm holds `vpdpbusd zmm`, 196 of them across the 8 row-count cases):

    576 -> 1536   rows 1: fp32 37.0 us, int8 15.2 us (2.4x); rows 4: 95.0 / 30.4 (3.1x); rows 8: 184 / 52 (3.6x)
    2048 -> 8192  rows 1: 653 us, 204 us (3.2x);  rows 4: 1716 / 559 (3.1x);  rows 8: 3491 / 900 (3.9x)

int8 error 0.7-0.9% of max |result| (x quantized to 127 levels per row). A first version with
the per-(block, row) float epilogue in plain numba loops stayed scalar (`vfmadd...ss`) and was
only 1.1-1.5x at 4 rows: the epilogue must be vector code next to the integer sums.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from mnnllm_backends.cpu.kernels.layout import PackedWeight, interleave_rows
from mnnllm_backends.cpu.kernels.linear import Gemv
from mnnllm_backends.cpu.kernels.simd import GROUP_ROWS

_I32 = ir.IntType(32)
_I64 = ir.IntType(64)
_V16 = ir.VectorType(_I32, 16)
_V64B = ir.VectorType(ir.IntType(8), 64)
_VF = ir.VectorType(ir.FloatType(), 16)
ROWS = 16  # weight rows per int32 vector
MAX_TOKENS = 8


def _data(context, builder, ty, value):
    return context.make_array(ty)(context, builder, value).data


@intrinsic
def _group_rows(typingctx, tokens, codes, c_start, x_words, x_stride, n_blocks, chunks, scale, zero, s_start, sx,
                xq_sum, x_sum, out, o_start, o_stride):
    """out[o_start + t * o_stride + r] = W[r] @ x_t for the 16 rows of the chunks from c_start.

    x_words int32 [tokens][ic / 4] (4 int8 each); scale, zero [n_blocks][16] float32 from s_start;
    per block b the int32 sum isum = codes . xq_t is exact, then, in this order for every row
    count alike: acc = fma(scale, sx_t * float(isum - 8 * xq_sum[t, b]), fma(zero, x_sum[t, b], acc)).
    """
    sig = types.void(tokens, codes, c_start, x_words, x_stride, n_blocks, chunks, scale, zero, s_start, sx,
                     xq_sum, x_sum, out, o_start, o_stride)

    def codegen(context, builder, signature, args):
        tys = signature.args
        code_p, x_p, scale_p, zero_p, sx_p, xqs_p, xs_p, out_p = (
            _data(context, builder, tys[i], args[i]) for i in (1, 3, 7, 8, 10, 11, 12, 13))
        count, c_start_v, stride, blocks, per_block, s_start_v, o_start_v, o_stride_v = (
            context.cast(builder, args[i], tys[i], types.int64) for i in (0, 2, 4, 5, 6, 9, 14, 15))
        fnty = ir.FunctionType(_V16, [_V16, _V64B, _V64B])
        dot = cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.avx512.vpdpbusd.512")
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VF, [_VF, _VF, _VF]),
                                             "llvm.fma.v16f32")
        low_mask = ir.Constant(_V64B, [15] * 64)
        four = ir.Constant(_V64B, [4] * 64)
        zero_i = ir.Constant(_V16, [0] * 16)
        zero_f = ir.Constant(_VF, [0.0] * 16)

        def const(v):
            return ir.Constant(_I64, v)

        def splat(value, vector_type):
            one = builder.insert_element(ir.Constant(vector_type, ir.Undefined), value, ir.Constant(_I32, 0))
            return builder.shuffle_vector(one, ir.Constant(vector_type, ir.Undefined), ir.Constant(_V16, [0] * 16))

        def vec(pointer, index, vector_type):
            return builder.load(builder.bitcast(builder.gep(pointer, [index]), vector_type.as_pointer()), align=4)

        end = builder.append_basic_block("end")
        switch = builder.switch(count, end)
        for t_count in range(1, MAX_TOKENS + 1):
            case = builder.append_basic_block(f"t{t_count}")
            switch.add_case(const(t_count), case)
            builder.position_at_end(case)
            acc = [cgutils.alloca_once_value(builder, zero_i) for _ in range(t_count)]
            facc = [cgutils.alloca_once_value(builder, zero_f) for _ in range(t_count)]
            with cgutils.for_range(builder, blocks) as block_loop:
                b = block_loop.index
                for t in range(t_count):
                    builder.store(zero_i, acc[t])
                with cgutils.for_range(builder, per_block) as chunk_loop:
                    c = builder.add(builder.mul(b, per_block), chunk_loop.index)
                    w = vec(code_p, builder.add(c_start_v, builder.mul(c, const(64))), _V64B)
                    lo = builder.and_(w, low_mask)
                    hi = builder.and_(builder.lshr(w, four), low_mask)
                    for t in range(t_count):
                        base = builder.add(builder.mul(const(t), stride), builder.mul(c, const(2)))
                        words = [builder.bitcast(splat(builder.load(builder.gep(x_p, [builder.add(base, const(k))])),
                                                       _V16), _V64B) for k in range(2)]
                        total = builder.call(dot, [builder.load(acc[t]), lo, words[0]])
                        builder.store(builder.call(dot, [total, hi, words[1]]), acc[t])
                a_index = builder.add(s_start_v, builder.mul(b, const(16)))
                scale_v, zero_v = vec(scale_p, a_index, _VF), vec(zero_p, a_index, _VF)
                for t in range(t_count):
                    tb = builder.add(builder.mul(const(t), blocks), b)
                    shift = splat(builder.mul(builder.load(builder.gep(xqs_p, [tb])), ir.Constant(_I32, 8)), _V16)
                    dots = builder.sitofp(builder.sub(builder.load(acc[t]), shift), _VF)
                    scaled = builder.fmul(dots, splat(builder.load(builder.gep(sx_p, [const(t)])), _VF))
                    inner = builder.call(fma, [zero_v, splat(builder.load(builder.gep(xs_p, [tb])), _VF),
                                               builder.load(facc[t])])
                    builder.store(builder.call(fma, [scale_v, scaled, inner]), facc[t])
            for t in range(t_count):
                row = builder.add(o_start_v, builder.mul(const(t), o_stride_v))
                target = builder.bitcast(builder.gep(out_p, [row]), _VF.as_pointer())
                builder.store(builder.load(facc[t]), target, align=4)
            builder.branch(end)
        builder.position_at_end(end)
        return context.get_dummy_value()

    return sig, codegen


@njit(cache=False)
def int8_linear(codes, scale, zero, xq_words, sx, xq_sum, x_sum, block, out):
    """out [tokens, oc] for the repacked int4 codes (16-row groups) and pre-quantized rows of x;
    scale and zero [groups][n_blocks][16]."""
    tokens, oc = out.shape
    n_blocks = scale.shape[1]
    chunks = block // 8
    flat_scale, flat_zero, flat_out = scale.reshape(-1), zero.reshape(-1), out.reshape(-1)
    for g in range(oc // ROWS):
        _group_rows(tokens, codes, g * n_blocks * chunks * 64, xq_words.reshape(-1), xq_words.shape[1], n_blocks,
                    chunks, flat_scale, flat_zero, g * n_blocks * ROWS, sx, xq_sum.reshape(-1), x_sum.reshape(-1),
                    flat_out, g * ROWS, oc)


@njit(cache=False)
def quantize_rows(x, block, words, sx, xq_sum, x_sum):
    """x [tokens, ic] -> int8 per row (symmetric, round half away), packed 4 a word."""
    tokens, ic = x.shape
    xq = np.empty(ic, np.int8)
    for t in range(tokens):
        top = np.float32(0.0)
        for j in range(ic):
            top = max(top, abs(x[t, j]))
        s = top / np.float32(127.0) if top > 0 else np.float32(1.0)
        sx[t] = s
        for j in range(ic):
            xq[j] = np.int8(np.round(x[t, j] / s))
        for b in range(ic // block):
            qs = 0
            fs = np.float32(0.0)
            for j in range(b * block, (b + 1) * block):
                qs += xq[j]
                fs += np.float32(xq[j]) * s
            xq_sum[t, b] = qs
            x_sum[t, b] = fs
        words[t] = xq.view(np.int32)


def repack(codes4: np.ndarray) -> np.ndarray:
    """codes uint8 [oc, ic] (0..15) -> the probe's 16-row chunks."""
    oc, ic = codes4.shape
    chunked = codes4.reshape(oc // ROWS, ROWS, ic // 8, 2, 4)  # g, r, c, half, i
    bytes_ = chunked[:, :, :, 0, :] | (chunked[:, :, :, 1, :] << 4)  # g, r, c, i
    return np.ascontiguousarray(bytes_.transpose(0, 2, 1, 3)).reshape(-1)


def fp32_packed(codes4: np.ndarray, scale: np.ndarray, zero: np.ndarray, block: int) -> PackedWeight:
    oc, ic = codes4.shape
    rows = (codes4[:, 0::2] << 4) | codes4[:, 1::2]
    out = np.empty(oc * ic // 2, np.uint8)
    interleave_rows(rows, out)
    groups = oc // GROUP_ROWS
    pairs = np.zeros((oc, ic // block, 2), np.float16)
    pairs[:, :, 0], pairs[:, :, 1] = zero, scale
    alpha = np.ascontiguousarray(pairs.reshape(groups, GROUP_ROWS, -1, 2).transpose(0, 2, 3, 1)).reshape(-1)
    return PackedWeight(4, oc, ic, block, out, alpha.view(np.uint16))


def median_time(call, n: int) -> float:
    times = []
    for _ in range(n):
        start = time.thread_time()
        call()
        times.append(time.thread_time() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=41)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    block = 64
    for oc, ic in ((1536, 576), (8192, 2048)):
        codes4 = rng.integers(0, 16, (oc, ic), dtype=np.uint8)
        scale = rng.uniform(0.001, 0.02, (oc, ic // block)).astype(np.float16).astype(np.float32)
        zero = rng.uniform(-0.05, 0.05, (oc, ic // block)).astype(np.float16).astype(np.float32)
        packed = fp32_packed(codes4, scale, zero, block)
        gemv = Gemv([packed])
        w64 = ((codes4.astype(np.float64) - 8).reshape(oc, -1, block) * scale[:, :, None] + zero[:, :, None])
        w64 = w64.reshape(oc, ic)
        chunks = repack(codes4)
        scale16 = np.ascontiguousarray(scale.reshape(oc // ROWS, ROWS, -1).transpose(0, 2, 1))
        zero16 = np.ascontiguousarray(zero.reshape(oc // ROWS, ROWS, -1).transpose(0, 2, 1))
        for tokens in (1, 4, 8):
            x = rng.standard_normal((tokens, ic)).astype(np.float32)
            words = np.empty((tokens, ic // 4), np.int32)
            sx = np.empty(tokens, np.float32)
            xq_sum = np.empty((tokens, ic // block), np.int32)
            x_sum = np.empty((tokens, ic // block), np.float32)
            out = np.empty((tokens, oc), np.float32)

            def int8_call():
                quantize_rows(x, block, words, sx, xq_sum, x_sum)
                int8_linear(chunks, scale16, zero16, words, sx, xq_sum, x_sum, block, out)

            def fp32_call():
                return gemv(x[0], 1) if tokens == 1 else gemv.few(x, 1)

            int8_call()
            fp32_call()
            reference = x.astype(np.float64) @ w64.T
            error = np.abs(out - reference).max() / np.abs(reference).max()
            t_int8, t_fp32 = median_time(int8_call, args.n), median_time(fp32_call, args.n)
            print(f"{oc}x{ic} rows {tokens}: fp32 {t_fp32 * 1e6:8.1f} us  int8 {t_int8 * 1e6:8.1f} us  "
                  f"speed-up {t_fp32 / t_int8:4.2f}x  int8 rel. error {error:.2e}")


if __name__ == "__main__":
    main()
