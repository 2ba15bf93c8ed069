"""MNN's Raster: each region a buffer copy when contiguous at both ends, else the strided copy
kernel (4-byte elements: fp32 and int32); a zero fill first when the op asks."""
from __future__ import annotations

import numpy as np

from mnnllm_core.backend_api import RasterParam, Refused, walks_contiguously

from ..device import Copy, Fill, Program, StepsExecution, fold, pack_params

LOCAL = 256  # work-group size of raster.wgsl


class RasterExecution(StepsExecution):
    def __init__(self, backend, param: RasterParam):
        super().__init__(backend)
        self.param = param

    def on_resize(self, inputs, outputs) -> None:
        device, out = self.backend.device, outputs[0].storage
        self.steps = [Fill(out, outputs[0].size * 4)] if self.param.zero_fill else []
        for region in self.param.regions:
            src = inputs[region.origin].storage
            size = [int(v) for v in region.size]
            count = int(np.prod(size))
            if count == 0:
                continue
            if walks_contiguously(size, region.src.stride) and walks_contiguously(size, region.dst.stride) \
                    and src is not out:
                self.steps.append(Copy(out, src, count * 4, region.dst.offset * 4, region.src.offset * 4))
                continue
            groups, row = fold(-(-count // LOCAL), LOCAL)
            params = pack_params("4i4i4iI", *size, count, *region.src.stride, region.src.offset,
                                 *region.dst.stride, region.dst.offset, row)
            self.steps.append(Program(device, "raster", [src, out], params, groups))

    def on_clone(self, backend, op):
        return RasterExecution(backend, op.param)


def create_raster(backend, inputs, outputs, op):
    tensors = (*inputs, outputs[0])
    if any(t.dtype.itemsize != 4 for t in tensors):
        return Refused("4-byte elements only")
    if not backend.fits(*tensors):
        return Refused("a tensor exceeds max_storage_buffer_binding_size")
    return RasterExecution(backend, op.param)


CREATORS = {"Raster": create_raster}
