"""The webgpu plugin (plugins/mnnllm-webgpu, installed by .ci/setup-test; wgpu on lavapipe where
there is no GPU): listed with its adapter, the conformance suite with no failure (and the GPU's
8-lane linear kernel, and weights split across bindings), the shared model's reference greedy
tokens wholly on webgpu, replayed and op by op alike, and the arch models the GPU backends run.
Skipped only when the plugin is not installed or wgpu finds no adapter (the reason says which)."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest

import mnnllm_core
from mnnllm_core.core.backend import ScheduleConfig
from mnnllm_core.errors import ConfigError
from mnnllm_core.express.runtime_manager import RuntimeManager
from mnnllm_core.plugins.manager import registry
from mnnllm_core.testing import run_suite, select
from paths import CONFIG, REFERENCE
from test_arch_models import DEVICE_CASES, FALLS_BACK
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
    assert (row["plugin"], row["available"], row["static_shapes"], row["settings"]) == ("webgpu", True, True, [])
    assert any("[default]" in d and "(" in d for d in row["devices"]), row["devices"]


def test_the_conformance_suite_has_no_failure() -> None:
    results = run_suite("webgpu")
    assert [r.case.id for r in results if r.status == "fail"] == []


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
