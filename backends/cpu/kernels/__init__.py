"""numba kernels of the cpu backend's `memory: "low"` path (packed int4/int8 weights).

Imported only when a low-memory op is created, so the fp32 path never pays numba's import.
Compiled code is cached on disk: `$NUMBA_CACHE_DIR` when set, else
`$MNNLLM_CACHE/numba/<digest of these sources>` (`~/.cache/mnnllm/...`), so only the first
process on a machine compiles, it works when the package folder is read-only, and a change
to any kernel file (numba only checks the file a function is in) compiles afresh.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

# a parallel kernel's threads sleep between launches instead of spinning: on a machine shared
# with other work, spinning threads take the cores the other threads of the launch wait for
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numba  # noqa: E402



# cores whose 512-bit instructions run as two 256-bit halves: the packed GEMV at 16 lanes was
# 1.1x slower there (Zen 4), so they keep 8
HALF_RATE_512 = frozenset({"znver4"})


def host_has(*features: str) -> bool:
    """Whether numba's host target has all these LLVM cpu features (e.g. "avx512f")."""
    from llvmlite import binding
    try:
        found = binding.get_host_cpu_features()
    except RuntimeError:  # no feature query on this platform
        return False
    return all(found.get(feature) for feature in features)


def _simd_lanes() -> int:
    """float32 lanes of the kernels' vectors: 16 where numba's host target has 512-bit registers
    (AVX-512F) at full rate, else 8. `MNNLLM_SIMD_LANES` (8, or 16 with AVX-512F) overrides it,
    to compare the two widths; the bits are the same at both (the lanes run over output rows or
    columns, never over a sum).
    A Xeon (Emerald Rapids), one thread, shared model: prefill 300 -> 471 tok/s, decode 135 -> 191."""
    from llvmlite import binding
    wide = host_has("avx512f")
    wanted = os.environ.get("MNNLLM_SIMD_LANES", "").strip()
    if wanted in ("8", "16"):  # 16 needs the 512-bit registers (the kernels' asm names one)
        return 16 if wanted == "16" and wide else 8
    return 16 if wide and binding.get_host_cpu_name() not in HALF_RATE_512 else 8


SIMD_LANES = _simd_lanes()


def _source_digest() -> str:
    """numba's version, the lanes, every kernel file and the name these files are imported under:
    numba's cache entries name the kernels' module, so the same files imported as another
    package (a script importing `backends.cpu...` beside `mnnllm_backends.cpu...`) left entries
    the other name could not load ("No module named 'backends'"); each name gets its own folder."""
    digest = hashlib.sha256(f"{numba.__version__} lanes {SIMD_LANES} {__name__}".encode())
    for source in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(source.read_bytes())
    return digest.hexdigest()[:16]


SOURCE_DIGEST = _source_digest()  # what the compiled code depends on

if not os.environ.get("NUMBA_CACHE_DIR"):
    numba.config.CACHE_DIR = str(Path(os.environ.get("MNNLLM_CACHE") or Path.home() / ".cache" / "mnnllm")
                                 / "numba" / SOURCE_DIGEST)

# numba's parallel runtime, started before any kernel loads: a kernel compiled in a process that
# loaded a parallel kernel it calls from the cache (the warm-up's compile processes fill one cache)
# is saved without the hook that starts the runtime on load, and its calls into the runtime
# (get_num_threads, do_scheduling_unsigned) are left at address 0 in a process that has not started
# it: such a kernel, called first, crashed the process (tests/test_cpu_first_compile.py)
numba.get_num_threads()

# fastmath without nnan/ninf: reassociation and contraction for the reductions, but NaN and
# inf still propagate as they do on the reference path
FASTMATH = {"nsz", "arcp", "contract", "afn", "reassoc"}


def jit(parallel: bool = False, fastmath: bool = True, inline: bool = False):
    """numba.njit as every kernel here uses it: cached, GIL released, no bounds checks, and
    numpy's error model (x / 0 is inf, not a ZeroDivisionError branch that stops vectorization).
    `inline`: numba copies the function into its callers, for a loop-free helper of a loop body
    (LLVM vectorizes the loop once it sees the body whole); a function with loops of its own
    stays a call (inlined by numba, the norm's row loops ran 60x slower)."""
    return numba.njit(cache=True, nogil=True, parallel=parallel, boundscheck=False, error_model="numpy",
                      fastmath=FASTMATH if fastmath else False, inline="always" if inline else "never")


def set_threads(count: int) -> int:
    """Threads of the parallel kernels launched from this thread (at most numba's pool size)."""
    count = max(1, min(int(count), numba.config.NUMBA_NUM_THREADS))
    numba.set_num_threads(count)
    return count
