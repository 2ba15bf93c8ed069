"""Load every kernel the low-memory path runs before the model's weights, then hand the JIT
compiler's code pages back.

numba compiles (or loads from its disk cache) a kernel on its first call, through LLVM:
libllvmlite is ~180 MB, of which ~100 MB become resident. Once every kernel is loaded LLVM
is not needed again, so its file-backed pages are paged out (madvise MADV_PAGEOUT, Linux):
they stay in the page cache and fault back in should a new kernel ever be compiled.
Loading here, with tiny arrays of the same types as the real calls, also keeps the one-off
cost inside `load()` instead of the first token.

The first run on a machine (an empty cache) compiles: numba holds one lock per process while it
compiles, so the kernels are split into PARTS compiled by up to one process per core at once
(`python -m mnnllm_backends.cpu.kernels.warmup THREADS PART...`), each writing the shared disk
cache; this process then loads them all from it. A marker file in the cache folder records a
complete warm-up, so that later runs neither start processes nor announce a compile.

This process never compiles a kernel itself, so that it runs the very code a later process loads:
numba links a copy of each called kernel into its caller's library (weak symbols, optimized again
there), and a caller compiled in this process calls the callee's own library, compiled before it,
while one loaded from the cache calls its own copy. Under fastmath the copies differ (an FMA
fused to the other product), so a GEMV gave other bits in the process that compiled it.
"""
from __future__ import annotations

import ctypes
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numba
import numpy as np

from mnnllm_core.backend_api import announce

from . import SOURCE_DIGEST, activation, attention, decode_attention, delta_rule, linear, norm, rope, set_threads
from .layout import PackedWeight, interleave_rows
from .program import warm_up_replay
from .team import warm_up_team
from .simd import GROUP_ROWS

log = logging.getLogger(__name__)

_MADV_PAGEOUT = 21
_IC = 32


def _weights() -> list[PackedWeight]:
    """A one-group weight with int4 and one with int8 codes (fp16 alphas)."""
    return [PackedWeight(bits, GROUP_ROWS, _IC, _IC, np.zeros(GROUP_ROWS * _IC * bits // 8, np.uint8),
                         np.zeros(2 * GROUP_ROWS, np.uint16)) for bits in (4, 8)]


def _gemv(threads: int) -> None:
    """With threads, the parallel GEMV and the part of its rows a thread team's rank computes."""
    x = np.zeros(_IC, np.float32)
    for weight in _weights():
        gemv = linear.Gemv([weight])
        gemv(x, 1)
        if threads > 1:
            gemv.parallel_worth = True
            gemv(x, threads)
            linear._gemv_part(weight.bits, gemv.codes, gemv.alphas, gemv.targets, gemv.starts, x, weight.n_blocks,
                              weight.block, 0, threads)


def _few_tokens(threads: int) -> None:
    few = np.zeros((2, _IC), np.float32)
    for weight in _weights():
        gemv = linear.Gemv([weight])
        gemv.few(few, 1)
        if threads > 1:
            gemv.parallel_worth = True
            gemv.few(few, threads)
            linear._few_gemv_part(weight.bits, gemv.codes, gemv.alphas, gemv.few_targets(2), gemv.starts, few,
                                  weight.n_blocks, weight.block, 0, threads)


def _matmul(threads: int) -> None:
    """The one-thread GEMM too: a later one-thread run then finds every kernel it needs cached."""
    for weight in _weights():
        for count in {1, threads}:
            linear.matmul(weight, np.zeros((2, _IC), np.float32), np.zeros((2, GROUP_ROWS), np.float32), count)


def _rows(threads: int) -> None:
    """Packing, norms, RoPE and the gated activation."""
    rows = np.zeros((1, 8), np.uint8)
    interleave_rows(rows, np.zeros(8 * GROUP_ROWS, np.uint8))
    rows.setflags(write=False)  # rows straight from the memory-mapped weight file
    interleave_rows(rows, np.zeros(8 * GROUP_ROWS, np.uint8))
    x = np.zeros(_IC, np.float32)
    gamma, empty = np.ones(_IC, np.float32), np.zeros(0, np.float32)
    norm.normalize_rows(x, _IC, gamma, empty, 1e-6, True, x.copy())
    norm.add_normalize_rows(x, x, _IC, gamma, empty, 1e-6, True, x.copy(), x.copy())
    table = x.reshape(1, _IC)
    rope.rope_qk(x, x, 1, 1, _IC, _IC, table, table, False, empty, empty, 0.0, True, False, empty, empty, 0.0, True,
                 x.copy(), x.copy())
    activation.mul_silu(x, x, x.copy())


def _attention(threads: int) -> None:
    """`attend` and, calling it, the replay's fused cache append + attention."""
    q = np.zeros((2, 1, 16), np.float32)
    keys_t, values = np.zeros((1, 16, 16), np.float32), np.zeros((1, 16, 16), np.float32)
    empty = np.zeros(0, np.float32)
    attention.attend(q, keys_t, values, 0, np.float32(1.0), empty, q.copy())
    one = q[:1].copy()
    attention.append_attend(one, one.copy(), one.copy(), keys_t, values, np.zeros(1, np.int64), np.float32(1.0), empty,
                            one.copy())
    if threads > 1:
        attention.attend_parallel(q, keys_t, values, 0, np.float32(1.0), empty, q.copy())


def _decode(threads: int) -> None:
    """One token's attention at depth: the fp32 cache's (`decode_attend`, which calls the split
    kernel) and a StoredKVCache's over int8 keys with int8 or float32 values; for threads, their
    thread-team parts (query heads)."""
    one = np.zeros((1, 1, 16), np.float32)
    keys_t, values = np.zeros((1, 16, 16), np.float32), np.zeros((1, 16, 16), np.float32)
    empty, past, rows = np.zeros(0, np.float32), np.zeros(1, np.int64), np.zeros((1, 16), np.float32)
    attention.decode_attend(one, keys_t, values, 0, np.float32(1.0), empty, one.copy(), threads)
    attention.append_decode(one, one.copy(), one.copy(), keys_t, values, past, np.float32(1.0), empty, one.copy(),
                            threads)
    if threads > 1:  # a thread team's part of it
        attention.append_decode_part(one, one.copy(), one.copy(), keys_t, values, past, np.float32(1.0), empty,
                                     one.copy(), threads, 0, 1)
    codes = np.zeros((1, 16, 16), np.int8)
    for stored_values, scale in ((codes.copy(), rows), (values, np.zeros((0, 0), np.float32))):
        decode_attention.append_attend_stored(one, one.copy(), one.copy(), codes, rows, rows.copy(), stored_values,
                                              scale, scale.copy(), past, np.float32(1.0), empty, one.copy(), threads)
        if threads > 1:
            decode_attention.append_attend_stored_part(one, one.copy(), one.copy(), codes, rows, rows.copy(),
                                                       stored_values, scale, scale.copy(), past, np.float32(1.0),
                                                       empty, one.copy(), threads, 0, 1)
        decode_attention.attend_stored(one[0], codes, rows, rows, stored_values, scale, scale, 1, np.float32(1.0),
                                       empty, one[0].copy(), 1)


def _delta_rule(threads: int) -> None:
    qk, state = np.zeros((1, 2, 16), np.float32), np.zeros((2, 16, 16), np.float32)
    gates = np.zeros((1, 2), np.float32)
    delta_rule._scan(qk, qk, qk, gates, gates, state, qk.copy(), 0)
    if threads > 1:
        delta_rule._scan_parallel(qk, qk, qk, gates, gates, state, qk.copy(), 0)


def _replay(threads: int) -> None:
    """The decode replay's program runner (it calls the kernels the other parts compile) and, for
    threads, the thread team's loops (`team.py`)."""
    warm_up_replay()
    if threads > 1:
        warm_up_team()


# each part and the seconds its first compile took alone in a process for 2 threads (2-core EPYC,
# numba 0.68, numba's own first compiles included; the mean of two runs on a lightly loaded
# machine): the compile processes get parts of about equal total time
PARTS: dict[str, tuple[Callable[[int], None], float]] = {
    "gemv": (_gemv, 3.0), "few_tokens": (_few_tokens, 3.6), "matmul": (_matmul, 4.2), "rows": (_rows, 2.3),
    "attention": (_attention, 4.7), "decode": (_decode, 8.0), "delta_rule": (_delta_rule, 2.4),
    "replay": (_replay, 2.1)}


def compiled_before(threads: int) -> bool:
    """Whether a complete warm-up for `threads` ran on this machine (its marker in the cache
    folder): else loading the kernels compiles them."""
    cache = Path(numba.config.CACHE_DIR)
    return any(path.exists() for path in (_marker(threads), cache / f"warm-{SOURCE_DIGEST}-parallel"))


def _marker(threads: int) -> Path:
    """A parallel warm-up loads the serial kernels too, so its marker covers both."""
    return Path(numba.config.CACHE_DIR) / f"warm-{SOURCE_DIGEST}-{'parallel' if threads > 1 else 'serial'}"


def warm_up(threads: int) -> None:
    """Load the kernels for `threads` threads (fp16 alphas, int4 and int8 codes), compiling them
    first, in parallel processes, when this machine's cache lacks them."""
    if not compiled_before(threads):
        _compile(threads)
    for run, _ in PARTS.values():
        run(threads)
    marker = _marker(threads)
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
    except OSError as err:  # a read-only cache: later runs load what numba could write, if anything
        log.debug("no warm-up marker in %s: %s", marker.parent, err)
    release_compiler_pages()


def _compile(threads: int) -> None:
    """Compile every part into the disk cache, in up to one process per core (not this one: see
    the module's docstring), announced before (with the expected time) and after (with the time
    it took)."""
    processes = max(1, min(len(PARTS), os.cpu_count() or 1))
    shares = _balanced(processes)
    expected = max(sum(PARTS[name][1] for name in share) for share in shares) + 2.0
    announce(f"compiling the cpu kernels for this machine, once: about {expected:.0f} s in {processes} "
             f"process{'es' if processes > 1 else ''} (later runs load them from {numba.config.CACHE_DIR})")
    start = time.perf_counter()
    workers = []
    for share in shares:
        try:
            workers.append(subprocess.Popen([sys.executable, "-m", __name__, str(threads), *share],
                                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        except OSError as err:  # no interpreter to start (an embedded Python): this process compiles it all
            log.warning("no compile process (%s): compiling the cpu kernels in this one", err)
            break
    for worker, share in zip(workers, shares):
        _, errors = worker.communicate()
        if worker.returncode:  # what it did not compile, this process compiles when it loads
            log.warning("compiling kernels %s in a separate process failed (%s)", ", ".join(share),
                        errors.strip().splitlines()[-1:] or worker.returncode)
    announce(f"compiled the cpu kernels in {time.perf_counter() - start:.0f} s")


def _balanced(count: int) -> list[list[str]]:
    """PARTS in `count` shares of about equal compile time, the largest share first."""
    shares: list[list[str]] = [[] for _ in range(count)]
    totals = [0.0] * count
    for name, (_, seconds) in sorted(PARTS.items(), key=lambda item: -item[1][1]):
        lightest = totals.index(min(totals))
        shares[lightest].append(name)
        totals[lightest] += seconds
    return [share for _, share in sorted(zip(totals, shares), key=lambda pair: -pair[0]) if share]


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


if __name__ == "__main__":  # one compile process of `_compile`: THREADS PART...
    set_threads(int(sys.argv[1]))
    for part in sys.argv[2:]:
        PARTS[part][0](int(sys.argv[1]))
