"""A batched decode step on the cpu at memory "low" (llm/batch_engine.py, ops/slot_attention.py)
replays as the one-sequence step does: each KV slot's attention is its twin's kernel call inside
the step's compiled programs (no per-op Python), the slots' one-token attentions joined on the
thread team (program.JOINS: no barrier between them). Its logits equal the per-op loop's bit for
bit, with 1 and 2 threads (team, rank 0 alone, chosen, serial program), for slots of ragged
lengths, as streams leave (fewer rows) and a new one comes (another row table), with prompt chunks
of up to 8 rows beside decode rows (each chunk its slot's `append_attend` call), and with int8
KV (attention_mode 10, STORED_ATTEND).
"""
from __future__ import annotations

import dataclasses
import json
from functools import partial

import numpy as np
import pytest

import mnnllm_core
from mnnllm_core.llm import batch_engine
from mnnllm_core.llm.batch_engine import BatchEngine

from paths import CONFIG, REFERENCE

numba = pytest.importorskip("numba")

# ragged: the reference prompts (their own lengths), one cut short, one repeated long
BASE = [p["prompt_ids"] for p in json.loads(REFERENCE.read_text())["prompts"]]
PROMPTS = [BASE[0], BASE[1][:5], (BASE[2] * 4)[:40]]
LATE = BASE[2][:9]  # submitted once the first stream is done: a new row table
TOKEN_BUDGET = 10


def engine_run(llm, modes: dict) -> dict:
    """Per mode (replay, team way or None for the serial program): every step's (rows' tokens,
    logits) of two passes of one engine over PROMPTS (stream i decodes 16 - 2 i tokens, LATE joins
    once the last is done; at most TOKEN_BUDGET rows a step, so prompts run in chunks of up to 8
    rows beside the decode rows); the second pass meets every step shape again, so it replays the
    shapes the first ran op by op (decode steps and mixed ones alike)."""
    runtime = llm.runtime_manager.runtime
    runs = {}
    for name, (replay, way) in modes.items():
        runtime.hints = dataclasses.replace(runtime.hints, replay=replay, cpu_thread_team=way is not None)
        if way is not None and runtime.team() is not None:
            runtime.team().way = way
        llm.reset()
        engine = BatchEngine(llm, slots=3, token_budget=TOKEN_BUDGET)
        steps, tokens = [], []
        forward = engine._forward

        def recorded(plan, forward=forward, steps=steps):
            logits = forward(plan)
            steps.append(([p.tokens for p in plan.parts], logits.copy()))
            return logits

        engine._forward = recorded
        for _ in range(2):
            for slot in engine.slots:
                slot.conversation.rewind(0)
            sequences = [engine.submit(p, 16 - 2 * i) for i, p in enumerate(PROMPTS)]
            while not sequences[2].finished:
                engine.step()
            late = engine.submit(LATE, 6)
            engine.run()
            tokens.append([s.tokens for s in sequences + [late]])
        assert tokens[0] == tokens[1], name
        runs[name] = (steps, tokens[0])
        runs[f"{name} engine"] = engine
    return runs


def assert_same(runs: dict, names: list[str]) -> None:
    steps, tokens = runs[names[0]]
    for name in names[1:]:
        other_steps, other_tokens = runs[name]
        assert other_tokens == tokens, name
        assert len(other_steps) == len(steps), name
        for (rows, logits), (other_rows, other_logits) in zip(steps, other_steps):
            assert rows == other_rows, name
            np.testing.assert_array_equal(logits, other_logits, err_msg=name)


def batched_replays(engine: BatchEngine, decode: bool = True) -> list:
    """The replays of the engine's clones of batched steps: decode steps (several rows, one
    token each), or (decode False) steps with prompt chunks too."""
    replays = []
    for (rows, first, batched), clone in engine._clones.items():
        replay = clone.static_module.session.pipeline.replay
        if batched and rows > 1 and replay is not None and (first == 0) == decode and replay.records:
            replays.append(replay)
    return replays


def program_rows(replay) -> list:
    rows = []
    for call in replay.calls:
        arrays = getattr(call, "arrays", None)
        if isinstance(call, partial) and getattr(call.func, "__name__", "") == "run":
            rows += list(arrays[1])  # a team program's code
        elif arrays is not None:
            rows += list(call.args[0])  # a serial program's code
    return rows


def load(threads: int, config: dict | None = None):
    llm = mnnllm_core.create(str(CONFIG))
    llm.set_config({"backend_type": "cpu", "memory": "low", "sampler_type": "greedy", "thread_num": threads,
                    **(config or {})})
    return llm.load()


@pytest.mark.parametrize("threads", [1, 2])
def test_a_batched_decode_step_replays_as_programs_with_the_loops_bits(threads, monkeypatch) -> None:
    from mnnllm_backends.cpu.kernels import program
    from mnnllm_backends.cpu.ops.slot_attention import SlotAttentionExecution

    monkeypatch.setattr(batch_engine, "CLONES", 64)  # every step shape's clone kept: the second pass replays
    llm = load(threads)
    modes = {"loop": (False, None), "serial": (True, None)}
    if threads > 1:
        modes.update({"team": (True, "team"), "solo": (True, "solo"), "auto": (True, "auto")})
    runs = engine_run(llm, modes)
    try:
        assert_same(runs, list(modes))
        for name in modes:
            if name == "loop":
                continue
            engine = runs[f"{name} engine"]
            replays = batched_replays(engine)
            assert replays, name
            # a prompt chunk of up to 8 rows is its slot's `append_attend` call (ATTEND), replayed too
            chunks = [row for replay in batched_replays(engine, False) for row in program_rows(replay)]
            assert any(row[0] == program.ATTEND for row in chunks), name
            for replay in replays:
                # no per-op Python left for the slots' attention: it runs inside the programs
                assert not any(isinstance(getattr(getattr(call, "func", None), "__self__", None),
                                          SlotAttentionExecution) for call in replay.calls), name
                rows = program_rows(replay)
                attentions = [row for row in rows if row[0] == program.DECODE_ATTEND]
                assert attentions and any(row[program.JOINS] for row in attentions), name
    finally:
        llm.runtime_manager.runtime.close_team()


def test_int8_kv_batched_steps_replay_stored_attention_with_the_loops_bits(monkeypatch) -> None:
    from mnnllm_backends.cpu.kernels import program

    monkeypatch.setattr(batch_engine, "CLONES", 64)
    llm = load(2, {"attention_mode": 10})
    modes = {"loop": (False, None), "team": (True, "team"), "serial": (True, None)}
    runs = engine_run(llm, modes)
    try:
        assert_same(runs, list(modes))
        rows = [row for replay in batched_replays(runs["team engine"]) for row in program_rows(replay)]
        assert any(row[0] == program.STORED_ATTEND and row[program.JOINS] for row in rows)
    finally:
        llm.runtime_manager.runtime.close_team()


def test_a_request_taking_a_freed_slot_keeps_the_decode_steps_recording() -> None:
    """Decode rows run in slot order: when a stream leaves and a new request takes its slot, the
    2-row decode step has the same row table as before (slot 0, slot 1), so its replay is neither
    bound nor recorded again (the caches stay under their first capacity: no growth either)."""
    llm = load(2)
    try:
        engine = BatchEngine(llm, slots=2)
        first = engine.submit(BASE[0][:6], 3)
        second = engine.submit(BASE[1][:6], 14)
        while not first.finished:
            engine.step()
        replay = engine._clones[(2, 0, True)].static_module.session.pipeline.replay
        records = replay.records
        late = engine.submit(BASE[2][:6], 3)
        engine.run()
        assert late.slot is first.slot and late.slot.index == 0 and second.slot.index == 1
        assert second.tokens[:3] == llm.generate(BASE[1][:6], 3)[:3]
        assert replay.records == records
    finally:
        llm.runtime_manager.runtime.close_team()
