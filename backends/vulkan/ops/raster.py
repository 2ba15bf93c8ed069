"""MNN's Raster: each region a buffer copy when contiguous at both ends, else the strided copy
shader (4-byte elements: fp32 and int32)."""
from __future__ import annotations

import numpy as np

from mnnllm_core.backend_api import Execution, RasterParam, Refused, walks_contiguously

from ..device import Program, fold, pack_push

LOCAL = 256  # local size of raster.comp


class RasterExecution(Execution):
    def __init__(self, backend, param: RasterParam):
        super().__init__(backend)
        self.param = param
        self.steps: list = []

    def on_resize(self, inputs, outputs) -> None:
        device, out = self.backend.device, outputs[0]
        self.steps = []
        if self.param.zero_fill:
            self.steps.append(("fill", out.storage, out.size * 4))
        for region in self.param.regions:
            src = inputs[region.origin].storage
            size = [int(v) for v in region.size]
            count = int(np.prod(size))
            if count == 0:
                continue
            if walks_contiguously(size, region.src.stride) and walks_contiguously(size, region.dst.stride):
                self.steps.append(("copy", out.storage, src, count * 4, region.dst.offset * 4, region.src.offset * 4))
                continue
            groups, row = fold(-(-count // LOCAL), LOCAL)
            push = pack_push("4i4i4iI", *size, count, *region.src.stride, region.src.offset,
                             *region.dst.stride, region.dst.offset, row)
            self.steps.append(("dispatch", Program(device, "raster", [src, out.storage], push, groups)))

    def on_execute(self, inputs, outputs) -> None:
        recorder = self.backend.recorder
        for step in self.steps:
            if step[0] == "dispatch":
                recorder.dispatch(step[1])
            elif step[0] == "copy":
                recorder.copy(*step[1:])
            else:
                recorder.fill_zero(step[1], step[2])

    def on_clone(self, backend, op):
        return RasterExecution(backend, op.param)


def create_raster(backend, inputs, outputs, op):
    tensors = (*inputs, outputs[0])
    if any(t.dtype.itemsize != 4 for t in tensors):
        return Refused("4-byte elements only")
    if not backend.fits(*tensors):
        return Refused("a tensor exceeds maxStorageBufferRange or maxTexelBufferElements")
    return RasterExecution(backend, op.param)


CREATORS = {"Raster": create_raster}
