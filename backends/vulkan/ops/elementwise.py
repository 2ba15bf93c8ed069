"""Float BinaryOp (broadcasting, fused relu/relu6, MUL_SILU = a * silu(b)), float UnaryOp (the
ops in UNARY) and Cast int32 <-> float32 (and float32 -> float32, a copy): one shader over every element each."""
from __future__ import annotations

from mnnllm_core.backend_api import FLOAT32, INT32, Refused, broadcast_strides

from ..device import Program, ProgramExecution, Texels, fold, pack_push

LOCAL = 256  # local size of binary.comp, unary.comp and cast.comp

BINARY = {"ADD": 0, "SUB": 1, "MUL": 2, "REALDIV": 3, "DIV": 3, "MUL_SILU": 4, "MAXIMUM": 5, "MAX_TEMP": 5,
          "MINIMUM": 6, "MIN_TEMP": 6}
UNARY = {"ABS": 0, "NEG": 1, "FLOOR": 2, "CEIL": 3, "SQUARE": 4, "SQRT": 5, "RSQRT": 6, "EXP": 7, "LOG": 8,
         "SIN": 9, "COS": 10, "TAN": 11, "ATAN": 12, "RECIPROCAL": 13, "SIGN": 14, "SIGMOID": 15, "TANH": 16,
         "HARDSWISH": 17, "SILU": 18, "GELU": 19, "GELU_STANDARD": 20, "ERF": 21}


class BinaryExecution(ProgramExecution):
    def __init__(self, backend, code: int, act: int):
        super().__init__(backend)
        self.code, self.act = code, act

    def on_resize(self, inputs, outputs) -> None:
        view = broadcast_strides(outputs[0].shape, [t.shape for t in inputs])
        if view is None:
            raise ValueError(f"vulkan BinaryOp: {[t.shape for t in inputs]} need more than 4 dims")
        dims, (sa, sb) = view
        total = outputs[0].size
        groups, row = fold(-(-total // LOCAL), LOCAL)
        push = pack_push("4i4i4iiiiI", *dims, *sa, *sb, total, self.code, self.act, row)
        self.program = Program(self.backend.device, "binary",
                               [Texels(inputs[0].storage, "float"), Texels(inputs[1].storage, "float"),
                                outputs[0].storage], push,
                               groups if total else (0, 0, 0))

    def on_clone(self, backend, op):
        return BinaryExecution(backend, self.code, self.act)


class ElementwiseExecution(ProgramExecution):
    """One shader over every element: unary.comp (code: the op) or cast.comp (code: the mode)."""

    def __init__(self, backend, shader: str, code: int):
        super().__init__(backend)
        self.shader, self.code = shader, code

    def on_resize(self, inputs, outputs) -> None:
        total = outputs[0].size
        groups, row = fold(-(-total // LOCAL), LOCAL)
        source = Texels(inputs[0].storage, "float") if self.shader == "unary" else inputs[0].storage
        self.program = Program(self.backend.device, self.shader, [source, outputs[0].storage],
                               pack_push("iiI", total, self.code, row), groups if total else (0, 0, 0))

    def on_clone(self, backend, op):
        return ElementwiseExecution(backend, self.shader, self.code)


def create_binary(backend, inputs, outputs, op):
    code = BINARY.get(op.param.operation)
    if code is None or len(inputs) != 2:
        return Refused(f"no {op.param.operation} kernel")
    if op.param.activation not in (0, 1, 2):
        return Refused(f"activation {op.param.activation}")
    if any(t.dtype != FLOAT32 for t in (*inputs, outputs[0])):
        return Refused("integer arithmetic stays on cpu")
    if not backend.fits(*inputs, outputs[0]):
        return Refused("a tensor exceeds maxStorageBufferRange or maxTexelBufferElements")
    if broadcast_strides(outputs[0].shape, [t.shape for t in inputs]) is None:
        return Refused("a broadcast of more than 4 dims")
    return BinaryExecution(backend, code, op.param.activation)


def create_unary(backend, inputs, outputs, op):
    code = UNARY.get(op.param.operation)
    if code is None or len(inputs) != 1:
        return Refused(f"no {op.param.operation} kernel")
    if any(t.dtype != FLOAT32 for t in (*inputs, outputs[0])):
        return Refused("float32 only")
    if not backend.fits(*inputs, outputs[0]):
        return Refused("a tensor exceeds maxStorageBufferRange or maxTexelBufferElements")
    return ElementwiseExecution(backend, "unary", code)


def create_cast(backend, inputs, outputs, op):
    pair = (inputs[0].dtype, outputs[0].dtype)
    mode = {(FLOAT32, INT32): 0, (INT32, FLOAT32): 1, (FLOAT32, FLOAT32): 2}.get(pair)
    if mode is None:
        return Refused(f"no {pair[0]} -> {pair[1]} kernel")
    if not backend.fits(inputs[0], outputs[0]):
        return Refused("a tensor exceeds maxStorageBufferRange or maxTexelBufferElements")
    return ElementwiseExecution(backend, "cast", mode)


CREATORS = {"BinaryOp": create_binary, "UnaryOp": create_unary, "Cast": create_cast}
