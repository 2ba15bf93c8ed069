"""The CPU adapter's 4-bit texel kernels in each of their forms give the conformance suite's
linear results: read-only storage textures (where the device binds six, lavapipe's form) and
sampled ones (elsewhere); (scale, zero) pairs as two f16 where they are f16 exactly (the shared
model's, whose reference tokens tests/test_webgpu_plugin.py checks) and as f32 bits otherwise."""
from __future__ import annotations

import numpy as np
import pytest

from mnnllm_core.backend_api import ConvolutionWeights
from mnnllm_core.testing import (LINEAR_TOL, Case, Trial, Weights, linear_op, linear_reference, quantize, randn,
                                 run_suite, select, single)


webgpu_device = pytest.importorskip("mnnllm_webgpu.device", reason="the webgpu plugin is not installed")


@pytest.fixture
def device():
    """The default adapter's device; skips where wgpu finds none."""
    try:
        return webgpu_device.open_device(webgpu_device.device_spec(None))
    except Exception as err:  # no adapter: wgpu raises its own errors
        pytest.skip(f"wgpu found no usable adapter: {err}")


@pytest.fixture
def packed_forms(monkeypatch):
    """(storage, half_scales) of every layer packed as texels while the test runs."""
    from mnnllm_webgpu.ops import linear
    seen = []
    original = linear.pack_texels

    def spy(*args, **kwargs):
        texels = original(*args, **kwargs)
        if texels is not None:
            seen.append((texels.storage, texels.half_scales))
        return texels

    monkeypatch.setattr(linear, "pack_texels", spy)
    return seen


def _failures(results) -> list[str]:
    return [r.case.id for r in results if r.status == "fail"]


def test_storage_textures_pass_every_linear_case(device, packed_forms) -> None:
    if device.max_storage_textures < 6 or not device.is_cpu:
        pytest.skip(f"{device.description} does not take the storage-texture form")
    assert _failures(run_suite("webgpu", cases=select("Convolution"))) == []
    assert packed_forms and all(storage for storage, _ in packed_forms)


def test_sampled_textures_pass_every_linear_case(device, packed_forms, monkeypatch) -> None:
    """With max_storage_textures_per_shader_stage lowered to WebGPU's default (4)."""
    if not device.is_cpu:
        pytest.skip(f"{device.description} is no CPU adapter: no texel kernels")
    monkeypatch.setattr(device, "max_storage_textures", 4)
    assert _failures(run_suite("webgpu", cases=select("Convolution"))) == []
    assert packed_forms and not any(storage for storage, _ in packed_forms)


def _half_scale_case(tokens: int, oc: int = 200) -> Case:
    """A 4-bit layer (block 64, rows not a multiple of 128) whose scales and zeros are fp16 values."""
    ic, block = 576, 64

    def build(rng) -> Trial:
        weight, _ = quantize(randn(rng, oc, ic), 4, block)
        weight.scale = weight.scale.astype(np.float16).astype(np.float32)
        weight.zero = weight.zero.astype(np.float16).astype(np.float32)
        bias, x = randn(rng, oc), randn(rng, tokens, ic, 1, 1)
        op = linear_op(oc, ic, Weights(conv=ConvolutionWeights(weight, bias)))
        return single(op, [x], [linear_reference(x, weight.dequantize().astype(np.float64), bias)
                                .reshape(tokens, oc, 1, 1)])
    return Case("Convolution", f"q4 f16 scales ic={ic} block={block} oc={oc} tokens={tokens}", build,
                device_tol=LINEAR_TOL)


def test_f16_scale_pairs_give_the_f32_pairs_results(device, packed_forms) -> None:
    if not device.is_cpu:
        pytest.skip("no texel kernels on a GPU adapter")
    cases = [_half_scale_case(t) for t in (1, 3, 37)]
    assert _failures(run_suite("webgpu", cases=cases)) == []
    assert packed_forms and all(half for _, half in packed_forms)


def test_prefill_tail_of_64_rows_gives_the_linear_results(device, packed_forms) -> None:
    """Rows 64 or fewer past a multiple of 128 (SmolLM2's 576 and 192): linear_q4_texel_tile.wgsl's
    last work-group narrow (64 rows), after the wide ones and alone."""
    if not device.is_cpu:
        pytest.skip("no texel kernels on a GPU adapter")
    from mnnllm_webgpu.ops.linear import tile_groups
    assert tile_groups(576) == [(0, 4, True), (4, 1, False)] and tile_groups(200) == [(0, 2, True)]
    cases = [_half_scale_case(t, oc) for oc in (192, 576, 64) for t in (5, 37)]
    assert _failures(run_suite("webgpu", cases=cases)) == []
