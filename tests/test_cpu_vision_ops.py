"""The cpu ops vision encoders add (k x k Convolution, Im2Col, SliceTf, Unpack) against torch
and numpy, through the size rules and the executions the pipeline would run."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from mnnllm_backends.cpu.ops.convolution2d import SpatialConvolutionExecution, unfold
from mnnllm_backends.cpu.ops.slicing import SliceTfExecution, UnpackExecution
from mnnllm_core.core.op import Op
from mnnllm_core.core.op_params import ConvolutionParams
from mnnllm_core.core.size_computer import compute_size
from mnnllm_core.errors import UnsupportedError

torch = pytest.importorskip("torch")
F = torch.nn.functional
WINDOWS = [  # kernel (x, y), stride, pad, dilation
    ((14, 14), (14, 14), (0, 0), (1, 1)), ((1, 2), (1, 2), (0, 0), (1, 1)), ((3, 3), (1, 1), (1, 1), (1, 1)),
    ((3, 2), (2, 1), (1, 0), (1, 2)),
]


def _tensor(array):
    return SimpleNamespace(storage=array, shape=array.shape, dtype=array.dtype, host=array)


def _params(oc, ic, kernel, stride, pad, dilation):
    return ConvolutionParams(oc, ic, kernel, stride, pad=pad, dilation=dilation)


@pytest.mark.parametrize("kernel, stride, pad, dilation", WINDOWS)
def test_im2col_is_torch_unfold(kernel, stride, pad, dilation):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 28, 19)).astype(np.float32)
    param = _params(0, 3, kernel, stride, pad, dilation)
    # MNN's x is the width: torch takes (height, width)
    expected = F.unfold(torch.from_numpy(x), kernel[::-1], dilation=dilation[::-1], padding=pad[::-1],
                        stride=stride[::-1]).numpy()
    op = Op("Im2Col", "im2col", param=param)
    assert compute_size(op, [_tensor(x)])[0][0] == expected.shape
    np.testing.assert_array_equal(unfold(x, param), expected)


@pytest.mark.parametrize("kernel, stride, pad, dilation", WINDOWS)
def test_spatial_convolution_is_torch_conv2d(kernel, stride, pad, dilation):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 28, 19)).astype(np.float32)
    weight = rng.standard_normal((5, 3, kernel[1], kernel[0])).astype(np.float32)
    bias = rng.standard_normal(5).astype(np.float32)
    expected = F.conv2d(torch.from_numpy(x), torch.from_numpy(weight), torch.from_numpy(bias), stride=stride[::-1],
                        padding=pad[::-1], dilation=dilation[::-1]).numpy()
    param = _params(5, 3, kernel, stride, pad, dilation)
    op = Op("Convolution", "conv", param=param)
    shape = compute_size(op, [_tensor(x)])[0][0]
    assert shape == expected.shape
    out = np.empty(shape, np.float32)
    SpatialConvolutionExecution(None, param, weight.reshape(5, -1), bias).on_execute([_tensor(x)], [_tensor(out)])
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)  # fp32 sums of up to 588 products


def test_a_window_larger_than_the_input_is_a_clear_error():
    x = np.zeros((1, 3, 10, 10), np.float32)
    op = Op("Convolution", "conv", param=_params(4, 3, (14, 14), (14, 14), (0, 0), (1, 1)))
    with pytest.raises(UnsupportedError, match="does not fit"):
        compute_size(op, [_tensor(x)])


def test_slice_tf_takes_begin_and_size_with_minus_one_to_the_end():
    x = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    begin, size = np.array([1, 0, 2], np.int32), np.array([2, -1, 3], np.int32)
    inputs = [_tensor(x), _tensor(begin), _tensor(size)]
    shape = compute_size(Op("SliceTf", "slice"), inputs)[0][0]
    assert shape == (2, 4, 3)
    out = np.empty(shape, np.float32)
    SliceTfExecution(None).on_execute(inputs, [_tensor(out)])
    np.testing.assert_array_equal(out, x[1:3, :, 2:5])
    with pytest.raises(UnsupportedError, match="outside"):
        compute_size(Op("SliceTf", "slice"), [_tensor(x), _tensor(begin), _tensor(np.array([3, 1, 1], np.int32))])


def test_unpack_splits_an_axis_into_its_slices():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    op = Op("Unpack", "unpack", table=SimpleNamespace(axis=1))
    shapes = compute_size(op, [_tensor(x)])
    assert [s for s, _ in shapes] == [(2, 4)] * 3
    outs = [np.empty((2, 4), np.float32) for _ in range(3)]
    UnpackExecution(None, 1).on_execute([_tensor(x)], [_tensor(o) for o in outs])
    for i, out in enumerate(outs):
        np.testing.assert_array_equal(out, x[:, i])
