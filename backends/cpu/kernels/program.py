"""A replayed step's kernel calls as one compiled call (`run_program`).

A program is a table of instructions (int64 rows: an opcode, then indexes into tables of the
arrays the kernels read and write, sizes, and the address of the kernel to call) plus those
tables, made once at record time (`step_program.py`). An array table holds one row per array,
its address and element count, so a program reads its arrays straight from memory; the
instruction's owner keeps the arrays alive. `run_program` walks the instructions calling the very
kernels the per-op loop calls, with the same arguments, so a step's values are the loop's bit for
bit, and a step costs one dispatch from Python instead of one per op. Parallel kernels
(`_gemv_parallel`) still split their rows over the threads inside each call.

The kernels are called through their compiled entry points' addresses (`kernel_address`), not
compiled into the program: numba would otherwise link every kernel's code into the program and
optimize it all again (parfors included), ~17 s on a first run; so `run_program` compiles in
about a second and calls the kernels the other warm-up parts compile and cache.
"""
from __future__ import annotations

from functools import cache

import numpy as np
from numba import carray, types
from numba.core.dispatcher import Dispatcher
from numba.extending import intrinsic

from . import jit
from .calls import address_of, function_at

GEMV, COPY, NORM, ADD_NORM, ROPE, MUL_SILU, ATTEND, FEW_GEMV = range(8)
INT8_LINEAR = 8  # the int8-activation linear (`int8_dot.linear`)
DECODE_ATTEND, STORED_ATTEND = 9, 10  # one token's attention: fp32 split at depth; over a StoredKVCache
WIDTH = 26  # int64 fields of one instruction
KERNEL = WIDTH - 1  # the field with the address of the instruction's kernel (`kernel_address`)
PART_KERNEL = WIDTH - 2  # a linear's: the address of its kernel for one part of its rows (`team.py`)
# the addresses of the step functions of the instructions `run_instruction` and `run_part` call
# rather than link in (`step_addresses`: the int8 linear's and the StoredKVCache attention's, whose
# step functions compile with their kernels' warm-up parts, which most runs never load)
STEP, PART_STEP = WIDTH - 3, WIDTH - 4
LINEARS = (GEMV, FEW_GEMV, INT8_LINEAR)  # the instructions a thread team splits by rows
# ... and those it splits by query heads (one token's attention); these and INT8_LINEAR have a
# part -1 that rank 0 runs first, alone (the new cache rows, unless each part writes those it
# reads: `decode_attention.parts_write_own_rows`; the quantized input rows, unless each rank
# quantizes its own: `int8_dot.own_rows`)
ATTENTIONS = (DECODE_ATTEND, STORED_ATTEND)
# an attention's field 21: 1 when it joins the attention before it (another KV slot's rows of a
# batched step: other rows, another cache), so a team runs the two without a barrier between
JOINS = 21
ONE = np.int64(1)  # a token's row count not as a literal: `_tensor` compiles once per literal shape

_F32, _BYTES, _HALVES, _INTS = types.float32[::1], types.uint8[::1], types.uint16[::1], types.int64[::1]
_F64 = types.float64[::1]
_TENSOR = types.Array(types.float32, 3, "C")
_MATRIX = types.Array(types.float32, 2, "C")
_CODES = types.Array(types.int8, 3, "C")


def _gemv_signature(alphas: types.Type, parallel: bool, few: bool = False, part: bool = False) -> types.Signature:
    """`_gemv` (or `_gemv_parallel`, with its thread count) for fp16-bit or float32 alphas; with
    `few`, `_few_gemv` (`_few_gemv_parallel`), whose x is [tokens, ic]; with `part`, `_gemv_part`
    (`_few_gemv_part`), with a part and the count of parts."""
    members = [types.UniTuple(t, 3) for t in (_BYTES, alphas, _F32)]
    return types.none(types.int64, *members, _INTS, _MATRIX if few else _F32, types.int64, types.int64,
                      *([types.int64] * (2 if part else 1 if parallel else 0)))


def _int8_signature(alphas: types.Type, parallel: bool, part: bool = False) -> types.Signature:
    """`int8_dot.linear` (`linear_parallel`, with its thread count; `linear_part`, with a part and
    the count of parts) for fp16-bit or float32 alphas."""
    members = [types.UniTuple(t, 3) for t in (_BYTES, types.int16[::1], alphas, _F32)]
    return types.none(_MATRIX, types.boolean, _BYTES, *members, _INTS, types.int64, types.int64,
                      *([types.int64] * (2 if part else 1 if parallel else 0)))


# the signature each instruction's kernel is compiled for (the types the per-op calls have)
SIGNATURES = {
    "gemv_half": _gemv_signature(_HALVES, False), "gemv_half_parallel": _gemv_signature(_HALVES, True),
    "gemv_real": _gemv_signature(_F32, False), "gemv_real_parallel": _gemv_signature(_F32, True),
    "few_half": _gemv_signature(_HALVES, False, True), "few_half_parallel": _gemv_signature(_HALVES, True, True),
    "few_real": _gemv_signature(_F32, False, True), "few_real_parallel": _gemv_signature(_F32, True, True),
    "norm": types.none(_F32, types.int64, _F32, _F32, types.float64, types.boolean, _F32),
    "add_norm": types.none(_F32, _F32, types.int64, _F32, _F32, types.float64, types.boolean, _F32, _F32),
    "rope": types.none(_F32, _F32, types.int64, types.int64, types.int64, types.int64,
                       types.Array(types.float32, 2, "C"), types.Array(types.float32, 2, "C"), types.boolean, _F32,
                       _F32, types.float64, types.boolean, types.boolean, _F32, _F32, types.float64, types.boolean,
                       _F32, _F32),
    "mul_silu": types.none(_F32, _F32, _F32),
    "attend": types.none(_TENSOR, _TENSOR, _TENSOR, _TENSOR, _TENSOR, _INTS, types.float32, _F32, _TENSOR),
    "decode": types.none(_TENSOR, _TENSOR, _TENSOR, _TENSOR, _TENSOR, _INTS, types.float32, _F32, _TENSOR, types.int64),
    **{f"stored_{kind}": types.none(_TENSOR, _TENSOR, _TENSOR, _CODES, _MATRIX, _MATRIX, values, _MATRIX, _MATRIX,
                                    _INTS, types.float32, _F32, _TENSOR, types.int64)
       for kind, values in (("i8", _CODES), ("f32", _TENSOR))},
}
SIGNATURES.update({f"{name}_part": types.none(*SIGNATURES[name].args, types.int64, types.int64)
                   for name in ("decode", "stored_i8", "stored_f32")})
SIGNATURES.update({f"int8_{alphas}{suffix}": _int8_signature(kind, bool(suffix))
                   for alphas, kind in (("half", _HALVES), ("real", _F32)) for suffix in ("", "_parallel")})
SIGNATURES.update({f"{kind}_{alphas}_part": _gemv_signature(real, False, kind == "few", True)
                   for kind in ("gemv", "few") for alphas, real in (("half", _HALVES), ("real", _F32))})
SIGNATURES.update({f"int8_{alphas}_part": _int8_signature(real, False, True)
                   for alphas, real in (("half", _HALVES), ("real", _F32))})
# the runners, called by address too (`run_program`, the thread team's loops): `run_instruction`,
# `run_part` and `team.run_rank`
_TABLES = [_F64, *[types.Array(types.int64, 2, "C")] * 5]
SIGNATURES.update({"instruction": types.none(_INTS, *_TABLES),
                   "part": types.none(_INTS, *_TABLES, types.int64, types.int64),
                   "rank": types.none(types.int64, types.int64, types.int64, types.int64)})


_KERNELS = {NORM: "norm", ADD_NORM: "add_norm", ROPE: "rope", MUL_SILU: "mul_silu", ATTEND: "attend",
            DECODE_ATTEND: "decode"}


def kernel_signature(instruction: list[int]) -> str | None:
    """The SIGNATURES entry of the kernel an instruction calls (None: it calls none)."""
    if instruction[0] in (GEMV, FEW_GEMV):  # fields 2 (fp16-bit alphas) and 16 (threads), see `_gemv_step`
        kind = "gemv" if instruction[0] == GEMV else "few"
        return f"{kind}_{'half' if instruction[2] else 'real'}{'_parallel' if instruction[16] else ''}"
    if instruction[0] == INT8_LINEAR:  # fields 1 (fp16-bit alphas) and 20 (threads), see `_int8_step`
        return f"int8_{'half' if instruction[1] else 'real'}{'_parallel' if instruction[20] else ''}"
    if instruction[0] == STORED_ATTEND:  # field 19: int8 values, see `_stored_step`
        return f"stored_{'i8' if instruction[19] else 'f32'}"
    return _KERNELS.get(instruction[0])


def part_signature(instruction: list[int]) -> str | None:
    """The SIGNATURES entry of the kernel computing one part of a linear instruction's rows or of
    a one-token attention's heads (None: a thread team runs the instruction on one thread)."""
    if instruction[0] in (GEMV, FEW_GEMV):
        return f"{'gemv' if instruction[0] == GEMV else 'few'}_{'half' if instruction[2] else 'real'}_part"
    if instruction[0] == INT8_LINEAR:
        return f"int8_{'half' if instruction[1] else 'real'}_part"
    if instruction[0] in ATTENTIONS:
        return f"{kernel_signature(instruction)}_part"
    return None


def kernel_address(kernel: Dispatcher, signature: str) -> int:
    """The address of `kernel`'s compiled code for SIGNATURES[signature] (`calls.address_of`)."""
    return address_of(kernel, SIGNATURES[signature])


def _function_at(signature: str):
    """A callable of the kernel at an address from `kernel_address` (`calls.function_at`)."""
    return function_at(SIGNATURES[signature])


_gemv_half, _gemv_half_parallel = _function_at("gemv_half"), _function_at("gemv_half_parallel")
_gemv_real, _gemv_real_parallel = _function_at("gemv_real"), _function_at("gemv_real_parallel")
_few_half, _few_half_parallel = _function_at("few_half"), _function_at("few_half_parallel")
_few_real, _few_real_parallel = _function_at("few_real"), _function_at("few_real_parallel")
_normalize_rows, _add_normalize_rows = _function_at("norm"), _function_at("add_norm")
_rope_qk, _mul_silu, _append_attend = _function_at("rope"), _function_at("mul_silu"), _function_at("attend")
_int8_half, _int8_half_parallel = _function_at("int8_half"), _function_at("int8_half_parallel")
_int8_real, _int8_real_parallel = _function_at("int8_real"), _function_at("int8_real_parallel")
_append_decode = _function_at("decode")
_stored_i8, _stored_f32 = _function_at("stored_i8"), _function_at("stored_f32")
_gemv_half_part, _gemv_real_part = _function_at("gemv_half_part"), _function_at("gemv_real_part")
_few_half_part, _few_real_part = _function_at("few_half_part"), _function_at("few_real_part")
_int8_half_part, _int8_real_part = _function_at("int8_half_part"), _function_at("int8_real_part")
_decode_part = _function_at("decode_part")
_stored_i8_part, _stored_f32_part = _function_at("stored_i8_part"), _function_at("stored_f32_part")
instruction_at, part_at, rank_at = _function_at("instruction"), _function_at("part"), _function_at("rank")


@intrinsic
def _pointer(typingctx, address):
    """An int64 address as a void pointer (for numba.carray)."""
    def codegen(context, builder, sig, args):
        return builder.inttoptr(args[0], context.get_value_type(types.voidptr))
    return types.voidptr(types.int64), codegen


@jit()
def _floats(table, i):
    return carray(_pointer(table[i, 0]), table[i, 1], np.float32)


@jit()
def _tensor(table, i, shape):
    """Entry i as float32 [shape] (its element count is the product of shape)."""
    return carray(_pointer(table[i, 0]), shape, np.float32)


@jit()
def _codes(table, i, shape):
    """Entry i (of the uint8 table) as int8 [shape]."""
    return carray(_pointer(table[i, 0]), shape, np.int8)


@jit()
def _bytes(table, i):
    return carray(_pointer(table[i, 0]), table[i, 1], np.uint8)


@jit()
def _halves(table, i):
    return carray(_pointer(table[i, 0]), table[i, 1], np.uint16)


@jit()
def _ints(table, i):
    return carray(_pointer(table[i, 0]), table[i, 1], np.int64)


@jit()
def _shorts(table, i):
    """Entry i of the fp16-bit table as int16 (the int8 linear's code sums)."""
    return carray(_pointer(table[i, 0]), table[i, 1], np.int16)


@jit()
def _gemv_step(c, floats, codes, reals, halves, ints):
    """Fields: 1 bits, 2 alpha in `halves` (fp16 bits) else `reals`, 3-5 codes, 6-8 alphas,
    9-11 targets, 12 starts, 13 x, 14 blocks, 15 block size, 16 threads (0: on this thread)."""
    code = (_bytes(codes, c[3]), _bytes(codes, c[4]), _bytes(codes, c[5]))
    outs = (_floats(floats, c[9]), _floats(floats, c[10]), _floats(floats, c[11]))
    starts = _ints(ints, c[12])
    x = _floats(floats, c[13])
    if c[2]:
        alphas = (_halves(halves, c[6]), _halves(halves, c[7]), _halves(halves, c[8]))
        if c[16]:
            _gemv_half_parallel(c[KERNEL])(c[1], code, alphas, outs, starts, x, c[14], c[15], c[16])
        else:
            _gemv_half(c[KERNEL])(c[1], code, alphas, outs, starts, x, c[14], c[15])
    else:
        real_alphas = (_floats(reals, c[6]), _floats(reals, c[7]), _floats(reals, c[8]))
        if c[16]:
            _gemv_real_parallel(c[KERNEL])(c[1], code, real_alphas, outs, starts, x, c[14], c[15], c[16])
        else:
            _gemv_real(c[KERNEL])(c[1], code, real_alphas, outs, starts, x, c[14], c[15])


@jit()
def _few_gemv_step(c, floats, codes, reals, halves, ints):
    """`_gemv_step`'s fields for the few-token GEMV, x [field 17 tokens, ic]."""
    code = (_bytes(codes, c[3]), _bytes(codes, c[4]), _bytes(codes, c[5]))
    outs = (_floats(floats, c[9]), _floats(floats, c[10]), _floats(floats, c[11]))
    starts = _ints(ints, c[12])
    tokens = c[17]
    x = _tensor(floats, c[13], (tokens, floats[c[13], 1] // tokens))
    if c[2]:
        alphas = (_halves(halves, c[6]), _halves(halves, c[7]), _halves(halves, c[8]))
        if c[16]:
            _few_half_parallel(c[KERNEL])(c[1], code, alphas, outs, starts, x, c[14], c[15], c[16])
        else:
            _few_half(c[KERNEL])(c[1], code, alphas, outs, starts, x, c[14], c[15])
    else:
        real_alphas = (_floats(reals, c[6]), _floats(reals, c[7]), _floats(reals, c[8]))
        if c[16]:
            _few_real_parallel(c[KERNEL])(c[1], code, real_alphas, outs, starts, x, c[14], c[15], c[16])
        else:
            _few_real(c[KERNEL])(c[1], code, real_alphas, outs, starts, x, c[14], c[15])


@jit()
def _int8_arrays(c, floats, codes, halves, ints):
    """An int8 linear's arrays but its alphas: x, symmetric, scratch, weights, code sums, targets, starts."""
    tokens = c[2]
    x = _tensor(floats, c[3], (tokens, floats[c[3], 1] // tokens))
    scratch = _bytes(codes, c[4])
    weights = (_bytes(codes, c[5]), _bytes(codes, c[6]), _bytes(codes, c[7]))
    sums = (_shorts(halves, c[8]), _shorts(halves, c[9]), _shorts(halves, c[10]))
    outs = (_floats(floats, c[14]), _floats(floats, c[15]), _floats(floats, c[16]))
    starts = _ints(ints, c[17])
    symmetric = c[21] != 0
    return x, symmetric, scratch, weights, sums, outs, starts


@jit()
def _int8_step(c, floats, codes, reals, halves, ints):
    """Fields: 1 alphas in `halves` (fp16 bits) else `reals`, 2 token rows, 3 x, 4 the quantized
    rows' bytes (in `codes`), 5-7 weight codes, 8-10 code sums (int16, in `halves`), 11-13 alphas,
    14-16 targets, 17 starts, 18 blocks, 19 block size, 20 threads (0: on this thread), 21 symmetric."""
    x, symmetric, scratch, weights, sums, outs, starts = _int8_arrays(c, floats, codes, halves, ints)
    if c[1]:
        alphas = (_halves(halves, c[11]), _halves(halves, c[12]), _halves(halves, c[13]))
        if c[20]:
            _int8_half_parallel(c[KERNEL])(x, symmetric, scratch, weights, sums, alphas, outs, starts, c[18], c[19],
                                           c[20])
        else:
            _int8_half(c[KERNEL])(x, symmetric, scratch, weights, sums, alphas, outs, starts, c[18], c[19])
    else:
        real_alphas = (_floats(reals, c[11]), _floats(reals, c[12]), _floats(reals, c[13]))
        if c[20]:
            _int8_real_parallel(c[KERNEL])(x, symmetric, scratch, weights, sums, real_alphas, outs, starts, c[18],
                                           c[19], c[20])
        else:
            _int8_real(c[KERNEL])(x, symmetric, scratch, weights, sums, real_alphas, outs, starts, c[18], c[19])


@jit()
def _attend_step(c, scalars, floats, ints):
    """Fields: 1-5 q, k, v, keys, values; 6 past (in `ints`); 7 scale (in `scalars`); 8 sinks;
    9 out; 10-14 tokens, heads, kv heads, head size, cache capacity."""
    tokens, heads, kv_heads, dim, capacity = c[10], c[11], c[12], c[13], c[14]
    _append_attend(c[KERNEL])(
        _tensor(floats, c[1], (tokens, heads, dim)), _tensor(floats, c[2], (tokens, kv_heads, dim)),
        _tensor(floats, c[3], (tokens, kv_heads, dim)), _tensor(floats, c[4], (kv_heads, dim, capacity)),
        _tensor(floats, c[5], (kv_heads, capacity, dim)), _ints(ints, c[6]),
        np.float32(scalars[c[7]]), _floats(floats, c[8]), _tensor(floats, c[9], (tokens, heads, dim)))


@jit()
def _decode_step(c, scalars, floats, ints, part, parts):
    """`_attend_step`'s fields for one token (field 10), then 15 threads; with parts > 0, part
    `part` of `parts` by the part kernel (`append_decode_part`)."""
    heads, kv_heads, dim, capacity = c[11], c[12], c[13], c[14]
    q, k, v = (_tensor(floats, c[1], (ONE, heads, dim)), _tensor(floats, c[2], (ONE, kv_heads, dim)),
               _tensor(floats, c[3], (ONE, kv_heads, dim)))
    keys_t, values = _tensor(floats, c[4], (kv_heads, dim, capacity)), _tensor(floats, c[5], (kv_heads, capacity, dim))
    past, scale, sinks, out = (_ints(ints, c[6]), np.float32(scalars[c[7]]), _floats(floats, c[8]),
                               _tensor(floats, c[9], (ONE, heads, dim)))
    if parts > 0:
        _decode_part(c[PART_KERNEL])(q, k, v, keys_t, values, past, scale, sinks, out, c[15], part, parts)
    else:
        _append_decode(c[KERNEL])(q, k, v, keys_t, values, past, scale, sinks, out, c[15])


@jit()
def _stored_step(c, scalars, floats, codes, ints, part, parts):
    """Fields: 1-3 q, k, v; 4-6 the keys' int8 codes (in `codes`), scale, zero; 7-9 the values'
    (int8 codes in `codes` when field 19, else float32 rows and empty scale and zero); 10 past
    (in `ints`); 11 scale (in `scalars`); 12 sinks; 13 out; 14-18 heads, kv heads, head size,
    cache capacity, threads; with parts > 0, part `part` of `parts` (`append_attend_stored_part`)."""
    heads, kv_heads, dim, capacity = c[14], c[15], c[16], c[17]
    rows = (kv_heads, capacity)
    values_rows = rows if c[19] else (0, 0)
    q, k, v = (_tensor(floats, c[1], (ONE, heads, dim)), _tensor(floats, c[2], (ONE, kv_heads, dim)),
               _tensor(floats, c[3], (ONE, kv_heads, dim)))
    keys = (_codes(codes, c[4], (kv_heads, capacity, dim)), _tensor(floats, c[5], rows), _tensor(floats, c[6], rows))
    v_scale, v_zero = _tensor(floats, c[8], values_rows), _tensor(floats, c[9], values_rows)
    past, scale, sinks, out = (_ints(ints, c[10]), np.float32(scalars[c[11]]), _floats(floats, c[12]),
                               _tensor(floats, c[13], (ONE, heads, dim)))
    if c[19]:
        v_codes = _codes(codes, c[7], (kv_heads, capacity, dim))
        if parts > 0:
            _stored_i8_part(c[PART_KERNEL])(q, k, v, *keys, v_codes, v_scale, v_zero, past, scale, sinks, out, c[18],
                                            part, parts)
        else:
            _stored_i8(c[KERNEL])(q, k, v, *keys, v_codes, v_scale, v_zero, past, scale, sinks, out, c[18])
    else:
        v_rows = _tensor(floats, c[7], (kv_heads, capacity, dim))
        if parts > 0:
            _stored_f32_part(c[PART_KERNEL])(q, k, v, *keys, v_rows, v_scale, v_zero, past, scale, sinks, out, c[18],
                                             part, parts)
        else:
            _stored_f32(c[KERNEL])(q, k, v, *keys, v_rows, v_scale, v_zero, past, scale, sinks, out, c[18])


@jit()
def _rope_step(c, scalars, floats):
    """Fields: 1 q, 2 k, 3-6 heads, kv heads, head size, rope size, 7 cos, 8 sin, 9 their rows,
    10-13 q norm (on, gamma, beta, rms), 14 its eps, 15-18 and 19 the k norm's, 20 q out, 21 k out."""
    rows = c[9]
    _rope_qk(c[KERNEL])(
        _floats(floats, c[1]), _floats(floats, c[2]), c[3], c[4], c[5], c[6],
        _tensor(floats, c[7], (rows, floats[c[7], 1] // rows)), _tensor(floats, c[8], (rows, floats[c[8], 1] // rows)),
        c[10] != 0, _floats(floats, c[11]), _floats(floats, c[12]),
        scalars[c[14]], c[13] != 0, c[15] != 0, _floats(floats, c[16]), _floats(floats, c[17]), scalars[c[19]],
        c[18] != 0, _floats(floats, c[20]), _floats(floats, c[21]))


@jit()
def run_instruction(c, scalars, floats, codes, reals, halves, ints):
    """Instruction `c` (see the step functions for the fields)."""
    op = c[0]
    if op == GEMV:
        _gemv_step(c, floats, codes, reals, halves, ints)
    elif op == COPY:  # a loop: a slice assignment compiles numba's shape-error formatting (seconds)
        target, source = _floats(floats, c[1]), _floats(floats, c[2])
        for j in range(target.size):
            target[j] = source[j]
    elif op == NORM:
        _normalize_rows(c[KERNEL])(_floats(floats, c[1]), c[2], _floats(floats, c[3]), _floats(floats, c[4]),
                                   scalars[c[5]], c[6] != 0, _floats(floats, c[7]))
    elif op == ADD_NORM:
        _add_normalize_rows(c[KERNEL])(_floats(floats, c[1]), _floats(floats, c[2]), c[3], _floats(floats, c[4]),
                                       _floats(floats, c[5]), scalars[c[6]], c[7] != 0, _floats(floats, c[8]),
                                       _floats(floats, c[9]))
    elif op == ROPE:
        _rope_step(c, scalars, floats)
    elif op == MUL_SILU:
        _mul_silu(c[KERNEL])(_floats(floats, c[1]), _floats(floats, c[2]), _floats(floats, c[3]))
    elif op == ATTEND:
        _attend_step(c, scalars, floats, ints)
    elif op == FEW_GEMV:
        _few_gemv_step(c, floats, codes, reals, halves, ints)
    elif op == DECODE_ATTEND:
        _decode_step(c, scalars, floats, ints, np.int64(0), np.int64(0))
    elif op == INT8_LINEAR or op == STORED_ATTEND:
        instruction_at(c[STEP])(c, scalars, floats, codes, reals, halves, ints)


@jit()
def run_program(code, scalars, floats, codes, reals, halves, ints, instruction):
    """Each instruction of `code` in order; the array tables: float32 values, uint8 codes,
    float32 alphas, fp16-bit alphas, int64. `instruction`: `run_instruction`'s address
    (`runner_address`), called through it rather than linked in, so that this loop compiles in
    a fraction of a second instead of optimizing every step function again."""
    run = instruction_at(instruction)
    for i in range(code.shape[0]):
        run(code[i], scalars, floats, codes, reals, halves, ints)


@jit()
def run_part(c, scalars, floats, codes, reals, halves, ints, part, parts):
    """Part `part` of `parts` of a linear instruction's rows (the split of its parallel kernel) or
    of a one-token attention's query heads, by its part kernel (field PART_KERNEL); part -1
    quantizes the int8 linear's input rows, or writes the attention's new cache rows."""
    op = c[0]
    if op == DECODE_ATTEND:
        _decode_step(c, scalars, floats, ints, part, parts)
        return
    if op == INT8_LINEAR or op == STORED_ATTEND:
        part_at(c[PART_STEP])(c, scalars, floats, codes, reals, halves, ints, part, parts)
        return
    code = (_bytes(codes, c[3]), _bytes(codes, c[4]), _bytes(codes, c[5]))
    outs = (_floats(floats, c[9]), _floats(floats, c[10]), _floats(floats, c[11]))
    starts = _ints(ints, c[12])
    if op == GEMV:
        x = _floats(floats, c[13])
        if c[2]:
            alphas = (_halves(halves, c[6]), _halves(halves, c[7]), _halves(halves, c[8]))
            _gemv_half_part(c[PART_KERNEL])(c[1], code, alphas, outs, starts, x, c[14], c[15], part, parts)
        else:
            real_alphas = (_floats(reals, c[6]), _floats(reals, c[7]), _floats(reals, c[8]))
            _gemv_real_part(c[PART_KERNEL])(c[1], code, real_alphas, outs, starts, x, c[14], c[15], part, parts)
        return
    tokens = c[17]
    rows = _tensor(floats, c[13], (tokens, floats[c[13], 1] // tokens))
    if c[2]:
        alphas = (_halves(halves, c[6]), _halves(halves, c[7]), _halves(halves, c[8]))
        _few_half_part(c[PART_KERNEL])(c[1], code, alphas, outs, starts, rows, c[14], c[15], part, parts)
    else:
        real_alphas = (_floats(reals, c[6]), _floats(reals, c[7]), _floats(reals, c[8]))
        _few_real_part(c[PART_KERNEL])(c[1], code, real_alphas, outs, starts, rows, c[14], c[15], part, parts)


@jit()
def int8_instruction(c, scalars, floats, codes, reals, halves, ints):
    """`run_instruction` for an int8 linear (`_int8_step`), called by address (field STEP)."""
    _int8_step(c, floats, codes, reals, halves, ints)


@jit()
def int8_instruction_part(c, scalars, floats, codes, reals, halves, ints, part, parts):
    """`run_part` for an int8 linear, by its part kernel (field PART_KERNEL), called by address
    (field PART_STEP)."""
    x, symmetric, scratch, weights, sums, outs, starts = _int8_arrays(c, floats, codes, halves, ints)
    if c[1]:
        alphas = (_halves(halves, c[11]), _halves(halves, c[12]), _halves(halves, c[13]))
        _int8_half_part(c[PART_KERNEL])(x, symmetric, scratch, weights, sums, alphas, outs, starts, c[18], c[19],
                                        part, parts)
    else:
        real_alphas = (_floats(reals, c[11]), _floats(reals, c[12]), _floats(reals, c[13]))
        _int8_real_part(c[PART_KERNEL])(x, symmetric, scratch, weights, sums, real_alphas, outs, starts, c[18],
                                        c[19], part, parts)


@jit()
def stored_instruction(c, scalars, floats, codes, reals, halves, ints):
    """`run_instruction` for an attention over a StoredKVCache (`_stored_step`), called by address."""
    _stored_step(c, scalars, floats, codes, ints, np.int64(0), np.int64(0))


@jit()
def stored_instruction_part(c, scalars, floats, codes, reals, halves, ints, part, parts):
    """`run_part` for an attention over a StoredKVCache, called by address."""
    _stored_step(c, scalars, floats, codes, ints, part, parts)


_STEPS = {INT8_LINEAR: (int8_instruction, int8_instruction_part),
          STORED_ATTEND: (stored_instruction, stored_instruction_part)}


@cache
def step_addresses(op: int, team: bool) -> tuple[int, int]:
    """Fields STEP and PART_STEP of an instruction `op`: the addresses of its step functions where
    the runners call them rather than link them in (0 for the others), the part's with a `team`.
    The int8 linear's and the StoredKVCache attention's arguments take more code to unpack than
    the rest of the runners together: linked into `run_instruction` and `run_part` they were ~2 s
    of a first run's compile (for a step most runs never take); here they compile with the warm-up
    part of their kernels ("int8", "stored"), which loads them."""
    steps = _STEPS.get(op)
    if steps is None:
        return 0, 0
    return kernel_address(steps[0], "instruction"), kernel_address(steps[1], "part") if team else 0


def array_table(arrays: list[np.ndarray]) -> np.ndarray:
    """int64 [len(arrays), 2]: each (C-contiguous) array's address and element count."""
    table = np.zeros((len(arrays), 2), np.int64)
    for row, array in zip(table, arrays):
        row[:] = array.__array_interface__["data"][0], array.size
    return table


@cache
def runner_address(runner: str) -> int:
    """The address of "instruction" (`run_instruction`) or "part" (`run_part`), for the loops
    that call them (`run_program`, `team.run_rank`)."""
    return kernel_address(run_instruction if runner == "instruction" else run_part, runner)


def warm_up_replay() -> None:
    """Load the program runner (a part of `warmup.PARTS`, so that a first run compiles it beside
    the kernels it calls)."""
    tables = [array_table([np.zeros(1, dtype)]) for dtype in (np.float32, np.uint8, np.float32, np.uint16, np.int64)]
    run_program(np.zeros((0, WIDTH), np.int64), np.zeros(1), *tables, runner_address("instruction"))
