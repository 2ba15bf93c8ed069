"""Reading an op's shape arguments (axes, dims, slice bounds) from its parameter table or,
as newer exports do, from constant input tensors. Shared by shape inference and geometry."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..op import Op
from ..tensor import Tensor
from ...errors import UnsupportedError


def _param(op: Op, name: str, default=None):
    """A field of the op's MNN table (data-movement ops are the core's: they have no typed params)."""
    value = getattr(op.table, name, None) if op.table is not None else None
    return default if value is None else value


def host_ints(tensor: Tensor, op: Op, what: str) -> list[int]:
    if tensor.host is None:
        raise UnsupportedError(f"{op.type} {op.name!r} needs its {what} at resize time, "
                               f"but input {tensor.name!r} is only known at run time", field=what)
    return [int(v) for v in np.asarray(tensor.host).reshape(-1)]


def normalize_axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def concat_axis(op: Op, rank: int) -> int:
    return normalize_axis(int(_param(op, "axis", 0)), rank)


def gather_axis(op: Op, inputs: Sequence[Tensor]) -> int:
    axis = host_ints(inputs[2], op, "axis")[0] if len(inputs) > 2 else op.param.axis
    return normalize_axis(axis, len(inputs[0].shape))


def squeeze_axes(op: Op, inputs: Sequence[Tensor]) -> list[int] | None:
    if len(inputs) > 1:
        return host_ints(inputs[1], op, "squeezeDims")
    dims = _param(op, "squeezeDims")
    return None if dims is None or len(dims) == 0 else [int(d) for d in dims]


def reshape_dims(op: Op, inputs: Sequence[Tensor]) -> list[int]:
    if len(inputs) > 1:
        return host_ints(inputs[1], op, "dims")
    return [int(d) for d in _param(op, "dims", [])]


def permute_axes(op: Op, inputs: Sequence[Tensor]) -> list[int] | None:
    rank = len(inputs[0].shape)
    if len(inputs) > 1:
        if inputs[1].host is None:
            return None
        axes = host_ints(inputs[1], op, "perm")
    else:
        axes = [int(d) for d in _param(op, "dims", [])]
    if not axes:
        axes = list(range(rank))[::-1]
    return [normalize_axis(a, rank) for a in axes]


def _clamp_bound(value: int, extent: int, step: int, is_begin: bool) -> int:
    if value < 0:
        value += extent
    if step > 0:
        return min(max(value, 0), extent)
    return min(max(value, -1), extent - 1)


def strided_slice_plan(op: Op, inputs: Sequence[Tensor]) -> tuple[list[int], list[int], list[int]] | None:
    """(begin, step, size) per input dim, or None if the bounds are run-time values."""
    if any(t.host is None for t in inputs[1:]):
        return None
    shape = list(inputs[0].shape)
    rank = len(shape)
    begins, steps, sizes = [0] * rank, [1] * rank, list(shape)
    if int(_param(op, "fromType", 0)) == 1:  # ONNX Slice: data, starts, ends, axes, steps
        starts = host_ints(inputs[1], op, "starts")
        ends = host_ints(inputs[2], op, "ends")
        axes = host_ints(inputs[3], op, "axes") if len(inputs) > 3 else list(range(len(starts)))
        strides = host_ints(inputs[4], op, "steps") if len(inputs) > 4 else [1] * len(starts)
        for b, e, a, s in zip(starts, ends, axes, strides):
            a = normalize_axis(a, rank)
            begins[a], steps[a], sizes[a] = _bounds(b, e, s, shape[a], False, False, op)
        return begins, steps, sizes
    begin = host_ints(inputs[1], op, "begin")
    end = host_ints(inputs[2], op, "end")
    strides = host_ints(inputs[3], op, "strides") if len(inputs) > 3 else [1] * len(begin)
    begin_mask = int(_param(op, "beginMask", 0))
    end_mask = int(_param(op, "endMask", 0))
    shrink_mask = int(_param(op, "shrinkAxisMask", 0))
    ellipsis_mask = int(_param(op, "ellipsisMask", 0))
    if int(_param(op, "newAxisMask", 0)):
        raise UnsupportedError(f"StridedSlice {op.name!r}: newAxisMask is not supported", field="newAxisMask")
    dim = 0
    for i in range(len(begin)):
        if ellipsis_mask & (1 << i):
            dim += rank - (len(begin) - 1)
            continue
        if dim >= rank:
            break
        if shrink_mask & (1 << i):
            b = begin[i] + shape[dim] if begin[i] < 0 else begin[i]
            if not 0 <= b < shape[dim]:
                raise UnsupportedError(f"StridedSlice {op.name!r}: index {begin[i]} of a shrunk axis is outside "
                                       f"its extent {shape[dim]}", field="begin")
            begins[dim], steps[dim], sizes[dim] = b, 1, 1
        else:
            begins[dim], steps[dim], sizes[dim] = _bounds(
                begin[i], end[i], strides[i], shape[dim], bool(begin_mask & (1 << i)), bool(end_mask & (1 << i)), op)
        dim += 1
    return begins, steps, sizes


def strided_slice_output_shape(op: Op, inputs: Sequence[Tensor], sizes: list[int]) -> list[int]:
    if int(_param(op, "fromType", 0)) == 1:
        return sizes
    shrink = int(_param(op, "shrinkAxisMask", 0))
    count = len(inputs[1].host.reshape(-1)) if inputs[1].host is not None else 0
    ellipsis_mask = int(_param(op, "ellipsisMask", 0))
    out, dim = [], 0
    removed = set()
    for i in range(count):
        if ellipsis_mask & (1 << i):
            dim += len(sizes) - (count - 1)
            continue
        if shrink & (1 << i):
            removed.add(dim)
        dim += 1
    for d, extent in enumerate(sizes):
        if d not in removed:
            out.append(extent)
    return out


def _bounds(b: int, e: int, s: int, extent: int, begin_masked: bool, end_masked: bool, op: Op):
    if s == 0:
        raise UnsupportedError(f"StridedSlice {op.name!r}: a stride of 0", field="strides")
    if begin_masked:
        b = 0 if s > 0 else extent - 1
    else:
        b = _clamp_bound(b, extent, s, True)
    if end_masked:
        e = extent if s > 0 else -1
    else:
        e = _clamp_bound(e, extent, s, False)
    size = max(0, -(-(e - b) // s)) if s > 0 else max(0, -(-(b - e) // -s))
    return b, s, size
