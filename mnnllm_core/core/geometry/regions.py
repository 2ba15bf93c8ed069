"""MNN's Raster: a copy described as regions, so a backend needs one copy primitive.

A region copies a 3-D box of `size` elements from the flat source (starting at
`src.offset`, walking `src.stride`) to the flat destination (`dst.offset`, `dst.stride`).
Offsets and strides count elements of the logical row-major layout.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class View:
    offset: int
    stride: tuple[int, int, int]


@dataclass(frozen=True)
class Region:
    src: View
    dst: View
    size: tuple[int, int, int]
    origin: int = 0  # which input of the Raster op the region reads


@dataclass
class RasterParam:
    """Parameter of the core-made "Raster" op; `zero_fill` when regions leave holes."""

    regions: list[Region]
    zero_fill: bool = False


def row_major_strides(shape: Sequence[int]) -> list[int]:
    strides, acc = [], 1
    for extent in reversed(shape):
        strides.append(acc)
        acc *= int(extent)
    return strides[::-1]


def strided_regions(sizes: Sequence[int], src_offset: int, src_strides: Sequence[int],
                    dst_offset: int, dst_strides: Sequence[int], origin: int = 0) -> list[Region]:
    """Regions copying an N-D box: dims of extent 1 dropped, dims that are contiguous in
    both source and destination merged, and any dims beyond three unrolled into
    one region per outer index."""
    dims = [(int(n), int(s), int(d)) for n, s, d in zip(sizes, src_strides, dst_strides) if n != 1]
    if any(n == 0 for n, _, _ in dims):
        return []
    merged: list[tuple[int, int, int]] = []
    for n, s, d in dims:
        if merged:
            pn, ps, pd = merged[-1]
            if ps == n * s and pd == n * d:
                merged[-1] = (pn * n, s, d)
                continue
        merged.append((n, s, d))
    while len(merged) < 3:
        merged.insert(0, (1, 0, 0))
    outer, inner = merged[:-3], merged[-3:]
    size = tuple(n for n, _, _ in inner)
    src_stride = tuple(s for _, s, _ in inner)
    dst_stride = tuple(d for _, _, d in inner)
    regions = []
    for index in range(_count(outer)):
        so, do, rest = src_offset, dst_offset, index
        for n, s, d in reversed(outer):
            rest, i = divmod(rest, n)
            so += i * s
            do += i * d
        regions.append(Region(View(so, src_stride), View(do, dst_stride), size, origin))
    return regions


def _count(dims: Sequence[tuple[int, int, int]]) -> int:
    total = 1
    for n, _, _ in dims:
        total *= n
    return total


def full_copy(count: int, origin: int = 0) -> Region:
    return Region(View(0, (0, 0, 1)), View(0, (0, 0, 1)), (1, 1, int(count)), origin)
