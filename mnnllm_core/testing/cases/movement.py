"""Data movement: the ops the core lowers to Raster regions (GatherV2 with constant indices,
Concat, StridedSlice, Squeeze/Unsqueeze/ExpandDims/Reshape, Permute/Transpose), each checked
to be lowered, over float32 and int32; and GatherV2 with run-time indices, which stays itself."""
from __future__ import annotations

import numpy as np

from ...core.op import Op
from ...schema.MNN.Axis import AxisT
from ...schema.MNN.ExpandDims import ExpandDimsT
from ...schema.MNN.Permute import PermuteT
from ...schema.MNN.Reshape import ReshapeT
from ...schema.MNN.SqueezeParam import SqueezeParamT
from ...schema.MNN.StridedSliceParam import StridedSliceParamT
from ..harness import Again, Const
from .case import Case, Trial, ints, randn, single

RASTER = ("Raster",)


def _raster(op: Op, inputs, expected, exact_commands: bool = True) -> Trial:
    if exact_commands:
        return single(op, inputs, [expected], commands=RASTER)

    def only_raster(outputs, module, runtime):
        types = {c.op.type for c in module.session.pipeline.commands}
        return None if types <= {"Raster"} else f"lowered to {sorted(types)}, not only Raster"
    return single(op, inputs, [expected], checks=[only_raster])


# ------------------------------------------------------------------ GatherV2

def _gather_const(axis: int):
    def build(rng) -> Trial:
        params = randn(rng, 5, 7, 3)
        indices = np.array([[2, 0], [-1, 1]], np.int32)  # negative indices count from the end
        expected = np.take(params, indices % params.shape[axis], axis=axis)
        return _raster(Op("GatherV2", "gather"), [params, Const(indices), ints(axis)], expected)
    return build


def _gather_run_time(axis: int):
    def build(rng) -> Trial:
        params = randn(rng, 6, 4, 5)
        indices = np.array([3, -1, 0, -5, 2], np.int32)
        expected = np.take(params, indices % params.shape[axis], axis=axis)
        return single(Op("GatherV2", "gather"), [params, indices, ints(axis)], [expected], commands=("GatherV2",))
    return build


def _embedding(rng) -> Trial:
    table = randn(rng, 49, 17)
    ids = rng.integers(0, 49, (1, 37)).astype(np.int32)
    return single(Op("GatherV2", "embed"), [table, ids], [table[ids]])


def _out_of_range(constant: bool):
    def build(rng) -> Trial:
        params = randn(rng, 4, 3)
        indices = np.array([1, 9], np.int32)  # MNN writes zeros for an index outside the extent
        expected = np.stack([params[1], np.zeros(3, np.float32)])
        return single(Op("GatherV2", "gather"), [params, Const(indices) if constant else indices], [expected])
    return build


# ------------------------------------------------------------------ Concat

def concat_op(axis: int) -> Op:
    table = AxisT()
    table.axis = axis
    return Op("Concat", "concat", table)


def _concat(axis: int, dtype=np.float32, sizes=(1, 2, 7), base=(3, 4, 5)):
    def build(rng) -> Trial:
        parts = [(randn(rng, *(n if d == axis % 3 else s for d, s in enumerate(base))) * 100).astype(dtype)
                 for n in sizes]
        return _raster(concat_op(axis), parts, np.concatenate(parts, axis=axis))
    return build


def _concat_itself(rng) -> Trial:
    value = randn(rng, 2, 3, 32)
    return single(concat_op(-1), [value, Again(0)], [np.concatenate([value, value], axis=-1)])


# ------------------------------------------------------------------ StridedSlice

def slice_op(begin_mask: int = 0, end_mask: int = 0, shrink: int = 0, ellipsis: int = 0, from_type: int = 0) -> Op:
    table = StridedSliceParamT()
    table.beginMask, table.endMask, table.shrinkAxisMask = begin_mask, end_mask, shrink
    table.ellipsisMask, table.fromType = ellipsis, from_type
    return Op("StridedSlice", "slice", table)


SLICES = [  # begin, end, strides, begin_mask, end_mask, shrink, numpy index
    ((1, 0, 2), (4, 7, 5), (1, 2, 1), 0, 0, 0, np.s_[1:4, 0:7:2, 2:5]),
    ((0, 0, 0), (0, 0, 0), (1, 1, 1), 0b111, 0b111, 0, np.s_[:, :, :]),
    ((-1, 5, 0), (0, -9, 5), (-1, -2, 2), 0b001, 0b001, 0, np.s_[::-1, 5:-9:-2, 0:5:2]),
    ((2, 0, -2), (3, 7, -1), (1, 3, 1), 0, 0b010, 0b101, np.s_[2, 0::3, -2]),
    ((-3, -100, 0), (100, 100, 5), (1, 1, -1), 0, 0, 0, np.s_[-3:100, -100:100, 0:5:-1]),
    ((4, 6, 4), (0, 0, 0), (-2, -3, -1), 0, 0b110, 0, np.s_[4:0:-2, 6::-3, 4::-1]),
]


def _slice(begin, end, strides, begin_mask, end_mask, shrink, index):
    def build(rng) -> Trial:
        x = randn(rng, 5, 7, 6)
        return _raster(slice_op(begin_mask, end_mask, shrink), [x, ints(*begin), ints(*end), ints(*strides)], x[index],
                       exact_commands=False)
    return build


def _ellipsis(rng) -> Trial:
    x = randn(rng, 3, 4, 5, 6)
    return single(slice_op(ellipsis=0b010), [x, ints(1, 0, 2), ints(3, 0, 6), ints(1, 1, 2)], [x[1:3, ..., 2:6:2]])


def _onnx_slice(rng) -> Trial:
    x = randn(rng, 5, 7, 6)
    starts, ends, axes, steps = ints(-1, 1), ints(-2**31, 6), ints(2, 0), ints(-2, 2)
    return single(slice_op(from_type=1), [x, starts, ends, axes, steps], [x[1:6:2, :, ::-2]])


def _empty_slice(rng) -> Trial:
    x = randn(rng, 5, 7)
    return single(slice_op(), [x, ints(3, 0), ints(3, 7), ints(1, 1)], [np.zeros((0, 7), np.float32)])


# ------------------------------------------------------------------ Squeeze, Unsqueeze, ExpandDims, Reshape, Permute

TABLES = {"Squeeze": (SqueezeParamT, "squeezeDims"), "Unsqueeze": (SqueezeParamT, "squeezeDims"),
          "Reshape": (ReshapeT, "dims"), "Permute": (PermuteT, "dims")}
BY_INPUT = {"Permute": "Transpose"}  # the op that takes its dims as an input


def _dims_op(op_type: str, source: tuple, dims: tuple, expected_of, by_input: bool, lowered: bool = True,
             dtype=np.float32):
    """An op with its dims in its table (checked to be lowered to Raster when `lowered`) or, as
    newer exports have it, as a constant input."""
    def build(rng) -> Trial:
        x = (randn(rng, *source) * 100).astype(dtype)
        if by_input:
            return single(Op(BY_INPUT.get(op_type, op_type), "dims"), [x, ints(*dims)], [expected_of(x)])
        kind, field_name = TABLES[op_type]
        table = kind()
        setattr(table, field_name, list(dims))
        op = Op(op_type, "dims", table)
        return _raster(op, [x], expected_of(x)) if lowered else single(op, [x], [expected_of(x)])
    return build


def _reshaped(shape: tuple):
    return lambda x: x.reshape(shape)


def _transposed(perm: tuple):
    return lambda x: x.transpose(perm)


def _expand_dims(rng) -> Trial:
    x = randn(rng, 3, 5)
    table = ExpandDimsT()
    table.axis = -1
    return single(Op("ExpandDims", "e", table), [x], [x[..., None]])


PERMUTES = [((3, 4, 5), (1, 0, 2)), ((3, 4, 5), (2, 1, 0)), ((3, 4, 5), (0, 2, 1)), ((3, 4, 5), (1, 2, 0)),
            ((3, 5, 7), (2, 0, 1)), ((2, 3, 4, 5), (0, 2, 1, 3)), ((37, 9, 64), (1, 0, 2))]


def cases() -> list[Case]:
    found = [Case("Raster", f"GatherV2 constant indices axis={axis}", _gather_const(axis), tol=0)
             for axis in (0, 1, -1)]
    found += [Case("GatherV2", f"run-time indices axis={axis}", _gather_run_time(axis), tol=0) for axis in (0, 2)]
    found.append(Case("GatherV2", "embedding rows by token ids", _embedding, tol=0))
    found += [Case("Raster" if constant else "GatherV2", "out-of-range index writes zeros", _out_of_range(constant),
                   tol=0) for constant in (True, False)]
    found += [Case("Raster", f"Concat axis={axis}", _concat(axis), tol=0) for axis in (0, 1, 2, -1)]
    found += [Case("Raster", f"Concat axis=1 {np.dtype(d).name}", _concat(1, d, (2, 1, 4), (3, 2, 5)), tol=0,
                   dtype=np.dtype(d).name) for d in (np.float32, np.int32)]
    found.append(Case("Raster", "Concat of a tensor with itself", _concat_itself, tol=0))
    found += [Case("Raster", f"StridedSlice {s[6]}", _slice(*s), tol=0) for s in SLICES]
    found += [Case("Raster", "StridedSlice with ellipsis", _ellipsis, tol=0),
              Case("Raster", "ONNX Slice (starts, ends, axes, steps)", _onnx_slice, tol=0),
              Case("Raster", "StridedSlice with an empty result", _empty_slice, tol=0)]
    for dims, shape in (((0,), (3, 1, 5)), ((-2, 0), (3, 5)), ((), (3, 5))):
        found += [Case("Raster", f"Squeeze {dims} by {way}", _dims_op("Squeeze", (1, 3, 1, 5), dims, _reshaped(shape),
                                                                     way == "input"), tol=0)
                  for way in ("param", "input") if dims or way == "param"]
    for dims, shape in (((0,), (1, 3, 5)), ((-1,), (3, 5, 1)), ((0, 3), (1, 3, 5, 1)), ((1, -1), (3, 1, 5, 1))):
        found += [Case("Raster", f"Unsqueeze {dims} by {way}", _dims_op("Unsqueeze", (3, 5), dims, _reshaped(shape),
                                                                       way == "input", lowered=False), tol=0)
                  for way in ("param", "input")]
    found.append(Case("Raster", "ExpandDims axis=-1", _expand_dims, tol=0))
    for dims, shape in (((0, -1), (2, 15)), ((-1, 5), (6, 5)), ((0, 0, 5, 1), (2, 3, 5, 1)), ((1, -1, 1), (1, 30, 1))):
        found += [Case("Raster", f"Reshape {dims} by {way}", _dims_op("Reshape", (2, 3, 5), dims, _reshaped(shape),
                                                                     way == "input"), tol=0)
                  for way in ("param", "input")]
    for shape, perm in PERMUTES:
        found += [Case("Raster", f"{'Transpose' if by_input else 'Permute'} {shape} {perm}",
                       _dims_op("Permute", shape, perm, _transposed(perm), by_input), tol=0)
                  for by_input in (False, True)]
    found.append(Case("Raster", "Permute (2, 3, 4, 5) (0, 2, 1, 3) int32",
                      _dims_op("Permute", (2, 3, 4, 5), (0, 2, 1, 3), _transposed((0, 2, 1, 3)), False, dtype=np.int32),
                      tol=0, dtype="int32"))
    return found
