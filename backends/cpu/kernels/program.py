"""A replayed step's kernel calls as one compiled call (`run_program`), and the kernels only a
replay calls, loaded at load like the rest (`warm_up_replay`, one of `warmup.PARTS`).

A program is a table of instructions (int64 rows: an opcode, then indexes into typed lists of
the arrays the kernels read and write, and sizes) plus those lists, made once at record time
(`replay.py`). `run_program` walks the table calling the very kernels the per-op loop calls,
with the same arguments, so a step's values are the loop's bit for bit, and a step costs one
dispatch from Python instead of one per op. Parallel kernels (`_gemv_parallel`) still split
their rows over the threads inside each call.
"""
from __future__ import annotations

import warnings

import numpy as np
from numba import types
from numba.core.errors import NumbaTypeSafetyWarning
from numba.typed import List

from . import jit
from .activation import mul_silu
from .attention import append_attend
from .linear import _gemv, _gemv_parallel
from .norm import add_normalize_rows, normalize_rows
from .rope import rope_qk

GEMV, COPY, NORM, ADD_NORM, ROPE, MUL_SILU, ATTEND = range(7)
WIDTH = 24  # int64 fields of one instruction


@jit()
def _gemv_step(c, floats, codes, reals, halves, ints):
    """Fields: 1 bits, 2 alpha in `halves` (fp16 bits) else `reals`, 3-5 codes, 6-8 alphas,
    9-11 targets, 12 starts, 13 x, 14 blocks, 15 block size, 16 threads (0: on this thread)."""
    code = (codes[c[3]], codes[c[4]], codes[c[5]])
    outs = (floats[c[9]], floats[c[10]], floats[c[11]])
    if c[2]:
        alphas = (halves[c[6]], halves[c[7]], halves[c[8]])
        if c[16]:
            _gemv_parallel(c[1], code, alphas, outs, ints[c[12]], floats[c[13]], c[14], c[15], c[16])
        else:
            _gemv(c[1], code, alphas, outs, ints[c[12]], floats[c[13]], c[14], c[15])
    else:
        real_alphas = (reals[c[6]], reals[c[7]], reals[c[8]])
        if c[16]:
            _gemv_parallel(c[1], code, real_alphas, outs, ints[c[12]], floats[c[13]], c[14], c[15], c[16])
        else:
            _gemv(c[1], code, real_alphas, outs, ints[c[12]], floats[c[13]], c[14], c[15])


@jit()
def _attend_step(c, scalars, floats, ints):
    """Fields: 1-5 q, k, v, keys, values; 6 past (in `ints`); 7 scale (in `scalars`); 8 sinks;
    9 out; 10-14 tokens, heads, kv heads, head size, cache capacity."""
    tokens, heads, kv_heads, dim, capacity = c[10], c[11], c[12], c[13], c[14]
    append_attend(floats[c[1]].reshape((tokens, heads, dim)), floats[c[2]].reshape((tokens, kv_heads, dim)),
                  floats[c[3]].reshape((tokens, kv_heads, dim)), floats[c[4]].reshape((kv_heads, dim, capacity)),
                  floats[c[5]].reshape((kv_heads, capacity, dim)), ints[c[6]], np.float32(scalars[c[7]]),
                  floats[c[8]], floats[c[9]].reshape((tokens, heads, dim)))


@jit()
def _rope_step(c, scalars, floats):
    """Fields: 1 q, 2 k, 3-6 heads, kv heads, head size, rope size, 7 cos, 8 sin, 9 their rows,
    10-13 q norm (on, gamma, beta, rms), 14 its eps, 15-18 and 19 the k norm's, 20 q out, 21 k out."""
    rows = c[9]
    cos, sin = floats[c[7]], floats[c[8]]
    rope_qk(floats[c[1]], floats[c[2]], c[3], c[4], c[5], c[6], cos.reshape((rows, cos.size // rows)),
            sin.reshape((rows, sin.size // rows)), c[10] != 0, floats[c[11]], floats[c[12]], scalars[c[14]],
            c[13] != 0, c[15] != 0, floats[c[16]], floats[c[17]], scalars[c[19]], c[18] != 0, floats[c[20]],
            floats[c[21]])


@jit()
def run_program(code, scalars, floats, codes, reals, halves, ints):
    """Each instruction of `code` in order (see the step functions for the fields)."""
    for i in range(code.shape[0]):
        c = code[i]
        op = c[0]
        if op == GEMV:
            _gemv_step(c, floats, codes, reals, halves, ints)
        elif op == COPY:
            floats[c[1]][:] = floats[c[2]]
        elif op == NORM:
            normalize_rows(floats[c[1]], c[2], floats[c[3]], floats[c[4]], scalars[c[5]], c[6] != 0, floats[c[7]])
        elif op == ADD_NORM:
            add_normalize_rows(floats[c[1]], floats[c[2]], c[3], floats[c[4]], floats[c[5]], scalars[c[6]],
                               c[7] != 0, floats[c[8]], floats[c[9]])
        elif op == ROPE:
            _rope_step(c, scalars, floats)
        elif op == MUL_SILU:
            mul_silu(floats[c[1]], floats[c[2]], floats[c[3]])
        elif op == ATTEND:
            _attend_step(c, scalars, floats, ints)


_REAL = types.float32[::1]


@jit()
def _new_lists():
    return (List.empty_list(_REAL), List.empty_list(types.uint8[::1]), List.empty_list(_REAL),
            List.empty_list(types.uint16[::1]), List.empty_list(types.int64[::1]))


@jit()
def _push(target, array):
    target.append(array)


def empty_lists() -> tuple[List, List, List, List, List]:
    """The typed lists of a program: float32, uint8 codes, float32 alphas, fp16-bit alphas, int64
    (made and filled by compiled functions: numba compiles a typed list's own Python-side
    methods in every process, ~0.1-0.5 s each, where these load from the disk cache)."""
    return _new_lists()


def append_array(target: List, array: np.ndarray) -> None:
    """target.append(array). A read-only array (weights mapped from a file) goes in through the
    list's own append, as the list's writable type: safe, as the kernels only read such arrays."""
    if array.flags.writeable:
        _push(target, array)
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NumbaTypeSafetyWarning)
        target.append(array)


def warm_up_replay() -> None:
    """Load the replay's kernels with tiny arrays of the real calls' types (a part of
    `warmup.PARTS`, so that a first run compiles them beside the others)."""
    q = np.zeros((1, 1, 16), np.float32)
    keys_t, values = np.zeros((1, 16, 16), np.float32), np.zeros((1, 16, 16), np.float32)
    append_attend(q, q.copy(), q.copy(), keys_t, values, np.zeros(1, np.int64), np.float32(1.0),
                  np.zeros(0, np.float32), q.copy())
    lists = empty_lists()
    for target, dtype in zip(lists, (np.float32, np.uint8, np.float32, np.uint16, np.int64)):
        append_array(target, np.zeros(1, dtype))
    run_program(np.zeros((0, WIDTH), np.int64), np.zeros(1), *lists)
