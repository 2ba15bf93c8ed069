"""Ops that move data by run-time values (Gather with run-time indices), MatMul, Reduction, TopKV2, Fill."""
from __future__ import annotations

import numpy as np

from mnnllm_core.backend_api import Execution, Refused


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


class MatMulExecution(Execution):
    def __init__(self, backend, transpose_a: bool, transpose_b: bool):
        super().__init__(backend)
        self.ta, self.tb = transpose_a, transpose_b

    def on_execute(self, inputs, outputs) -> None:
        a, b = inputs[0].storage, inputs[1].storage
        a = np.swapaxes(a, -1, -2) if self.ta else a
        b = np.swapaxes(b, -1, -2) if self.tb else b
        result = np.matmul(a, b)
        if len(inputs) > 2:
            result = result + inputs[2].storage
        outputs[0].storage[...] = result


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


class TopKExecution(Execution):
    """The k largest (or smallest) along the axis, largest first; equal values in index order."""

    def __init__(self, backend, largest: bool):
        super().__init__(backend)
        self.largest = largest
        self.k = self.axis = 0

    def on_resize(self, inputs, outputs) -> None:
        self.k = int(inputs[1].host.reshape(-1)[0])
        rank = len(inputs[0].shape)
        self.axis = int(inputs[2].host.reshape(-1)[0]) % rank if len(inputs) > 2 else rank - 1

    def on_execute(self, inputs, outputs) -> None:
        x = inputs[0].storage
        order = np.argsort(-x if self.largest else x, axis=self.axis, kind="stable")
        index = np.take(order, np.arange(self.k), axis=self.axis)
        outputs[0].storage[...] = np.take_along_axis(x, index, axis=self.axis)
        outputs[1].storage[...] = index


class FillExecution(Execution):
    """Fill (ONNX ConstantOfShape): the output, of the shape input 0 gave at resize, all input 1."""

    def on_execute(self, inputs, outputs) -> None:
        outputs[0].storage[...] = inputs[1].storage.reshape(-1)[0]


def _gather(backend, inputs, outputs, op):
    return GatherExecution(backend, len(inputs) > 2, op.param.axis)


def _matmul(backend, inputs, outputs, op):
    return MatMulExecution(backend, op.param.transpose_a, op.param.transpose_b)


def _reduction(backend, inputs, outputs, op):
    function = REDUCE.get(op.param.operation)
    if function is None:
        return Refused(f"no {op.param.operation} reduction")
    if len(inputs) > 1 and inputs[1].host is None:
        return Refused("dims from a tensor computed at run time")
    return ReductionExecution(backend, function, list(op.param.dims))


def _topk(backend, inputs, outputs, op):
    if inputs[0].dtype.kind != "f":
        return Refused(f"TopKV2 of {inputs[0].dtype}")
    return TopKExecution(backend, op.param.largest)


def _fill(backend, inputs, outputs, op):
    return FillExecution(backend)


CREATORS = {"GatherV2": _gather, "Gather": _gather, "MatMul": _matmul, "BatchMatMul": _matmul,
            "Reduction": _reduction, "TopKV2": _topk, "Fill": _fill}
