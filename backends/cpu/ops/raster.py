"""The one copy primitive geometry lowers data movement to."""
from __future__ import annotations

from functools import partial

import numpy as np
from numpy.lib.stride_tricks import as_strided

from mnnllm_core.backend_api import Execution, RasterParam


def _box(flat: np.ndarray, offset: int, stride, size) -> np.ndarray:
    item = flat.itemsize
    return as_strided(flat[offset:], shape=size, strides=tuple(s * item for s in stride))


class RasterExecution(Execution):
    """The strided views of each region are made once per resize (as_strided is slow); the
    storages they view stay put until the next resize."""

    def __init__(self, backend, param: RasterParam):
        super().__init__(backend)
        self.param = param
        self.copies: list[tuple[np.ndarray, np.ndarray]] = []

    def on_resize(self, inputs, outputs) -> None:
        dst = outputs[0].storage.reshape(-1)
        sources = [t.storage.reshape(-1) for t in inputs]
        self.copies = [(_box(dst, r.dst.offset, r.dst.stride, r.size),
                        _box(sources[r.origin], r.src.offset, r.src.stride, r.size)) for r in self.param.regions]

    def on_execute(self, inputs, outputs) -> None:
        if self.param.zero_fill:
            outputs[0].storage[...] = 0
        for target, source in self.copies:
            target[...] = source

    def replay_steps(self, inputs, outputs) -> list:
        """Each region's copy bound to its views (a zero fill first where the param asks)."""
        zero = [partial(outputs[0].storage.fill, 0)] if self.param.zero_fill else []
        return zero + [partial(np.copyto, target, source, casting="unsafe") for target, source in self.copies]


CREATORS = {"Raster": lambda backend, inputs, outputs, op: RasterExecution(backend, op.param)}
