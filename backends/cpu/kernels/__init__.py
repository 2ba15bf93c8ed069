"""numba kernels of the cpu backend's `memory: "low"` path (packed int4/int8 weights).

Imported only when a low-memory op is created, so the fp32 path never pays numba's import.
Compiled code is cached on disk: `$NUMBA_CACHE_DIR` when set, else `$MNNLLM_CACHE/numba`
(`~/.cache/mnnllm/numba`), so only the first process on a machine compiles, and it works
when the package folder is read-only.
"""
from __future__ import annotations

import os
from pathlib import Path

# a parallel kernel's threads sleep between launches instead of spinning: on a machine shared
# with other work, spinning threads take the cores the other threads of the launch wait for
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numba  # noqa: E402

if not os.environ.get("NUMBA_CACHE_DIR"):
    numba.config.CACHE_DIR = str(Path(os.environ.get("MNNLLM_CACHE") or Path.home() / ".cache" / "mnnllm") / "numba")

# fastmath without nnan/ninf: reassociation and contraction for the reductions, but NaN and
# inf still propagate as they do on the reference path
FASTMATH = {"nsz", "arcp", "contract", "afn", "reassoc"}


def jit(parallel: bool = False, fastmath: bool = True):
    """numba.njit as every kernel here uses it: cached, GIL released, no bounds checks."""
    return numba.njit(cache=True, nogil=True, parallel=parallel, boundscheck=False,
                      fastmath=FASTMATH if fastmath else False)


def set_threads(count: int) -> int:
    """Threads of the parallel kernels launched from this thread (at most numba's pool size)."""
    count = max(1, min(int(count), numba.config.NUMBA_NUM_THREADS))
    numba.set_num_threads(count)
    return count
