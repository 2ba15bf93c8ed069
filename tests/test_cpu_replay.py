"""The cpu backend's replay (CPUReplay): a decode step recorded once after resize and replayed
per token as calls bound at record time, at memory "low" its numba kernels as a few compiled
programs (StepProgram). Pinned against the per-op loop it replaces (the
"replay" hint off): the same greedy tokens and the same logits bit for bit, on the shared
model at memory "low" (packed int4) and "normal" (fp32, whose tokens stay MNN's memory-normal
ones), with one and two threads, and on tiny MNN exports with per-head q/k norm (gemma3) and
with Qwen3.5's gated delta-net layers, whose ops the replay runs as their on_execute.
"""
from __future__ import annotations

import dataclasses
import json
from functools import partial

import numpy as np
import pytest

import mnnllm_core
from paths import CONFIG, REFERENCE, SHARED
from test_replay import greedy_with_logits

ARCH = SHARED / "models" / "arch"
ARCH3 = SHARED / "models" / "arch3"
STEPS = 6  # greedy tokens per prompt and mode (memory "normal" reads fp32 weights: slow)


def replayed_and_looped(config, memory: str, threads: int, prompts: list[list[int]], recorded_once: bool = True,
                        hints: dict | None = None) -> dict:
    """For each replay setting, per prompt (tokens, logits); asserts the decode step really was
    replayed or really ran op by op. `recorded_once`: the decode shapes stay put, so its step is
    recorded once (a model whose decode mask grows with the cache, gemma3's, resizes and records
    again every token). `hints`: backend hints of the load."""
    llm = mnnllm_core.create(str(config))
    llm.set_config({"backend_type": "cpu", "memory": memory, "sampler_type": "greedy", "thread_num": threads,
                    "backend_hints": hints or {}})
    llm.load()
    runtime = llm.runtime_manager.runtime
    runs = {}
    for replay in (True, False):
        runtime.hints = dataclasses.replace(runtime.hints, replay=replay)
        llm.pool.clear()  # fresh clones read the hint; they share the weights and the KV caches
        runs[replay] = [greedy_with_logits(llm, ids, STEPS) for ids in prompts]
        decode = llm.pool.get(1, False).static_module.session.pipeline
        assert decode.replayed is replay and (decode.records == 1 if replay and recorded_once else
                                              bool(decode.records) is replay)
        if replay:
            runs["replay"] = decode.replay
    return runs


def assert_same(runs: dict) -> None:
    for (tokens, logits), (looped_tokens, looped_logits) in zip(runs[True], runs[False]):
        assert tokens == looped_tokens
        for replayed, looped in zip(logits, looped_logits):
            np.testing.assert_array_equal(replayed, looped)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("memory", ["low", "normal"])
def test_the_shared_model_replayed_gives_the_per_op_loops_tokens_and_logits(memory: str, threads: int) -> None:
    prompts = json.loads(REFERENCE.read_text())["prompts"][:2]
    runs = replayed_and_looped(CONFIG, memory, threads, [p["prompt_ids"] for p in prompts])
    assert_same(runs)
    replay = runs["replay"]
    if memory == "low":  # the 30 layers' kernels as a few compiled programs, numpy ops between them
        assert replay.kernel_calls >= 30 * 11 and len(replay.calls) <= 16, (replay.kernel_calls, len(replay.calls))
    else:  # BLAS products and numpy ops: bound calls, no program
        assert replay.programs == 0 and len(replay.calls) >= 30 * 7
    if memory == "normal":  # the fp32 path stays exact to MNN's memory-normal tokens
        for prompt, (tokens, _) in zip(prompts, runs[True]):
            expected = prompt["mnn_cpp_q4_memory_normal"]["gen_ids"][:STEPS]
            assert tokens[:len(expected)] == expected, prompt["prompt"]


@pytest.mark.parametrize("threads", [1, 2])
def test_few_token_forwards_replayed_give_the_per_op_loops_logits(threads: int) -> None:
    """Verify-sized forwards (2..8 tokens) replay their few-token GEMVs inside the programs: the
    same logits bit for bit as op by op, run after run (the second run of a shape records)."""
    llm = mnnllm_core.create(str(CONFIG))
    llm.set_config({"backend_type": "cpu", "memory": "low", "sampler_type": "greedy", "thread_num": threads})
    llm.load()
    runtime = llm.runtime_manager.runtime
    ids = (json.loads(REFERENCE.read_text())["prompts"][0]["prompt_ids"] * 4)[:8 + 3 * 8]
    runs = {}
    for replay in (True, False):
        runtime.hints = dataclasses.replace(runtime.hints, replay=replay)
        llm.pool.clear()
        logits = []
        for tokens in (2, 5, 8):
            llm.reset()
            llm.forward(ids[:8])
            for at in range(8, 8 + 3 * tokens, tokens):  # three runs of the shape: looped, recorded, replayed
                logits.append(llm.forward(ids[at:at + tokens], all_logits=True).copy())
            pipeline = llm.pool.get(tokens, True).static_module.session.pipeline
            assert pipeline.replayed is replay
            if replay:  # the GEMVs inside programs: a handful of calls, not one per linear
                assert pipeline.replay.kernel_calls >= 30 * 11 and len(pipeline.replay.calls) <= 16
        runs[replay] = logits
    for replayed, looped in zip(runs[True], runs[False]):
        np.testing.assert_array_equal(replayed, looped)


TINY = [(ARCH / "tiny-gemma3_text-mnn-q4", "low", False), (ARCH3 / "tiny-qwen3_5-mnn-q4", "low", True),
        (ARCH3 / "tiny-qwen3_5-mnn-q4", "normal", True)]


@pytest.mark.parametrize("folder,memory,once", TINY, ids=[f"{f.name}-{m}" for f, m, _ in TINY])
def test_tiny_exports_with_qk_norm_and_gated_delta_net_replayed_give_the_loops_tokens(folder, memory: str,
                                                                                       once: bool) -> None:
    if not (folder / "config.json").exists():
        pytest.skip(f"shared model missing at {folder}")
    reference = json.loads((folder.parent / "reference.json").read_text())[folder.name]
    prompts = [p.get("mnn_prompt_ids", p["prompt_ids"]) for p in reference["prompts"][:2]]
    assert_same(replayed_and_looped(folder / "config.json", memory, 2, prompts, once))


def test_a_program_runs_the_kernels_it_recognises_as_called_and_leaves_the_rest() -> None:
    """Norm kernel calls as one program give the calls' values bit for bit; a call on a strided
    view or of a function it does not know is refused, and the refused call's arrays leave no
    entries behind."""
    pytest.importorskip("numba")
    from mnnllm_backends.cpu.kernels.norm import add_normalize_rows, normalize_rows
    from mnnllm_backends.cpu.step_program import StepProgram

    rng = np.random.default_rng(3)
    x, gamma, empty = (rng.standard_normal(4 * 96).astype(np.float32), rng.standard_normal(96).astype(np.float32),
                       np.zeros(0, np.float32))
    calls = [partial(normalize_rows, x, 96, gamma, empty, 1e-6, True, np.empty_like(x)),
             partial(add_normalize_rows, x, x[::-1].copy(), 96, gamma, empty, 1e-5, False, np.empty_like(x),
                     np.empty_like(x))]
    program = StepProgram()
    assert all(program.add(call) for call in calls)
    entries = len(program.floats)
    assert not program.add(partial(normalize_rows, x[::2], 96, gamma, empty, 1e-6, True, np.empty(192, np.float32)))
    assert not program.add(partial(np.add, x, x, out=np.empty_like(x)))
    assert len(program.floats) == entries and len(program) == 2
    for call in calls:  # the per-op way: each kernel called as bound
        call()
    outs = [call.args[-1] for call in calls]
    before = [o.copy() for o in outs]
    for o in outs:
        o[...] = 0
    program.bound()()
    for got, want in zip(outs, before):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("values", ["i8", "f32", "fp32 cache", "fp32 cache below the split"])
def test_a_program_runs_the_decode_attention_kernels_as_called(values: str) -> None:
    """One token's attention as a program instruction (over a StoredKVCache of int8 keys and int8
    or float32 values; over the fp32 cache, split over keys past SPLIT_FROM tokens, and by the
    kernel without the split below) gives the bound call's cache rows and output bit for bit."""
    pytest.importorskip("numba")
    from mnnllm_backends.cpu.kernels import set_threads
    from mnnllm_backends.cpu.kernels.attention import SPLIT_FROM, append_decode, append_decode_deep
    from mnnllm_backends.cpu.kernels.decode_attention import append_attend_stored
    from mnnllm_backends.cpu.kv_storage import StoredKinds, StoredKVCache
    from mnnllm_backends.cpu.step_program import StepProgram

    rng = np.random.default_rng(5)
    heads, kv_heads, dim = 6, 2, 64
    past = 300 if values == "fp32 cache below the split" else SPLIT_FROM + 40
    capacity = -(-(past + 1) // 16) * 16
    rows = rng.standard_normal((past, kv_heads, dim)).astype(np.float32)
    q, k, v = (rng.standard_normal((1, h, dim)).astype(np.float32) for h in (heads, kv_heads, kv_heads))
    scale, sinks, threads = np.float32(0.125), rng.standard_normal(heads).astype(np.float32), 2
    set_threads(threads)
    if values.startswith("fp32 cache"):
        keys_t, stored = (np.zeros((kv_heads, dim, capacity), np.float32),
                          np.zeros((kv_heads, capacity, dim), np.float32))
        keys_t[:, :, :past], stored[:, :past] = rows.transpose(1, 2, 0), rows.transpose(1, 0, 2) * 2
        caches = [(keys_t, stored), (keys_t.copy(), stored.copy())]
        kernel = append_decode if values == "fp32 cache below the split" else append_decode_deep
    else:
        caches = []
        for _ in range(2):
            cache = StoredKVCache(StoredKinds("i8", values), True, None, lambda nbytes: np.zeros)
            cache.add(rows, rows * 2)
            cache.extend(1)
            caches.append(cache.stored())
        kernel = append_attend_stored
    outs = [np.zeros_like(q), np.zeros_like(q)]
    calls = [partial(kernel, q, k, v, *cache, np.array([past]), scale, sinks, out, threads)
             for cache, out in zip(caches, outs)]
    program = StepProgram()
    assert program.add(calls[1]) and len(program) == 1
    calls[0]()
    program.bound()()
    for got, want in zip((*caches[1], outs[1]), (*caches[0], outs[0])):
        np.testing.assert_array_equal(got, want)
    assert np.abs(outs[0]).max() > 0
