"""BinaryOp (float, broadcasting, incl. MUL_SILU = a * silu(b)), UnaryOp and Cast.
Integer arithmetic is left to the cpu backend (the core folds the shape arithmetic anyway)."""
from __future__ import annotations

import numpy as np
import pyopencl.cltypes as cltypes

from mnnllm_core.core.backend import Execution

BINARY = {"ADD": "ADD", "SUB": "SUB", "MUL": "MUL", "REALDIV": "REALDIV", "DIV": "REALDIV",
          "MAXIMUM": "MAXIMUM", "MAX_TEMP": "MAXIMUM", "MINIMUM": "MINIMUM", "MIN_TEMP": "MINIMUM",
          "POW": "POW", "SquaredDifference": "SquaredDifference", "ATAN2": "ATAN2", "MOD": "MOD",
          "FLOORDIV": "FLOORDIV", "FLOORMOD": "FLOORMOD", "MUL_SILU": "MUL_SILU"}
UNARY = {"ABS", "NEG", "FLOOR", "CEIL", "SQUARE", "SQRT", "RSQRT", "EXP", "LOG", "SIN", "COS", "TAN", "ASIN",
         "ACOS", "ATAN", "RECIPROCAL", "LOG1P", "BNLL", "ACOSH", "SINH", "ASINH", "ATANH", "SIGN", "ROUND",
         "COSH", "EXPM1", "SIGMOID", "TANH", "HARDSWISH", "SILU", "GELU", "GELU_STANDARD", "ERF"}
FLOAT = np.dtype(np.float32)
INT = np.dtype(np.int32)


def broadcast_view(out_shape, in_shapes) -> tuple[list[int], list[list[int]]] | None:
    """The output as at most 4 dims, with each input's element strides over them (0 where it
    broadcasts); dims of extent 1 dropped and dims contiguous for every input merged.
    None when more than 4 dims remain."""
    rank = len(out_shape)
    strides = []
    for shape in in_shapes:
        shape = (1,) * (rank - len(shape)) + tuple(shape)
        own, acc = [0] * rank, 1
        for d in reversed(range(rank)):
            own[d] = acc if shape[d] != 1 else 0
            acc *= shape[d]
        strides.append(own)
    dims: list[int] = []
    merged: list[list[int]] = [[] for _ in in_shapes]
    for d, extent in enumerate(out_shape):
        if extent == 1:
            continue
        if dims and all(m[-1] == s[d] * extent for m, s in zip(merged, strides)):
            dims[-1] *= extent
            for m, s in zip(merged, strides):
                m[-1] = s[d]
            continue
        dims.append(int(extent))
        for m, s in zip(merged, strides):
            m.append(s[d])
    if len(dims) > 4:
        return None
    pad = 4 - len(dims)
    return [1] * pad + dims, [[0] * pad + m for m in merged]


class BinaryExecution(Execution):
    def __init__(self, backend, name: str, act: int):
        super().__init__(backend)
        self.name, self.act = name, act
        self.kernel = None

    def on_resize(self, inputs, outputs) -> None:
        view = broadcast_view(outputs[0].shape, [t.shape for t in inputs])
        if view is None:
            raise ValueError(f"BinaryOp broadcast of {[t.shape for t in inputs]} needs more than 4 dims")
        dims, (sa, sb) = view
        buffers = (inputs[0].storage, inputs[1].storage, outputs[0].storage)
        if all(t.size == outputs[0].size for t in inputs):
            self.kernel = self.backend.program("elementwise.cl", f"binary_{self.name}_flat").bind(
                (outputs[0].size,), None, *buffers, np.int32(self.act))
            return
        self.kernel = self.backend.program("elementwise.cl", f"binary_{self.name}").bind(
            (outputs[0].size,), None, *buffers, cltypes.make_int4(*dims), cltypes.make_int4(*sa),
            cltypes.make_int4(*sb), np.int32(self.act))

    def on_execute(self, inputs, outputs) -> None:
        self.kernel(self.backend.queue)

    def on_clone(self, backend, op):
        return BinaryExecution(backend, self.name, self.act)


class MapExecution(Execution):
    """One kernel from the input's buffer to the output's, one work-item per element."""

    def __init__(self, backend, kernel: str):
        super().__init__(backend)
        self.kernel_name = kernel
        self.kernel = None

    def on_resize(self, inputs, outputs) -> None:
        self.kernel = self.backend.program("elementwise.cl", self.kernel_name).bind(
            (outputs[0].size,), None, inputs[0].storage, outputs[0].storage)

    def on_execute(self, inputs, outputs) -> None:
        self.kernel(self.backend.queue)

    def on_clone(self, backend, op):
        return MapExecution(backend, self.kernel_name)


class CopyExecution(Execution):
    """A Cast between equal dtypes: one device-side copy."""

    def on_execute(self, inputs, outputs) -> None:
        self.backend.on_copy_buffer(inputs[0], outputs[0])

    def on_clone(self, backend, op):
        return CopyExecution(backend)


def _binary(backend, inputs, outputs, op):
    name = BINARY.get(op.extra.get("operation"))
    if name is None or len(inputs) != 2 or any(t.dtype != FLOAT for t in (*inputs, outputs[0])):
        return None
    if broadcast_view(outputs[0].shape, [t.shape for t in inputs]) is None:
        return None
    return BinaryExecution(backend, name, int(getattr(op.param, "activationType", 0) or 0))


def _unary(backend, inputs, outputs, op):
    name = op.extra.get("operation")
    if name not in UNARY or inputs[0].dtype != FLOAT or outputs[0].dtype != FLOAT:
        return None
    return MapExecution(backend, f"unary_{name}")


def _cast(backend, inputs, outputs, op):
    pair = (inputs[0].dtype, outputs[0].dtype)
    if pair[0] == pair[1]:
        return CopyExecution(backend)
    kernel = {(INT, FLOAT): "cast_int_to_float", (FLOAT, INT): "cast_float_to_int"}.get(pair)
    return None if kernel is None else MapExecution(backend, kernel)


CREATORS = {"BinaryOp": _binary, "UnaryOp": _unary, "Cast": _cast}
