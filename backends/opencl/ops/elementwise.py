"""BinaryOp (float, broadcasting, incl. MUL_SILU = a * silu(b)), UnaryOp and Cast.
Integer arithmetic is left to the cpu backend (the core folds the shape arithmetic anyway)."""
from __future__ import annotations

import numpy as np
import pyopencl.cltypes as cltypes

from mnnllm_core.backend_api import FLOAT32, INT32, Execution, Refused, broadcast_strides

from ..device import ProgramExecution

BINARY = {"ADD": "ADD", "SUB": "SUB", "MUL": "MUL", "REALDIV": "REALDIV", "DIV": "REALDIV",
          "MAXIMUM": "MAXIMUM", "MAX_TEMP": "MAXIMUM", "MINIMUM": "MINIMUM", "MIN_TEMP": "MINIMUM",
          "POW": "POW", "SquaredDifference": "SquaredDifference", "ATAN2": "ATAN2", "MOD": "MOD",
          "FLOORDIV": "FLOORDIV", "FLOORMOD": "FLOORMOD", "MUL_SILU": "MUL_SILU"}
UNARY = {"ABS", "NEG", "FLOOR", "CEIL", "SQUARE", "SQRT", "RSQRT", "EXP", "LOG", "SIN", "COS", "TAN", "ASIN",
         "ACOS", "ATAN", "RECIPROCAL", "LOG1P", "BNLL", "ACOSH", "SINH", "ASINH", "ATANH", "SIGN", "ROUND",
         "COSH", "EXPM1", "SIGMOID", "TANH", "HARDSWISH", "SILU", "GELU", "GELU_STANDARD", "ERF"}


class BinaryExecution(ProgramExecution):
    def __init__(self, backend, name: str, act: int):
        super().__init__(backend)
        self.name, self.act = name, act

    def on_resize(self, inputs, outputs) -> None:
        view = broadcast_strides(outputs[0].shape, [t.shape for t in inputs])
        if view is None:
            raise ValueError(f"BinaryOp broadcast of {[t.shape for t in inputs]} needs more than 4 dims")
        dims, (sa, sb) = view
        buffers = (inputs[0].storage, inputs[1].storage, outputs[0].storage)
        if all(t.size == outputs[0].size for t in inputs):
            self.program = self.backend.program("elementwise.cl", f"binary_{self.name}_flat").bind(
                (outputs[0].size,), None, *buffers, np.int32(self.act))
            return
        self.program = self.backend.program("elementwise.cl", f"binary_{self.name}").bind(
            (outputs[0].size,), None, *buffers, cltypes.make_int4(*dims), cltypes.make_int4(*sa),
            cltypes.make_int4(*sb), np.int32(self.act))

    def on_clone(self, backend, op):
        return BinaryExecution(backend, self.name, self.act)


class MapExecution(ProgramExecution):
    """One kernel from the input's buffer to the output's, one work-item per element."""

    def __init__(self, backend, kernel: str):
        super().__init__(backend)
        self.kernel_name = kernel

    def on_resize(self, inputs, outputs) -> None:
        self.program = self.backend.program("elementwise.cl", self.kernel_name).bind(
            (outputs[0].size,), None, inputs[0].storage, outputs[0].storage)

    def on_clone(self, backend, op):
        return MapExecution(backend, self.kernel_name)


class CopyExecution(Execution):
    """A Cast between equal dtypes: one device-side copy."""

    def on_execute(self, inputs, outputs) -> None:
        self.backend.on_copy_buffer(inputs[0], outputs[0])

    def on_clone(self, backend, op):
        return CopyExecution(backend)


def _binary(backend, inputs, outputs, op):
    name = BINARY.get(op.param.operation)
    if name is None:
        return Refused(f"no {op.param.operation} kernel")
    if len(inputs) != 2 or any(t.dtype != FLOAT32 for t in (*inputs, outputs[0])):
        return Refused("integer arithmetic stays on cpu")
    if broadcast_strides(outputs[0].shape, [t.shape for t in inputs]) is None:
        return Refused("a broadcast of more than 4 dims")
    return BinaryExecution(backend, name, op.param.activation)


def _unary(backend, inputs, outputs, op):
    name = op.param.operation
    if name not in UNARY:
        return Refused(f"no {name} kernel")
    if inputs[0].dtype != FLOAT32 or outputs[0].dtype != FLOAT32:
        return Refused("float32 only")
    return MapExecution(backend, f"unary_{name}")


def _cast(backend, inputs, outputs, op):
    pair = (inputs[0].dtype, outputs[0].dtype)
    if pair[0] == pair[1]:
        return CopyExecution(backend)
    kernel = {(INT32, FLOAT32): "cast_int_to_float", (FLOAT32, INT32): "cast_float_to_int"}.get(pair)
    return Refused(f"no {pair[0]} -> {pair[1]} kernel") if kernel is None else MapExecution(backend, kernel)


CREATORS = {"BinaryOp": _binary, "UnaryOp": _unary, "Cast": _cast}
