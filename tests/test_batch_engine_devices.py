"""Continuous batching on the device backends (their slot-aware Attention: backends/opencl/ops/
slot_attention.py, backends/vulkan/ops/slot_attention.py): the three reference prompts run together
in the BatchEngine give, token for token, the greedy tokens each gives alone on the same backend
(pocl and lavapipe here: GPUs on the CPU), with prompts chunked behind decode rows; a prompt queued
behind them takes a freed slot; `serve --parallel 3` answers three concurrent clients as each alone.
Decode steps are padded to a few sizes (batch_plan.pad_decode): three streams run as four rows,
each size resized once, and a padded step is one replay (on vulkan one submit) and one readback;
padding changes no stream's tokens (exact: each row's kernels sum as they do unpadded).
The numbers of the op itself: the conformance suite's KV slot cases."""
from __future__ import annotations

import json
import logging
from collections import Counter

import numpy as np
import pytest

import mnnllm_core
from mnnllm_core.llm.batch_engine import BatchEngine, batch_refusal
from mnnllm_core.llm.batch_plan import BATCH_SIZES

from paths import CONFIG, REFERENCE

TOKENS = 12
PROMPTS = [p["prompt_ids"] for p in json.loads(REFERENCE.read_text())["prompts"]]


@pytest.fixture(scope="module", params=["opencl", "vulkan"])
def llm(request):
    from mnnllm_core.plugins.manager import registry
    ok, reason = registry().get(request.param).is_available()
    if not ok:
        pytest.skip(f"{request.param} unavailable: {reason}")
    model = mnnllm_core.create(CONFIG)
    model.set_config({"sampler_type": "greedy", "thread_num": 2, "backend_type": request.param})
    return model.load()


def test_the_reference_prompts_run_together_on_the_device_give_the_tokens_each_gives_alone(llm) -> None:
    assert batch_refusal(llm) is None
    alone = [llm.generate(p, TOKENS) for p in PROMPTS]
    engine = BatchEngine(llm, slots=2, token_budget=16)  # 16 rows a step: prompts in chunks; one queues
    sequences = [engine.submit(p, TOKENS) for p in PROMPTS]
    engine.run()
    assert [s.tokens for s in sequences] == alone
    assert engine.idle


def counting(obj, name: str, counts: Counter, key: str, only=lambda self: True) -> None:
    """Count the calls of `obj.name` (an instance's method, or a class's: then `only(self)` says
    which calls count) under `key`."""
    original = getattr(obj, name)
    if isinstance(obj, type):
        def counted(self, *args, **kwargs):
            counts[key] += bool(only(self))
            return original(self, *args, **kwargs)
    else:
        def counted(*args, **kwargs):
            counts[key] += 1
            return original(*args, **kwargs)
    return counted


def test_three_streams_decode_padded_to_four_rows_one_replay_a_step_with_the_tokens_each_gives_alone(
        llm, monkeypatch, caplog) -> None:
    caplog.set_level(logging.INFO, logger="mnnllm_core.llm.batch_engine")
    alone = [llm.generate(p, TOKENS) for p in PROMPTS]
    engine = BatchEngine(llm, slots=3)  # the default token budget: every prompt prefills in one step
    assert engine.batch_sizes == BATCH_SIZES
    sequences = [engine.submit(p, TOKENS) for p in PROMPTS]
    while any(s.state != "decode" for s in sequences):
        engine.step()
    engine.step()  # the first step of size 4: resized and recorded
    pipeline = engine.sized[4].static_module.session.pipeline
    assert pipeline.replayed and pipeline.tensors[pipeline.info.input_indexes["input_ids"]].shape[0] == 4
    counts: Counter = Counter()
    monkeypatch.setattr(pipeline.replay, "play", counting(pipeline.replay, "play", counts, "replays"))
    monkeypatch.setattr(pipeline.backend, "download", counting(pipeline.backend, "download", counts, "readbacks"))
    expected = Counter(replays=1, readbacks=1)
    if llm.runtime_manager.config.backend_type == "vulkan":  # a submit that runs something (a command buffer)
        from mnnllm_backends.vulkan.device import Recorder
        monkeypatch.setattr(Recorder, "submit", counting(Recorder, "submit", counts, "submits", lambda r: r.count))
        expected["submits"] = 1
    for _ in range(3):
        assert engine.slots_in_use == 3
        before = Counter(counts)
        assert len(engine.step()) == 3
        assert counts - before == expected
    assert pipeline.replay.records == 1 and engine.sized[4].static_module.session.resize_count == 1
    monkeypatch.undo()
    engine.run()
    assert [s.tokens for s in sequences] == alone
    assert engine.padding_run >= 4
    assert all(nbytes > 0 for nbytes in engine.sized_memory().values())
    assert any("decode steps of 4 rows resized and recorded" in r.getMessage() for r in caplog.records)


def test_padding_leaves_the_real_rows_logits_bit_for_bit_those_of_the_unpadded_step(llm) -> None:
    """The three prompts' steps with padding (3 rows run as 4) and without: the real rows' logits
    equal bit for bit (pocl and lavapipe; a device whose linear kernels sum differently for 3 and
    4 rows would leave the tokens equal, within float32 rounding of the logits)."""
    runs = []
    for sizes in (BATCH_SIZES, ()):
        engine = BatchEngine(llm, slots=3, batch_sizes=sizes)
        for slot in engine.slots:  # the other run's rows are in these KV slots: start empty
            slot.conversation.rewind(0)
        steps = []
        forward = engine._forward

        def recorded(plan, forward=forward, steps=steps):
            logits = forward(plan)
            steps.append((plan.rows, logits[:plan.rows - plan.padding].copy()))
            return logits
        engine._forward = recorded
        for p in PROMPTS:
            engine.submit(p, 6)
        engine.run()
        runs.append(steps)
    padded, unpadded = runs
    assert (4, 3) in {(p[0], u[0]) for p, u in zip(padded, unpadded)}
    for (_, mine), (_, theirs) in zip(padded, unpadded):
        np.testing.assert_array_equal(mine, theirs)


def test_serve_parallel_on_the_device_answers_concurrent_clients_as_each_alone(llm) -> None:
    import concurrent.futures

    import openai

    from serve_harness import LiveServer

    questions = [p["prompt"] for p in json.loads(REFERENCE.read_text())["prompts"]]
    alone = {q: llm.response([{"role": "user", "content": q}], max_new_tokens=8) for q in questions}
    with LiveServer(llm, parallel=3, queue_size=4) as live:
        assert live.worker.engine.slots and len(live.worker.engine.slots) == 3
        client = openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=600)

        def ask(question):
            answer = client.chat.completions.create(model="any", messages=[{"role": "user", "content": question}],
                                                    temperature=0, max_tokens=8)
            return answer.choices[0].message.content
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            answers = list(pool.map(ask, questions))
    assert answers == [alone[q] for q in questions]
