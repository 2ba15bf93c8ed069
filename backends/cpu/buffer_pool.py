"""The cpu backend's step buffers: one flat byte buffer serves any tensor that fits it.

The core's BufferPool hands a released buffer only to a tensor of the same shape and dtype, which
suits device buffers. Host arrays can take any shape over a byte buffer, so here a released buffer
goes to the next tensor it holds (the smallest such, and not one under 1/MAX_WASTE of it): a long
prefill's MLP buffers ([rows, 1536] on the shared model) then hold the attention's [rows, 576]
tensors of the next layer, instead of each shape keeping buffers of its own. A step of 8,192 rows
held 287 MiB of buffers, MNN's whole step ~264 MiB (see bench/README.md, "Depth 8,192").
Two live tensors never share a buffer: the pipeline releases a tensor only after its last reader
is resized, as with the core's pool.
"""
from __future__ import annotations

import numpy as np

from .host_memory import mapped_zeros

MAX_WASTE = 4  # a buffer serves tensors of at least 1/MAX_WASTE of its bytes


class SizedBufferPool:
    """The interface of the core's BufferPool (acquire, release, clear) over flat uint8 buffers."""

    def __init__(self) -> None:
        self._free: list[np.ndarray] = []
        self._lent: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # id(view) -> (view, its buffer)

    def acquire(self, tensor) -> np.ndarray:
        """A view of tensor.shape and dtype over the best-fitting released buffer, else a new one."""
        dtype = np.dtype(tensor.dtype)
        need = int(np.prod(tensor.shape, dtype=np.int64)) * dtype.itemsize
        fits = [i for i, b in enumerate(self._free) if need <= b.nbytes <= need * MAX_WASTE]
        if fits:
            buffer = self._free.pop(min(fits, key=lambda i: self._free[i].nbytes))
        else:
            buffer = mapped_zeros(max(need, dtype.itemsize), np.uint8)  # given back to the system when dropped
        view = buffer[:need].view(dtype).reshape(tensor.shape)
        self._lent[id(view)] = (view, buffer)
        return view

    def release(self, tensor) -> None:
        """tensor's buffer may serve a later tensor of this resize (a second release is a no-op)."""
        lent = self._lent.pop(id(tensor.storage), None)
        if lent is not None:
            self._free.append(lent[1])

    def clear(self) -> None:
        self._free.clear()
        self._lent.clear()
