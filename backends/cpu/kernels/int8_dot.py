"""int8 activations x int4 weight codes with integer dot products: the opt-in "dynamic quant"
linear of memory "low" (MNN's low-memory CPU path, `DenseConvInt8TiledExecutor`, quantizes the
input to int8 on the fly in the same way; `ops/int8_linear.py` says when it runs).

The exact fp32 kernels (`linear.py`) widen every code to float and spend two FMAs per weight;
here each input row is quantized to int8 once (`quantize_rows`) and AVX512-VNNI's `vpdpbusd`
multiplies 4 unsigned codes by 4 signed int8 inputs and adds them into an int32 lane, so one
instruction does 64 multiply-adds. A first probe of this kernel, timed single-threaded against the
fp32 `Gemv` on a loaded Zen4 (2026-12-04), was 2.4-3.9x faster at 1-8 rows (576->1536: 2.4x / 3.1x
/ 3.6x at 1 / 4 / 8 rows; 2048->8192: 3.2x / 3.1x / 3.9x), but only 1.1-1.5x at 4 rows while the
per-(block, row) float epilogue was plain numba (scalar code): the epilogue is vector IR beside the
integer sums. `bench/int8_activation_bench.py` times this path against fp32 in the model.

Layout (`Int8Weight`, packed at load from the weight's 4-bit codes by `pack`): 16 rows a group,
a 64-byte chunk per 8 inputs, byte 4r + i = code[r, 8c + i] | code[r, 8c + 4 + i] << 4, so the
low nibbles of a chunk are inputs 8c..8c+3 of the 16 rows and the high nibbles 8c+4..8c+7. The
(zero, scale) pairs are laid out as `PackedWeight.alpha`; `code_sums` holds each (row, block)'s
sum of codes, read as a 16-bit unsigned integer (blocks of at most MAX_BLOCK inputs: a longer one,
a per-channel weight of 6,144 inputs, stays on the fp32 kernels).

Arithmetic, for weight w = zero + scale * (c - 8) and input x ~ ds * (q - zp) (per token row, zp
a float as MNN's): per block, E = sum (c - 8) q = isum - 8 * qsum exactly in int32, then
acc = fma(scale, (float(E) - zp * float(csum - 8 * block)) * ds, fma(zero, xsum, acc)) with
xsum = ds * (qsum - zp * block); zp is 0 for symmetric rows, whose bits do not depend on it.
Every token row goes through the same instructions whatever the number of rows a call takes,
so a row's result is bit-identical in a 1-row and a k-row call (speculative decoding stays exact
against plain decoding on this path).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from mnnllm_core.backend_api import QuantizedWeight

from . import host_has, jit, layout
from .linear import MEMBERS
from .simd import GROUP_ROWS, PREFETCH_BYTES, prefetch

ROWS = 16  # weight rows of one int32 vector
CHUNK_INPUTS = 8  # inputs of one 64-byte chunk
MAX_TOKENS = 8  # token rows one kernel call keeps in registers
MAX_BLOCK = np.iinfo(np.uint16).max // 15  # inputs of a block whose code sums fit 16 bits unsigned
LAYOUT_VERSION = f"{layout.LAYOUT_VERSION}+int8-{ROWS}-rows-1"  # change it with the layout (cached packs)

_I8, _I16, _I32, _I64 = (ir.IntType(n) for n in (8, 16, 32, 64))
_VI = ir.VectorType(_I32, ROWS)
_VS = ir.VectorType(_I16, ROWS)
_VB = ir.VectorType(_I8, 4 * ROWS)
_VF = ir.VectorType(ir.FloatType(), ROWS)
_VH = ir.VectorType(ir.HalfType(), ROWS)


def supported() -> bool:
    """Whether this cpu has the instruction the kernel is written with (AVX512-VNNI)."""
    return host_has("avx512vnni", "avx512bw")


@dataclass(eq=False)
class Int8Weight:
    oc: int
    ic: int
    block: int
    rows: int  # oc padded to whole 32-row groups (what `alpha` covers)
    codes: np.ndarray  # uint8 [rows / 16][ic / 8][64]
    code_sums: np.ndarray  # int16 [rows / 16][n_blocks][16], the bits of uint16 sums
    alpha: np.ndarray  # PackedWeight.alpha: [rows / 32][n_blocks][zero[32], scale[32]], fp16 bits or float32

    @property
    def n_blocks(self) -> int:
        return self.ic // self.block

    @property
    def nbytes(self) -> int:
        return self.codes.nbytes + self.code_sums.nbytes + self.alpha.nbytes

    def arrays(self) -> dict[str, np.ndarray]:
        """The weight as plain arrays, what `runtime.weight_cache` keeps on disk."""
        return {"codes": self.codes, "code_sums": self.code_sums, "alpha": self.alpha,
                "shape": np.array([self.oc, self.ic, self.block, self.rows], np.int64)}

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> "Int8Weight":
        oc, ic, block, rows = (int(x) for x in arrays["shape"])
        return cls(oc, ic, block, rows, arrays["codes"], arrays["code_sums"], arrays["alpha"])


def takes(weight: QuantizedWeight) -> bool:
    """4-bit codes (`layout.four_bit`) in blocks of whole chunks, at most MAX_BLOCK inputs (8-bit
    codes and longer blocks stay on the fp32 kernels)."""
    block = weight.block_size
    return layout.four_bit(weight) and block % CHUNK_INPUTS == 0 and block <= MAX_BLOCK and weight.ic % block == 0


def pack(weight: QuantizedWeight, spread: layout.Spread | None = None) -> Int8Weight:
    """This kernel's layout of a weight it `takes`, written from the weight's code bytes (the
    weight file's, for 4 bits) a span of groups at a time, spread over the runtime's threads as
    `layout.pack` does: no other layout made first and no full-size temporary, so the load's
    peak is the fp32 path's plus the code sums."""
    rows = layout.code_rows(weight)[0]
    oc, ic, block = weight.oc, weight.ic, weight.block_size
    padded, width, blocks = -(-oc // GROUP_ROWS) * GROUP_ROWS, ic // 2, ic // block
    codes = np.empty(padded * width, np.uint8)
    code_sums = np.empty(padded * blocks, np.int16)

    def pack_codes(first: int, last: int) -> None:
        interleave_nibbles(rows[first:last], block, codes[first * width:last * width],
                           code_sums[first * blocks:last * blocks])

    alpha = layout.pack_spans(weight, pack_codes, codes.nbytes, spread)
    return Int8Weight(oc, ic, block, padded, codes, code_sums, alpha)


@jit()
def interleave_nibbles(rows, block, out, sums):
    """rows uint8 [n, ic / 2], MNN's bytes (code 2j in byte j's high nibble, 2j + 1 in its low)
    -> out uint8 [groups][ic / 8][64] (the chunks of the module docstring) and sums int16
    [groups][ic / block][16] (each row's sum of codes per block), for groups of 16 rows; rows
    past n are zero codes."""
    n, width = rows.shape
    chunks, blocks, per_block = width // 4, 2 * width // block, block // CHUNK_INPUTS
    for row in range(n):
        source = rows[row]
        first = (row // ROWS) * chunks * 64 + 4 * (row % ROWS)  # the row's 4 bytes of chunk 0
        sum_at = (row // ROWS) * blocks * ROWS + row % ROWS
        for b in range(blocks):
            total = 0
            for c in range(b * per_block, (b + 1) * per_block):
                b0, b1, b2, b3 = source[4 * c], source[4 * c + 1], source[4 * c + 2], source[4 * c + 3]
                at = first + 64 * c
                out[at] = (b0 >> 4) | (b2 & 0xF0)
                out[at + 1] = (b0 & 15) | (b2 << 4)
                out[at + 2] = (b1 >> 4) | (b3 & 0xF0)
                out[at + 3] = (b1 & 15) | (b3 << 4)
                total += ((b0 >> 4) + (b0 & 15) + (b1 >> 4) + (b1 & 15)
                          + (b2 >> 4) + (b2 & 15) + (b3 >> 4) + (b3 & 15))
            sums[sum_at + b * ROWS] = total
    for row in range(n, out.shape[0] // width):
        first = (row // ROWS) * chunks * 64 + 4 * (row % ROWS)
        for c in range(chunks):
            out[first + 64 * c:first + 64 * c + 4] = 0
        for b in range(blocks):
            sums[(row // ROWS) * blocks * ROWS + row % ROWS + b * ROWS] = 0


@intrinsic
def _float_of_bits(typingctx, bits):
    """The float32 whose bits are the int32 `bits` (numpy's `view` without an array)."""
    if bits != types.int32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.int32), codegen


@jit(fastmath=False)
def _order_key(bits):
    """An int32 that orders as the float32 of the int32 `bits` does: a negative float's magnitude
    bits flipped (-0.0 just below 0.0, NaN beyond +-inf). Its own inverse."""
    return np.int32(bits ^ ((bits >> 31) & 0x7FFFFFFF))


@jit(fastmath=False)
def _row_range(row):
    """min and max of a float32 row, as the scalar loop `low = min(low, x)` from row[0] finds them.

    That loop does not vectorize without fast-math flags (a float min reduction depends on the
    order for NaN and signed zeros); the floats' order keys (`_order_key`) do, as int32 min/max
    reductions. The keys give the loop's values whenever min < max; they order -0.0 below 0.0
    where the loop keeps the first of the two, which only a row of zeros shows (`quantize_rows`
    reads a zero bound's sign nowhere else), and put a NaN on a bound where the loop skips a NaN
    after row[0]: so a constant row (zeros included) or one holding a NaN takes the loop."""
    keys = row.view(np.int32)
    low = high = _order_key(keys[0])
    for j in range(keys.shape[0]):
        key = _order_key(keys[j])
        low = min(low, key)
        high = max(high, key)
    lowest, highest = _float_of_bits(_order_key(low)), _float_of_bits(_order_key(high))
    if lowest < highest:
        return lowest, highest
    lowest = highest = row[0]
    for j in range(row.shape[0]):
        lowest = min(lowest, row[j])
        highest = max(highest, row[j])
    return lowest, highest


@jit(fastmath=False)
def _round_half_away(value):
    """C's lroundf for a float32 in [-128, 127], in float32 lanes: value - trunc(value) is exact,
    so the half steps are found exactly (value + 0.5 in float32 is not: 0.49999997 + 0.5 rounds
    to 1.0; the former floor(value + 0.5) / ceil(value - 0.5) took float64 and a branch)."""
    whole = np.trunc(value)
    if abs(value - whole) >= np.float32(0.5):
        whole += np.copysign(np.float32(1.0), value)
    return np.int32(whole)


@jit(fastmath=False)
def quantize_rows(x, block, symmetric, xq, ds, zp, qsum, xsum):
    """x float32 [tokens, ic] -> int8 xq [tokens, ic], one (ds, zp) per row: x ~ ds * (xq - zp).

    Asymmetric (MNN 3.6.1's one-token quantization, measured against its runtime by
    `bench/mnn_int8_linear_probe.py`): 255 levels over [min, max] with a float zero point
    zp = -min * 255 / range - 128 (not rounded: the dequantized grid starts at min), values
    x * (255 / range) + zp clamped to [-128, 127] and rounded half away from zero. Symmetric
    (MNN's several-token "batch" quantization): 127 levels a side of max |x|, zp = 0, ties to
    even. Also qsum [tokens, n_blocks] (the int sums of xq per block) and xsum = ds * (qsum - zp
    * block), the block sums of the dequantized row.

    Each loop over a row vectorizes with fast-math off, so its bits are those of plain scalar
    float32 code in order (`tests/test_cpu_int8_quantize.py` holds the scalar loops as they
    were): the range by order keys (`_row_range`), the scale and zero point as locals (ds[t] and
    zp[t] share the scratch with xq: read in the loop, a store to xq could change them), the
    rounding in float32 lanes, the block sums on slices. On a loaded Zen4 (2026-12-05) a row of
    576 inputs takes ~0.19 us asymmetric (0.83 us before), 1536 inputs 0.43 us (2.2 us).
    """
    tokens, ic = x.shape
    n_blocks = ic // block
    for t in range(tokens):
        row, codes = x[t], xq[t]
        low, high = _row_range(row)
        top = max(high, -low)
        span = high - low
        if symmetric or span == 0:
            scale = np.float32(127.0) / top if top > 0 else np.float32(0.0)
            step, point = top / np.float32(127.0), np.float32(0.0)
            for j in range(ic):
                codes[j] = min(127, max(-127, np.int32(np.rint(row[j] * scale))))
        else:
            scale = np.float32(255.0) / span
            step, point = span / np.float32(255.0), -low * np.float32(255.0) / span - np.float32(128.0)
            for j in range(ic):
                codes[j] = _round_half_away(min(np.float32(127.0), max(np.float32(-128.0), row[j] * scale + point)))
        ds[t], zp[t] = step, point
        for b in range(n_blocks):
            part = codes[b * block:(b + 1) * block]  # indexes from 0: no negative-index wrap, so a vector load
            total = np.int32(0)
            for j in range(block):
                total = np.int32(total + part[j])
            qsum[t, b] = total
            xsum[t, b] = step * (np.float32(total) - point * np.float32(block))


def _data(context, builder, ty, value):
    return context.make_array(ty)(context, builder, value).data


def _const(value: int) -> ir.Constant:
    return ir.Constant(_I64, value)


@intrinsic
def int8_group_dot(typingctx, tokens, first, codes, c_start, code_sums, alpha, a_start, words, n_blocks, chunks,
                   block, ds, zp, qsum, xsum, out, o_start, o_stride):
    """One group of 16 rows for token rows first..first+tokens-1 (tokens 1..MAX_TOKENS):
    out[o_start + t * o_stride + r] = W[r] . x_t (see the module docstring).

    codes from c_start (the group's chunks), code_sums from (c_start / 64 / chunks) * 16, alpha
    from a_start (this group's zero; its scale GROUP_ROWS further), words int32 [rows][ic / 4]
    (the int8 xq, 4 a word), ds/zp [rows], qsum/xsum [rows][n_blocks].
    """
    sig = types.void(tokens, first, codes, c_start, code_sums, alpha, a_start, words, n_blocks, chunks, block, ds,
                     zp, qsum, xsum, out, o_start, o_stride)
    half = alpha.dtype == types.uint16

    def codegen(context, builder, signature, args):
        tys = signature.args
        code_p, sums_p, alpha_p, word_p, ds_p, zp_p, qsum_p, xsum_p, out_p = (
            _data(context, builder, tys[i], args[i]) for i in (2, 4, 5, 7, 11, 12, 13, 14, 15))
        count, first_v, c_start_v, a_start_v, blocks, per_block, block_v, o_start_v, o_stride_v = (
            context.cast(builder, args[i], tys[i], types.int64) for i in (0, 1, 3, 6, 8, 9, 10, 16, 17))
        dot = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VI, [_VI, _VB, _VB]),
                                             "llvm.x86.avx512.vpdpbusd.512")
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VF, [_VF, _VF, _VF]), "llvm.fma.v16f32")
        stride = builder.sdiv(builder.mul(blocks, builder.mul(per_block, _const(CHUNK_INPUTS))), _const(4))
        low_mask, four = ir.Constant(_VB, [15] * 64), ir.Constant(_VB, [4] * 64)
        zero_i, zero_f = ir.Constant(_VI, [0] * ROWS), ir.Constant(_VF, [0.0] * ROWS)
        s_start = builder.mul(builder.sdiv(c_start_v, builder.mul(per_block, _const(64))), _const(ROWS))

        def splat(value, vector_type):
            undef = ir.Constant(vector_type, ir.Undefined)
            one = builder.insert_element(undef, value, ir.Constant(_I32, 0))
            return builder.shuffle_vector(one, undef, ir.Constant(_VI, [0] * ROWS))

        def load(pointer, index, vector_type, align):
            address = builder.bitcast(builder.gep(pointer, [index]), vector_type.as_pointer())
            return builder.load(address, align=align)

        def alphas(index):
            if half:
                return builder.fpext(load(alpha_p, index, _VH, 2), _VF)
            return load(alpha_p, index, _VF, 4)

        def scalar(pointer, index):
            return builder.load(builder.gep(pointer, [index]))

        end = builder.append_basic_block("int8.end")
        switch = builder.switch(count, end)
        for rows in range(1, MAX_TOKENS + 1):
            case = builder.append_basic_block(f"int8.{rows}")
            switch.add_case(_const(rows), case)
            builder.position_at_end(case)
            token = [builder.add(first_v, _const(t)) for t in range(rows)]
            isum = [cgutils.alloca_once_value(builder, zero_i) for _ in range(rows)]
            acc = [cgutils.alloca_once_value(builder, zero_f) for _ in range(rows)]
            with cgutils.for_range(builder, blocks) as block_loop:
                b = block_loop.index
                for t in range(rows):
                    builder.store(zero_i, isum[t])
                with cgutils.for_range(builder, per_block) as chunk_loop:
                    c = builder.add(builder.mul(b, per_block), chunk_loop.index)
                    offset = builder.add(c_start_v, builder.mul(c, _const(64)))
                    prefetch(builder, code_p, builder.add(offset, _const(PREFETCH_BYTES)))
                    w = load(code_p, offset, _VB, 1)
                    low = builder.and_(w, low_mask)
                    high = builder.and_(builder.lshr(w, four), low_mask)
                    for t in range(rows):
                        base = builder.add(builder.mul(token[t], stride), builder.mul(c, _const(2)))
                        x_low = builder.bitcast(splat(scalar(word_p, base), _VI), _VB)
                        x_high = builder.bitcast(splat(scalar(word_p, builder.add(base, _const(1))), _VI), _VB)
                        total = builder.call(dot, [builder.load(isum[t]), low, x_low])
                        builder.store(builder.call(dot, [total, high, x_high]), isum[t])
                a_index = builder.add(a_start_v, builder.mul(b, _const(2 * GROUP_ROWS)))
                zero = alphas(a_index)
                scale = alphas(builder.add(a_index, _const(GROUP_ROWS)))
                csum = builder.zext(load(sums_p, builder.add(s_start, builder.mul(b, _const(ROWS))), _VS, 2), _VI)
                eight_block = splat(builder.trunc(builder.mul(block_v, _const(8)), _I32), _VI)
                centred = builder.sitofp(builder.sub(csum, eight_block), _VF)  # sum of (c - 8), exact
                for t in range(rows):
                    tb = builder.add(builder.mul(token[t], blocks), b)
                    # sum (c - 8) q exactly, then the float zero point: - zp * (csum - 8 * block)
                    shift = builder.mul(scalar(qsum_p, tb), ir.Constant(_I32, 8))
                    exact = builder.sub(builder.load(isum[t]), splat(shift, _VI))
                    offset = builder.fmul(splat(scalar(zp_p, token[t]), _VF), centred)
                    dots = builder.fmul(builder.fsub(builder.sitofp(exact, _VF), offset),
                                        splat(scalar(ds_p, token[t]), _VF))
                    inner = builder.call(fma, [zero, splat(scalar(xsum_p, tb), _VF), builder.load(acc[t])])
                    builder.store(builder.call(fma, [scale, dots, inner]), acc[t])
            for t in range(rows):
                row = builder.add(o_start_v, builder.mul(token[t], o_stride_v))
                builder.store(builder.load(acc[t]), builder.bitcast(builder.gep(out_p, [row]), _VF.as_pointer()),
                              align=4)
            builder.branch(end)
        builder.position_at_end(end)
        return context.get_dummy_value()

    return sig, codegen


@jit(fastmath=False)
def _groups(codes, code_sums, alpha, n_blocks, block, words, ds, zp, qsum, xsum, out, tokens, h0, h1):
    """Groups h0..h1 of one weight into out (flat [tokens][out.size / tokens])."""
    rows = out.shape[0] // tokens
    chunks = block // CHUNK_INPUTS
    flat_words = words.reshape(-1)
    flat_qsum, flat_xsum = qsum.reshape(-1), xsum.reshape(-1)
    for h in range(h0, h1):
        a_start = (h // 2) * n_blocks * 2 * GROUP_ROWS + (h % 2) * ROWS
        for t0 in range(0, tokens, MAX_TOKENS):
            int8_group_dot(min(MAX_TOKENS, tokens - t0), t0, codes, h * n_blocks * chunks * 64, code_sums, alpha,
                           a_start, flat_words, n_blocks, chunks, block, ds, zp, flat_qsum, flat_xsum, out,
                           h * ROWS, rows)


@jit(fastmath=False)
def _members(codes, code_sums, alphas, outs, starts, n_blocks, block, words, ds, zp, qsum, xsum, tokens, first,
             last):
    """Groups first..last of the members laid end to end (member m holds groups starts[m]..starts[m+1])."""
    for m in range(MEMBERS):
        h0 = max(first, starts[m]) - starts[m]
        h1 = min(last, starts[m + 1]) - starts[m]
        if h0 < h1:
            _groups(codes[m], code_sums[m], alphas[m], n_blocks, block, words, ds, zp, qsum, xsum, outs[m], tokens,
                    h0, h1)


@jit()
def scratch_bytes(tokens, ic, n_blocks):
    """The bytes of one call's quantized rows (`quantized_rows`)."""
    return tokens * (ic + 8 + 8 * n_blocks)


@jit()
def own_rows(scratch_size, tokens, ic, n_blocks, parts):
    """Whether a scratch of `scratch_size` bytes holds a copy of the quantized rows for each of
    `parts` parts: then each part (a rank of the thread team) quantizes the rows into its own
    copy, the same bits as every other, and no rank waits for rank 0's (`linear_part`)."""
    return scratch_size >= parts * scratch_bytes(tokens, ic, n_blocks)


@jit(fastmath=False)
def quantized_rows(scratch, tokens, ic, n_blocks):
    """The quantized rows' arrays laid end to end in the bytes `scratch`: xq int8 [tokens, ic],
    ds float32 [tokens], zp float32 [tokens], qsum int32 and xsum float32 [tokens, n_blocks] (one
    buffer, so that a replayed call holds a single array for them)."""
    at = tokens * ic
    xq = scratch[:at].view(np.int8).reshape(tokens, ic)
    ds = scratch[at:at + 4 * tokens].view(np.float32)
    at += 4 * tokens
    zp = scratch[at:at + 4 * tokens].view(np.float32)
    at += 4 * tokens
    sums = 4 * tokens * n_blocks
    qsum = scratch[at:at + sums].view(np.int32).reshape(tokens, n_blocks)
    xsum = scratch[at + sums:at + 2 * sums].view(np.float32).reshape(tokens, n_blocks)
    return xq, ds, zp, qsum, xsum


@jit(fastmath=False)
def linear(x, symmetric, scratch, codes, code_sums, alphas, outs, starts, n_blocks, block):
    """outs[m] ([tokens][its rows], flat) = x [tokens, ic] @ W_m.T for up to MEMBERS weights of
    one format reading x (unused places: empty arrays), x quantized once into `scratch`."""
    tokens, ic = x.shape
    xq, ds, zp, qsum, xsum = quantized_rows(scratch, tokens, ic, n_blocks)
    quantize_rows(x, block, symmetric, xq, ds, zp, qsum, xsum)
    _members(codes, code_sums, alphas, outs, starts, n_blocks, block, xq.view(np.int32), ds, zp, qsum, xsum, tokens,
             np.int64(0), starts[MEMBERS])


@jit(parallel=True, fastmath=False)
def linear_parallel(x, symmetric, scratch, codes, code_sums, alphas, outs, starts, n_blocks, block, parts):
    """`linear` with the members' groups split into `parts` ranges, one a thread (the rows are
    quantized first, on the calling thread)."""
    tokens, ic = x.shape
    xq, ds, zp, qsum, xsum = quantized_rows(scratch, tokens, ic, n_blocks)
    quantize_rows(x, block, symmetric, xq, ds, zp, qsum, xsum)
    words = xq.view(np.int32)
    total = starts[MEMBERS]
    per_part = (total + parts - 1) // parts
    for task in prange(parts):
        part = np.int64(task)  # prange counts unsigned; int64 keeps the arithmetic integral
        _members(codes, code_sums, alphas, outs, starts, n_blocks, block, words, ds, zp, qsum, xsum, tokens,
                 part * per_part, min(total, (part + 1) * per_part))


@jit(fastmath=False)
def linear_part(x, symmetric, scratch, codes, code_sums, alphas, outs, starts, n_blocks, block, part, parts):
    """One rank's share of `linear_parallel` on the calling thread (the replay's thread team,
    `team.py`): part -1 quantizes the rows into `scratch` (one rank, before the others read it),
    part 0..parts-1 computes that part's groups from them. Where the scratch holds a copy per part
    (`own_rows`) there is no part -1: each part quantizes the rows into its own copy first (a
    decode step's 576 inputs take ~0.2 us, less than a barrier's hand-over)."""
    tokens, ic = x.shape
    if part >= 0 and own_rows(scratch.shape[0], tokens, ic, n_blocks, parts):
        size = scratch_bytes(tokens, ic, n_blocks)
        xq, ds, zp, qsum, xsum = quantized_rows(scratch[part * size:(part + 1) * size], tokens, ic, n_blocks)
        quantize_rows(x, block, symmetric, xq, ds, zp, qsum, xsum)
    else:
        xq, ds, zp, qsum, xsum = quantized_rows(scratch, tokens, ic, n_blocks)
        if part < 0:
            quantize_rows(x, block, symmetric, xq, ds, zp, qsum, xsum)
            return
    total = starts[MEMBERS]
    per_part = (total + parts - 1) // parts
    _members(codes, code_sums, alphas, outs, starts, n_blocks, block, xq.view(np.int32), ds, zp, qsum, xsum, tokens,
             min(total, part * per_part), min(total, (part + 1) * per_part))


def bind(x: np.ndarray, symmetric: bool, scratch: np.ndarray, weights: list[Int8Weight], outs: list[np.ndarray],
         threads: int) -> functools.partial:
    """One `linear` call (`linear_parallel` for threads > 1) as a call without arguments (a
    replay step): outs[m] = x @ weights[m].T, flat [tokens][rows], rows a multiple of 16 (the
    weight's first rows, padding included where it is weights[m].rows). x float32 [tokens, ic]
    C-contiguous, scratch at least `scratch_bytes` long; the weights share ic, block and alphas' type."""
    tokens = x.shape[0]
    first, pad = weights[0], MEMBERS - len(weights)
    starts = np.zeros(MEMBERS + 1, np.int64)
    starts[1:len(weights) + 1] = np.cumsum([out.size // tokens // ROWS for out in outs])
    starts[len(weights) + 1:] = starts[len(weights)]
    args = (x, symmetric, scratch, tuple(w.codes for w in weights) + (first.codes[:0],) * pad,
            tuple(w.code_sums for w in weights) + (first.code_sums[:0],) * pad,
            tuple(w.alpha for w in weights) + (first.alpha[:0],) * pad, tuple(outs) + (outs[0][:0],) * pad, starts,
            first.n_blocks, first.block)
    if threads > 1:
        return functools.partial(linear_parallel, *args, threads)
    return functools.partial(linear, *args)


class BoundLinear:
    """out [tokens, out.shape[1]] = x @ W.T for the arrays given, x quantized first, as one
    compiled call without arguments (a replay step). out.shape[1] is a multiple of 16: the
    weight's first rows (padding included where it is weight.rows). The quantized rows stay
    readable (xq, ds, zp, qsum, xsum) after a call."""

    def __init__(self, weight: Int8Weight, x: np.ndarray, out: np.ndarray, symmetric: bool, threads: int):
        tokens, ic = x.shape
        self.scratch = np.empty(scratch_bytes(tokens, ic, weight.n_blocks), np.uint8)
        self.xq, self.ds, self.zp, self.qsum, self.xsum = quantized_rows(self.scratch, tokens, ic, weight.n_blocks)
        self.call = bind(x, symmetric, self.scratch, [weight], [out.reshape(-1)], threads)

    def __call__(self) -> None:
        self.call()
