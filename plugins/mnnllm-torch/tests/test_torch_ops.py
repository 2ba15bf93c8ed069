"""The torch backend op by op against float64 numpy, the ops it refuses (they fall back to
cpu), its device probe, and a plugin module that imports no torch."""
from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not importable")

from mnnllm_core.core.backend import BackendConfig, ScheduleConfig  # noqa: E402
from mnnllm_core.core.op import Op  # noqa: E402
from mnnllm_core.core.tensor import Tensor  # noqa: E402
from mnnllm_core.geometry.regions import RasterParam, Region, View  # noqa: E402
from mnnllm_torch.creator import TorchRuntimeCreator  # noqa: E402

RNG = np.random.default_rng(3)


@pytest.fixture(scope="module")
def backend():
    runtime = TorchRuntimeCreator().create(ScheduleConfig(backend_type="torch", thread_num=1),
                                           {"torch_device": "cpu"})
    return runtime.create_backend(BackendConfig())


def tensors(backend, arrays=(), shapes=(), dtype=np.float32):
    made = []
    for i, array in enumerate(arrays):
        t = Tensor(i, f"in{i}", tuple(array.shape), np.dtype(array.dtype), backend=backend)
        backend.on_acquire_buffer(t)
        backend.upload(t, array)
        made.append(t)
    for i, shape in enumerate(shapes):
        t = Tensor(100 + i, f"out{i}", tuple(shape), np.dtype(dtype), backend=backend)
        backend.on_acquire_buffer(t)
        made.append(t)
    return made[:len(arrays)], made[len(arrays):]


def run(backend, op, arrays, shapes, dtype=np.float32):
    inputs, outputs = tensors(backend, arrays, shapes, dtype)
    execution = backend.on_create(inputs, outputs, op)
    assert execution is not None, f"torch refused {op}"
    execution.on_resize(inputs, outputs)
    execution.on_execute(inputs, outputs)
    return [backend.download(t).copy() for t in outputs], execution


def conv_op(weight, bias, kernel=1):
    common = SimpleNamespace(kernelX=kernel, kernelY=kernel, group=1, relu=False, relu6=False)
    weights = SimpleNamespace(convolution=lambda: SimpleNamespace(
        quantized=SimpleNamespace(dequantize=lambda: weight), bias=bias))
    return Op("Convolution", "linear", SimpleNamespace(common=common), weights=weights)


def norm_op(gamma, beta, rms, fmt=None, group=1):
    param = SimpleNamespace(axis=[-1], epsilon=1e-5, useRmsnorm=rms, group=group)
    weights = SimpleNamespace(layernorm=lambda: (gamma, beta))
    return Op("LayerNorm", "norm", param, weights=weights, extra={"format": fmt} if fmt else {})


def binary_op(operation):
    return Op("BinaryOp", operation, SimpleNamespace(activationType=0), extra={"operation": operation})


def test_linear_equals_x_times_weight_transposed_plus_bias_and_clones_share_the_weight(backend):
    w = RNG.standard_normal((24, 40)).astype(np.float32)
    b = RNG.standard_normal(24).astype(np.float32)
    x = RNG.standard_normal((5, 40, 1, 1)).astype(np.float32)
    (out,), execution = run(backend, conv_op(w, b), [x], [(5, 24, 1, 1)])
    want = x.reshape(5, 40).astype(np.float64) @ w.T.astype(np.float64) + b
    np.testing.assert_allclose(out.reshape(5, 24), want, rtol=1e-5, atol=1e-4)
    twin = execution.on_clone(backend, None)
    assert twin.weight_t is execution.weight_t and execution.packed_bytes == w.nbytes + b.nbytes


def test_a_convolution_with_a_3x3_kernel_is_refused(backend):
    inputs, outputs = tensors(backend, [np.zeros((1, 4, 3, 3), np.float32)], [(1, 4, 1, 1)])
    assert backend.on_create(inputs, outputs, conv_op(np.zeros((4, 36), np.float32), None, kernel=3)) is None


def test_fused_residual_rms_norm_writes_the_sum_and_its_norm(backend):
    a, b = (RNG.standard_normal((3, 1, 16)).astype(np.float32) for _ in range(2))
    gamma = RNG.standard_normal(16).astype(np.float32)
    (total, normed), _ = run(backend, norm_op(gamma, None, rms=True), [a, b], [(3, 1, 16), (3, 1, 16)])
    s = a.astype(np.float64) + b
    np.testing.assert_allclose(total, s, rtol=1e-6)
    np.testing.assert_allclose(normed, s / np.sqrt(np.mean(s * s, -1, keepdims=True) + 1e-5) * gamma, rtol=1e-5)


def test_layer_norm_with_beta_and_over_the_channel_axis_of_nc4hw4(backend):
    x = RNG.standard_normal((2, 8, 3, 3)).astype(np.float32)
    gamma, beta = (RNG.standard_normal(8).astype(np.float32) for _ in range(2))
    (out,), _ = run(backend, norm_op(gamma, beta, rms=False, fmt="NC4HW4"), [x], [x.shape])
    moved = np.moveaxis(x.astype(np.float64), 1, -1)
    centered = moved - moved.mean(-1, keepdims=True)
    want = centered / np.sqrt(np.mean(centered ** 2, -1, keepdims=True) + 1e-5) * gamma + beta
    np.testing.assert_allclose(out, np.moveaxis(want, -1, 1), rtol=1e-5, atol=1e-5)


def test_group_norm_is_refused(backend):
    inputs, outputs = tensors(backend, [np.zeros((2, 8), np.float32)], [(2, 8)])
    assert backend.on_create(inputs, outputs, norm_op(None, None, rms=False, group=2)) is None


def test_binary_ops_broadcast_and_mul_silu_is_a_times_silu_b(backend):
    a = RNG.standard_normal((4, 1, 6)).astype(np.float32)
    b = RNG.standard_normal((1, 1, 6)).astype(np.float32)
    (added,), _ = run(backend, binary_op("ADD"), [a, b], [(4, 1, 6)])
    np.testing.assert_allclose(added, a + b, rtol=1e-6)
    c = RNG.standard_normal((4, 1, 6)).astype(np.float32)
    (gated,), _ = run(backend, binary_op("MUL_SILU"), [a, c], [(4, 1, 6)])
    c64 = c.astype(np.float64)
    np.testing.assert_allclose(gated, a * c64 / (1 + np.exp(-c64)), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("operation, dtype", [("MOD", np.int32), ("ADD", np.int32), ("ATAN2", np.float32)])
def test_integer_or_unknown_binary_ops_are_refused(backend, operation, dtype):
    inputs, outputs = tensors(backend, [np.ones(3, dtype), np.ones(3, dtype)], [(3,)], dtype)
    assert backend.on_create(inputs, outputs, binary_op(operation)) is None


def test_raster_regions_transpose_and_zero_fill(backend):
    x = np.arange(12, dtype=np.int32).reshape(3, 4)
    transpose = Region(View(0, (0, 1, 4)), View(0, (0, 3, 1)), (1, 4, 3))
    (out,), _ = run(backend, Op("Raster", "t", RasterParam([transpose])), [x], [(4, 3)], np.int32)
    np.testing.assert_array_equal(out, x.T)
    first_row = Region(View(0, (0, 0, 1)), View(4, (0, 0, 1)), (1, 1, 4))
    (out,), _ = run(backend, Op("Raster", "pad", RasterParam([first_row], zero_fill=True)), [x], [(2, 4)], np.int32)
    np.testing.assert_array_equal(out, [[0, 0, 0, 0], [0, 1, 2, 3]])


def test_raster_with_a_negative_stride_is_refused(backend):
    reverse = Region(View(3, (0, 0, -1)), View(0, (0, 0, 1)), (1, 1, 4))
    inputs, outputs = tensors(backend, [np.arange(4, dtype=np.float32)], [(4,)])
    assert backend.on_create(inputs, outputs, Op("Raster", "rev", RasterParam([reverse]))) is None


def test_probe_of_a_device_torch_cannot_use_says_why(monkeypatch):
    monkeypatch.setenv("MNNLLM_TORCH_DEVICE", "nosuchdevice")
    ok, reason = TorchRuntimeCreator().is_available()
    assert not ok and "nosuchdevice" in reason
    monkeypatch.setenv("MNNLLM_TORCH_DEVICE", "cpu")
    assert TorchRuntimeCreator().is_available() == (True, "")
    assert TorchRuntimeCreator().devices()[0].startswith("cpu (torch ")


def test_the_plugin_module_imports_no_torch():
    code = ("import sys, mnnllm_torch.plugin as p; "
            "print('torch' in sys.modules, len(p.mnnllm_register_runtime_creators()))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["False", "1"], done.stderr
