"""Load the kernels the low-memory path will run before the model's weights, then hand the JIT
compiler's code pages back.

numba compiles (or loads from its disk cache) a kernel on its first call, through LLVM:
libllvmlite is ~180 MB, of which ~100 MB become resident. Once every kernel is loaded LLVM
is not needed again, so its file-backed pages are paged out (madvise MADV_PAGEOUT, Linux) and,
where another process maps them too, dropped from this process (MADV_DONTNEED): they stay in
the page cache and fault back in should a new kernel ever be compiled.
Loading here, with tiny arrays of the same types as the real calls, also keeps the one-off
cost inside `load()` instead of the first token.

The kernels come in PARTS, and a runtime loads only those its settings run (`parts_for`: the
thread team's loops with threads, the StoredKVCache's attention with an int8 KV cache, the int8
linears with `cpu_int8_activations`); a model's op that needs a rarer part (the gated delta rule)
asks for it when it is created. A part missing from the cache is compiled on a machine's first run:
numba holds one lock per process while it compiles, so the missing parts are compiled by up to one
process per core at once (`python -m mnnllm_backends.cpu.kernels.warmup THREADS PART...`), each
writing the shared disk cache; this process then loads them from it. A marker file per part in
the cache folder records a complete compile, so that later runs neither start processes nor
announce one.

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
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numba
import numpy as np

from mnnllm_core.backend_api import announce

from . import SOURCE_DIGEST, activation, attention, decode_attention, delta_rule, int8_dot, linear, norm, rope, set_threads
from .layout import PackedWeight, interleave_half_alpha, interleave_rows
from .program import INT8_LINEAR, STORED_ATTEND, step_addresses, warm_up_replay
from .team import warm_up_team
from .simd import GROUP_ROWS

log = logging.getLogger(__name__)

_MADV_DONTNEED = 4
_MADV_PAGEOUT = 21
_IC = 32


def _weights(groups: int = 1) -> list[PackedWeight]:
    """A weight of `groups` groups with int4 and one with int8 codes (fp16 alphas): the same
    kernels (the bits are an argument), so one process of either width finds both loaded."""
    rows = groups * GROUP_ROWS
    return [PackedWeight(bits, rows, _IC, _IC, np.zeros(rows * _IC * bits // 8, np.uint8),
                         np.zeros(2 * rows, np.uint16)) for bits in (4, 8)]


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
    """The GEMM `linear.matmul` runs: its groups on the calling thread, and for threads the
    parallel kernel that calls it by address."""
    for weight in _weights(groups=2):
        x, out = np.zeros((2, _IC), np.float32), np.zeros((2, 2 * GROUP_ROWS), np.float32)
        linear.matmul(weight, x, out, 1)
        if threads > 1:
            linear.matmul(weight, x, out, threads)


def _rows(threads: int) -> None:
    """Packing, norms, RoPE and the gated activation."""
    rows = np.zeros((1, 8), np.uint8)
    interleave_rows(rows, np.zeros(8 * GROUP_ROWS, np.uint8))
    rows.setflags(write=False)  # rows straight from the memory-mapped weight file
    interleave_rows(rows, np.zeros(8 * GROUP_ROWS, np.uint8))
    alpha = np.zeros((1, 1), np.uint32)
    interleave_half_alpha(alpha, alpha, np.zeros(2 * GROUP_ROWS, np.uint16))
    x = np.zeros(_IC, np.float32)
    gamma, empty = np.ones(_IC, np.float32), np.zeros(0, np.float32)
    norm.normalize_rows(x, _IC, gamma, empty, 1e-6, True, x.copy())
    norm.add_normalize_rows(x, x, _IC, gamma, empty, 1e-6, True, x.copy(), x.copy())
    table = x.reshape(1, _IC)
    rope.rope_qk(x, x, 1, 1, _IC, _IC, table, table, False, empty, empty, 0.0, True, False, empty, empty, 0.0, True,
                 x.copy(), x.copy())
    activation.mul_silu(x, x, x.copy())


def _attention(threads: int) -> None:
    """Attention over the fp32 cache: `attend` and, calling it, the replay's fused cache append +
    attention; for threads, a prompt's parallel one (which calls `attend`'s tasks by address)."""
    q = np.zeros((2, 1, 16), np.float32)
    keys_t, values = np.zeros((1, 16, 16), np.float32), np.zeros((1, 16, 16), np.float32)
    empty, past = np.zeros(0, np.float32), np.zeros(1, np.int64)
    attention.attend(q, keys_t, values, 0, np.float32(1.0), empty, q.copy())
    attention.append_attend(q, q.copy(), q.copy(), keys_t, values, past, np.float32(1.0), empty, q.copy())
    if threads > 1:
        attention.attend_parallel(q, keys_t, values, 0, np.float32(1.0), empty, q.copy(), threads)


def _decode(threads: int) -> None:
    """One token's attention over an fp32 cache below SPLIT_FROM rows (`decode_attend`, on the
    calling thread) and the replay's fused append + attention; for threads, a thread team's part
    of it (query heads)."""
    _one_token(threads, attention.decode_attend, attention.append_decode, attention.append_decode_part)


def _deep_decode(threads: int) -> None:
    """The same kernels for a cache that can reach SPLIT_FROM rows with threads, splitting the keys
    over the threads there (`attention.splits_keys`): loaded when a cache first grows that far."""
    _one_token(threads, attention.decode_attend_deep, attention.append_decode_deep,
               attention.append_decode_deep_part)


def _one_token(threads: int, attend, append, append_part) -> None:
    one = np.zeros((1, 1, 16), np.float32)
    keys_t, values = np.zeros((1, 16, 16), np.float32), np.zeros((1, 16, 16), np.float32)
    empty, past = np.zeros(0, np.float32), np.zeros(1, np.int64)
    attend(one, keys_t, values, 0, np.float32(1.0), empty, one.copy(), threads)
    append(one, one.copy(), one.copy(), keys_t, values, past, np.float32(1.0), empty, one.copy(), threads)
    if threads > 1:
        append_part(one, one.copy(), one.copy(), keys_t, values, past, np.float32(1.0), empty, one.copy(), threads,
                    0, 1)


def _stored(threads: int) -> None:
    """One token's attention over a StoredKVCache (int8 keys, int8 or float32 values), and for
    threads a thread team's part of it (query heads)."""
    one = np.zeros((1, 1, 16), np.float32)
    values, empty = np.zeros((1, 16, 16), np.float32), np.zeros(0, np.float32)
    past, rows = np.zeros(1, np.int64), np.zeros((1, 16), np.float32)
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
    step_addresses(STORED_ATTEND, threads > 1)  # the replay's step functions of such an attention


def _delta_rule(threads: int) -> None:
    qk, state = np.zeros((1, 2, 16), np.float32), np.zeros((2, 16, 16), np.float32)
    gates = np.zeros((1, 2), np.float32)
    delta_rule._scan(qk, qk, qk, gates, gates, state, qk.copy(), 0)
    if threads > 1:
        delta_rule._scan_parallel(qk, qk, qk, gates, gates, state, qk.copy(), 0)


def _int8(threads: int) -> None:
    """Packing into the int8 layout (from the weight file's read-only rows too), the
    int8-activation linear (`cpu_int8_activations`) for one token and a few, and for threads its
    parallel kernel and a thread team's part of it."""
    rows = np.zeros((1, _IC // 2), np.uint8)
    codes, sums = np.zeros(GROUP_ROWS * _IC // 2, np.uint8), np.zeros(GROUP_ROWS, np.int16)
    int8_dot.interleave_nibbles(rows, _IC, codes, sums)
    rows.setflags(write=False)
    int8_dot.interleave_nibbles(rows, _IC, codes, sums)
    weight = int8_dot.Int8Weight(GROUP_ROWS, _IC, _IC, GROUP_ROWS, codes, sums, np.zeros(2 * GROUP_ROWS, np.uint16))
    for tokens in (1, 2):
        x, out = np.zeros((tokens, _IC), np.float32), np.zeros(tokens * GROUP_ROWS, np.float32)
        scratch = np.zeros(int8_dot.scratch_bytes(tokens, _IC, weight.n_blocks), np.uint8)
        int8_dot.BoundLinear(weight, x, out.reshape(tokens, -1), tokens > 1, 1)()
        if threads > 1:
            call = int8_dot.bind(x, False, scratch, [weight], [out], threads)
            call()
            int8_dot.linear_part(*call.args[:-1], 0, threads)
    step_addresses(INT8_LINEAR, threads > 1)  # the replay's step functions of an int8 linear


def _replay(threads: int) -> None:
    """The decode replay's program runner (it calls the kernels the other parts compile) and, for
    threads, the thread team's loops (`team.py`), which call the runner's instructions."""
    warm_up_replay()
    if threads > 1:
        warm_up_team()


@dataclass(frozen=True)
class Part:
    run: Callable[[int], None]
    # CPU seconds of its first compile in a process for 2 threads (the process's start,
    # `_PROCESS_SECONDS`, not included): the compile processes get parts of about equal total time
    seconds: float
    # a part whose kernels this one calls: both go to the same compile process, that one first
    # (in another process the callees would be compiled twice)
    after: str | None = None


# in the order a compile process runs its parts: "decode" calls "attention"'s `attend`, which
# the process then finds compiled instead of compiling it again.
# Seconds: on a 2-core EPYC (znver4), numba 0.68, in one process in the order of `parts_for`
# ("decode" after "attention"), the rarer parts after those.
PARTS: dict[str, Part] = {
    "gemv": Part(_gemv, 3.0), "few_tokens": Part(_few_tokens, 4.0), "matmul": Part(_matmul, 2.6),
    "rows": Part(_rows, 2.9), "attention": Part(_attention, 3.6), "replay": Part(_replay, 5.2),
    "decode": Part(_decode, 3.4, after="attention"), "deep_decode": Part(_deep_decode, 9.5, after="attention"),
    "stored": Part(_stored, 9.9), "delta_rule": Part(_delta_rule, 1.9), "int8": Part(_int8, 8.5)}


def parts_for(threads: int, kv_stored: bool = False, int8_activations: bool = False) -> list[str]:
    """The parts a runtime runs on any model: linears of one token and of a prompt, norms, RoPE,
    attention and the replay; `kv_stored`, the attention over a StoredKVCache (int8 rows);
    `int8_activations`, the int8 linears (on a cpu that has them). Rarer steps ask for their own
    part (`warm_up`) when their op is resized or created: few-token linears (a speculative step, a
    prompt of 2..8 tokens), the gated delta rule, the one-token attention that splits the keys of a
    cache that can reach SPLIT_FROM rows (`attention.splits_keys`)."""
    parts = ["gemv", "matmul", "rows", "attention", "replay", "stored" if kv_stored else "decode"]
    if int8_activations and int8_dot.supported():
        parts.append("int8")
    return parts


def compiled_before(part: str, threads: int) -> bool:
    """Whether `part` for `threads` was compiled on this machine (its marker in the cache
    folder): else loading it compiles it."""
    return any(marker.exists() for marker in _markers(part, threads))


def _markers(part: str, threads: int) -> list[Path]:
    """The markers that show `part` loadable for `threads`: its own, and for one thread the
    parallel one (every part's warm-up for threads loads its one-thread kernels too)."""
    cache = Path(numba.config.CACHE_DIR)
    modes = ["parallel"] if threads > 1 else ["serial", "parallel"]
    return [cache / f"warm-{SOURCE_DIGEST}-{part}-{mode}" for mode in modes]


def warm_up(threads: int, parts: Iterable[str] = ()) -> None:
    """Load `parts` (default: `parts_for(threads)`) for `threads` threads, compiling first, in
    parallel processes, those this machine's cache lacks."""
    wanted = list(dict.fromkeys(parts or parts_for(threads)))
    missing = [part for part in wanted if not compiled_before(part, threads)]
    if missing:
        _compile(threads, missing)
    for part in wanted:
        PARTS[part].run(threads)
        if part in missing:
            _mark(part, threads)
    release_compiler_pages()


def _mark(part: str, threads: int) -> None:
    marker = _markers(part, threads)[0]
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
    except OSError as err:  # a read-only cache: later runs load what numba could write, if anything
        log.debug("no warm-up marker in %s: %s", marker.parent, err)


_PROCESS_SECONDS = 1.2  # a compile process's start: the interpreter, numba's import and first compile


def _compile(threads: int, parts: list[str]) -> None:
    """Compile `parts` into the disk cache, in up to one process per core (not this one: see
    the module's docstring), announced before (with the expected time) and after (with the time
    it took)."""
    processes = max(1, min(len(parts), os.cpu_count() or 1))
    shares = _balanced(parts, processes)
    expected = max(sum(PARTS[name].seconds for name in share) for share in shares) + _PROCESS_SECONDS
    announce(f"compiling the cpu kernels for this machine, once: about {expected:.0f} s in {len(shares)} "
             f"process{'es' if len(shares) > 1 else ''} (later runs load them from {numba.config.CACHE_DIR})")
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


def _balanced(parts: list[str], count: int) -> list[list[str]]:
    """`parts` in `count` shares of about equal compile time, the largest share first; a part
    goes with the part it comes `after` when both are wanted."""
    units = [[name] for name in parts if PARTS[name].after not in parts]
    for name in parts:
        if PARTS[name].after in parts:
            next(unit for unit in units if PARTS[name].after in unit).append(name)
    shares: list[list[str]] = [[] for _ in range(count)]
    totals = [0.0] * count
    for unit in sorted(units, key=lambda unit: -sum(PARTS[name].seconds for name in unit)):
        lightest = totals.index(min(totals))
        shares[lightest].extend(unit)
        totals[lightest] += sum(PARTS[name].seconds for name in unit)
    order = list(PARTS)
    return [sorted(share, key=order.index) for _, share in sorted(zip(totals, shares), key=lambda pair: -pair[0])
            if share]


def release_compiler_pages() -> int:
    """Page out the read-only mappings of libllvmlite, then drop this process's mapping of the
    pages of those that hold no private copy (`Anonymous:` 0 in smaps): MADV_PAGEOUT skips a page
    another process maps too (any other numba process), and such a page stays resident here, but
    an unwritten page of a file mapping can be dropped with MADV_DONTNEED and faults back in from
    the file (a mapping with private copies, such as relocated read-only data, keeps them). The
    bytes of the mappings released (0 where unsupported)."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
        madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        mappings = _compiler_mappings()
    except (OSError, AttributeError):
        return 0
    released = 0
    for start, end, clean in mappings:
        paged_out = madvise(start, end - start, _MADV_PAGEOUT) == 0
        dropped = clean and madvise(start, end - start, _MADV_DONTNEED) == 0
        if paged_out or dropped:
            released += end - start
    log.debug("paged out %d MiB of JIT compiler mappings", released >> 20)
    return released


def _compiler_mappings() -> list[tuple[int, int, bool]]:
    """(start, end, whether it holds no private copy) of each read-only mapping of libllvmlite."""
    mappings: list[list] = []
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if fields and not fields[0].endswith(":"):  # a mapping's header: range, perms, offset, dev, inode, path
                wanted = len(fields) >= 6 and "llvmlite" in fields[5] and fields[1][1] != "w"
                start, end = (int(v, 16) for v in fields[0].split("-"))
                mappings.append([start, end, True] if wanted else None)
            elif fields and fields[0] == "Anonymous:" and mappings and mappings[-1] is not None:
                mappings[-1][2] = int(fields[1]) == 0
    return [tuple(m) for m in mappings if m is not None]


if __name__ == "__main__":  # one compile process of `_compile`: THREADS PART...
    set_threads(int(sys.argv[1]))
    for part in sys.argv[2:]:
        PARTS[part].run(int(sys.argv[1]))
