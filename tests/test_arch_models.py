"""MNN's own exports of other architectures (../shared/models/arch: Qwen3-MoE, LFM2, Hunyuan,
Gemma 2/3), run by our engine: greedy, 24 tokens, the three reference prompts, each equal to the
list its README names (transformers' where MNN's runtime agrees with it, else MNN's runtime's).
On opencl/vulkan an op the backend does not run falls back to cpu, with the reason in the
placement summary; the tokens must not change."""
from __future__ import annotations

import json

import pytest

from mnnllm_core.errors import ConfigError
from mnnllm_core.llm.create import create
from mnnllm_core.plugins.manager import registry
from paths import SHARED

ARCH = SHARED / "models" / "arch"
REFERENCE = json.loads((ARCH / "reference.json").read_text()) if (ARCH / "reference.json").exists() else {}
NEW_TOKENS = 24
FALLS_BACK = {"qwen3_moe": "MoE", "lfm2": "LinearAttention"}  # no GPU kernel yet: on cpu, with the reason
DEVICE_CASES = [("opencl", "tiny-gemma3_text-mnn-fp16"), ("opencl", "tiny-gemma2-mnn-fp16"),
                ("opencl", "tiny-hunyuan-mnn-q4"), ("opencl", "tiny-qwen3_moe-mnn-q4"), ("opencl", "tiny-lfm2-mnn-fp16"),
                ("vulkan", "tiny-gemma3_text-mnn-q4")]


def generate(folder: str, backend: str, reset: bool = True) -> tuple[list[list[int]], dict]:
    """Our greedy tokens for the folder's prompts, and the placement summary. Without `reset`
    each prompt reuses the cache of the shared system-prompt prefix (the rest is cut back)."""
    llm = create(str(ARCH / folder / "config.json"))
    llm.set_config({"backend_type": backend, "memory": "normal", "sampler_type": "greedy", "thread_num": 2})
    llm.load()
    out = []
    for prompt in REFERENCE[folder]["prompts"]:
        if reset:
            llm.reset()
        out.append(list(llm.generate(prompt["prompt_ids"], NEW_TOKENS)))
    return out, llm.placement()


def expected(folder: str) -> list[list[int]]:
    entry = REFERENCE[folder]
    return [p[entry["reference"]] for p in entry["prompts"]]


pytestmark = pytest.mark.skipif(not REFERENCE, reason=f"shared arch models missing at {ARCH}")


@pytest.mark.parametrize("folder", sorted(REFERENCE))
def test_cpu_reproduces_the_reference_tokens_of_mnns_export(folder) -> None:
    got, _ = generate(folder, "cpu")
    assert got == expected(folder)


@pytest.mark.parametrize("folder", ["tiny-lfm2-mnn-fp16", "tiny-gemma3_text-mnn-fp16", "tiny-qwen3_moe-mnn-q4"])
def test_a_prompt_reusing_the_cached_prefix_gives_the_tokens_of_a_fresh_start(folder) -> None:
    """The prompts share the system prompt: the second and third keep its KV cache (and LFM2's
    convolution history, gemma3's windowed mask over it) and cut back the previous answer."""
    got, _ = generate(folder, "cpu", reset=False)
    assert got == expected(folder)


@pytest.mark.parametrize("backend,folder", DEVICE_CASES, ids=[f"{b}-{f}" for b, f in DEVICE_CASES])
def test_a_device_backend_reproduces_the_reference_tokens_and_names_each_fallback(backend, folder) -> None:
    available, reason = registry().get(backend).is_available()
    if not available:
        pytest.skip(f"{backend} unavailable: {reason}")
    got, placement = generate(folder, backend)
    assert got == expected(folder)
    assert placement["ops_per_backend"].get(backend, 0) > 0
    assert all(f["reason"] for f in placement["fallbacks"])
    if REFERENCE[folder]["arch"] in FALLS_BACK:
        assert FALLS_BACK[REFERENCE[folder]["arch"]] in {f["type"] for f in placement["fallbacks"]}


@pytest.mark.parametrize("folder,attention_type", [("tiny-gemma3_text-mnn-q4", "full"),
                                                   ("tiny-gemma2-mnn-fp16", "mix")])
def test_an_attention_type_the_graph_cannot_take_is_a_config_error_at_load(folder, attention_type) -> None:
    llm = create(str(ARCH / folder / "config.json"))
    llm.set_config({"attention_type": attention_type, "sliding_window": 16})
    with pytest.raises(ConfigError, match="attention_mask") as err:
        llm.load()
    assert err.value.field == "attention_type"
