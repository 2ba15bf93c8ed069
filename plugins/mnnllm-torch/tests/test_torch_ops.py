"""The torch backend through mnnllm's conformance suite (mnnllm_core.testing): every case runs
on torch or is handed to cpu, never fails, and torch runs at least what it always has; the
forms it refuses say why; its linear layers share their weight with clones; its device probe;
and a plugin module that imports no torch."""
from __future__ import annotations

import subprocess
import sys
from functools import lru_cache

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not importable")

from mnnllm_core.backend_api import BackendConfig, ConvolutionParams, Op, ScheduleConfig, Tensor  # noqa: E402
from mnnllm_core.testing import Case, Runner, Weights, all_cases  # noqa: E402
from mnnllm_torch.runtime import TorchRuntimeCreator  # noqa: E402

CASES = all_cases()
TORCH_BINARY = {"ADD", "SUB", "MUL", "REALDIV", "MAXIMUM", "MINIMUM", "MAX_TEMP", "MIN_TEMP", "POW", "MUL_SILU"}
TORCH_UNARY = {"ABS", "NEG", "SQUARE", "SQRT", "RSQRT", "EXP", "LOG", "SIN", "COS", "TANH", "SIGMOID", "SILU",
               "RECIPROCAL"}
# Raster cases without negative strides (a StridedSlice that walks backwards is refused)
TORCH_RASTER = ("Concat", "Permute", "Transpose", "Squeeze", "Unsqueeze", "Reshape", "ExpandDims", "GatherV2",
                "out-of-range")
REFUSED = {  # case: what the placement summary says
    "LayerNorm[rms groups]": "torch refused this LayerNorm: group norm stays on cpu",
    "BinaryOp[MOD int32 takes the sign of the divisor]": "torch refused this BinaryOp: no MOD kernel",
    "BinaryOp[ADD int32]": "torch refused this BinaryOp: integer arithmetic keeps numpy's rules on cpu",
    "BinaryOp[ATAN2 (7, 17) x (7, 17)]": "torch refused this BinaryOp: no ATAN2 kernel",
    "Raster[StridedSlice (slice(None, None, -1), slice(5, -9, -2), slice(0, 5, 2))]":
        "torch refused this Raster: torch views have no negative strides",
    "RoPE[qwen3 rms q/k norm tokens=7]": "torch refused this RoPE: per-head q/k norms stay on cpu",
}


def required(case: Case) -> bool:
    if case.op_type == "Convolution":
        return True
    if case.op_type == "LayerNorm":
        return "groups" not in case.name
    if case.op_type == "BinaryOp":
        return case.dtype == "float32" and case.operation in TORCH_BINARY
    if case.op_type == "UnaryOp":
        return case.dtype == "float32" and case.operation in TORCH_UNARY
    if case.op_type == "RoPE":
        return "norm" not in case.name
    if case.op_type in ("Attention", "Cast"):  # KV slots: this Attention keeps one sequence (the runner says so)
        return "UnsupportedError" not in case.name and "slots" not in case.tags
    return case.op_type == "Raster" and case.name.startswith(TORCH_RASTER)


@lru_cache(maxsize=1)
def runner() -> Runner:
    return Runner("torch", hints={"torch_device": "cpu"})


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_torch_runs_the_case_or_hands_it_to_cpu_and_never_fails(case: Case) -> None:
    result = runner().run(case)
    assert result.status != "fail", result.reason
    assert result.matches, result.reason
    if required(case):
        assert result.status == "pass", f"torch must run {case.id} itself: {result.reason}"
    if case.id in REFUSED:
        assert result.status == "unsupported" and result.reason == REFUSED[case.id]


@pytest.fixture(scope="module")
def backend():
    runtime = TorchRuntimeCreator().create(ScheduleConfig(backend_type="torch", thread_num=1),
                                           {"torch_device": "cpu"})
    return runtime.create_backend(BackendConfig())


def tensors(backend, shapes):
    made = []
    for i, shape in enumerate(shapes):
        t = Tensor(i, f"t{i}", tuple(shape), np.dtype(np.float32), backend=backend)
        backend.on_acquire_buffer(t)
        made.append(t)
    return made


def test_a_linear_layer_shares_its_weight_with_clones(backend):
    w = np.random.default_rng(3).standard_normal((24, 40)).astype(np.float32)
    b = np.random.default_rng(4).standard_normal(24).astype(np.float32)
    x, out = tensors(backend, [(5, 40, 1, 1), (5, 24, 1, 1)])
    execution = backend.on_create([x], [out], Op("Convolution", "linear", param=ConvolutionParams(24, 40),
                                                 weights=Weights.dense(w, b)))
    twin = execution.on_clone(backend, None)
    assert twin.weight_t is execution.weight_t and execution.packed_bytes == w.nbytes + b.nbytes


def test_a_convolution_with_a_3x3_kernel_is_refused(backend):
    x, out = tensors(backend, [(1, 4, 3, 3), (1, 4, 1, 1)])
    op = Op("Convolution", "conv", param=ConvolutionParams(4, 4, kernel=(3, 3)),
            weights=Weights.dense(np.zeros((4, 36), np.float32)))
    refused = backend.on_create([x], [out], op)
    assert not refused and "1x1" in refused.reason


def test_probe_of_a_device_torch_cannot_use_says_why(monkeypatch):
    monkeypatch.setenv("MNNLLM_TORCH_DEVICE", "nosuchdevice")
    ok, reason = TorchRuntimeCreator().is_available()
    assert not ok and "nosuchdevice" in reason
    monkeypatch.setenv("MNNLLM_TORCH_DEVICE", "cpu")
    assert TorchRuntimeCreator().is_available() == (True, "")
    assert TorchRuntimeCreator().devices()[0].startswith("cpu (torch ")


def test_the_plugin_module_imports_no_torch():
    code = ("import sys, mnnllm_torch.plugin as p; "
            "print('torch' in sys.modules, len(p.mnnllm_register_runtime_creators()), 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["False", "1", "False"], done.stderr
