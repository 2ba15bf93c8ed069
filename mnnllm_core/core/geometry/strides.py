"""Element strides of the views device kernels walk: broadcast inputs folded to a few dims,
and whether a Raster region's box is one contiguous run."""
from __future__ import annotations

from typing import Sequence


def broadcast_strides(out_shape: Sequence[int], in_shapes: Sequence[Sequence[int]],
                      max_dims: int = 4) -> tuple[list[int], list[list[int]]] | None:
    """The output walked as `max_dims` dims (leading ones padded with extent 1), with each
    input's element stride per dim (0 where it broadcasts): dims of extent 1 are dropped and
    neighbours merged where every input allows it. None when more than `max_dims` remain."""
    rank = len(out_shape)
    per_input = []
    for shape in in_shapes:
        shape = (1,) * (rank - len(shape)) + tuple(shape)
        strides, step = [0] * rank, 1
        for d in range(rank - 1, -1, -1):
            strides[d] = 0 if shape[d] == 1 else step
            step *= shape[d]
        per_input.append(strides)
    dims: list[int] = []
    merged: list[list[int]] = [[] for _ in in_shapes]
    for d in range(rank):
        n = int(out_shape[d])
        if n == 1:
            continue
        if dims and all(m[-1] == own[d] * n for m, own in zip(merged, per_input)):
            dims[-1] *= n
            for m, own in zip(merged, per_input):
                m[-1] = own[d]
            continue
        dims.append(n)
        for m, own in zip(merged, per_input):
            m.append(own[d])
    if len(dims) > max_dims:
        return None
    pad = max_dims - len(dims)
    return [1] * pad + dims, [[0] * pad + m for m in merged]


def walks_contiguously(size: Sequence[int], stride: Sequence[int]) -> bool:
    """Whether a box of `size` with element `stride`s visits consecutive elements (dims of
    extent 1 do not matter), so that a region can be a plain buffer copy."""
    expected = 1
    for n, s in zip(reversed(list(size)), reversed(list(stride))):
        if n != 1 and s != expected:
            return False
        expected *= n
    return True
