"""BinaryOp, UnaryOp, Cast, Select and friends: numpy ufuncs in the tensor's dtype."""
from __future__ import annotations

from functools import partial

import numpy as np

from mnnllm_core.backend_api import RELU, RELU6, Execution, Refused


def _silu(x):
    return x / (1.0 + np.exp(-x))


def _mod(a, b):
    """MNN's MOD: C fmod for floats, floor-sign-corrected remainder for ints."""
    if np.issubdtype(np.result_type(a, b), np.floating):
        return np.fmod(a, b)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.mod(a, b)


def _round_half_away(x):
    """C roundf, as MNN's UnaryRound: halves go away from zero (np.round goes to even)."""
    whole = np.trunc(x)
    return np.where(np.abs(x - whole) >= 0.5, whole + np.sign(x), whole)


BINARY = {
    "ADD": np.add, "SUB": np.subtract, "MUL": np.multiply, "REALDIV": np.divide,
    "DIV": np.divide,  # ints: the float quotient is stored truncated, C division as in MNN (-7 / 3 = -2)
    "MAX_TEMP": np.maximum, "MIN_TEMP": np.minimum, "MAXIMUM": np.maximum, "MINIMUM": np.minimum,
    "POW": np.power, "FLOORDIV": np.floor_divide, "FLOORMOD": np.mod, "MOD": _mod,
    "SquaredDifference": lambda a, b: np.square(a - b), "ATAN2": np.arctan2,
    "GREATER": np.greater, "GREATER_EQUAL": np.greater_equal, "LESS": np.less, "LESS_EQUAL": np.less_equal,
    "EQUAL": np.equal, "NOTEQUAL": np.not_equal, "LOGICALOR": np.logical_or, "LOGICALXOR": np.logical_xor,
    "BITWISE_AND": np.bitwise_and, "BITWISE_OR": np.bitwise_or, "BITWISE_XOR": np.bitwise_xor,
    "LEFTSHIFT": np.left_shift, "RIGHTSHIFT": np.right_shift,
    "MUL_SILU": lambda a, b: a * _silu(b),
}

UNARY = {
    "ABS": np.abs, "NEG": np.negative, "FLOOR": np.floor, "CEIL": np.ceil, "SQUARE": np.square,
    "SQRT": np.sqrt, "RSQRT": lambda x: 1.0 / np.sqrt(x), "EXP": np.exp, "LOG": np.log,
    "SIN": np.sin, "COS": np.cos, "TAN": np.tan, "ASIN": np.arcsin, "ACOS": np.arccos, "ATAN": np.arctan,
    "RECIPROCAL": np.reciprocal, "LOG1P": np.log1p, "BNLL": lambda x: np.log1p(np.exp(x)),
    "ACOSH": np.arccosh, "SINH": np.sinh, "ASINH": np.arcsinh, "ATANH": np.arctanh, "SIGN": np.sign,
    "ROUND": _round_half_away, "COSH": np.cosh, "EXPM1": np.expm1, "SIGMOID": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "TANH": np.tanh, "HARDSWISH": lambda x: x * np.clip(x + 3, 0, 6) / 6, "SILU": _silu,
    "GELU": lambda x: 0.5 * x * (1 + np.tanh(0.7978845608 * (x + 0.044715 * x ** 3))),
    "GELU_STANDARD": lambda x: 0.5 * x * (1 + _erf(x / np.sqrt(2.0))),
    "ERF": lambda x: _erf(x),
}


def _erf(x):
    """Abramowitz and Stegun 7.1.26 in float64, |error| <= 1.5e-7 (about an fp32 ulp): math.erf
    element by element is a Python call each, seconds for one BERT layer's GELU."""
    a = np.abs(x.astype(np.float64))
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return (np.sign(x) * (1.0 - poly * np.exp(-a * a))).astype(x.dtype)


ACTIVATIONS = {0: None, RELU: lambda x: np.maximum(x, 0), RELU6: lambda x: np.clip(x, 0, 6)}


class BinaryExecution(Execution):
    def __init__(self, backend, function, activation):
        super().__init__(backend)
        self.function = function
        self.activation = activation

    def on_execute(self, inputs, outputs) -> None:
        out = outputs[0].storage
        result = self.function(inputs[0].storage, inputs[1].storage)
        if self.activation is not None:
            result = self.activation(result)
        out[...] = result


class MulSiluExecution(Execution):
    """memory "low": a * silu(b) in one numba pass when both sides have the output's shape. Each
    element is read before it is written, so the output may take a's storage (the MLP's gate:
    a long prefill holds one [rows, intermediate] buffer less)."""

    output_may_share = 0
    row_wise = True

    def on_resize(self, inputs, outputs) -> None:
        from ..kernels.activation import mul_silu
        self.kernel = mul_silu
        self.arguments = tuple(t.storage.reshape(-1) for t in (*inputs, *outputs))  # fixed until the next resize

    def on_execute(self, inputs, outputs) -> None:
        self.kernel(*self.arguments)

    def replay_steps(self, inputs, outputs) -> list:
        return [partial(self.kernel, *self.arguments)]


class UnaryExecution(Execution):
    def __init__(self, backend, function):
        super().__init__(backend)
        self.function = function

    def on_execute(self, inputs, outputs) -> None:
        outputs[0].storage[...] = self.function(inputs[0].storage)


class CastExecution(Execution):
    def on_execute(self, inputs, outputs) -> None:
        outputs[0].storage[...] = inputs[0].storage


class SelectExecution(Execution):
    def on_execute(self, inputs, outputs) -> None:
        outputs[0].storage[...] = np.where(inputs[0].storage != 0, inputs[1].storage, inputs[2].storage)


class EltwiseExecution(Execution):
    """Folds every input with one binary function, left to right."""

    def __init__(self, backend, function):
        super().__init__(backend)
        self.function = function

    def on_execute(self, inputs, outputs) -> None:
        acc = inputs[0].storage
        for t in inputs[1:]:
            acc = self.function(acc, t.storage)
        outputs[0].storage[...] = acc


def _binary(backend, inputs, outputs, op):
    p = op.param
    function = BINARY.get(p.operation)
    if function is None:
        return Refused(f"no {p.operation} kernel")
    if (p.operation == "MUL_SILU" and not p.activation and backend.low_memory()
            and all(t.shape == outputs[0].shape and t.dtype == np.float32 for t in (*inputs, outputs[0]))):
        return MulSiluExecution(backend)
    return BinaryExecution(backend, function, ACTIVATIONS.get(p.activation))


def _unary(backend, inputs, outputs, op):
    function = UNARY.get(op.param.operation)
    return Refused(f"no {op.param.operation} kernel") if function is None else UnaryExecution(backend, function)


ELTWISE = {"PROD": np.multiply, "SUM": np.add, "MAXIMUM": np.maximum, "SUB": np.subtract}


def _eltwise(backend, inputs, outputs, op):
    function = ELTWISE.get(op.param.operation)
    return Refused(f"no {op.param.operation} kernel") if function is None else EltwiseExecution(backend, function)


def _softmax(x, axis):
    x = x - x.max(axis=axis, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)


def _softmax_creator(backend, inputs, outputs, op):
    axis = op.param.axis
    return UnaryExecution(backend, lambda x: _softmax(x, axis))


def _relu(backend, inputs, outputs, op):
    slope = op.param.slope
    if not slope:
        return UnaryExecution(backend, lambda x: np.maximum(x, 0))
    return UnaryExecution(backend, lambda x: np.where(x > 0, x, x * slope))


CREATORS = {
    "BinaryOp": _binary,
    "UnaryOp": _unary,
    "Eltwise": _eltwise,
    "Cast": lambda b, i, o, op: CastExecution(b),
    "Select": lambda b, i, o, op: SelectExecution(b),
    "ReLU": _relu,
    "Sigmoid": lambda b, i, o, op: UnaryExecution(b, UNARY["SIGMOID"]),
    "TanH": lambda b, i, o, op: UnaryExecution(b, np.tanh),
    "Softmax": _softmax_creator,
}
