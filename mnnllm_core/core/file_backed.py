"""Arrays whose pages live in a file rather than in anonymous memory (MNN's `kvcache_mmap`).

A long context's KV cache can outgrow what a machine wants to keep resident: in a shared file
mapping the kernel writes cold pages back to the file and drops them, instead of holding them or
swapping. The file is created in the given folder and unlinked at once, so it takes disk space
only while the array lives and nothing is left behind, even after a crash.
"""
from __future__ import annotations

import mmap
import os
import tempfile
from math import prod

import numpy as np


def file_backed_zeros(shape: tuple[int, ...], dtype: np.dtype | type, folder: str | os.PathLike[str]) -> np.ndarray:
    dtype = np.dtype(dtype)
    count = prod(shape)
    nbytes = max(count * dtype.itemsize, 1)
    os.makedirs(folder, exist_ok=True)
    fd, path = tempfile.mkstemp(prefix="mnnllm-kv-", suffix=".bin", dir=folder)
    try:
        os.unlink(path)
        os.ftruncate(fd, nbytes)  # a sparse file: zeros until written
        mapping = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED)
    finally:
        os.close(fd)
    return np.frombuffer(mapping, dtype, count).reshape(shape)
