"""The webgpu plugin (plugins/mnnllm-webgpu, installed by .ci/setup-test; wgpu on lavapipe where
there is no GPU): listed with its adapter, the conformance suite with no failure, the shared
model's reference greedy tokens with the ops on webgpu, and the tiny arch model the GPU backends
run. Skipped only when the plugin is not installed or wgpu finds no adapter (the reason says which)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import mnnllm_core
from mnnllm_core.plugins.manager import registry
from mnnllm_core.testing import run_suite
from paths import CONFIG, REFERENCE, SHARED

os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")  # wgpu's Vulkan loader warns without it
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
