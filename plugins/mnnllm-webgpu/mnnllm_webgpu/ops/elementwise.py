"""Float BinaryOp (broadcasting up to 4 dims, fused relu/relu6, MUL_SILU = a * silu(b)), float
UnaryOp (the ops in UNARY) and the activation ops ReLU (no slope), TanH, Sigmoid, Cast int32 <->
float32 and Softmax over one axis."""
from __future__ import annotations

import numpy as np

from mnnllm_core.backend_api import FLOAT32, INT32, Refused, broadcast_strides

from ..device import Program, StepsExecution, fold, pack_params

LOCAL = 256  # work-group size of binary.wgsl, unary.wgsl and cast.wgsl

BINARY = {"ADD": 0, "SUB": 1, "MUL": 2, "REALDIV": 3, "DIV": 3, "MUL_SILU": 4, "MAXIMUM": 5, "MAX_TEMP": 5,
          "MINIMUM": 6, "MIN_TEMP": 6}
UNARY = {"ABS": 0, "NEG": 1, "FLOOR": 2, "CEIL": 3, "SQUARE": 4, "SQRT": 5, "RSQRT": 6, "EXP": 7, "LOG": 8,
         "SIN": 9, "COS": 10, "TAN": 11, "ATAN": 12, "RECIPROCAL": 13, "SIGN": 14, "SIGMOID": 15, "TANH": 16,
         "HARDSWISH": 17, "SILU": 18, "GELU": 19, "GELU_STANDARD": 20, "ERF": 21, "RELU": 22}
ACTIVATION_OPS = {"TanH": "TANH", "Sigmoid": "SIGMOID", "ReLU": "RELU"}  # op types run as a UnaryOp
CAST_MODES = {(FLOAT32, INT32): 0, (INT32, FLOAT32): 1, (FLOAT32, FLOAT32): 2}


def refusal(backend, inputs, outputs, floats: bool = True) -> Refused | None:
    """Why these tensors cannot run here (not float32, larger than one binding), or None (a
    Refused is falsy, so creators test `is not None`)."""
    if floats and any(t.dtype != FLOAT32 for t in (*inputs, outputs[0])):
        return Refused("float32 only (integer arithmetic keeps numpy's rules on cpu)")
    if not backend.fits(*inputs, outputs[0]):
        return Refused("a tensor exceeds max_storage_buffer_binding_size")
    return None


class BinaryExecution(StepsExecution):
    def __init__(self, backend, code: int, act: int):
        super().__init__(backend)
        self.code, self.act = code, act

    def on_resize(self, inputs, outputs) -> None:
        dims, (sa, sb) = broadcast_strides(outputs[0].shape, [t.shape for t in inputs])
        total = outputs[0].size
        groups, row = fold(-(-total // LOCAL), LOCAL)
        params = pack_params("4i4i4iiiiI", *dims, *sa, *sb, total, self.code, self.act, row)
        broadcast = any(t.size != total for t in inputs)
        self.steps = [Program(self.backend.device, "binary",
                              [inputs[0].storage, inputs[1].storage, outputs[0].storage], params,
                              groups if total else (0, 0, 0), (("BROADCAST", str(broadcast).lower()),))]

    def on_clone(self, backend, op):
        return BinaryExecution(backend, self.code, self.act)


class ElementwiseExecution(StepsExecution):
    """One kernel over every element: unary.wgsl (code: the op) or cast.wgsl (code: the mode)."""

    def __init__(self, backend, shader: str, code: int):
        super().__init__(backend)
        self.shader, self.code = shader, code

    def on_resize(self, inputs, outputs) -> None:
        total = outputs[0].size
        groups, row = fold(-(-total // LOCAL), LOCAL)
        self.steps = [Program(self.backend.device, self.shader, [inputs[0].storage, outputs[0].storage],
                              pack_params("iiI", total, self.code, row), groups if total else (0, 0, 0))]

    def on_clone(self, backend, op):
        return ElementwiseExecution(backend, self.shader, self.code)


class SoftmaxExecution(StepsExecution):
    def __init__(self, backend, axis: int):
        super().__init__(backend)
        self.axis = axis

    def on_resize(self, inputs, outputs) -> None:
        shape = inputs[0].shape or (1,)
        axis = self.axis % len(shape)
        length, inner = shape[axis], int(np.prod(shape[axis + 1:], dtype=np.int64))
        lines = inputs[0].size // max(1, length)
        groups, row = fold(lines, 1)
        self.steps = [Program(self.backend.device, "softmax", [inputs[0].storage, outputs[0].storage],
                              pack_params("iiiI", lines, length, inner, row),
                              groups if lines and length else (0, 0, 0))]

    def on_clone(self, backend, op):
        return SoftmaxExecution(backend, self.axis)


def create_binary(backend, inputs, outputs, op):
    code = BINARY.get(op.param.operation)
    if code is None or len(inputs) != 2:
        return Refused(f"no {op.param.operation} kernel")
    if op.param.activation not in (0, 1, 2):
        return Refused(f"activation {op.param.activation}")
    if broadcast_strides(outputs[0].shape, [t.shape for t in inputs]) is None:
        return Refused("a broadcast of more than 4 dims")
    refused = refusal(backend, inputs, outputs)
    return refused if refused is not None else BinaryExecution(backend, code, op.param.activation)


def create_unary(backend, inputs, outputs, op):
    code = UNARY.get(op.param.operation)
    if code is None or len(inputs) != 1:
        return Refused(f"no {op.param.operation} kernel")
    refused = refusal(backend, inputs, outputs)
    return refused if refused is not None else ElementwiseExecution(backend, "unary", code)


def create_activation(backend, inputs, outputs, op):
    if op.type == "ReLU" and op.param is not None and op.param.slope:
        return Refused("a leaky ReLU")
    refused = refusal(backend, inputs, outputs)
    return refused if refused is not None else ElementwiseExecution(backend, "unary", UNARY[ACTIVATION_OPS[op.type]])


def create_cast(backend, inputs, outputs, op):
    pair = (inputs[0].dtype, outputs[0].dtype)
    mode = CAST_MODES.get(pair)
    if mode is None:
        return Refused(f"no {pair[0]} -> {pair[1]} kernel")
    refused = refusal(backend, inputs, outputs, floats=False)
    return refused if refused is not None else ElementwiseExecution(backend, "cast", mode)


def create_softmax(backend, inputs, outputs, op):
    refused = refusal(backend, inputs, outputs)
    return refused if refused is not None else SoftmaxExecution(backend, op.param.axis)


CREATORS = {"BinaryOp": create_binary, "UnaryOp": create_unary, "Cast": create_cast, "Softmax": create_softmax,
            **{op_type: create_activation for op_type in ACTIVATION_OPS}}
