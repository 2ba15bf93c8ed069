"""Continuous batching (llm/batch_engine.py, batch_plan.py): sequences run together, each in its own
KV slot, give the tokens each gives run alone; the token budget chunks prompts behind decode rows;
queued requests take freed slots (the one sharing the longest prefix); each row samples with its
own sampler and seed; a cancel frees its slot at once.

Exactness: the shared model with its exported config (memory "low", and "normal", the fp32 path):
greedy tokens equal, token for token, those of `Llm.generate` run alone on the three reference
prompts (24 tokens each; 12 on the fp32 path),
although a batch's linears sum over several rows (float32 rounding may differ; the logits agree
to the last bits on these prompts, so the greedy choice does)."""
from __future__ import annotations

import json

import pytest

import mnnllm_core
from mnnllm_core.errors import ConfigError, ContextLengthError
from mnnllm_core.llm.batch_engine import BatchEngine, batch_refusal, kv_bytes_per_token
from mnnllm_core.llm.batch_plan import BATCH_SIZES, PAD_TOKEN, pad_decode, plan_step

from paths import CONFIG, REFERENCE, load_shared_greedy

TOKENS = 24
PROMPTS = [p["prompt_ids"] for p in json.loads(REFERENCE.read_text())["prompts"]]


@pytest.fixture(scope="module")
def llm():
    return load_shared_greedy()


@pytest.fixture(scope="module")
def alone(llm) -> list[list[int]]:
    return [llm.generate(p, TOKENS) for p in PROMPTS]


def test_the_reference_prompts_run_together_give_the_tokens_each_gives_alone(llm, alone) -> None:
    engine = BatchEngine(llm, slots=3, token_budget=16)  # 16 rows a step: the prompts prefill in chunks
    sequences = [engine.submit(p, TOKENS) for p in PROMPTS]
    engine.run()
    assert [s.tokens for s in sequences] == alone
    assert [s.finish_reason for s in sequences] == ["stop" if llm.tokenizer.is_stop(a[-1]) else "length"
                                                    for a in alone]
    assert engine.slots_in_use == 0 and engine.idle


def test_more_requests_than_slots_queue_and_a_repeated_prompt_reuses_its_slot_cache(llm, alone) -> None:
    engine = BatchEngine(llm, slots=2, token_budget=24)
    first = [engine.submit(p, TOKENS) for p in PROMPTS]
    engine.step()
    assert engine.slots_in_use == 2 and len(engine.waiting) == 1
    engine.run()
    again = engine.submit(PROMPTS[1], TOKENS)
    engine.run()
    assert [s.tokens for s in first] == alone
    assert again.tokens == alone[1]
    assert again.cached == len(PROMPTS[1]) - 1  # the slot held the prompt: only its last token ran


def test_each_row_samples_with_its_own_sampler_and_seed(llm) -> None:
    settings = [{"sampler_type": "temperature", "temperature": 0.9, "seed": seed} for seed in (3, 11)]
    alone = [llm.generate(PROMPTS[0], 12, llm.make_sampler(s)) for s in settings]
    engine = BatchEngine(llm, slots=3)
    greedy = engine.submit(PROMPTS[1], 12)
    sampled = [engine.submit(PROMPTS[0], 12, llm.make_sampler(s)) for s in settings]
    engine.run()
    assert [s.tokens for s in sampled] == alone
    assert greedy.tokens == llm.generate(PROMPTS[1], 12)


def test_a_cancel_frees_the_slot_for_the_next_request_at_once(llm, alone) -> None:
    engine = BatchEngine(llm, slots=1)
    doomed = engine.submit(PROMPTS[2], TOKENS)
    queued = engine.submit(PROMPTS[0], TOKENS)
    engine.step()
    engine.step()
    engine.cancel(doomed)
    engine.step()
    assert doomed.finish_reason == "cancelled" and queued.slot is not None
    engine.run()
    assert queued.tokens == alone[0]


def test_the_token_budget_runs_decode_rows_first_and_chunks_prompts_in_order() -> None:
    plan = plan_step([("a", 5), ("b", 6)], [("c", list(range(10))), ("d", [1, 2, 3])], token_budget=8)
    assert [(p.owner, len(p.tokens), p.logits) for p in plan.parts] == [("c", 6, False), ("a", 1, True),
                                                                        ("b", 1, True)]
    assert plan.rows == 8 and plan.logits_from == 6
    plan = plan_step([("a", 5)], [("c", [1, 2]), ("d", list(range(9)))], token_budget=8)
    assert [(p.owner, len(p.tokens), p.logits) for p in plan.parts] == [("d", 5, False), ("c", 2, True),
                                                                        ("a", 1, True)]
    assert plan.logits_from == 6  # c's last row, then a's
    assert plan_step([], [], 8) is None


def test_decode_rows_pad_to_the_smallest_size_holding_them_and_other_steps_run_as_planned() -> None:
    slot = "cab".index  # the owners' slots: c in 0, a in 1, b in 2
    three = plan_step([("a", 5), ("b", 6), ("c", 7)], [], token_budget=8)
    padded = pad_decode(three, BATCH_SIZES, slot)
    assert padded.sized and padded.rows == 4 and padded.padding == 1 and padded.logits_from == 0
    assert padded.tokens == [7, 5, 6, PAD_TOKEN]  # in slot order, then the padding
    assert [(p.owner, p.start, p.last_row) for p in padded.parts] == [("c", 0, 0), ("a", 1, 1), ("b", 2, 2)]
    assert pad_decode(plan_step([("a", 5), ("b", 6)], [], 8), BATCH_SIZES, slot).padding == 0  # a size already
    assert pad_decode(plan_step([("a", 5)], [], 8), BATCH_SIZES, slot) is None  # one stream runs unpadded
    assert pad_decode(plan_step([("a", 5), ("b", 6)], [("c", [1, 2])], 8), BATCH_SIZES, slot) is None  # a prompt
    assert pad_decode(three, (1, 2), slot) is None  # no size holds three rows
    assert pad_decode(three, (), slot) is None


def test_bad_settings_and_a_prompt_that_cannot_fit_are_typed_errors(llm) -> None:
    with pytest.raises(ConfigError, match="token_budget"):
        BatchEngine(llm, slots=4, token_budget=4)
    with pytest.raises(ConfigError, match="slots"):
        BatchEngine(llm, slots=0)
    for sizes in ((4, 2), (0, 1), (1.5,), (True,)):
        with pytest.raises(ConfigError, match="batch_sizes"):
            BatchEngine(llm, slots=2, batch_sizes=sizes)
    assert BatchEngine(llm, slots=2).batch_sizes == ()  # cpu: shapes are not static, nothing to pad
    with pytest.raises(ContextLengthError, match="max_all_tokens"):
        BatchEngine(llm, slots=1).submit([1] * llm.config.max_all_tokens, 4)


def test_the_shared_model_batches_on_cpu_and_says_its_kv_bytes(llm) -> None:
    assert batch_refusal(llm) is None
    assert kv_bytes_per_token(llm) == 30 * 2 * 3 * 64 * 4  # 30 layers, k and v, 3 kv heads of 64, fp32


def test_the_fp32_path_memory_normal_batches_exactly_too() -> None:
    llm = mnnllm_core.create(CONFIG)
    llm.set_config({"sampler_type": "greedy", "thread_num": 2, "memory": "normal"})
    llm.load()
    alone = [llm.generate(p, 12) for p in PROMPTS]
    engine = BatchEngine(llm, slots=3, token_budget=16)
    sequences = [engine.submit(p, 12) for p in PROMPTS]
    engine.run()
    assert [s.tokens for s in sequences] == alone


def test_one_stream_runs_in_the_llm_own_slot_as_the_one_sequence_step(llm, alone) -> None:
    engine = BatchEngine(llm, slots=2)
    sequence = engine.submit(PROMPTS[2], TOKENS)
    engine.run()
    assert sequence.slot.index == 0 and sequence.tokens == alone[2]
    assert not any(batched for _, _, batched in engine._clones)  # no batch table: the Llm's own step
    assert llm.conversation.history[:len(PROMPTS[2])] == PROMPTS[2]  # the slot is the Llm's conversation


def test_the_engine_reaches_the_llm_only_through_the_public_batch_host_protocol() -> None:
    import ast
    import inspect

    from mnnllm_core.llm import batch_engine
    from mnnllm_core.llm.batch_host import BatchHost
    from mnnllm_core.llm.llm import Llm

    def names_the_llm(node: ast.AST) -> bool:
        return (isinstance(node, ast.Name) and node.id == "llm") or (
            isinstance(node, ast.Attribute) and node.attr == "llm" and isinstance(node.value, ast.Name)
            and node.value.id == "self")

    used = {node.attr for node in ast.walk(ast.parse(inspect.getsource(batch_engine)))
            if isinstance(node, ast.Attribute) and names_the_llm(node.value)}
    protocol = set(BatchHost.__annotations__) | {n for n in vars(BatchHost) if not n.startswith("_")}
    assert used and used <= protocol, used - protocol
    assert all(hasattr(Llm, n) for n in protocol if n not in BatchHost.__annotations__)
