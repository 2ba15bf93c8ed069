"""Geometry: data movement described as Raster regions.

The regions made by `strided_regions` and `lower()` are replayed here by a plain index
interpreter (independent of the cpu backend's Raster) and compared with numpy slicing,
transposing and concatenation; each output element must be written exactly once, and
contiguous dims must merge so the region count stays small. Finally, the shared model's
data-movement ops must all reach the backend as Raster, with Shape/Rank folded.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mnnllm_core.core.backend import ScheduleConfig
from mnnllm_core.core.op import Op
from mnnllm_core.core.size_computer import compute_size
from mnnllm_core.core.tensor import Tensor
from mnnllm_core.express.module import Module
from mnnllm_core.express.runtime_manager import RuntimeManager
from mnnllm_core.express.static_module import Config
from mnnllm_core.core.geometry.regions import Region, row_major_strides, strided_regions
from mnnllm_core.core.geometry.transform import lower
from mnnllm_core.schema.MNN.Axis import AxisT
from mnnllm_core.schema.MNN.Permute import PermuteT
from mnnllm_core.schema.MNN.StridedSliceParam import StridedSliceParamT

MODEL = Path(__file__).resolve().parents[2] / "shared" / "models" / "smollm2-135m-instruct-mnn-q4" / "llm.mnn"

shapes = st.lists(st.integers(1, 5), min_size=1, max_size=5)


def replay(regions: Sequence[Region], sources: Sequence[np.ndarray], size: int) -> tuple[np.ndarray, np.ndarray]:
    """(flat output, how many times each output element was written)."""
    out = np.zeros(size, sources[0].dtype)
    writes = np.zeros(size, np.int64)
    for region in regions:
        src = sources[region.origin].reshape(-1)
        grid = np.indices(region.size).reshape(3, -1)
        src_index = region.src.offset + np.asarray(region.src.stride) @ grid
        dst_index = region.dst.offset + np.asarray(region.dst.stride) @ grid
        out[dst_index] = src[src_index]
        np.add.at(writes, dst_index, 1)
    return out, writes


def tensor(index: int, value: np.ndarray, constant: bool = False) -> Tensor:
    return Tensor(index, f"t{index}", tuple(value.shape), value.dtype, host=value if constant else None)


def run_lowering(op: Op, inputs: list[Tensor], sources: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, int]:
    """Shape inference + lowering + replay: (output, write counts, region count)."""
    (shape, dtype), = compute_size(op, inputs)
    output = Tensor(99, "out", tuple(shape), np.dtype(dtype))
    raster = lower(op, inputs, [output])
    assert raster is not None
    flat, writes = replay(raster.regions, sources, output.size)
    return flat.reshape(shape), writes, len(raster.regions)


@st.composite
def sliced(draw):
    shape = draw(shapes)
    index = []
    for extent in shape:
        step = draw(st.sampled_from([1, 1, 2, 3, -1, -2]))
        start = draw(st.integers(-extent - 1, extent + 1))
        stop = draw(st.integers(-extent - 1, extent + 1))
        index.append(slice(start, stop, step))
    return shape, tuple(index)


@settings(max_examples=150, deadline=None)
@given(sliced())
def test_strided_regions_of_a_slice_copy_exactly_the_sliced_elements(case) -> None:
    shape, index = case
    x = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)
    expected = x[index]
    src_strides = row_major_strides(shape)
    bounds = [s.indices(n) for s, n in zip(index, shape)]
    offset = sum(b * st for (b, _, _), st in zip(bounds, src_strides))
    strides = [step * st for (_, _, step), st in zip(bounds, src_strides)]
    regions = strided_regions(expected.shape, offset, strides, 0, row_major_strides(expected.shape))
    out, writes = replay(regions, [x], expected.size) if regions else (np.zeros(0, np.int32), np.zeros(0))
    np.testing.assert_array_equal(out.reshape(expected.shape), expected)
    assert (writes == 1).all()


@settings(max_examples=150, deadline=None)
@given(shapes.flatmap(lambda shape: st.tuples(st.just(shape), st.permutations(range(len(shape))))))
def test_permute_lowering_equals_numpy_transpose(case) -> None:
    shape, perm = case
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    param = PermuteT()
    param.dims = list(perm)
    out, writes, count = run_lowering(Op("Permute", "p", param), [tensor(0, x)], [x])
    np.testing.assert_array_equal(out, x.transpose(perm))
    assert (writes == 1).all()
    # at most the output dims beyond the innermost three are unrolled; dims kept in order merge
    outer = [shape[a] for a in perm if shape[a] != 1][:-3]
    assert count <= int(np.prod(outer, dtype=np.int64))
    if list(perm) == sorted(perm):
        assert count == 1


@settings(max_examples=100, deadline=None)
@given(shapes, st.data())
def test_concat_lowering_equals_numpy_concatenate(shape, data) -> None:
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    extents = data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    parts = []
    for k, extent in enumerate(extents):
        part_shape = list(shape)
        part_shape[axis] = extent
        parts.append(np.arange(int(np.prod(part_shape)), dtype=np.float32).reshape(part_shape) + 1000 * k)
    param = AxisT()
    param.axis = axis
    inputs = [tensor(k, p) for k, p in enumerate(parts)]
    out, writes, count = run_lowering(Op("Concat", "c", param), inputs, parts)
    np.testing.assert_array_equal(out, np.concatenate(parts, axis=axis))
    assert (writes == 1).all()
    assert count == len(parts), "an input's outer dims merge into one region per input"


@settings(max_examples=150, deadline=None)
@given(sliced())
def test_strided_slice_lowering_equals_numpy_slicing(case) -> None:
    shape, index = case
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    consts = [np.asarray([getattr(s, part) for s in index], np.int32) for part in ("start", "stop", "step")]
    inputs = [tensor(0, x)] + [tensor(k + 1, c, constant=True) for k, c in enumerate(consts)]
    op = Op("StridedSlice", "s", StridedSliceParamT())
    expected = x[index]
    (shape_out, _), = compute_size(op, inputs)
    assert tuple(shape_out) == expected.shape
    if expected.size == 0:
        return
    out, writes, _ = run_lowering(op, inputs, [x])
    np.testing.assert_array_equal(out, expected)
    assert (writes == 1).all()


@pytest.mark.parametrize("shape", [(7,), (3, 4, 5), (2, 3, 4, 5, 6), (1, 1, 37, 1, 576)])
def test_a_contiguous_copy_of_any_rank_is_one_region(shape: tuple) -> None:
    strides = row_major_strides(shape)
    regions = strided_regions(shape, 0, strides, 0, strides)
    assert len(regions) == 1
    assert int(np.prod(regions[0].size)) == int(np.prod(shape))


def test_slicing_the_outer_dim_of_a_five_dim_tensor_stays_one_region() -> None:
    shape = (6, 2, 3, 4, 5)
    strides = row_major_strides(shape)
    sizes = (3,) + shape[1:]
    regions = strided_regions(sizes, 2 * strides[0], strides, 0, row_major_strides(sizes))
    assert len(regions) == 1


def test_a_five_dim_transpose_without_mergeable_dims_unrolls_the_outer_dims() -> None:
    shape, perm = (2, 3, 4, 5, 6), (4, 3, 2, 1, 0)
    strides = row_major_strides(shape)
    sizes = [shape[a] for a in perm]
    regions = strided_regions(sizes, 0, [strides[a] for a in perm], 0, row_major_strides(sizes))
    assert len(regions) == 6 * 5


DATA_MOVEMENT = {"Concat", "StridedSlice", "Squeeze", "Unsqueeze", "GatherV2", "Reshape", "ConvertTensor",
                 "Permute", "Transpose", "ExpandDims"}


@pytest.mark.skipif(not MODEL.exists(), reason=f"{MODEL} not found")
def test_shared_model_data_movement_is_lowered_to_raster_and_shapes_are_folded() -> None:
    runtime = RuntimeManager.create(ScheduleConfig(backend_type="cpu", thread_num=2))
    module = Module.load([], [], MODEL, runtime, Config(rearrange=True))
    tokens = 3
    module.forward({"input_ids": np.zeros((tokens, 1, 576), np.float32),
                    "attention_mask": np.zeros((1, 1, 1, 1), np.float32),
                    "position_ids": np.arange(tokens, dtype=np.int32).reshape(1, tokens),
                    "logits_index": np.array([-1], np.int32)})
    summary = module.placement()
    ran = summary["op_types_per_backend"]["cpu"]
    assert not DATA_MOVEMENT & set(ran), ran
    assert not {"Shape", "Rank"} & set(ran), ran
    assert ran.get("Raster", 0) > 0
    assert summary["folded_at_resize"] >= 2, "Shape and Rank at least"
    assert summary["fallbacks"] == [] and summary["copies"] == 0
    graph_types = {node.op.type for node in module.static_module.info.nodes}
    assert {"Shape", "Rank", "Concat", "StridedSlice", "GatherV2"} <= graph_types
