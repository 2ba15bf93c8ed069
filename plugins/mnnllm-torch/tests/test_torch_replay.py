"""Record and replay on the torch plugin (`TorchBackend.on_record` -> TorchReplay): the shared
model runs wholly on torch, so its decode step is one recorded step; on CUDA it is captured as a
CUDA graph, elsewhere the same step runs eagerly ("torch_replay": "eager"). Pinned here on the
cpu device against the per-op loop it replaces: the same logits bit for bit and MNN's greedy
tokens, a new recording after every resize, a KV cache that moves under a replay reaching the
graph layer as "capture again" (a stand-in for the CUDA graph records what it is asked), and the
hint's errors. The CUDA capture itself runs only where torch sees a GPU (the last test)."""
from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not importable")

import mnnllm_core  # noqa: E402
from mnnllm_core.backend_api import ConfigError  # noqa: E402
from mnnllm_core.testing import make_module, new_runtime  # noqa: E402
from paths import CONFIG, REFERENCE  # noqa: E402
from test_replay import check_replay_against_loop, greedy_with_logits  # noqa: E402
from test_static_shapes import NormLinearReshape, feeds  # noqa: E402

STEPS = 6  # greedy tokens per reference prompt
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the graph capture is not run here")


def test_a_replay_on_torch_gives_the_per_op_loops_outputs_and_records_again_after_every_resize() -> None:
    graph = NormLinearReshape()
    check_replay_against_loop(graph, make_module(graph.info, new_runtime(
        "torch", hints={"torch_device": "cpu", "torch_replay": "eager"})))


def test_off_the_default_on_cpu_keeps_the_per_op_loop() -> None:
    module = make_module(NormLinearReshape().info, new_runtime("torch", hints={"torch_device": "cpu"}))
    module.forward(feeds(2))
    assert not module.session.pipeline.replayed and module.session.pipeline.records == 0


@pytest.mark.parametrize("hints", [{"torch_replay": "always"}, {"torch_replay": "graph", "torch_device": "cpu"}])
def test_a_bad_torch_replay_hint_is_a_config_error(hints) -> None:
    with pytest.raises(ConfigError, match="torch_replay"):
        new_runtime("torch", hints={"torch_device": "cpu", **hints})


def _torch_llm(**hints):
    llm = mnnllm_core.create(CONFIG)
    llm.set_config({"backend_type": "torch", "sampler_type": "greedy", "thread_num": 1,  # 2 threads wait on a loaded cpu
                    "backend_hints": {"torch_device": "cpu", **hints}})
    llm.load()
    return llm


def _runs(llm, modes: tuple[str, ...], steps: int = STEPS):
    """Per reference prompt: {mode: (tokens, logits, decode pipeline)}, each mode on fresh clones
    (sharing the weights)."""
    runtime = llm.runtime_manager.runtime
    for prompt in json.loads(REFERENCE.read_text())["prompts"]:
        runs = {}
        for mode in modes:
            runtime.replay_mode = mode
            llm.pool.clear()
            tokens, logits = greedy_with_logits(llm, prompt["prompt_ids"], steps)
            decode = llm.pool.get(1, False).static_module.session.pipeline
            assert decode.replayed is (mode != "off") and decode.records == int(mode != "off")
            runs[mode] = tokens, logits, decode
        yield prompt, runs


def test_the_shared_model_gives_the_same_logits_and_mnns_tokens_replayed_and_op_by_op() -> None:
    llm = _torch_llm(torch_replay="eager")
    for prompt, runs in _runs(llm, ("eager", "off")):
        expected = prompt["mnn_cpp_q4_memory_normal"]["gen_ids"][:STEPS]
        assert runs["eager"][0] == runs["off"][0] and runs["eager"][0][:len(expected)] == expected, prompt["prompt"]
        for replayed, looped in zip(runs["eager"][1], runs["off"][1]):
            np.testing.assert_array_equal(replayed, looped)
    assert llm.placement()["ops_per_backend"] == {"torch": 382}, "the whole step is on torch"


class StandInGraph:
    """What TorchReplay asks of cuda_graph.CudaGraphStep, recorded; the step runs eagerly."""

    made: list["StandInGraph"] = []

    def __init__(self, step, device):
        self.step, self.device, self.calls = step, device, []
        StandInGraph.made.append(self)

    def run(self, moved: bool) -> None:
        self.calls.append("capture" if moved or not self.calls else "replay")
        self.step()


def test_a_kv_cache_that_moves_under_a_replay_asks_the_graph_to_capture_again(monkeypatch) -> None:
    from mnnllm_torch import cuda_graph
    from mnnllm_torch.ops.attention import TorchKVCache
    monkeypatch.setattr(cuda_graph, "CudaGraphStep", StandInGraph)
    StandInGraph.made.clear()
    prompt = json.loads(REFERENCE.read_text())["prompts"][0]["prompt_ids"]
    monkeypatch.setattr(TorchKVCache, "min_capacity", len(prompt) + 3)  # full after 3 decode steps
    llm = _torch_llm(torch_replay="eager")
    llm.runtime_manager.runtime.replay_mode = "graph"  # on a cpu device only with the stand-in
    llm.reset()
    token = int(np.argmax(llm.forward(prompt)))  # the prefill: a replay of its own
    for _ in range(6):
        token = int(np.argmax(llm.forward([token])))
    prefill, decode = StandInGraph.made[:2]
    assert prefill.calls == ["capture"] and prefill.device.type == "cpu"
    assert decode.calls == ["capture", "replay", "replay", "capture", "replay", "replay"], \
        "captured at the first step and again when the caches outgrew their tensors"
    token = int(np.argmax(llm.forward(list(range(100, 200)))))  # another prefill clone grows the shared caches
    llm.forward([token])
    assert decode.calls[-1] == "capture", "the decode step's captured tensors moved under it"


@CUDA
def test_on_cuda_the_decode_step_is_one_graph_replayed_with_the_eager_steps_tokens() -> None:
    llm = _torch_llm(torch_device="cuda")
    assert llm.runtime_manager.runtime.replay_mode == "graph"
    for prompt, runs in _runs(llm, ("graph", "eager", "off"), steps=16):
        assert runs["graph"][0] == runs["eager"][0] == runs["off"][0], prompt["prompt"]
        for graphed, eager in zip(runs["graph"][1], runs["eager"][1]):
            np.testing.assert_allclose(graphed, eager, rtol=1e-5, atol=1e-4)
        graph = runs["graph"][2].replay.graph
        assert graph is not None and not graph.failed and graph.captures == 1, "captured once, replayed 15 times"


@pytest.mark.parametrize("folder", ["tiny-gemma2-mnn-fp16", "tiny-hunyuan-mnn-q4"])
def test_other_architectures_wholly_on_torch_replay_and_give_their_reference_tokens(folder: str) -> None:
    from test_arch_models import ARCH, REFERENCE, expected
    if folder not in REFERENCE:
        pytest.skip(f"{folder} missing in {ARCH}")
    llm = mnnllm_core.create(str(ARCH / folder / "config.json"))
    llm.set_config({"backend_type": "torch", "memory": "normal", "sampler_type": "greedy", "thread_num": 1,
                    "backend_hints": {"torch_device": "cpu", "torch_replay": "eager"}})
    llm.load()
    got = []
    for prompt in REFERENCE[folder]["prompts"]:
        llm.reset()
        got.append(list(llm.generate(prompt["prompt_ids"], 24)))
    assert got == expected(folder)
    assert set(llm.placement()["ops_per_backend"]) == {"torch"}
    assert llm.pool.get(1, False).static_module.session.pipeline.replayed
