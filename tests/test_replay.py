"""Record and replay (`Backend.on_record` -> `Replay`): a backend turns a resized pipeline into
one step it replays per token (vulkan: one command buffer; opencl: one flat enqueue loop; cpu:
one list of bound calls). Pinned here against the per-op loop it replaces, on opencl (pocl),
vulkan (lavapipe) and cpu (its models: test_cpu_replay.py): the same outputs bit for bit, a new
recording after every resize, the shared model's logits and greedy tokens with replay on and
off (the replay runs q+k and gate+up as one dispatch / kernel each, on opencl gate+up with their MUL_SILU, the loop one per layer), and the
"replay" hint.
"""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

import mnnllm_core
from mnnllm_core.errors import ConfigError
from mnnllm_core.plugins.manager import registry
from mnnllm_core.testing import make_module, new_runtime
from paths import CONFIG, REFERENCE
from test_static_shapes import NormLinearReshape, feeds

BACKENDS = [pytest.param(name, marks=pytest.mark.skipif(not registry().get(name).is_available()[0],
                                                        reason=f"{name} unavailable"))
            for name in ("opencl", "vulkan")]
# tokens per reference prompt: lavapipe is slow, so vulkan decodes a few
GREEDY_TOKENS = {"opencl": 12, "vulkan": 3}


@pytest.mark.parametrize("backend", BACKENDS)
def test_replay_gives_the_per_op_loops_outputs_and_records_again_after_every_resize(backend: str) -> None:
    graph = NormLinearReshape()
    check_replay_against_loop(graph, make_module(graph.info, new_runtime(backend), shape_mutable=False))


def check_replay_against_loop(graph: NormLinearReshape, module) -> None:
    """Over six runs with four resizes: replayed outputs equal the per-op loop's bit for bit and
    the reference's; one recording per resize."""
    pipeline = module.session.pipeline
    records = []
    for seq in (3, 3, 1, 37, 37, 3):
        inputs = feeds(seq)
        replayed = module.forward(inputs)[0]
        assert pipeline.replayed, pipeline.placement.summary()
        pipeline.replay_enabled = False
        looped = module.forward(inputs)[0]
        pipeline.replay_enabled = True
        np.testing.assert_array_equal(replayed, looped)
        np.testing.assert_allclose(replayed, graph.reference(inputs["x"], inputs["dims"]), rtol=1e-5, atol=1e-4)
        records.append(pipeline.records)
    assert records == [1, 1, 2, 3, 3, 4], "recorded once per resize, never per run"


@pytest.mark.parametrize("memory", ["normal", "low"])
def test_the_cpu_replay_gives_the_per_op_loops_outputs_and_records_again_after_every_resize(memory: str) -> None:
    graph = NormLinearReshape()
    check_replay_against_loop(graph, make_module(graph.info, new_runtime("cpu", memory=memory)))


def test_with_the_replay_hint_off_a_cpu_pipeline_keeps_the_per_op_loop() -> None:
    graph = NormLinearReshape()
    module = make_module(graph.info, new_runtime("cpu", hints={"replay": False}))
    module.forward(feeds(2))
    assert not module.session.pipeline.replayed and module.session.pipeline.records == 0


@pytest.mark.parametrize("value", ["no", 0, "false"])
def test_a_replay_hint_that_is_not_a_boolean_is_a_config_error(value) -> None:
    with pytest.raises(ConfigError, match="replay"):
        make_module(NormLinearReshape().info, new_runtime("cpu", hints={"replay": value}))


def greedy_with_logits(llm, prompt_ids: list[int], steps: int) -> tuple[list[int], list[np.ndarray]]:
    llm.reset()
    logits = [llm.forward(prompt_ids)]
    tokens = []
    for _ in range(steps):
        tokens.append(int(np.argmax(logits[-1])))
        logits.append(llm.forward([tokens[-1]]))
    return tokens, logits


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_shared_model_gives_the_same_logits_and_reference_tokens_replayed_and_op_by_op(backend: str) -> None:
    llm = mnnllm_core.create(CONFIG)
    llm.set_config({"backend_type": backend, "sampler_type": "greedy", "thread_num": 2})
    llm.load()
    runtime = llm.runtime_manager.runtime
    steps = GREEDY_TOKENS[backend]
    for prompt in json.loads(REFERENCE.read_text())["prompts"]:
        expected = prompt["mnn_cpp_q4_memory_normal"]["gen_ids"][:steps]
        runs = {}
        for replay in (True, False):
            runtime.hints = dataclasses.replace(runtime.hints, replay=replay)
            llm.pool.clear()  # fresh clones read the hint; they share the packed weights and the KV cache
            runs[replay] = greedy_with_logits(llm, prompt["prompt_ids"], steps)
            decode = llm.pool.get(1, False).static_module.session.pipeline
            assert decode.replayed is replay and decode.records == int(replay)
            if replay:  # q+k and gate+up: one dispatch / kernel each (lavapipe's texel layers, pocl's GEMVs)
                assert decode.replay.paired == 2 * 30
                assert getattr(decode.replay, "gated", 30) == 30  # opencl: gate, up and their MUL_SILU as one
        assert runs[True][0] == runs[False][0], prompt["prompt"]
        assert runs[True][0][:len(expected)] == expected, (prompt["prompt"], runs[True][0], expected)  # MNN stops at eos
        for replayed, looped in zip(runs[True][1], runs[False][1]):
            np.testing.assert_array_equal(replayed, looped)


def test_the_replay_hint_turns_replay_off_from_the_config() -> None:
    if not registry().get("opencl").is_available()[0]:
        pytest.skip("opencl unavailable")
    llm = mnnllm_core.create(CONFIG)
    llm.set_config({"backend_type": "opencl", "thread_num": 2, "backend_hints": {"replay": False}})
    llm.load()
    llm.forward([1, 2])
    llm.forward([3])
    assert not any(m.static_module.session.pipeline.replayed for m in llm.pool.modules())
