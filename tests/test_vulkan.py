"""The vulkan backend (the `vulkan` package; lavapipe on machines without a GPU): what the
conformance suite (tests/test_backend_ops.py runs it on every backend) does not cover: the device
and its probe, a weight over maxStorageBufferRange, the device KV cache shared by clones and grown
past its first capacity, the shared model with every op on vulkan, and the committed SPIR-V.
Skipped only when Vulkan cannot build and run the probe shader (with the probe's reason).
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from functools import lru_cache

import numpy as np
import pytest

from mnnllm_core.core.backend import ScheduleConfig
from mnnllm_core.core.op import Op
from mnnllm_core.core.op_params import AttentionParams, ConvolutionParams
from mnnllm_core.core.weights.formats import ConvolutionWeights, FloatWeight
from mnnllm_core.errors import ConfigError
from mnnllm_core.express.runtime_manager import RuntimeManager
from mnnllm_core.plugins.manager import registry
from mnnllm_core.testing import FP16_TOL, Graph, Weights, make_module, run_op, run_suite, select
from mnnllm_core.testing.cases import attention_long
from mnnllm_core.testing.references import attention_reference
from paths import CONFIG, REFERENCE

def vulkan_creator():
    """The vulkan RuntimeCreator, registered through the project's `mnnllm` entry points."""
    return registry().get("vulkan")


AVAILABLE, REASON = vulkan_creator().is_available()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=f"Vulkan unavailable: {REASON}")

RNG = np.random.default_rng(11)
LINEAR_TOL = 2e-5


def randn(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


@lru_cache(maxsize=None)
def shared_vulkan() -> RuntimeManager:
    return RuntimeManager.create(ScheduleConfig(backend_type="vulkan", thread_num=2))


# ------------------------------------------------------------------ runtime and availability

def test_runtime_reports_the_device_and_forces_static_shapes() -> None:
    runtime = shared_vulkan()
    assert runtime.static_shapes
    assert "maxStorageBufferRange" in runtime.runtime.device_name()
    assert vulkan_creator().devices()


def test_importing_the_plugin_does_not_touch_vulkan() -> None:
    script = ("import sys, mnnllm_backends.vulkan.plugin; assert 'vulkan' not in sys.modules, 'vulkan imported'; "
              "print('ok')")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr


def test_without_a_driver_the_backend_is_unavailable_with_a_reason_and_never_raises(tmp_path) -> None:
    script = textwrap.dedent("""
        from mnnllm_backends.vulkan.runtime import VulkanRuntimeCreator
        ok, reason = VulkanRuntimeCreator().is_available()
        assert not ok and reason, (ok, reason)
        print("unavailable:", reason)
    """)
    env = dict(os.environ, VK_ICD_FILENAMES=str(tmp_path / "none.json"), VK_DRIVER_FILES=str(tmp_path / "none.json"))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "unavailable:" in done.stdout


# ------------------------------------------------------------------ limits of the device

def test_a_weight_over_max_storage_buffer_range_is_refused_and_runs_on_cpu() -> None:
    limit = shared_vulkan().runtime.device.max_range
    oc, ic = 8, limit // (8 * 4) + 1  # one fp32 weight buffer just over the limit
    weight = np.zeros((oc, ic), np.float32)
    weight[:, :3] = randn(oc, 3)
    x = np.zeros((1, ic, 1, 1), np.float32)
    x[0, :3, 0, 0] = randn(3)
    weights = Weights(conv=ConvolutionWeights(FloatWeight(oc, ic, weight), None))
    op = Op("Convolution", "big", param=ConvolutionParams(oc, ic), weights=weights)
    result = run_op(op, [x], runtime=shared_vulkan())
    assert [f["type"] for f in result.placement["fallbacks"]] == ["Convolution"]
    assert "maxStorageBufferRange" in result.placement["fallbacks"][0]["reason"]
    expected = (weight[:, :3] @ x[0, :3, 0, 0]).reshape(1, oc, 1, 1)
    np.testing.assert_allclose(result.outputs[0], expected, rtol=LINEAR_TOL, atol=LINEAR_TOL)


# ------------------------------------------------------------------ the device KV cache

HEADS, KV_HEADS, DIM = 9, 3, 64
SCALAR_MASK = np.zeros((1, 1, 1, 1), np.float32)


def test_attention_decode_grows_the_device_cache_past_its_first_capacity_and_clones_share_it() -> None:
    from mnnllm_backends.vulkan.ops.attention import AttentionExecution
    from mnnllm_core.core.kv_cache import DeviceKVCache
    MIN_CAPACITY = DeviceKVCache.min_capacity
    graph = Graph()
    inputs = [graph.input(n) for n in ("q", "k", "v", "mask")]
    out = graph.add(Op("Attention", "attn", param=AttentionParams(heads=(HEADS, KV_HEADS, DIM))), inputs)
    runtime = RuntimeManager.create(ScheduleConfig(backend_type="vulkan", thread_num=2))
    prefill = make_module(graph.schedule(out), runtime)
    decode = prefill.clone()
    prompt, steps = MIN_CAPACITY - 3, 7
    total = prompt + steps
    q, k, v = randn(total, HEADS, DIM), randn(total, KV_HEADS, DIM), randn(total, KV_HEADS, DIM)

    def step(module, start, end):
        runtime.kv_meta.add = end - start
        packed = [t[start:end].reshape(end - start, -1, 1, 1) for t in (q, k, v)]
        result = module.forward(dict(zip(("q", "k", "v", "mask"), packed + [SCALAR_MASK])))[0]
        runtime.kv_meta.sync()
        assert not module.session.pipeline.placement.fallbacks
        return result.reshape(end - start, HEADS, DIM)
    step(prefill, 0, prompt)
    for t in range(prompt, total):
        out = step(decode, t, t + 1)
        expected = attention_reference(q[t:t + 1], k[:t + 1], v[:t + 1], causal_offset=t)
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(expected).max())))
    assert (prefill.resize_count, decode.resize_count) == (1, 1), "one prefill shape, one decode shape"
    executions = [m.session.pipeline.executions[0][1] for m in (prefill, decode)]
    assert all(isinstance(e, AttentionExecution) for e in executions)
    assert executions[0].cache is executions[1].cache, "prefill and decode clones share one KV cache"
    cache = executions[0].cache
    assert cache.length == total and cache.capacity == 2 * MIN_CAPACITY


# ------------------------------------------------------------------ decode kernels per device class


@pytest.mark.parametrize("variant", ["texel", "group", "lanes"])
def test_every_decode_linear_kernel_passes_every_linear_case(variant: str) -> None:
    """texel (a CPU's), group (a GPU's work-group reduction) and lanes, forced by the hint: decode
    and prefill (the cases have several token counts)."""
    results = run_suite("vulkan", hints={"vulkan_linear": variant}, cases=select("Convolution"))
    failed = [(r.case.id, r.status, r.reason) for r in results if r.status != "pass"]
    assert not failed, failed


def test_the_decode_linear_kernel_follows_the_device_class_and_a_bad_hint_is_a_config_error() -> None:
    runtime = shared_vulkan().runtime
    assert runtime.linear_variant == ("texel" if runtime.device.is_cpu else "group")
    with pytest.raises(ConfigError, match="vulkan_linear"):
        RuntimeManager.create(ScheduleConfig(backend_type="vulkan", thread_num=2), {"vulkan_linear": "fast"})


@pytest.mark.parametrize("op", ["LayerNorm", "Attention"])
def test_the_kernels_without_subgroups_pass_the_cases_the_subgroup_kernels_pass(op: str) -> None:
    """norm / attention softmax: the subgroup kernels (the default where the device has subgroup
    arithmetic, lavapipe included) and the one-invocation-per-row kernels forced by the hint. Those
    keep [seq, heads, capacity] scores in one buffer, so a prompt of ~4,000 tokens exceeds it: an
    UnsupportedError at run, the long-context cases' result there (the one-dispatch kernel has no
    scores buffer)."""
    for hints in ({}, {"vulkan_subgroups": False}):
        cases = [c for c in select(op) if not c.tags & {"sinks", "slots"}]  # refused by every vulkan kernel
        results = run_suite("vulkan", hints=hints, cases=cases)
        failed = [(r.case.id, r.status, r.reason) for r in results if r.status != "pass"
                  and not (hints and r.reason.startswith("at run: vulkan Attention:")
                           and "scores exceed" in r.reason and ("4096" in r.case.id or "4059" in r.case.id))]
        assert results and not failed, (hints, failed)


def test_the_one_dispatch_attention_needs_no_scores_buffer_so_its_size_limit_does_not_apply() -> None:
    """A 70-token prefill whose [seq, heads, capacity] scores exceed the (lowered) texel limit while
    q, k, v, the cache and the output fit: the fused kernel runs it, the scores path refuses it."""
    from mnnllm_core.testing import Case
    from mnnllm_core.testing.cases.attention import _prefill
    case = Case("Attention", "causal prefill heads=9/3 dim=64 tokens=70", _prefill(70, 9, 3, 64))
    device = shared_vulkan().runtime.device
    saved = device.max_texels
    device.max_texels = 50_000  # scores 70 x 9 x 128 = 80640 floats; q 40320, the cache 128 x 192
    try:
        fused = run_suite("vulkan", cases=[case])[0]
        scores = run_suite("vulkan", hints={"vulkan_subgroups": False}, cases=[case])[0]
    finally:
        device.max_texels = saved
    if not shared_vulkan().runtime.subgroups:
        pytest.skip("the device has no subgroup arithmetic: no one-dispatch attention")
    assert fused.status == "pass", fused.reason
    assert scores.status != "pass" and "maxTexelBufferElements" in scores.reason


def test_subgroup_kernels_follow_the_device() -> None:
    runtime = shared_vulkan().runtime
    device = runtime.device
    assert runtime.subgroups == (device.subgroup_arithmetic and device.subgroup_size >= 8)
    off = RuntimeManager.create(ScheduleConfig(backend_type="vulkan", thread_num=2), {"vulkan_subgroups": False})
    assert off.runtime.subgroups is False


def spy_attention_programs(monkeypatch) -> list[str]:
    """The names of the Programs the vulkan Attention creates from now on."""
    from mnnllm_backends.vulkan.ops import attention
    names, real = [], attention.Program

    def program(device, name, *args):
        names.append(name)
        return real(device, name, *args)
    monkeypatch.setattr(attention, "Program", program)
    return names


@pytest.mark.parametrize("hints, tol", [({}, None), ({"kv_fp16": True}, FP16_TOL), ({"attention_mode": 10}, 3e-2)])
def test_flash_decoding_passes_the_decode_cases_in_every_cache_format(monkeypatch, hints, tol) -> None:
    """vulkan_split_keys 1: every decode step splits its keys (attn_split, attn_merge), shallow
    ones included (most splits then empty); the long-context cases in fp32 (tolerances: the
    cases' own, fp16's, int8's relative step of 1/127 as tests/test_kv_formats_gpu.py)."""
    if not shared_vulkan().runtime.subgroups:
        pytest.skip("the device has no subgroup arithmetic: no one-dispatch attention to split")
    names = spy_attention_programs(monkeypatch)
    cases = [c for c in select("Attention") if "decode" in c.name and not c.tags & {"sinks", "slots"}]
    cases = [dataclasses.replace(c, device_tol=tol) for c in cases] if tol else cases + attention_long.cases()
    results = run_suite("vulkan", hints={**hints, "vulkan_split_keys": 1}, cases=cases)
    assert not [(r.case.id, r.status, r.reason) for r in results if r.status != "pass"]
    assert any(n.startswith("attn_split") for n in names) and "attn_merge" in names


def test_a_negative_split_threshold_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="vulkan_split_keys"):
        RuntimeManager.create(ScheduleConfig(backend_type="vulkan", thread_num=2), {"vulkan_split_keys": -1})


# ------------------------------------------------------------------ the shared model

def test_the_shared_model_gives_the_reference_greedy_tokens_with_vulkan_in_use() -> None:
    import mnnllm_core
    prompt = json.loads(REFERENCE.read_text())["prompts"][0]
    expected = prompt["mnn_cpp_q4_memory_normal"]["gen_ids"][:16]
    got = {}
    for backend in ("vulkan", "cpu"):
        llm = mnnllm_core.create(CONFIG)
        llm.set_config({"backend_type": backend, "sampler_type": "greedy", "thread_num": 2})
        llm.load()
        got[backend] = llm.generate(prompt["prompt_ids"], 16)[:len(expected)]
        if backend == "vulkan":
            placement = llm.placement()
    assert got["vulkan"] == got["cpu"] == expected, got
    on_vulkan_types = placement["op_types_per_backend"]["vulkan"]
    assert {"Convolution", "LayerNorm", "BinaryOp", "RoPE", "Attention", "UnaryOp", "Cast"} <= set(on_vulkan_types), \
        placement
    assert set(placement["ops_per_backend"]) == {"vulkan"} and placement["copies"] == 0, placement


def test_greedy_tokens_are_unchanged_when_decode_crosses_the_flash_decoding_threshold(monkeypatch) -> None:
    """The split threshold set 4 keys past the prompt: the replay runs the one-dispatch attention,
    then is recorded again with attn_split + attn_merge, and the tokens stay MNN's."""
    import mnnllm_core
    prompt = json.loads(REFERENCE.read_text())["prompts"][0]
    expected = prompt["mnn_cpp_q4_memory_normal"]["gen_ids"][:16]
    names = spy_attention_programs(monkeypatch)
    llm = mnnllm_core.create(CONFIG)
    llm.set_config({"backend_type": "vulkan", "sampler_type": "greedy", "thread_num": 2,
                    "backend_hints": {"vulkan_split_keys": len(prompt["prompt_ids"]) + 4}})
    llm.load()
    assert llm.generate(prompt["prompt_ids"], 16)[:len(expected)] == expected
    if shared_vulkan().runtime.subgroups:
        assert "attn_fused64" in names and "attn_split64" in names and "attn_merge" in names, sorted(set(names))


@pytest.mark.skipif(shutil.which("glslangValidator") is None, reason="glslangValidator (glslang-tools) is not installed")
def test_committed_spirv_matches_the_glsl_sources(tmp_path) -> None:
    """The build script, run on a copy of the sources, reproduces every committed .spv."""
    root = Path(__file__).resolve().parents[1]
    shaders = root / "backends" / "vulkan" / "shaders"
    copy = tmp_path / "backends" / "vulkan" / "shaders"
    shutil.copytree(shaders, copy)
    for built in copy.glob("*.spv"):
        built.unlink()
    (tmp_path / "scripts").mkdir()
    shutil.copy(root / "scripts" / "build_vulkan_shaders.sh", tmp_path / "scripts")
    subprocess.run(["sh", str(tmp_path / "scripts" / "build_vulkan_shaders.sh")], check=True, capture_output=True)
    sources = sorted(copy.glob("*.comp"))
    assert sorted(p.stem for p in copy.glob("*.spv")) == [p.stem for p in sources]
    assert sorted(p.stem for p in shaders.glob("*.spv")) == [p.stem for p in sources], "a .spv without its source"
    for source in sources:
        assert source.with_suffix(".spv").read_bytes() == (shaders / source.with_suffix(".spv").name).read_bytes()
