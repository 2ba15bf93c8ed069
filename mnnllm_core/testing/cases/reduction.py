"""Reduction: every float reduction over several dims, with and without keepDims, dims as an
input as ONNX's ReduceX gives them; ANY/ALL on int32."""
from __future__ import annotations

import numpy as np

from ...core.op import Op
from ...core.op_params import ReductionParams
from ..references import REDUCTIONS
from .case import Case, Trial, ints, randn, single


def _reduction(operation: str, dims: tuple, keep: bool):
    def build(rng) -> Trial:
        x = randn(rng, 3, 4, 5) * 0.9 + 0.3
        axes = tuple(d % 3 for d in dims) if dims else None
        op = Op("Reduction", operation.lower(), param=ReductionParams(operation, dims, keep))
        return single(op, [x], [REDUCTIONS[operation](x.astype(np.float64), axis=axes, keepdims=keep)])
    return build


def _reduction_dims_input(operation: str, dims: tuple, keep: bool):
    def build(rng) -> Trial:
        x = randn(rng, 3, 5, 7) * 0.9 + 0.3
        op = Op("Reduction", operation.lower(), param=ReductionParams(operation, (), keep))
        axes = tuple(d % 3 for d in dims)
        return single(op, [x, ints(*dims)], [REDUCTIONS[operation](x.astype(np.float64), axis=axes, keepdims=keep)])
    return build


def _logical(operation: str, reference):
    def build(rng) -> Trial:
        x = np.array([[0, 1, 0], [1, 1, 1], [0, 0, 0]], np.int32)
        op = Op("Reduction", "r", param=ReductionParams(operation, (1,), False))
        return single(op, [x], [reference(x != 0, axis=1).astype(np.int32)])
    return build


def cases() -> list[Case]:
    found = [Case("Reduction", f"{operation} dims={dims} keep={keep}", _reduction(operation, dims, keep),
                  operation=operation)
             for operation in sorted(REDUCTIONS) for dims, keep in (((1,), False), ((-1,), True), ((0, 2), False),
                                                                   ((), True))]
    found += [Case("Reduction", f"{operation} dims={dims} as an input keep={keep}",
                   _reduction_dims_input(operation, dims, keep), operation=operation)
              for operation in ("SUM", "MEAN", "MAXIMUM") for dims, keep in (((-1,), True), ((0, 2), False))]
    found += [Case("Reduction", f"{operation} int32", _logical(operation, reference), tol=0, operation=operation,
                   dtype="int32") for operation, reference in (("ANY", np.any), ("ALL", np.all))]
    return found
