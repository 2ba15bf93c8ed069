"""GatherV2 with run-time indices on 4-byte elements (an embedding lookup): negative indices from
the end, zeros for one out of range (as MNN). An axis given as a third, run-time input is refused
(the kernel's sizes are fixed at resize)."""
from __future__ import annotations

import numpy as np

from mnnllm_core.backend_api import INT32, Refused

from ..device import Program, StepsExecution, fold, pack_params

LOCAL = 256  # work-group size of gather.wgsl


class GatherExecution(StepsExecution):
    def __init__(self, backend, axis: int):
        super().__init__(backend)
        self.axis = axis

    def on_resize(self, inputs, outputs) -> None:
        shape = inputs[0].shape
        axis = self.axis % len(shape)
        extent, inner = shape[axis], int(np.prod(shape[axis + 1:], dtype=np.int64))
        total, count = outputs[0].size, inputs[1].size
        groups, row = fold(-(-total // LOCAL), LOCAL)
        self.steps = [Program(self.backend.device, "gather",
                              [inputs[0].storage, inputs[1].storage, outputs[0].storage],
                              pack_params("4iI", total, count, inner, extent, row), groups if total else (0, 0, 0))]

    def on_clone(self, backend, op):
        return GatherExecution(backend, self.axis)


def create_gather(backend, inputs, outputs, op):
    if len(inputs) > 2:
        return Refused("the axis is a run-time input")
    if inputs[1].dtype != INT32 or inputs[0].dtype.itemsize != 4 or not inputs[0].shape:
        return Refused("4-byte elements and int32 indices only")
    if not backend.fits(inputs[0], inputs[1], outputs[0]):
        return Refused("a tensor exceeds max_storage_buffer_binding_size")
    return GatherExecution(backend, op.param.axis)


CREATORS = {"GatherV2": create_gather, "Gather": create_gather}
