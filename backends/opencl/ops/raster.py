"""MNN's Raster, the one copy primitive the core lowers data movement to: each region is a
device-side buffer copy when it is contiguous at both ends, else one launch of the strided
copy kernel (element type chosen by size, so it serves every dtype and fp16 storage)."""
from __future__ import annotations

from functools import partial

import numpy as np
import pyopencl as cl
import pyopencl.cltypes as cltypes

from mnnllm_core.backend_api import Execution, RasterParam, Refused, walks_contiguously

from ..device import Program

ELEMENT_TYPES = {1: "uchar", 2: "ushort", 4: "uint", 8: "ulong"}


class RasterExecution(Execution):
    def __init__(self, backend, param: RasterParam):
        super().__init__(backend)
        self.param = param
        self.steps = []

    def on_resize(self, inputs, outputs) -> None:
        backend, out = self.backend, outputs[0]
        item = backend.storage_dtype(out).itemsize
        self.steps = []
        if self.param.zero_fill:
            nbytes = out.size * item
            self.steps.append(lambda queue: cl.enqueue_fill_buffer(queue, out.storage, np.uint8(0), 0, nbytes))
        for region in self.param.regions:
            src = inputs[region.origin].storage
            size = region.size
            if walks_contiguously(size, region.src.stride) and walks_contiguously(size, region.dst.stride):
                count = int(np.prod(region.size))
                self.steps.append(lambda queue, src=src, count=count, region=region: backend.allocator.copy(
                    out.storage, src, count * item, region.dst.offset * item, region.src.offset * item))
                continue
            kernel = backend.program("raster.cl", "raster", T=ELEMENT_TYPES[item]).bind(
                tuple(reversed(region.size)), None, src, out.storage,
                np.int32(region.src.offset), cltypes.make_int4(*region.src.stride, 0),
                np.int32(region.dst.offset), cltypes.make_int4(*region.dst.stride, 0))
            self.steps.append(kernel)

    def on_execute(self, inputs, outputs) -> None:
        for step in self.steps:
            step(self.backend.queue)

    def replay_steps(self, inputs, outputs) -> list:
        """Its kernels, and its fills and copies with the queue bound."""
        queue = self.backend.queue
        return [step if isinstance(step, Program) else partial(step, queue) for step in self.steps]

    def on_clone(self, backend, op):
        return RasterExecution(backend, op.param)


def _raster(backend, inputs, outputs, op):
    items = {backend.storage_dtype(t).itemsize for t in (*inputs, outputs[0])}
    if len(items) != 1 or items.pop() not in ELEMENT_TYPES:
        return Refused("sources and destination of different element sizes")
    return RasterExecution(backend, op.param)


CREATORS = {"Raster": _raster}
