"""Continuous batching (llm/batch_engine.py) with the cpu's int8-activation linears (hint
`cpu_int8_activations`, ops/int8_linear.py): each stream's rows give the bits they give with the
stream decoded alone, since each row is quantized by one rule whatever the rows beside it (a
decode row beside a prompt chunk, a prompt chunk of a few rows, a whole prompt alone).

Streams: the three reference prompts and two bench-like prompts (batch_bench.py's), 16 tokens
each, with a token budget that chunks the prompts (16 rows) and one that does not (64). Each
sampled row's logits equal, bit for bit, those of the same stream alone (`Llm.forward` of the
prompt, then of each token), so the greedy tokens do too; on 1 thread and on 2 (the replay's
thread team splits each int8 linear's rows).
"""
from __future__ import annotations

import json

import numpy as np
import pytest

import mnnllm_core
from mnnllm_core.llm.batch_engine import BatchEngine

from paths import CONFIG, REFERENCE

numba = pytest.importorskip("numba")

TOKENS = 16
PROMPTS = [p["prompt_ids"] for p in json.loads(REFERENCE.read_text())["prompts"]]
PROMPTS += [[1] + [(1000 + 997 * s + 31 * i) % 49000 + 50 for i in range(15)] for s in range(2)]


def _int8_supported() -> bool:
    from mnnllm_backends.cpu.kernels import int8_dot
    return int8_dot.supported()


pytestmark = pytest.mark.skipif(not _int8_supported(), reason="no AVX512-VNNI on this cpu")


@pytest.fixture(scope="module", params=[1, 2], ids=["1 thread", "2 threads"])
def llm(request):
    llm = mnnllm_core.create(str(CONFIG))
    llm.set_config({"sampler_type": "greedy", "thread_num": request.param, "memory": "low",
                    "backend_hints": {"cpu_int8_activations": True}})
    return llm.load()


@pytest.fixture(scope="module")
def alone(llm) -> list[tuple[list[int], list[np.ndarray]]]:
    """Each prompt alone: (greedy tokens, the logits each was taken from)."""
    runs = []
    for prompt in PROMPTS:
        llm.reset()
        logits = [llm.forward(prompt).reshape(-1).copy()]
        tokens = [int(np.argmax(logits[0]))]
        while len(tokens) < TOKENS:
            logits.append(llm.forward([tokens[-1]]).reshape(-1).copy())
            tokens.append(int(np.argmax(logits[-1])))
        runs.append((tokens, logits))
    return runs


@pytest.mark.parametrize("budget", [16, 64])
def test_streams_together_give_each_rows_bits_alone(llm, alone, budget) -> None:
    llm.reset()
    engine = BatchEngine(llm, slots=len(PROMPTS), token_budget=budget)
    sampled = {}
    forward = engine._forward

    def recorded(plan):
        logits = forward(plan)
        for part in plan.parts:
            if part.logits:
                sampled.setdefault(part.owner.id, []).append(logits[part.last_row - plan.logits_from].copy())
        return logits

    engine._forward = recorded
    sequences = [engine.submit(p, TOKENS) for p in PROMPTS]
    engine.run()
    for index, (sequence, (tokens, logits)) in enumerate(zip(sequences, alone)):
        steps = sampled[sequence.id][:len(sequence.tokens)]
        for step, (together, single) in enumerate(zip(steps, logits)):
            np.testing.assert_array_equal(together, single, err_msg=f"prompt {index}, token {step}")
        assert sequence.tokens == tokens[:len(sequence.tokens)], index
        assert len(sequence.tokens) == TOKENS or llm.tokenizer.is_stop(sequence.tokens[-1])
