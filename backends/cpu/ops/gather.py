"""Gather / GatherV2: rows picked by run-time indices (negative ones from the end); MNN writes
zeros for an index out of range."""
from __future__ import annotations

import numpy as np

from mnnllm_core.backend_api import Execution


class GatherExecution(Execution):
    def __init__(self, backend, axis_from_input: bool, axis: int):
        super().__init__(backend)
        self.axis_from_input, self.axis = axis_from_input, axis

    def on_execute(self, inputs, outputs) -> None:
        params = inputs[0].storage
        axis = int(inputs[2].storage.reshape(-1)[0]) if self.axis_from_input else self.axis
        axis = axis + params.ndim if axis < 0 else axis
        extent = params.shape[axis]
        index = inputs[1].storage.astype(np.int64)
        index = np.where(index < 0, index + extent, index)
        valid = (index >= 0) & (index < extent)
        result = np.take(params, np.where(valid, index, 0), axis=axis)
        if not valid.all():  # MNN writes zeros for out-of-range indices
            shape = [1] * axis + list(index.shape) + [1] * (params.ndim - axis - 1)
            result = result * valid.reshape(shape)
        outputs[0].storage[...] = result


def _gather(backend, inputs, outputs, op):
    return GatherExecution(backend, len(inputs) > 2, op.param.axis)


CREATORS = {"GatherV2": _gather, "Gather": _gather}
