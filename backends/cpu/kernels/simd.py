"""Explicit SIMD for the packed-weight kernels, written as numba intrinsics in LLVM IR.

numba's auto-vectorizer turns a plain nibble loop into gathers or into latency-bound single
accumulators; these intrinsics spell out the loop over one group of `GROUP_ROWS` interleaved
rows (see `layout.py`) with independent vector accumulators of LANES floats (`SIMD_LANES`: 16
where the cores run 512-bit vectors at full rate, else 8), so LLVM emits `vpmovzxbd / vpand /
vcvtdq2ps / vfmadd` per LANES bytes and `vcvtph2ps` for the fp16 alphas on any x86-64 with
AVX2+FMA+F16C (and the equivalent NEON on arm64). The lanes run over rows, never across a sum:
a row's value is the same at either width.
"""
from __future__ import annotations

import platform

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from . import SIMD_LANES, host_has

GROUP_ROWS = 32  # rows interleaved per group: 4 vectors of 8 lanes, or 2 of 16
LANES = SIMD_LANES

_F32 = ir.FloatType()
_I32 = ir.IntType(32)
_I64 = ir.IntType(64)
VF = ir.VectorType(_F32, LANES)
_VI = ir.VectorType(_I32, LANES)
_VB = ir.VectorType(ir.IntType(8), LANES)
_VH = ir.VectorType(ir.HalfType(), LANES)
FAST = ("fast",)
_X86 = platform.machine().lower() in ("x86_64", "amd64", "i686", "x86")
_VECTORS = GROUP_ROWS // LANES


def i64(value: int) -> ir.Constant:
    return ir.Constant(_I64, value)


def array_data(context, builder, array_type, array):
    return context.make_array(array_type)(context, builder, array).data


def splat(builder, value, lanes: int = LANES):
    vector_type = ir.VectorType(_F32, lanes)
    undef = ir.Constant(vector_type, ir.Undefined)
    one = builder.insert_element(undef, value, ir.Constant(_I32, 0))
    return builder.shuffle_vector(one, undef, ir.Constant(ir.VectorType(_I32, lanes), [0] * lanes))


def load_vector(builder, pointer, index, vector_type, align):
    address = builder.bitcast(builder.gep(pointer, [index]), vector_type.as_pointer())
    return builder.load(address, align=align)


def store_vector(builder, value, pointer, index):
    builder.store(value, builder.bitcast(builder.gep(pointer, [index]), value.type.as_pointer()), align=4)


def fma(builder, a, b, c):
    return builder.fadd(builder.fmul(a, b, flags=FAST), c, flags=FAST)


def _alphas(builder, pointer, index, half: bool):
    """LANES consecutive alphas (fp16 bits or fp32) as floats."""
    if half:
        return builder.fpext(load_vector(builder, pointer, index, _VH, 2), VF)
    return load_vector(builder, pointer, index, VF, 4)


def zero_slots(builder, count: int, lanes: int = LANES):
    zero = ir.Constant(ir.VectorType(_F32, lanes), [0.0] * lanes)
    return [cgutils.alloca_once_value(builder, zero) for _ in range(count)]


def reset_slots(builder, slots):
    zero = ir.Constant(VF, [0.0] * LANES)
    for slot in slots:
        builder.store(zero, slot)


def _codes(builder, codes, index):
    """LANES unsigned code bytes as 32-bit lanes."""
    return builder.zext(load_vector(builder, codes, index, _VB, 1), _VI)


def _wide_codes(builder, codes, index):
    """`_codes` kept as 32-bit lanes: an empty asm hides the widening from LLVM, which would
    otherwise mask the low nibbles on the bytes and widen them a second time (a second
    `vpmovzxbd`, on the shuffle ports, where one `vpand` on the wide lanes does)."""
    wide = _codes(builder, codes, index)
    if not _X86:
        return wide
    return builder.asm(ir.FunctionType(_VI, [_VI]), "", "=x,0", [wide], False)


def _values(builder, codes, index):
    """LANES signed int8 values as floats (exact)."""
    return builder.sitofp(builder.sext(load_vector(builder, codes, index, _VB, 1), _VI), VF)


def _accumulate(builder, alpha, a_index, half, xs, mid, sums, acc):
    """acc += scale * sum + (zero - mid * scale) * xsum, for each vector of the group."""
    for v in range(_VECTORS):
        zero = _alphas(builder, alpha, builder.add(a_index, i64(v * LANES)), half)
        scale = _alphas(builder, alpha, builder.add(a_index, i64(GROUP_ROWS + v * LANES)), half)
        shift = builder.fsub(zero, builder.fmul(scale, ir.Constant(VF, [float(mid)] * LANES), flags=FAST),
                             flags=FAST)
        builder.store(fma(builder, shift, xs, fma(builder, scale, sums[v], builder.load(acc[v]))), acc[v])


def _block_alphas(builder, alpha, a_index, half):
    """(zeros, scales) of one block of the group, one vector of LANES floats per vector of rows."""
    zeros = [_alphas(builder, alpha, builder.add(a_index, i64(v * LANES)), half) for v in range(_VECTORS)]
    scales = [_alphas(builder, alpha, builder.add(a_index, i64(GROUP_ROWS + v * LANES)), half)
              for v in range(_VECTORS)]
    return zeros, scales


def _exact_weight(builder, value, scale, zero):
    """value * scale + zero rounded twice, exactly as MNN and `QuantizedWeight.dequantize`."""
    return builder.fadd(builder.fmul(value, scale), zero)


def _finish(builder, out, o_index, acc):
    for v in range(_VECTORS):
        store_vector(builder, builder.load(acc[v]), out, builder.add(o_index, i64(v * LANES)))


# how far ahead of the byte it reads an int4 GEMV (one token or a few) asks for its codes: the
# hardware prefetcher alone leaves the kernels waiting on memory (one thread, 72 MB of weights on
# Zen4: one token 12.5 -> 13.6 GB/s, the few-token kernel 8-14% faster; 2 to 8 KiB alike there).
# On an Emerald Rapids Xeon 4 KiB against 2: the 1.7B shape's decode t1 12.2-12.5 -> 12.7-13.9
# tok/s, t2 22.3-22.9 -> 23.5-25.8, the 135M model's t1 166-169 -> 179-189 (8 and 16 KiB no
# better on the 1.7B, slower on the 135M); with int8 activations 13.5-13.7 -> 14.4-14.5 and
# 23.9-24.1 -> 26.0-26.3
PREFETCH_BYTES = 4096


def prefetch(builder, pointer, index):
    """A read prefetch of pointer[index] into all cache levels (never faults, past the end too)."""
    module = builder.module
    fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer(), _I32, _I32, _I32])
    function = cgutils.get_or_insert_function(module, fnty, "llvm.prefetch.p0")
    address = builder.bitcast(builder.gep(pointer, [index]), ir.IntType(8).as_pointer())
    builder.call(function, [address, ir.Constant(_I32, 0), ir.Constant(_I32, 3), ir.Constant(_I32, 1)])


def _ahead(builder, j, group_bytes, groups: int):
    """Where, from its group's first code byte, a group's stream asks for the byte PREFETCH_BYTES
    past byte row j: in the group itself, then past its end in the same group of the next call
    (`groups` further on). Groups read side by side each read their own span, so the bytes
    right past one group's end are the next group's, already read; this prefetches the next
    call's instead, which were otherwise read cold (two groups at once, one thread, 0.9 GB of
    the 1.7B shape's weights: 12.6-12.9 -> 13.3-13.5 GB/s)."""
    ahead = builder.add(builder.mul(j, i64(GROUP_ROWS)), i64(PREFETCH_BYTES))
    if groups == 1:
        return ahead
    past = builder.icmp_signed(">=", ahead, group_bytes)
    return builder.select(past, builder.add(ahead, builder.mul(group_bytes, i64(groups - 1))), ahead)


def _q4_dot(groups: int):
    """The intrinsic of `groups` consecutive groups of 32 rows of an int4 GEMV: per group,
    out[o_start:o_start+32] = W_group @ x, the next group's codes, alphas and outputs right after.

    codes uint8 [ic/2][32] from c_start (byte j of row r at j*32 + r: high nibble is
    weight 2j, low nibble weight 2j+1); alpha [n_blocks][zero[32], scale[32]] from a_start
    (fp16 bits as uint16, or float32); w = zero + scale * (code - 8). x_even, x_odd: x's element
    pairs as a code byte and its low nibble weigh them (`linear.byte_weights`: the byte and its
    low nibble are converted, no shift); x_sum: x's block sums. Each byte's two products go into
    one sum a vector, in order, as the few-token kernel adds them (its rows must equal this bit
    for bit). Each row's sum is the same chain of FMAs whatever the group count, so the bits are
    the same; more groups give the loop more independent chains (`q4_group_pair_dot`)."""

    @intrinsic
    def dot(typingctx, codes, c_start, alpha, a_start, x_even, x_odd, x_sum, n_blocks, block_bytes, out, o_start):
        sig = types.void(codes, c_start, alpha, a_start, x_even, x_odd, x_sum, n_blocks, block_bytes, out, o_start)
        half = alpha.dtype == types.uint16

        def codegen(context, builder, signature, args):
            tys = signature.args
            code_p, alpha_p = array_data(context, builder, tys[0], args[0]), array_data(context, builder, tys[2], args[2])
            xe_p, xo_p = array_data(context, builder, tys[4], args[4]), array_data(context, builder, tys[5], args[5])
            xs_p, out_p = array_data(context, builder, tys[6], args[6]), array_data(context, builder, tys[9], args[9])
            c_start_v, a_start_v, blocks, per_block, o_start_v = args[1], args[3], args[7], args[8], args[10]
            group_bytes = builder.mul(builder.mul(blocks, per_block), i64(GROUP_ROWS))
            code_starts = [builder.add(c_start_v, builder.mul(group_bytes, i64(k))) for k in range(groups)]
            alpha_starts = [builder.add(a_start_v, builder.mul(blocks, i64(2 * GROUP_ROWS * k))) for k in range(groups)]
            acc = [zero_slots(builder, _VECTORS) for _ in range(groups)]
            part = [zero_slots(builder, _VECTORS) for _ in range(groups)]
            with cgutils.for_range(builder, blocks) as block_loop:
                b = block_loop.index
                for k in range(groups):
                    reset_slots(builder, part[k])
                first = builder.mul(b, per_block)
                with cgutils.for_range(builder, per_block) as byte_loop:
                    j = builder.add(first, byte_loop.index)
                    whole_x = splat(builder, builder.load(builder.gep(xe_p, [j])))
                    low_x = splat(builder, builder.load(builder.gep(xo_p, [j])))
                    for k in range(groups):
                        row0 = builder.add(code_starts[k], builder.mul(j, i64(GROUP_ROWS)))
                        prefetch(builder, code_p, builder.add(code_starts[k], _ahead(builder, j, group_bytes, groups)))
                        for v in range(_VECTORS):
                            w = _wide_codes(builder, code_p, builder.add(row0, i64(v * LANES)))
                            whole = builder.sitofp(w, VF)
                            low = _low_nibble_float(builder, w)
                            total = fma(builder, low, low_x, fma(builder, whole, whole_x, builder.load(part[k][v])))
                            builder.store(total, part[k][v])
                xs = splat(builder, builder.load(builder.gep(xs_p, [b])))
                for k in range(groups):
                    sums = [builder.load(part[k][v]) for v in range(_VECTORS)]
                    a_index = builder.add(alpha_starts[k], builder.mul(b, i64(2 * GROUP_ROWS)))
                    _accumulate(builder, alpha_p, a_index, half, xs, 8, sums, acc[k])
            for k in range(groups):
                _finish(builder, out_p, builder.add(o_start_v, i64(k * GROUP_ROWS)), acc[k])
            return context.get_dummy_value()

        return sig, codegen

    return dot


q4_group_dot = _q4_dot(1)  # one group of 32 rows (the layout: `_q4_dot`)
# two groups at once, the second's codes, alphas and outputs right after the first's: at 16 lanes
# a group is two vectors, two chains of two dependent FMAs a byte, so one group at a time waits on
# the FMAs' latency (8 cycles a byte) where two keep four chains in flight
q4_group_pair_dot = _q4_dot(2)
# At 8 lanes a group already runs four chains (and AVX2 has 16 registers). Paired there anyway on
# Zen 4 (32 registers): 16.8 against 15.6 GB/s on one thread in cache, but no gain in the 1.7B
# shape's decode from memory (three alternations, one and two threads)
PAIRED_GROUPS = _VECTORS < 4


@intrinsic
def q8_group_dot(typingctx, codes, c_start, alpha, a_start, x, x_sum, n_blocks, block, out, o_start):
    """One group of 32 rows of an int8 GEMV: int8 values [ic][32] from c_start, w = zero + scale * value."""
    sig = types.void(codes, c_start, alpha, a_start, x, x_sum, n_blocks, block, out, o_start)
    half = alpha.dtype == types.uint16

    def codegen(context, builder, signature, args):
        tys = signature.args
        code_p, alpha_p = array_data(context, builder, tys[0], args[0]), array_data(context, builder, tys[2], args[2])
        x_p, xs_p = array_data(context, builder, tys[4], args[4]), array_data(context, builder, tys[5], args[5])
        out_p = array_data(context, builder, tys[8], args[8])
        c_start_v, a_start_v, blocks, per_block, o_start_v = args[1], args[3], args[6], args[7], args[9]
        acc = zero_slots(builder, _VECTORS)
        part = zero_slots(builder, _VECTORS)
        with cgutils.for_range(builder, blocks) as block_loop:
            b = block_loop.index
            reset_slots(builder, part)
            first = builder.mul(b, per_block)
            with cgutils.for_range(builder, per_block) as column_loop:
                j = builder.add(first, column_loop.index)
                xj = splat(builder, builder.load(builder.gep(x_p, [j])))
                row0 = builder.add(c_start_v, builder.mul(j, i64(GROUP_ROWS)))
                for v in range(_VECTORS):
                    w = _values(builder, code_p, builder.add(row0, i64(v * LANES)))
                    builder.store(fma(builder, w, xj, builder.load(part[v])), part[v])
            sums = [builder.load(part[v]) for v in range(_VECTORS)]
            xs = splat(builder, builder.load(builder.gep(xs_p, [b])))
            a_index = builder.add(a_start_v, builder.mul(b, i64(2 * GROUP_ROWS)))
            _accumulate(builder, alpha_p, a_index, half, xs, 0, sums, acc)
        _finish(builder, out_p, o_start_v, acc)
        return context.get_dummy_value()

    return sig, codegen


def _dequantizer(bits: int):
    """The intrinsic writing one group's weights transposed: tile[t_start + i * t_stride + r] = w[r, i]
    for its 32 rows (int4: block_bytes = block / 2 code bytes per block; int8: block values)."""

    @intrinsic
    def dequantize(typingctx, codes, c_start, alpha, a_start, n_blocks, block_bytes, tile, t_start, t_stride):
        sig = types.void(codes, c_start, alpha, a_start, n_blocks, block_bytes, tile, t_start, t_stride)
        half = alpha.dtype == types.uint16

        def codegen(context, builder, signature, args):
            tys = signature.args
            code_p, alpha_p = (array_data(context, builder, tys[i], args[i]) for i in (0, 2))
            tile_p = array_data(context, builder, tys[6], args[6])
            c_start_v, a_start_v, blocks, per_block, t_start_v, stride = (args[i] for i in (1, 3, 4, 5, 7, 8))
            mask, four = ir.Constant(_VI, [15] * LANES), ir.Constant(_VI, [4] * LANES)
            eight = ir.Constant(VF, [8.0] * LANES)
            with cgutils.for_range(builder, blocks) as block_loop:
                b = block_loop.index
                a_index = builder.add(a_start_v, builder.mul(b, i64(2 * GROUP_ROWS)))
                zeros, scales = _block_alphas(builder, alpha_p, a_index, half)
                with cgutils.for_range(builder, per_block) as byte_loop:
                    j = builder.add(builder.mul(b, per_block), byte_loop.index)
                    row0 = builder.add(c_start_v, builder.mul(j, i64(GROUP_ROWS)))
                    first = builder.add(t_start_v, builder.mul(builder.mul(j, i64(8 // bits)), stride))
                    for v in range(_VECTORS):
                        if bits == 4:
                            w = _codes(builder, code_p, builder.add(row0, i64(v * LANES)))
                            values = [builder.fsub(builder.uitofp(builder.lshr(w, four), VF), eight),
                                      builder.fsub(builder.uitofp(builder.and_(w, mask), VF), eight)]
                        else:
                            values = [_values(builder, code_p, builder.add(row0, i64(v * LANES)))]
                        for i, value in enumerate(values):
                            target = builder.add(builder.add(first, builder.mul(i64(i), stride)), i64(v * LANES))
                            store_vector(builder, _exact_weight(builder, value, scales[v], zeros[v]), tile_p, target)
            return context.get_dummy_value()

        return sig, codegen

    return dequantize


q4_group_dequantize = _dequantizer(4)
q8_group_dequantize = _dequantizer(8)



_MAGIC = 1 << 23  # a float32 with this exponent holds integers 0 .. 2^23 - 1 in its mantissa


def _exact_float(builder, value):
    """LANES integers 0..255 as floats (a signed conversion: one instruction without AVX-512)."""
    return builder.sitofp(value, VF)


_NIBBLE_LOOKUP = _X86 and LANES == 16  # vpermps reads 4 bits of each index at 16 lanes, 3 at 8


def _low_nibble_float(builder, value):
    """The low nibbles of LANES code bytes (in 32-bit lanes) as floats 0..15. At 16 lanes on x86
    one `vpermps` from a table of the 16 floats (it reads the low 4 bits of each lane, so no mask):
    one micro-op where the mask and the conversion are two on the ports the FMAs need, the same
    bits (every table entry is the conversion's value)."""
    if not _NIBBLE_LOOKUP:
        return _exact_float(builder, builder.and_(value, ir.Constant(_VI, [15] * LANES)))
    function = cgutils.get_or_insert_function(builder.module, ir.FunctionType(VF, [VF, _VI]),
                                              "llvm.x86.avx512.permvar.sf.512")
    return builder.call(function, [ir.Constant(VF, [float(n) for n in range(16)]), value])


def _small_to_float(builder, value):
    """LANES integers 0..255 as floats, exactly as `uitofp` gives them, but as an integer OR
    and a float subtract (2^23 + v - 2^23): the FMA ports, which a few-token pass of 3 or more rows
    keeps busy, are left to the FMAs (x86 runs `vcvtdq2ps` on them, the subtract on the add
    ports; 3 rows on: 11-12% faster on Zen4)."""
    bits = builder.or_(value, ir.Constant(_VI, [0x4B000000] * LANES))
    return builder.fsub(builder.bitcast(bits, VF), ir.Constant(VF, [float(_MAGIC)] * LANES))


def _few_tokens_rows(builder, bits, first_token, tokens, half, pointers, values):
    """The code of one group of rows for token rows first_token.. first_token + tokens - 1 (an i64
    value and a count of at most TOKENS_A_PASS, see `_few_tokens_dot`)."""
    code_p, alpha_p, xe_p, xo_p, xs_p, out_p = pointers
    c_start_v, a_start_v, x_stride_v, blocks, per_block, o_start_v, o_stride_v = values
    per_pass = FEW_VECTORS_A_PASS
    mask = ir.Constant(_VI, [15] * LANES)
    middle = ir.Constant(VF, [8.0 if bits == 4 else 0.0] * LANES)
    token_rows = [builder.add(first_token, i64(t)) for t in range(tokens)]
    # two rows leave the FMA ports idle half the time (each sum's two FMAs a byte wait on each other);
    # at 16 lanes (Intel's cores, where a zmm OR and subtract take the FMA ports as the conversion
    # does) the one conversion is one micro-op where the trick is two
    small_ints = tokens > 2 and LANES == 8
    nibble = _small_to_float if small_ints else _exact_float
    acc = zero_slots(builder, tokens * per_pass)
    part = zero_slots(builder, tokens * per_pass)
    with cgutils.for_range(builder, i64(_VECTORS // per_pass)) as pass_loop:
        first_row = builder.mul(pass_loop.index, i64(per_pass * LANES))
        reset_slots(builder, acc)
        with cgutils.for_range(builder, blocks) as block_loop:
            b = block_loop.index
            reset_slots(builder, part)
            with cgutils.for_range(builder, per_block) as byte_loop:
                j = builder.add(builder.mul(b, per_block), byte_loop.index)
                row0 = builder.add(builder.add(c_start_v, builder.mul(j, i64(GROUP_ROWS))), first_row)
                prefetch(builder, code_p, builder.add(row0, i64(PREFETCH_BYTES)))
                weights = []
                for u in range(per_pass):
                    index = builder.add(row0, i64(u * LANES))
                    if bits == 4:  # the byte and its low nibble, as `q4_group_dot`
                        w = _wide_codes(builder, code_p, index)
                        low = (nibble(builder, builder.and_(w, mask)) if small_ints
                               else _low_nibble_float(builder, w))
                        weights.append((nibble(builder, w), low))
                    else:
                        weights.append((_values(builder, code_p, index),))
                for t in range(tokens):
                    x_index = builder.add(builder.mul(token_rows[t], x_stride_v), j)
                    xs = [splat(builder, builder.load(builder.gep(xe_p, [x_index])))]
                    if bits == 4:
                        xs.append(splat(builder, builder.load(builder.gep(xo_p, [x_index]))))
                    for u in range(per_pass):
                        slot = part[t * per_pass + u]
                        total = builder.load(slot)
                        for w, x in zip(weights[u], xs):
                            total = fma(builder, w, x, total)
                        builder.store(total, slot)
            a_index = builder.add(builder.add(a_start_v, builder.mul(b, i64(2 * GROUP_ROWS))), first_row)
            for u in range(per_pass):
                zero = _alphas(builder, alpha_p, builder.add(a_index, i64(u * LANES)), half)
                scale = _alphas(builder, alpha_p, builder.add(a_index, i64(GROUP_ROWS + u * LANES)), half)
                shift = builder.fsub(zero, builder.fmul(scale, middle, flags=FAST), flags=FAST)
                for t in range(tokens):
                    x_sum = builder.load(builder.gep(xs_p, [builder.add(builder.mul(token_rows[t], blocks), b)]))
                    slot = acc[t * per_pass + u]
                    total = fma(builder, scale, builder.load(part[t * per_pass + u]), builder.load(slot))
                    builder.store(fma(builder, shift, splat(builder, x_sum), total), slot)
        for t in range(tokens):
            row = builder.add(builder.add(o_start_v, builder.mul(token_rows[t], o_stride_v)), first_row)
            for u in range(per_pass):
                store_vector(builder, builder.load(acc[t * per_pass + u]), out_p, builder.add(row, i64(u * LANES)))


def _vectors_a_pass() -> int:
    """Vectors of LANES rows a few-token pass covers: its TOKENS_A_PASS * this partial sums, the
    widened codes and the broadcasts must stay in registers. AVX-512VL gives numba's host target
    32 vector registers (the whole group, 4 vectors of 8 or 2 of 16: each hi/lo FMA chain has
    enough independent neighbours to hide the FMA latency; 2 vectors a pass there, no partial
    sum spilled, were slower on Zen 4: 37 against 44 G multiply-adds a second at 4 rows, one
    thread); 16 registers (AVX2, NEON's 128-bit pairs) hold 2."""
    return _VECTORS if host_has("avx512vl") else 2


FEW_VECTORS_A_PASS = _vectors_a_pass()
FEW_TOKENS_MAX = 8  # token rows the few-token kernels take at once
TOKENS_A_PASS = 4  # more rows go as two passes, each widening the codes again (from cache): a pass's
# x broadcasts then stay within the load ports' share


def _few_tokens_dot(bits: int):
    """The intrinsic of one group of 32 rows for 2..FEW_TOKENS_MAX token rows at once: every code
    byte is loaded and widened once and multiplied with each token's x, so a verify step of a few
    tokens reads the weight once instead of once per token.

    Same layout and block arithmetic as `q4_group_dot` / `q8_group_dot`, for token t:
    out[o_start + t * o_stride + r] = W_group[r] @ x_t, with x_t's even (int4: and odd) elements at
    x_even[t * x_stride:] (x_odd) and its block sums at x_sum[t * n_blocks:]. Up to TOKENS_A_PASS
    rows run in one pass, more in two passes of about half each; the code is compiled once for
    each pass size (2..TOKENS_A_PASS, chosen by a switch), which keeps the function small enough to
    compile in seconds (a count outside 2..FEW_TOKENS_MAX is the caller's to refuse).
    """

    @intrinsic
    def dot(typingctx, tokens, codes, c_start, alpha, a_start, x_even, x_odd, x_stride, x_sum, n_blocks,
            block_bytes, out, o_start, o_stride):
        sig = types.void(tokens, codes, c_start, alpha, a_start, x_even, x_odd, x_stride, x_sum, n_blocks,
                         block_bytes, out, o_start, o_stride)
        half = alpha.dtype == types.uint16

        def codegen(context, builder, signature, args):
            tys = signature.args
            pointers = [array_data(context, builder, tys[i], args[i]) for i in (1, 3, 5, 6, 8, 11)]
            values = [context.cast(builder, args[i], tys[i], types.int64) for i in (2, 4, 7, 9, 10, 12, 13)]
            count = context.cast(builder, args[0], tys[0], types.int64)
            one_pass = builder.icmp_signed("<=", count, i64(TOKENS_A_PASS))
            head = builder.select(one_pass, count, builder.sdiv(builder.add(count, i64(1)), i64(2)))
            passes = builder.select(one_pass, i64(1), i64(2))
            with cgutils.for_range(builder, passes) as pass_loop:
                second = builder.icmp_signed("==", pass_loop.index, i64(1))
                first_token = builder.select(second, head, i64(0))
                size = builder.select(second, builder.sub(count, head), head)
                end = builder.append_basic_block("few.end")
                widest = builder.append_basic_block(f"few.{TOKENS_A_PASS}")
                switch = builder.switch(size, widest)
                for rows in range(2, TOKENS_A_PASS + 1):
                    block = widest if rows == TOKENS_A_PASS else builder.append_basic_block(f"few.{rows}")
                    if rows < TOKENS_A_PASS:
                        switch.add_case(i64(rows), block)
                    builder.position_at_end(block)
                    _few_tokens_rows(builder, bits, first_token, rows, half, pointers, values)
                    builder.branch(end)
                builder.position_at_end(end)
            return context.get_dummy_value()

        return sig, codegen

    return dot


q4_few_dot = _few_tokens_dot(4)
q8_few_dot = _few_tokens_dot(8)
