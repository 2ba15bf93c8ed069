"""Kernels only a replayed step (`replay.py`) calls, loaded at load like the rest (`warm_up`)."""
from __future__ import annotations

import numpy as np

from . import attention
from .warmup import release_compiler_pages


def warm_up_replay() -> None:
    """Load the replay's kernels with tiny arrays of the real calls' types, then hand the JIT
    compiler's pages back again."""
    q = np.zeros((1, 1, 16), np.float32)
    keys_t, values = np.zeros((1, 16, 16), np.float32), np.zeros((1, 16, 16), np.float32)
    attention.append_attend(q, q.copy(), q.copy(), keys_t, values, np.zeros(1, np.int64), np.float32(1.0),
                            np.zeros(0, np.float32), q.copy())
    release_compiler_pages()
