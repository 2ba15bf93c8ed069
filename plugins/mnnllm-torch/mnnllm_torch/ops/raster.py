"""Raster: each region is one strided copy, a view of the destination receiving a view of its
source."""
from __future__ import annotations

import torch

from mnnllm_core.backend_api import Execution, RasterParam, Refused


def _box(flat: torch.Tensor, offset: int, stride, size) -> torch.Tensor:
    return flat.as_strided(tuple(size), tuple(stride), flat.storage_offset() + offset)


class RasterExecution(Execution):
    def __init__(self, backend, param: RasterParam):
        super().__init__(backend)
        self.param = param
        self.dst = None
        self.copies: list[tuple[torch.Tensor, torch.Tensor]] = []

    def on_resize(self, inputs, outputs) -> None:
        self.dst = outputs[0].storage.view(-1)
        sources = [t.storage.view(-1) for t in inputs]
        self.copies = [(_box(self.dst, r.dst.offset, r.dst.stride, r.size),
                        _box(sources[r.origin], r.src.offset, r.src.stride, r.size)) for r in self.param.regions]

    def on_execute(self, inputs, outputs) -> None:
        if self.param.zero_fill:
            self.dst.zero_()
        for dst, src in self.copies:
            dst.copy_(src)


def create_raster(backend, inputs, outputs, op):
    if len({t.dtype for t in (*inputs, *outputs)}) != 1:
        return Refused("sources and destination of different dtypes")
    for region in op.param.regions:
        if any(s < 0 for s in (*region.src.stride, *region.dst.stride)):
            return Refused("torch views have no negative strides")
        if any(n > 1 and s == 0 for n, s in zip(region.size, region.dst.stride)):
            return Refused("a destination that writes one element twice")
    return RasterExecution(backend, op.param)


CREATORS = {"Raster": create_raster}
