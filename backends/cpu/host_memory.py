"""Large host arrays each in an anonymous mapping of its own, not on the malloc heap.

After a long prefill frees its activation buffers, glibc raises its mmap threshold to their size
(up to 32 MiB), so later arrays of that size come from the heap: freed ones stay in the process
and np.zeros there writes every page (calloc clears recycled memory), committing a KV cache's
whole capacity. A mapping of its own is committed page by page as it is written and given back to
the system when the array is dropped, so resident memory follows what is live and written.
"""
from __future__ import annotations

import mmap
from math import prod

import numpy as np

MAPPED_FROM = 1 << 20  # bytes: smaller arrays stay on the heap (a mapping costs a system call and a page)


def mapped_zeros(shape, dtype=np.float32) -> np.ndarray:
    """np.zeros(shape, dtype), in an anonymous mapping when it holds MAPPED_FROM bytes or more."""
    dtype = np.dtype(dtype)
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    count = prod(shape)
    if count * dtype.itemsize < MAPPED_FROM:
        return np.zeros(shape, dtype)
    return np.frombuffer(mmap.mmap(-1, count * dtype.itemsize), dtype, count).reshape(shape)
