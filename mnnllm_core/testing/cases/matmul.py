"""MatMul of two run-time tensors: each transpose, broadcast batches, a single-column result."""
from __future__ import annotations

import numpy as np

from ...core.op import Op
from ...core.op_params import MatMulParams
from .case import Case, Trial, randn, single


def _matmul(ta: bool, tb: bool, shape_a: tuple, shape_b: tuple):
    def build(rng) -> Trial:
        a, b = randn(rng, *shape_a), randn(rng, *shape_b)
        a_in = np.ascontiguousarray(np.swapaxes(a, -1, -2)) if ta else a
        b_in = np.ascontiguousarray(np.swapaxes(b, -1, -2)) if tb else b
        op = Op("MatMul", "mm", param=MatMulParams(ta, tb))
        return single(op, [a_in, b_in], [np.matmul(a.astype(np.float64), b.astype(np.float64))])
    return build


def cases() -> list[Case]:
    return [Case("MatMul", f"{shape_a} x {shape_b} transpose a={ta} b={tb}", _matmul(ta, tb, shape_a, shape_b))
            for ta in (False, True) for tb in (False, True)
            for shape_a, shape_b in (((7, 5), (5, 3)), ((2, 1, 3, 4), (5, 4, 6)), ((37, 17), (17, 1)))]
