"""MatMul (transposes, broadcast batches) and Reduction (every float reduction over several
dims, with and without keepDims; ANY/ALL on int32)."""
from __future__ import annotations

import numpy as np

from ...core.op import Op
from ...core.op_params import MatMulParams, ReductionParams
from ..references import REDUCTIONS
from . import Case, Trial, randn, single


def _matmul(ta: bool, tb: bool, shape_a: tuple, shape_b: tuple):
    def build(rng) -> Trial:
        a, b = randn(rng, *shape_a), randn(rng, *shape_b)
        a_in = np.ascontiguousarray(np.swapaxes(a, -1, -2)) if ta else a
        b_in = np.ascontiguousarray(np.swapaxes(b, -1, -2)) if tb else b
        op = Op("MatMul", "mm", param=MatMulParams(ta, tb))
        return single(op, [a_in, b_in], [np.matmul(a.astype(np.float64), b.astype(np.float64))])
    return build


def _reduction(operation: str, dims: tuple, keep: bool):
    def build(rng) -> Trial:
        x = randn(rng, 3, 4, 5) * 0.9 + 0.3
        axes = tuple(d % 3 for d in dims) if dims else None
        op = Op("Reduction", operation.lower(), param=ReductionParams(operation, dims, keep))
        return single(op, [x], [REDUCTIONS[operation](x.astype(np.float64), axis=axes, keepdims=keep)])
    return build


def _logical(operation: str, reference):
    def build(rng) -> Trial:
        x = np.array([[0, 1, 0], [1, 1, 1], [0, 0, 0]], np.int32)
        op = Op("Reduction", "r", param=ReductionParams(operation, (1,), False))
        return single(op, [x], [reference(x != 0, axis=1).astype(np.int32)])
    return build


def cases() -> list[Case]:
    found = [Case("MatMul", f"{shape_a} x {shape_b} transpose a={ta} b={tb}", _matmul(ta, tb, shape_a, shape_b))
             for ta in (False, True) for tb in (False, True)
             for shape_a, shape_b in (((7, 5), (5, 3)), ((2, 1, 3, 4), (5, 4, 6)), ((37, 17), (17, 1)))]
    found += [Case("Reduction", f"{operation} dims={dims} keep={keep}", _reduction(operation, dims, keep),
                   operation=operation)
              for operation in sorted(REDUCTIONS) for dims, keep in (((1,), False), ((-1,), True), ((0, 2), False),
                                                                    ((), True))]
    found += [Case("Reduction", f"{operation} int32", _logical(operation, reference), tol=0, operation=operation,
                   dtype="int32") for operation, reference in (("ANY", np.any), ("ALL", np.all))]
    return found
