"""Load every kernel the low-memory path runs before the model's weights, then hand the JIT
compiler's code pages back.

numba compiles (or loads from its disk cache) a kernel on its first call, through LLVM:
libllvmlite is ~180 MB, of which ~100 MB become resident. Once every kernel is loaded LLVM
is not needed again, so its file-backed pages are paged out (madvise MADV_PAGEOUT, Linux):
they stay in the page cache and fault back in should a new kernel ever be compiled.
Loading here, with tiny arrays of the same types as the real calls, also keeps the one-off
cost inside `load()` instead of the first token.
"""
from __future__ import annotations

import ctypes
import logging
import sys

import numpy as np

from . import activation, attention, delta_rule, linear, norm, rope
from .layout import PackedWeight, interleave_rows
from .simd import GROUP_ROWS

log = logging.getLogger(__name__)

_MADV_PAGEOUT = 21


def warm_up(threads: int) -> None:
    """Load the kernels for `threads` threads (fp16 alphas, int4 and int8 codes)."""
    ic = 32
    x = np.zeros(ic, np.float32)
    for bits in (4, 8):
        codes = np.zeros(GROUP_ROWS * ic * bits // 8, np.uint8)
        weight = PackedWeight(bits, GROUP_ROWS, ic, ic, codes, np.zeros(2 * GROUP_ROWS, np.uint16))
        gemv = linear.Gemv([weight])
        few = np.zeros((2, ic), np.float32)
        gemv(x, 1)
        gemv.few(few, 1)
        if threads > 1:
            gemv.parallel_worth = True
            gemv(x, threads)
            gemv.few(few, threads)
        linear.matmul(weight, np.zeros((2, ic), np.float32), np.zeros((2, GROUP_ROWS), np.float32), threads)
    rows = np.zeros((1, 8), np.uint8)
    interleave_rows(rows, np.zeros(8 * GROUP_ROWS, np.uint8))
    rows.setflags(write=False)  # rows straight from the memory-mapped weight file
    interleave_rows(rows, np.zeros(8 * GROUP_ROWS, np.uint8))
    gamma, empty = np.ones(ic, np.float32), np.zeros(0, np.float32)
    norm.normalize_rows(x, ic, gamma, empty, 1e-6, True, x.copy())
    norm.add_normalize_rows(x, x, ic, gamma, empty, 1e-6, True, x.copy(), x.copy())
    table = x.reshape(1, ic)
    rope.rope_qk(x, x, 1, 1, ic, ic, table, table, False, empty, empty, 0.0, True, False, empty, empty, 0.0, True,
                 x.copy(), x.copy())
    q = np.zeros((2, 1, 16), np.float32)
    keys_t, values = np.zeros((1, 16, 16), np.float32), np.zeros((1, 16, 16), np.float32)
    attention.attend(q, keys_t, values, 0, np.float32(1.0), empty, q.copy())
    if threads > 1:
        attention.attend_parallel(q, keys_t, values, 0, np.float32(1.0), empty, q.copy())
    activation.mul_silu(x, x, x.copy())
    qk, state = np.zeros((1, 2, 16), np.float32), np.zeros((2, 16, 16), np.float32)
    gates = np.zeros((1, 2), np.float32)
    delta_rule._scan(qk, qk, qk, gates, gates, state, qk.copy(), 0)
    if threads > 1:
        delta_rule._scan_parallel(qk, qk, qk, gates, gates, state, qk.copy(), 0)
    release_compiler_pages()


def release_compiler_pages() -> int:
    """Page out the read-only mappings of libllvmlite; the bytes released (0 where unsupported)."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
        madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        with open("/proc/self/maps") as maps:
            regions = [line.split() for line in maps]
    except (OSError, AttributeError):
        return 0
    released = 0
    for fields in regions:
        if len(fields) < 6 or "llvmlite" not in fields[5] or fields[1][1] == "w":
            continue
        start, end = (int(v, 16) for v in fields[0].split("-"))
        if madvise(start, end - start, _MADV_PAGEOUT) == 0:
            released += end - start
    log.debug("paged out %d MiB of JIT compiler mappings", released >> 20)
    return released
