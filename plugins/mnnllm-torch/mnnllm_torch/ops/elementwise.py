"""BinaryOp and UnaryOp on float32 tensors (broadcasting, fused relu/relu6, MUL_SILU = a * silu(b)),
and Cast (torch's conversion truncates toward zero, as numpy's does)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from mnnllm_core.backend_api import FLOAT32, INT32, RELU, RELU6, Execution, Refused


def _mul_silu(a, b, out):
    return torch.mul(a, F.silu(b), out=out)


BINARY = {
    "ADD": torch.add, "SUB": torch.sub, "MUL": torch.mul, "REALDIV": torch.div,
    "MAXIMUM": torch.maximum, "MINIMUM": torch.minimum, "MAX_TEMP": torch.maximum, "MIN_TEMP": torch.minimum,
    "POW": torch.pow, "MUL_SILU": _mul_silu,
}
UNARY = {
    "ABS": torch.abs, "NEG": torch.neg, "SQUARE": torch.square, "SQRT": torch.sqrt, "RSQRT": torch.rsqrt,
    "EXP": torch.exp, "LOG": torch.log, "SIN": torch.sin, "COS": torch.cos, "TANH": torch.tanh,
    "SIGMOID": torch.sigmoid, "SILU": lambda x, out: torch.mul(x, torch.sigmoid(x), out=out),
    "RECIPROCAL": torch.reciprocal,
}
ACTIVATIONS = {0: None, RELU: lambda out: out.relu_(), RELU6: lambda out: out.clamp_(0, 6)}


class BinaryExecution(Execution):
    def __init__(self, backend, function, activation):
        super().__init__(backend)
        self.function, self.activation = function, activation
        self.out = None

    def on_resize(self, inputs, outputs) -> None:
        shape = torch.broadcast_shapes(inputs[0].storage.shape, inputs[1].storage.shape)
        self.out = outputs[0].storage.view(shape)

    def on_execute(self, inputs, outputs) -> None:
        self.function(inputs[0].storage, inputs[1].storage, out=self.out)
        if self.activation is not None:
            self.activation(self.out)


def create_binary(backend, inputs, outputs, op):
    function = BINARY.get(op.param.operation)
    if function is None:
        return Refused(f"no {op.param.operation} kernel")
    if op.param.activation not in ACTIVATIONS:
        return Refused(f"activation {op.param.activation}")
    if {t.dtype for t in (*inputs, *outputs)} != {FLOAT32}:
        return Refused("integer arithmetic keeps numpy's rules on cpu")
    return BinaryExecution(backend, function, ACTIVATIONS[op.param.activation])


class UnaryExecution(Execution):
    def __init__(self, backend, function):
        super().__init__(backend)
        self.function = function

    def on_execute(self, inputs, outputs) -> None:
        self.function(inputs[0].storage, out=outputs[0].storage)


class CastExecution(Execution):
    def on_execute(self, inputs, outputs) -> None:
        outputs[0].storage.copy_(inputs[0].storage)


def create_unary(backend, inputs, outputs, op):
    function = UNARY.get(op.param.operation)
    if function is None:
        return Refused(f"no {op.param.operation} kernel")
    if {t.dtype for t in (*inputs, *outputs)} != {FLOAT32}:
        return Refused("integer arithmetic keeps numpy's rules on cpu")
    return UnaryExecution(backend, function)


def create_cast(backend, inputs, outputs, op):
    if {t.dtype for t in (*inputs, *outputs)} - {FLOAT32, INT32}:
        return Refused("only float32 and int32")
    return CastExecution(backend)


CREATORS = {"BinaryOp": create_binary, "UnaryOp": create_unary, "Cast": create_cast}
