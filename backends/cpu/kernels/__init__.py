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



def _source_digest() -> str:
    digest = hashlib.sha256(numba.__version__.encode())
    for source in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(source.read_bytes())
    return digest.hexdigest()[:16]


SOURCE_DIGEST = _source_digest()  # numba and every kernel file: what the compiled code depends on

if not os.environ.get("NUMBA_CACHE_DIR"):
    numba.config.CACHE_DIR = str(Path(os.environ.get("MNNLLM_CACHE") or Path.home() / ".cache" / "mnnllm")
                                 / "numba" / SOURCE_DIGEST)

# fastmath without nnan/ninf: reassociation and contraction for the reductions, but NaN and
# inf still propagate as they do on the reference path
FASTMATH = {"nsz", "arcp", "contract", "afn", "reassoc"}


def jit(parallel: bool = False, fastmath: bool = True):
    """numba.njit as every kernel here uses it: cached, GIL released, no bounds checks, and
    numpy's error model (x / 0 is inf, not a ZeroDivisionError branch that stops vectorization)."""
    return numba.njit(cache=True, nogil=True, parallel=parallel, boundscheck=False, error_model="numpy",
                      fastmath=FASTMATH if fastmath else False)


def set_threads(count: int) -> int:
    """Threads of the parallel kernels launched from this thread (at most numba's pool size)."""
    count = max(1, min(int(count), numba.config.NUMBA_NUM_THREADS))
    numba.set_num_threads(count)
    return count
