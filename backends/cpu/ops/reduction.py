"""Reduction (sum, mean, max, min, prod, any, all, abs-sum, sum of squares) over the op's axes,
keeping them."""
from __future__ import annotations

import numpy as np

from mnnllm_core.backend_api import Execution, Refused

REDUCE = {
    "SUM": np.sum, "MEAN": np.mean, "MAXIMUM": np.max, "MINIMUM": np.min, "PROD": np.prod,
    "ANY": np.any, "ALL": np.all,
    "ASUM": lambda x, axis, keepdims: np.sum(np.abs(x), axis=axis, keepdims=keepdims),
    "SUMSQ": lambda x, axis, keepdims: np.sum(np.square(x), axis=axis, keepdims=keepdims),
}


class ReductionExecution(Execution):
    """The axes: the op's dims, or (an ONNX ReduceX with axes as an input) that input's value,
    known at resize; none reduces every axis."""

    def __init__(self, backend, function, axes):
        super().__init__(backend)
        self.function, self.axes = function, axes

    def on_resize(self, inputs, outputs) -> None:
        if len(inputs) > 1:
            self.axes = [int(a) for a in inputs[1].host.reshape(-1)]

    def on_execute(self, inputs, outputs) -> None:
        x = inputs[0].storage
        axes = tuple(range(x.ndim)) if not self.axes else tuple(a % x.ndim for a in self.axes)
        outputs[0].storage[...] = self.function(x, axis=axes, keepdims=True).reshape(outputs[0].shape)


def _reduction(backend, inputs, outputs, op):
    function = REDUCE.get(op.param.operation)
    if function is None:
        return Refused(f"no {op.param.operation} reduction")
    if len(inputs) > 1 and inputs[1].host is None:
        return Refused("dims from a tensor computed at run time")
    return ReductionExecution(backend, function, list(op.param.dims))


CREATORS = {"Reduction": _reduction}
