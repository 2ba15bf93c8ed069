"""TopKV2: largest and smallest, k and axis as inputs, ties in index order."""
from __future__ import annotations

import numpy as np

from ...core.op import Op
from ...core.op_params import TopKParams
from .case import Case, Trial, ints, randn, single


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


def cases() -> list[Case]:
    return [Case("TopKV2", f"{shape} k={k} axis={axis} largest={largest}{' ties' if ties else ''}",
                 _topk(shape, k, axis, largest, ties), tol=0)
            for shape, k, axis, largest, ties in (((7, 4), 2, None, True, False), ((5, 37), 1, None, True, False),
                                                  ((3, 9, 5), 3, 1, True, False), ((6, 11), 4, -1, False, False),
                                                  ((4, 13), 5, None, True, True), ((4, 13), 13, None, False, True))]
