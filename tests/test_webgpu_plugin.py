"""The webgpu plugin (plugins/mnnllm-webgpu, installed by .ci/setup-test; wgpu on lavapipe where
there is no GPU): listed with its adapter and what it honours, the conformance suite with no
failure (and the GPU's 8-lane linear kernel, weights split across bindings, the queries of an
attention in blocks whose scores fit one binding, the GPU's fused attention kernel, the CPU
adapter's one-dispatch online attention where its subgroups hold 8 invocations), fp16 storage
where the adapter has shader-f16 (the KV cache and linear weights within FP16_TOL of float64,
an fp16 model's reference tokens; without shader-f16 the request is reported ignored and fp32
runs), the shared model's reference greedy tokens wholly on webgpu, replayed and op by op alike,
and the arch models the GPU backends run. Skipped only when the plugin is not installed or wgpu
finds no adapter (the reason says which)."""
from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import sys

import numpy as np
import pytest

import mnnllm_core
from mnnllm_core.core.backend import BackendConfig, ScheduleConfig
from mnnllm_core.errors import ConfigError
from mnnllm_core.express.runtime_manager import RuntimeManager
from mnnllm_core.plugins.manager import registry
from mnnllm_core.testing import FP16_TOL, run_suite, select
from mnnllm_core.testing.cases import attention_long
from paths import CONFIG, REFERENCE
from test_arch_models import ARCH, DEVICE_CASES, FALLS_BACK
from test_arch_models import REFERENCE as ARCH_REFERENCE
from test_arch_models import expected, generate
from test_replay import greedy_with_logits

NEW_TOKENS = 24
ON_WEBGPU = {"Convolution", "LayerNorm", "BinaryOp", "RoPE", "Attention", "UnaryOp", "Raster", "Cast"}


def webgpu_status() -> tuple[bool, str]:
    try:
        creator = registry().get("webgpu")
    except Exception as err:  # the plugin is not installed
        return False, f"the webgpu plugin is not installed (pip install -e plugins/mnnllm-webgpu): {err}"
    available, reason = creator.is_available()
    return available, f"wgpu found no usable adapter: {reason}"


AVAILABLE, REASON = webgpu_status()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=REASON)


def test_backends_lists_the_adapter_and_what_the_plugin_honours() -> None:
    done = subprocess.run([sys.executable, "-m", "mnnllm_core.cli", "backends", "--json"], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    row = {r["name"]: r for r in json.loads(done.stdout)["backends"]}["webgpu"]
    honours = ["precision"] if default_device().f16 else []  # fp16 storage needs shader-f16
    assert (row["plugin"], row["available"], row["static_shapes"], row["settings"]) == ("webgpu", True, True, honours)
    assert any("[default]" in d and "(" in d for d in row["devices"]), row["devices"]


def default_device():
    from mnnllm_webgpu.device import device_spec, open_device
    return open_device(device_spec(None))


def test_the_conformance_suite_has_no_failure() -> None:
    """Every Attention case runs (long prompts included: their queries go in blocks) but the
    KV-slot ones, which the plugin's one-sequence caches refuse."""
    results = run_suite("webgpu")
    assert [r.case.id for r in results if r.status == "fail"] == []
    assert [r.case.id for r in results if r.status == "unsupported" and r.case.op_type == "Attention"
            and "slots" not in r.case.tags] == []


def failures(results) -> list[str]:
    return [r.case.id for r in results if r.status == "fail"]


def test_the_gpus_eight_lane_linear_kernel_passes_every_linear_case_and_a_bad_hint_is_a_config_error() -> None:
    """Its lanes summed by subgroup shuffles (lavapipe has the "subgroup" feature) and through
    workgroup memory."""
    for subgroups in (True, False):
        hints = {"webgpu_linear_lanes": 8, "webgpu_subgroups": subgroups}
        assert failures(run_suite("webgpu", hints=hints, cases=select("Convolution"))) == [], hints
    with pytest.raises(ConfigError, match="webgpu_linear_lanes"):
        RuntimeManager.create(ScheduleConfig(backend_type="webgpu", thread_num=2), {"webgpu_linear_lanes": 4})


def test_weights_larger_than_one_binding_are_split_into_chunks_with_the_same_outputs() -> None:
    """With max_storage_buffer_binding_size lowered to 4 KiB, every linear case still passes (or
    is refused for an activation over the limit): the 576-wide weights run as chunks of rows (the
    textures of the CPU adapter's 4-bit kernels off: max_texture_dimension_2d 0)."""
    from mnnllm_webgpu.device import device_spec, open_device
    from mnnllm_webgpu.ops.linear import LinearExecution
    device = open_device(device_spec(None))
    limit, device.max_binding = device.max_binding, 4096
    texture, device.max_texture = device.max_texture, 0
    chunked = []
    original = LinearExecution.on_resize

    def spy(self, inputs, outputs):
        chunked.append(len(self.packed.chunks))
        original(self, inputs, outputs)

    LinearExecution.on_resize = spy
    try:
        results = run_suite("webgpu", cases=select("Convolution"))
    finally:
        device.max_binding, device.max_texture, LinearExecution.on_resize = limit, texture, original
    assert failures(results) == []
    assert max(chunked) > 1 and sum(r.status == "pass" for r in results) > 0


LONG_IDS = {c.id for c in attention_long.cases()}
SHORT_ATTENTION = [c for c in select("Attention") if not c.tags & {"slots"} and c.id not in LONG_IDS
                   and not any(n in c.name for n in ("past 4096", "after 4059"))]


def test_an_attentions_queries_go_in_blocks_whose_scores_fit_the_limit_with_the_same_results() -> None:
    """With a block's scores limited to 16 KiB the short cases run in blocks of one to a few
    queries, on the CPU adapter's three passes and on the GPU's fused kernel alike (the
    one-dispatch online kernel, which lavapipe takes, keeps no scores: switched off here)."""
    from mnnllm_webgpu.ops import attention
    device = default_device()
    blocks = []
    original, limit, is_cpu, online = attention.query_block, attention.SCORES_LIMIT, device.is_cpu, attention.online

    def spy(seq, heads, stride, most):
        blocks.append((seq, original(seq, heads, stride, most)))
        return blocks[-1][1]

    attention.query_block, attention.SCORES_LIMIT = spy, 1 << 14
    attention.online = lambda device, dim: False
    try:
        for cpu in (True, False):
            device.is_cpu = cpu
            results = run_suite("webgpu", cases=SHORT_ATTENTION)
            assert failures(results) == [], cpu
            refused = [r.case.id for r in results if r.status != "pass"]
            assert all("one query's" in r.reason for r in results if r.status != "pass"), refused
            assert len(refused) <= 1, refused  # "decode past 256": 9 heads x 512 keys over 16 KiB
    finally:
        attention.query_block, attention.SCORES_LIMIT, device.is_cpu = original, limit, is_cpu
        attention.online = online
    assert any(0 < block < seq for seq, block in blocks)


def test_the_one_dispatch_attention_runs_where_the_adapter_has_subgroups_of_eight() -> None:
    """attention_online.wgsl on a CPU adapter with subgroups of at least 8 (lavapipe), head dims
    that are multiples of 4; the others keep the scores kernels."""
    from mnnllm_webgpu.ops import attention
    device = default_device()
    if not (device.is_cpu and device.subgroup_size >= 8):
        pytest.skip("not a CPU adapter with subgroups of 8")
    assert attention.online(device, 64) and attention.online(device, 256)
    assert not attention.online(device, 6) and not attention.online(device, 260)


@pytest.mark.skipif(not AVAILABLE, reason="no WebGPU adapter")
def test_a_prefills_attention_work_group_takes_the_query_heads_of_one_kv_head_and_decodes_one() -> None:
    """attention_online_group.wgsl reads each key once for up to ONLINE_HEADS query heads (a
    divisor of the group: 6/1 heads by 3 and 3); a decode step keeps one head a work-group. The
    conformance suite's prefill cases (9/3, 6/1, 4/4 heads) check its outputs."""
    from mnnllm_webgpu.ops.attention import online_heads
    assert [online_heads(128, group) for group in (1, 2, 3, 4, 6, 7, 8)] == [1, 2, 3, 4, 3, 1, 4]
    assert online_heads(1, 3) == 1


F16 = pytest.mark.skipif(not AVAILABLE or not default_device().f16, reason="the adapter has no shader-f16")
FP16_LONG = [c for c in attention_long.cases(FP16_TOL) if "prefill" in c.name]


@F16
def test_an_fp16_kv_cache_passes_the_attention_cases_within_the_fp16_tolerance() -> None:
    """The hint kv_fp16 (f16 rows, f32 arithmetic), the long prefills included, on every kernel:
    the CPU adapter's one-dispatch online kernel and three passes, the GPU's fused kernel."""
    from mnnllm_webgpu.ops import attention
    device = default_device()
    cases = [dataclasses.replace(c, device_tol=FP16_TOL) for c in SHORT_ATTENTION if c.dtype == "float32"]
    is_cpu, online = device.is_cpu, attention.online
    try:
        for cpu, scores in ((True, False), (True, True), (False, True)):
            device.is_cpu = cpu
            attention.online = (lambda device, dim: False) if scores else online
            chosen = cases + (FP16_LONG if cpu and not scores else [])
            assert failures(run_suite("webgpu", hints={"kv_fp16": True}, cases=chosen)) == [], (cpu, scores)
    finally:
        device.is_cpu, attention.online = is_cpu, online
    runtime = RuntimeManager.create(ScheduleConfig(backend_type="webgpu", thread_num=2), {"kv_fp16": True}).runtime
    assert runtime.create_backend(BackendConfig()).kv_format.name == "fp16"


@F16
def test_fp16_weights_stay_fp16_at_every_precision_and_fp32_ones_under_precision_low() -> None:
    """fp16 weights in linear_f16.wgsl pass within the fp32 tolerance (f16 -> f32 is exact);
    under precision "low" fp32 weights join them, within FP16_TOL (the runner's fp16 bound)."""
    from mnnllm_webgpu.ops import linear_f16
    made = []
    original = linear_f16.HalfLinearExecution.on_resize

    def spy(self, inputs, outputs):
        made.append(self)
        original(self, inputs, outputs)

    linear_f16.HalfLinearExecution.on_resize = spy
    try:
        counts = {}
        for precision in ("normal", "low"):
            made.clear()
            assert failures(run_suite("webgpu", precision=precision, cases=select("Convolution"))) == [], precision
            counts[precision] = len(made)
    finally:
        linear_f16.HalfLinearExecution.on_resize = original
    assert 0 < counts["normal"] < counts["low"], counts


@F16
def test_an_fp16_model_gives_its_reference_tokens_with_fp16_weights_and_kv_cache() -> None:
    """tiny-hunyuan-mnn-fp16 (a llama-like dense model, fp16 weights) under precision "low": its
    linears in linear_f16.wgsl, its KV cache fp16, the three prompts' 24 greedy tokens equal the
    reference (transformers' fp32 tokens, which MNN's runtime reproduces)."""
    folder = "tiny-hunyuan-mnn-fp16"
    if folder not in ARCH_REFERENCE:
        pytest.skip(f"{folder} missing under {ARCH}")
    llm = mnnllm_core.create(str(ARCH / folder / "config.json"))
    llm.set_config({"backend_type": "webgpu", "precision": "low", "sampler_type": "greedy", "thread_num": 2})
    llm.load()
    runtime = llm.runtime_manager.runtime
    got = []
    for prompt in ARCH_REFERENCE[folder]["prompts"]:
        llm.reset()
        got.append(list(llm.generate(prompt["prompt_ids"], NEW_TOKENS)))
    assert got == expected(folder)
    pipeline = llm.pool.get(1, False).static_module.session.pipeline
    kinds = {type(e).__name__ for _, e in pipeline.executions.values()}
    assert {"HalfLinearExecution", "AttentionExecution"} <= kinds, kinds
    assert pipeline.backend.kv_format.name == "fp16" and runtime.device.f16


def test_without_shader_f16_storage_stays_fp32_and_precision_low_is_reported_ignored(caplog) -> None:
    """An adapter without the feature (the device's features narrowed here): fp32 weights and
    KV cache, `settings` empty, and the request logged as ignored."""
    from mnnllm_webgpu.runtime import WebGPURuntimeCreator
    device = default_device()
    features = device.features
    device.features = [f for f in features if f != "shader-f16"]
    try:
        assert WebGPURuntimeCreator().settings == frozenset()
        with caplog.at_level(logging.INFO):
            runtime = RuntimeManager.create(ScheduleConfig(backend_type="webgpu", thread_num=2,
                                                           backend_config=BackendConfig(precision="low"))).runtime
            backend = runtime.create_backend(BackendConfig(precision="low"))
        assert (backend.kv_format.name, backend.f16_weights) == ("float", False)
        assert "shader-f16" in caplog.text and "precision=low" in caplog.text
        results = run_suite("webgpu", precision="low", cases=select("Convolution")[:20])
        assert failures(results) == [] and {r.tolerance for r in results} != {FP16_TOL}
    finally:
        device.features = features


def test_the_decode_step_is_replayed_with_the_per_op_loops_logits() -> None:
    """One recording per resize, the step's steps encoded and submitted once per token: the
    logits equal the per-op loop's bit for bit."""
    prompt = json.loads(REFERENCE.read_text())["prompts"][0]
    llm = mnnllm_core.create(CONFIG)
    llm.set_config({"backend_type": "webgpu", "sampler_type": "greedy", "thread_num": 2})
    llm.load()
    runtime = llm.runtime_manager.runtime
    runs = {}
    for replay in (True, False):
        runtime.hints = dataclasses.replace(runtime.hints, replay=replay)
        llm.pool.clear()
        runs[replay] = greedy_with_logits(llm, prompt["prompt_ids"], 6)
        decode = llm.pool.get(1, False).static_module.session.pipeline
        assert decode.replayed is replay and decode.records == int(replay)
    assert runs[True][0] == runs[False][0] == prompt["mnn_cpp_q4_memory_normal"]["gen_ids"][:6]
    for replayed, looped in zip(runs[True][1], runs[False][1]):
        np.testing.assert_array_equal(replayed, looped)


def test_the_shared_model_gives_the_reference_greedy_tokens_of_the_three_prompts() -> None:
    prompts = json.loads(REFERENCE.read_text())["prompts"][:3]
    llm = mnnllm_core.create(CONFIG)
    llm.set_config({"backend_type": "webgpu", "sampler_type": "greedy", "thread_num": 2})
    llm.load()
    for prompt in prompts:
        llm.reset()
        expected = prompt["mnn_cpp_q4_memory_normal"]["gen_ids"][:NEW_TOKENS]
        assert llm.generate(prompt["prompt_ids"], NEW_TOKENS)[:len(expected)] == expected
    placement = llm.placement()
    assert ON_WEBGPU <= set(placement["op_types_per_backend"].get("webgpu", ())), placement


GPU_ARCH_CASES = sorted({folder for _, folder in DEVICE_CASES})


@pytest.mark.skipif(not ARCH_REFERENCE, reason="shared arch models missing")
@pytest.mark.parametrize("folder", GPU_ARCH_CASES)
def test_the_arch_models_the_gpu_backends_run_give_their_reference_tokens(folder: str) -> None:
    got, placement = generate(folder, "webgpu")
    assert got == expected(folder)
    assert placement["ops_per_backend"].get("webgpu", 0) > 0
    assert all(f["reason"] for f in placement["fallbacks"])
    if ARCH_REFERENCE[folder]["arch"] in FALLS_BACK:
        assert FALLS_BACK[ARCH_REFERENCE[folder]["arch"]] in {f["type"] for f in placement["fallbacks"]}
