"""MatMul (transposes, broadcast batches), Reduction (every float reduction over several
dims, with and without keepDims, dims as an input as ONNX's ReduceX gives them; ANY/ALL on
int32), TopKV2 (largest and smallest, k and axis as inputs, ties in index order) and Fill
(ONNX ConstantOfShape: the shape an input known at resize)."""
from __future__ import annotations

import numpy as np

from ...core.op import Op
from ...core.op_params import MatMulParams, ReductionParams, TopKParams
from ..references import REDUCTIONS
from . import Case, Trial, ints, randn, single


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


def _reduction_dims_input(operation: str, dims: tuple, keep: bool):
    def build(rng) -> Trial:
        x = randn(rng, 3, 5, 7) * 0.9 + 0.3
        op = Op("Reduction", operation.lower(), param=ReductionParams(operation, (), keep))
        axes = tuple(d % 3 for d in dims)
        return single(op, [x, ints(*dims)], [REDUCTIONS[operation](x.astype(np.float64), axis=axes, keepdims=keep)])
    return build


def topk_reference(x: np.ndarray, k: int, axis: int, largest: bool) -> tuple[np.ndarray, np.ndarray]:
    """The k largest (smallest) along the axis, in order; equal values by lower index."""
    moved = np.moveaxis(x.astype(np.float64), axis, -1)
    flat = moved.reshape(-1, moved.shape[-1])
    index = np.empty((flat.shape[0], k), np.int32)
    for row in range(flat.shape[0]):
        ranked = sorted(range(flat.shape[1]), key=lambda i: (-flat[row, i] if largest else flat[row, i], i))
        index[row] = ranked[:k]
    values = np.take_along_axis(flat, index.astype(np.int64), axis=-1)
    shape = moved.shape[:-1] + (k,)
    return (np.moveaxis(values.reshape(shape), -1, axis), np.moveaxis(index.reshape(shape), -1, axis))


def _topk(shape: tuple, k: int, axis: int | None, largest: bool, ties: bool = False):
    def build(rng) -> Trial:
        x = randn(rng, *shape)
        if ties:
            x = np.round(x * 2).astype(np.float32) / 2
        inputs = [x, ints(k)] + ([ints(axis)] if axis is not None else [])
        values, index = topk_reference(x, k, axis if axis is not None else -1, largest)
        op = Op("TopKV2", "topk", param=TopKParams(largest, True))
        return single(op, inputs, [values, index], outputs=2)
    return build


def _fill(shape: tuple, value, dtype):
    def build(rng) -> Trial:
        fill = np.asarray([value], dtype)
        return single(Op("Fill", "fill"), [ints(*shape), fill], [np.full(shape, value, dtype)])
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
    found += [Case("Reduction", f"{operation} dims={dims} as an input keep={keep}",
                   _reduction_dims_input(operation, dims, keep), operation=operation)
              for operation in ("SUM", "MEAN", "MAXIMUM") for dims, keep in (((-1,), True), ((0, 2), False))]
    found += [Case("TopKV2", f"{shape} k={k} axis={axis} largest={largest}{' ties' if ties else ''}",
                   _topk(shape, k, axis, largest, ties), tol=0)
              for shape, k, axis, largest, ties in (((7, 4), 2, None, True, False), ((5, 37), 1, None, True, False),
                                                    ((3, 9, 5), 3, 1, True, False), ((6, 11), 4, -1, False, False),
                                                    ((4, 13), 5, None, True, True), ((4, 13), 13, None, False, True))]
    found += [Case("Fill", f"{shape} with {value} {np.dtype(dtype).name}", _fill(shape, value, dtype), tol=0,
                   dtype=np.dtype(dtype).name)
              for shape, value, dtype in (((1, 7, 1), 0.0, np.float32), ((2, 3, 5), 1.5, np.float32),
                                          ((4,), 3, np.int32))]
    found += [Case("Reduction", f"{operation} int32", _logical(operation, reference), tol=0, operation=operation,
                   dtype="int32") for operation, reference in (("ANY", np.any), ("ALL", np.all))]
    return found
