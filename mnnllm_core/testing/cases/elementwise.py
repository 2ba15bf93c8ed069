"""BinaryOp (every float operation on nine broadcast shapes, comparisons, int arithmetic, the
division family, shifts, fused activations), UnaryOp (every operation on several shapes and
input ranges, saturating and large arguments), Cast, Select, Eltwise, Softmax, ReLU/TanH/Sigmoid."""
from __future__ import annotations

import math

import numpy as np

from ...core.op import Op
from ...core.op_params import RELU, RELU6, BinaryParams, CastParams, EltwiseParams, SoftmaxParams, UnaryParams
from ..references import COMPARISON, FLOAT_BINARY, INT_BINARY, UNARY
from .case import Case, Trial, randn, single

UNARY_TOL = 2e-5  # device transcendental functions are a few ulp from numpy's
# (a, b): equal shapes, broadcasts of every kind, a scalar, a 5-D broadcast (needs 5 dims)
BINARY_SHAPES = [((7, 17), (7, 17)), ((3, 1, 5), (4, 1)), ((37,), ()), ((37, 1536, 1, 1), (37, 1536, 1, 1)),
                 ((37, 1), (32,)), ((37, 1), (33,)), ((2, 1, 5), (3, 1)), ((7,), ()), ((2, 3, 5, 1, 3), (3, 5, 4, 1))]
# The quotient rounded to fp32 first, as any correctly rounded fp32 division gives it, so that
# floor() of the reference and of the kernel see the same number next to an integer.
FLOAT_REFERENCE = {**FLOAT_BINARY,
                   "FLOORDIV": lambda a, b: np.floor((a / b).astype(np.float32)),
                   "FLOORMOD": lambda a, b: a - np.floor((a / b).astype(np.float32)) * b}


def binary_op(operation: str, activation: int = 0) -> Op:
    return Op("BinaryOp", operation.lower(), param=BinaryParams(operation, activation))


def unary_op(operation: str) -> Op:
    return Op("UnaryOp", operation.lower(), param=UnaryParams(operation))


def _float_binary(operation: str, shape_a: tuple, shape_b: tuple):
    def build(rng) -> Trial:
        if operation == "POW":
            a, b = np.abs(randn(rng, *shape_a)) + 0.1, randn(rng, *shape_b)
        else:
            a, b = randn(rng, *shape_a) * 3, randn(rng, *shape_b) * 3
            b = np.where(np.abs(b) < 0.25, np.float32(0.5), b).astype(np.float32)  # divisors away from 0
        return single(binary_op(operation), [a, b], [FLOAT_REFERENCE[operation](a.astype(np.float64),
                                                                                 b.astype(np.float64))])
    return build


def _comparison(operation: str, dtype):
    def build(rng) -> Trial:
        a = rng.integers(-3, 4, (7, 5)).astype(dtype)
        b = rng.integers(-3, 4, (5,)).astype(dtype)
        return single(binary_op(operation), [a, b], [COMPARISON[operation](a, b).astype(np.int32)])
    return build


def _int_binary(operation: str):
    def build(rng) -> Trial:
        a = rng.integers(-20, 21, (7, 5)).astype(np.int32)
        b = rng.integers(1, 9, (5,)).astype(np.int32) * rng.choice([-1, 1], 5).astype(np.int32)
        expected = INT_BINARY[operation](a.astype(np.int64), b.astype(np.int64)).astype(np.int32)
        return single(binary_op(operation), [a, b], [expected])
    return build


def _fixed(operation: str, a, b, expected, dtype=np.int32, checks=()):
    def build(rng) -> Trial:
        return single(binary_op(operation), [np.asarray(a, dtype), np.asarray(b, dtype)],
                      [np.asarray(expected, dtype)], checks=list(checks))
    return build


MOD_A = [7, -7, 7, -7, 3, -3, 0, 9]
MOD_B = [3, 3, -3, -3, 5, 5, 4, -2]
FLOAT_MOD_A = [v + 0.5 for v in MOD_A]


def _float_mod_signs(outputs, module, runtime):
    out = outputs[0]
    return None if out[1] < 0 and out[2] > 0 else "float MOD must take the sign of the dividend"


def _activation(activation: int, shape: tuple):
    def build(rng) -> Trial:
        a, b = randn(rng, *shape) * 5, randn(rng, *shape) * 5
        high = 6 if activation == RELU6 else np.inf
        return single(binary_op("ADD", activation), [a, b], [np.clip(a.astype(np.float64) + b, 0, high)])
    return build


def unary_input(rng, domain: str, shape: tuple) -> np.ndarray:
    """The reference suite's inputs: uniform in [-4, 4], kept inside the op's domain."""
    x = rng.uniform(-4, 4, shape)
    if domain == "positive":
        x = np.abs(x) + 0.05
    elif domain == "unit":
        x = np.clip(x / 4.5, -0.95, 0.95)
    elif domain == "above_one":
        x = np.abs(x) + 1.05
    return x.astype(np.float32)


WIDE_DOMAIN = {"SQRT": "positive", "RSQRT": "positive", "LOG": "positive", "LOG1P": "positive", "ACOSH": "above1",
               "ASIN": "unit", "ACOS": "unit", "ATANH": "unit", "RECIPROCAL": "nonzero"}
SATURATING = ("SIN", "COS", "TANH", "SIGMOID", "SILU", "GELU", "GELU_STANDARD", "ERF", "HARDSWISH")
SPECIAL_OPS = ("ABS", "NEG", "FLOOR", "CEIL", "SQUARE", "SQRT", "RSQRT", "EXP", "LOG", "SIN", "COS", "TAN", "ATAN",
               "RECIPROCAL", "SIGN", "SIGMOID", "TANH", "HARDSWISH", "SILU", "GELU", "GELU_STANDARD", "ERF")


def wide_input(rng, operation: str) -> np.ndarray:
    """randn * 2 over [37, 33], moved into the op's domain."""
    x = randn(rng, 37, 33) * 2
    domain = WIDE_DOMAIN.get(operation)
    if domain == "positive":
        x = np.abs(x) + 0.05
    elif domain == "above1":
        x = np.abs(x) + 1.01
    elif domain == "unit":
        x = np.tanh(x) * 0.95
    elif domain == "nonzero":
        x = np.where(np.abs(x) < 0.1, 0.5, x)
    return x.astype(np.float32)


def special_input(rng, operation: str) -> np.ndarray:
    """randn * 2 with zero, saturating and large arguments, halves, and tan away from its poles."""
    x = randn(rng, 37, 33) * 2
    if operation in SATURATING:
        x[0, :6] = [0.0, -30.0, 30.0, 95.0, -0.5, 0.5]
    if operation in ("SQRT", "RSQRT", "LOG"):
        x = np.abs(x) + 0.05
    elif operation == "RECIPROCAL":
        x = np.where(np.abs(x) < 0.1, 0.5, x)
    elif operation == "TAN":
        x = np.tanh(x) * 1.4
    return x.astype(np.float32)


def _unary(operation: str, make_input):
    def build(rng) -> Trial:
        x = make_input(rng)
        return single(unary_op(operation), [x], [UNARY[operation][0](x.astype(np.float64))])
    return build


def _round_halves(rng) -> Trial:
    x = np.array([0.5, 1.5, 2.5, -0.5, -2.5, 0.49999997, -1.2], np.float32)
    return single(unary_op("ROUND"), [x], [np.array([1, 2, 3, -1, -3, 0, -1], np.float32)])


def _cast(values: np.ndarray, dtype):
    def build(rng) -> Trial:
        return single(Op("Cast", "cast", param=CastParams(np.dtype(dtype))), [values], [values.astype(dtype)])
    return build


def _select(rng) -> Trial:
    condition = rng.integers(0, 2, (7, 1)).astype(np.int32)
    x, y = randn(rng, 7, 5), randn(rng, 5)
    return single(Op("Select", "select"), [condition, x, y], [np.where(condition != 0, x, y)])


def _softmax(axis: int):
    def build(rng) -> Trial:
        x = randn(rng, 3, 37, 5) * 4
        e = np.exp(x.astype(np.float64) - x.max(axis=axis, keepdims=True))
        return single(Op("Softmax", "softmax", param=SoftmaxParams(axis)), [x], [e / e.sum(axis=axis, keepdims=True)])
    return build


ELTWISE = {"SUM": lambda a, b, c: a + b + c, "PROD": lambda a, b, c: a * b * c,
           "MAXIMUM": lambda a, b, c: np.maximum(np.maximum(a, b), c)}


def _eltwise(operation: str):
    def build(rng) -> Trial:
        a, b, c = randn(rng, 7, 17), randn(rng, 7, 17), randn(rng, 7, 17)
        expected = ELTWISE[operation](*(t.astype(np.float64) for t in (a, b, c)))
        return single(Op("Eltwise", "eltwise", param=EltwiseParams(operation)), [a, b, c], [expected])
    return build


ACTIVATION_OPS = {"ReLU": lambda x: np.maximum(x, 0), "TanH": np.tanh, "Sigmoid": lambda x: 1 / (1 + np.exp(-x))}


def _activation_op(op_type: str):
    def build(rng) -> Trial:
        x = randn(rng, 7, 17) * 3
        return single(Op(op_type, op_type.lower()), [x], [ACTIVATION_OPS[op_type](x.astype(np.float64))])
    return build


def _binary_cases() -> list[Case]:
    found = []
    for operation in sorted(FLOAT_REFERENCE):
        for shape_a, shape_b in BINARY_SHAPES:
            tags = frozenset({"5d"}) if len(shape_a) > 4 else frozenset()
            found.append(Case("BinaryOp", f"{operation} {shape_a} x {shape_b}",
                              _float_binary(operation, shape_a, shape_b), operation=operation, tags=tags))
    for operation in sorted(COMPARISON):
        for dtype in (np.float32, np.int32):
            found.append(Case("BinaryOp", f"{operation} {np.dtype(dtype).name} gives int32",
                              _comparison(operation, dtype), tol=0, operation=operation, dtype=np.dtype(dtype).name))
    found += [Case("BinaryOp", f"{operation} int32", _int_binary(operation), tol=0, operation=operation, dtype="int32")
              for operation in sorted(INT_BINARY)]
    # MNN's BinaryModInt: C remainder, moved by the divisor when the signs differ
    found.append(Case("BinaryOp", "MOD int32 takes the sign of the divisor",
                      _fixed("MOD", MOD_A, MOD_B, [1, 2, -2, -1, 3, 2, 0, -1]), tol=0, operation="MOD", dtype="int32"))
    found.append(Case("BinaryOp", "MOD float32 takes the sign of the dividend",
                      _fixed("MOD", FLOAT_MOD_A, MOD_B, [math.fmod(a, b) for a, b in zip(FLOAT_MOD_A, MOD_B)],
                             np.float32, [_float_mod_signs]), tol=0, operation="MOD"))
    # values measured with MNN 3.6.1's own runtime (MNN.expr) on [7, -7, 7, -7] op [3, 3, -3, -3]
    for operation, expected in (("MOD", [1, 2, -2, -1]), ("FLOORDIV", [2, -3, -3, 2]), ("REALDIV", [2, -2, -2, 2]),
                                ("DIV", [2, -2, -2, 2])):
        found.append(Case("BinaryOp", f"{operation} int32 as MNN", _fixed(operation, [7, -7, 7, -7], [3, 3, -3, -3],
                                                                         expected), tol=0, operation=operation,
                          dtype="int32"))
    for operation, expected in (("LEFTSHIFT", [8, 10, 12, -8]), ("RIGHTSHIFT", [2, 2, 0, -2])):
        found.append(Case("BinaryOp", f"{operation} int32", _fixed(operation, [4, 5, 3, -4], [1, 1, 2, 1], expected),
                          tol=0, operation=operation, dtype="int32"))
    found += [Case("BinaryOp", f"ADD fused {name} {shape}", _activation(act, shape), operation="ADD")
              for name, act in (("relu", RELU), ("relu6", RELU6)) for shape in ((7, 17), (5, 9))]
    return found


def _unary_cases() -> list[Case]:
    found = []
    for operation in sorted(UNARY):
        domain = UNARY[operation][1]
        for shape in ((1,), (7, 17), (3, 576)):
            found.append(Case("UnaryOp", f"{operation} {shape}",
                              _unary(operation, lambda rng, d=domain, s=shape: unary_input(rng, d, s)),
                              device_tol=UNARY_TOL, operation=operation))
        found.append(Case("UnaryOp", f"{operation} randn*2 (37, 33)",
                          _unary(operation, lambda rng, o=operation: wide_input(rng, o)), device_tol=UNARY_TOL,
                          operation=operation))
    found += [Case("UnaryOp", f"{operation} special values", _unary(operation, lambda rng, o=operation:
                                                                    special_input(rng, o)),
                   device_tol=UNARY_TOL, operation=operation) for operation in SPECIAL_OPS]
    found.append(Case("UnaryOp", "ROUND sends halves away from zero", _round_halves, tol=0, operation="ROUND"))
    found.append(Case("UnaryOp", "TAN beside its poles", _unary("TAN", _near_tan_poles), device_tol=UNARY_TOL,
                      operation="TAN"))
    return found


def _near_tan_poles(rng) -> np.ndarray:
    """Arguments within 2e-3 of odd multiples of pi/2 up to 20, where tan is large and a tan built
    from approximate sin and cos loses every digit (the tolerance is relative to the largest value)."""
    poles = (2 * np.arange(-6, 7) + 1) * np.pi / 2
    return (poles[:, None] + rng.uniform(-2e-3, 2e-3, (len(poles), 5))).astype(np.float32)


def _other_cases() -> list[Case]:
    found = [
        Case("Cast", "float32 -> int32 truncates toward zero",
             _cast(np.array([[1.7, -1.7, 2.5, -0.2, 37.0]], np.float32), np.int32), tol=0),
        Case("Cast", "float32 -> int32 halves and large values",
             _cast(np.array([[1.7, -1.7, 2.5, -0.2, 37.0, -2.5, 1e6 + 0.5, 0.0, 3.0]], np.float32), np.int32), tol=0),
        Case("Cast", "int32 -> float32 positions", _cast(np.arange(37, dtype=np.int32).reshape(1, 37) - 5, np.float32),
             tol=0, dtype="int32"),
        Case("Cast", "int32 -> float32 rounds past 2^24",
             _cast(np.concatenate([np.arange(-3, 40), [16777217]]).astype(np.int32).reshape(1, -1), np.float32), tol=0,
             dtype="int32"),
        Case("Cast", "float32 -> float32 copies (a mask cast to float)",
             _cast(np.array([[1.0, -0.0, 2.5, -1e30, 3.4e38, 1e-40]], np.float32), np.float32), tol=0),
        Case("Select", "by condition with broadcasting", _select, tol=0),
    ]
    found += [Case("Softmax", f"axis={axis}", _softmax(axis)) for axis in (-1, 0, 1)]
    found += [Case("Eltwise", operation, _eltwise(operation), operation=operation) for operation in ELTWISE]
    found += [Case(op_type, "(7, 17)", _activation_op(op_type)) for op_type in ACTIVATION_OPS]
    return found


def cases() -> list[Case]:
    return _binary_cases() + _unary_cases() + _other_cases()

