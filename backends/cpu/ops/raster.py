"""The one copy primitive geometry lowers data movement to."""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from mnnllm_core.backend_api import Execution, RasterParam


def _box(flat: np.ndarray, offset: int, stride, size) -> np.ndarray:
    item = flat.itemsize
    return as_strided(flat[offset:], shape=size, strides=tuple(s * item for s in stride))


class RasterExecution(Execution):
    def __init__(self, backend, param: RasterParam):
        super().__init__(backend)
        self.param = param

    def on_execute(self, inputs, outputs) -> None:
        dst = outputs[0].storage.reshape(-1)
        if self.param.zero_fill:
            dst[...] = 0
        sources = [t.storage.reshape(-1) for t in inputs]
        for region in self.param.regions:
            src = sources[region.origin]
            _box(dst, region.dst.offset, region.dst.stride, region.size)[...] = _box(
                src, region.src.offset, region.src.stride, region.size)


CREATORS = {"Raster": lambda backend, inputs, outputs, op: RasterExecution(backend, op.param)}
