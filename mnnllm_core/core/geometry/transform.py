"""Lowering of pure data-movement ops to Raster regions (MNN's geometry computing).

Each function gets the op, its inputs and its outputs (shapes already computed) and
returns a RasterParam, or None when the op cannot be lowered as given (e.g. a Gather
whose indices are only known at run time): the op then runs as itself.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from ..op import Op
from ..tensor import Tensor
from .regions import RasterParam, full_copy, row_major_strides, strided_regions
from .shape_args import concat_axis, gather_axis, permute_axes, strided_slice_plan


def _reshape_like(op: Op, inputs: Sequence[Tensor], outputs: Sequence[Tensor]) -> RasterParam:
    return RasterParam([full_copy(outputs[0].size)])


def _concat(op: Op, inputs: Sequence[Tensor], outputs: Sequence[Tensor]) -> RasterParam:
    out = outputs[0]
    axis = concat_axis(op, len(out.shape))
    inner = int(np.prod(out.shape[axis + 1:], dtype=np.int64))
    outer = int(np.prod(out.shape[:axis], dtype=np.int64))
    regions, start = [], 0
    for origin, tensor in enumerate(inputs):
        extent = tensor.shape[axis]
        regions += strided_regions(
            (outer, extent * inner), 0, (extent * inner, 1), start * inner, (out.shape[axis] * inner, 1), origin)
        start += extent
    return RasterParam(regions)


def _strided_slice(op: Op, inputs: Sequence[Tensor], outputs: Sequence[Tensor]) -> RasterParam | None:
    plan = strided_slice_plan(op, inputs)
    if plan is None:
        return None
    begins, steps, sizes = plan
    src_strides = row_major_strides(inputs[0].shape)
    offset = sum(b * s for b, s in zip(begins, src_strides))
    strides = [st * s for st, s in zip(steps, src_strides)]
    return RasterParam(strided_regions(sizes, offset, strides, 0, row_major_strides(sizes)))


def _permute(op: Op, inputs: Sequence[Tensor], outputs: Sequence[Tensor]) -> RasterParam | None:
    axes = permute_axes(op, inputs)
    if axes is None:
        return None
    src_strides = row_major_strides(inputs[0].shape)
    sizes = [inputs[0].shape[a] for a in axes]
    return RasterParam(strided_regions(sizes, 0, [src_strides[a] for a in axes], 0, row_major_strides(sizes)))


def _gather(op: Op, inputs: Sequence[Tensor], outputs: Sequence[Tensor]) -> RasterParam | None:
    params, indices = inputs[0], inputs[1]
    if indices.host is None:
        return None
    axis = gather_axis(op, inputs)
    extent = params.shape[axis]
    outer = int(np.prod(params.shape[:axis], dtype=np.int64))
    inner = int(np.prod(params.shape[axis + 1:], dtype=np.int64))
    flat = indices.host.reshape(-1).astype(np.int64)
    regions, holes = [], False
    for k, index in enumerate(flat):
        index = index + extent if index < 0 else index
        if not 0 <= index < extent:
            holes = True  # MNN writes zeros for an out-of-range index
            continue
        regions += strided_regions(
            (outer, inner), int(index) * inner, (extent * inner, 1), k * inner, (len(flat) * inner, 1))
    return RasterParam(regions, zero_fill=holes)


LOWERINGS: dict[str, Callable[[Op, Sequence[Tensor], Sequence[Tensor]], RasterParam | None]] = {
    "Reshape": _reshape_like,
    "Squeeze": _reshape_like,
    "Unsqueeze": _reshape_like,
    "ExpandDims": _reshape_like,
    "Flatten": _reshape_like,
    "ConvertTensor": _reshape_like,
    "Concat": _concat,
    "StridedSlice": _strided_slice,
    "Permute": _permute,
    "Transpose": _permute,
    "GatherV2": _gather,
    "Gather": _gather,
}


def lower(op: Op, inputs: Sequence[Tensor], outputs: Sequence[Tensor]) -> RasterParam | None:
    """Regions for `op`, or None if it is not a data-movement op (or not lowerable)."""
    lowering = LOWERINGS.get(op.type)
    if lowering is None or len(outputs) != 1:
        return None
    return lowering(op, inputs, outputs)
