"""Generation strategies: lookahead (n-gram speculative) decoding is exact under greedy (the n-gram
cache and the other strategies: test_speculative.py)."""
import json

import numpy as np
import pytest

import mnnllm_core
from mnnllm_core.errors import ConfigError
from mnnllm_core.llm.generation import ARGeneration, LookaheadGeneration, create_generation
from paths import CONFIG, REFERENCE

PROMPTS = json.loads(REFERENCE.read_text())["prompts"]


@pytest.fixture(scope="module")
def lookahead():
    llm = mnnllm_core.create(CONFIG)
    llm.set_config({"sampler_type": "greedy", "thread_num": 2, "speculative_type": "lookahead"})
    return llm.load()


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(PROMPTS)))
def test_lookahead_gives_exactly_the_greedy_tokens(lookahead, index):
    prompt = PROMPTS[index]
    assert isinstance(lookahead.generation, LookaheadGeneration)
    lookahead.reset()
    assert lookahead.generate(prompt["prompt_ids"], 64) == prompt["mnn_cpp_q4_memory_normal"]["gen_ids"]
    history, meta = lookahead.context.history_tokens, lookahead.kv_meta
    assert meta.previous - meta.remove == len(history)  # rejected guesses leave the KV cache


def test_lookahead_accepts_guesses_on_repetitive_text(lookahead):
    """The answer repeats itself: with MNN's ngram_update its own n-grams become guesses
    (without it, as in MNN, only the history before the answer and lookup_file are searched)."""
    lookahead.set_config({"ngram_update": True, "draft_adaptive": False})  # every step drafts
    try:
        lookahead.reset()
        before = lookahead.generation.accepted
        lookahead.generate(PROMPTS[1]["prompt_ids"], 48)
        assert lookahead.generation.accepted > before
    finally:
        lookahead.set_config({"ngram_update": False, "draft_adaptive": True})


def test_lookahead_respects_max_new_tokens_and_the_cache_stays_consistent(lookahead):
    for budget in (1, 2, 5, 13):
        lookahead.reset()
        out = lookahead.generate(PROMPTS[2]["prompt_ids"], budget)
        assert out == PROMPTS[2]["mnn_cpp_q4_memory_normal"]["gen_ids"][:budget]
        meta = lookahead.kv_meta
        assert meta.previous - meta.remove == len(lookahead.context.history_tokens)
    # feeding the last token continues from a consistent cache: same logits as a fresh prefill
    follow = lookahead.forward([out[-1]])
    lookahead.reset()
    fresh = lookahead.forward(PROMPTS[2]["prompt_ids"] + out)
    np.testing.assert_allclose(follow, fresh, rtol=1e-4, atol=1e-3)


def test_lookahead_without_greedy_falls_back_to_token_by_token():
    llm = mnnllm_core.create(CONFIG)
    llm.set_config({"speculative_type": "lookahead", "sampler_type": "mixed"})
    llm.load()
    assert isinstance(llm.generation, ARGeneration)


def test_unknown_speculative_type_is_a_config_error():
    llm = mnnllm_core.create(CONFIG)
    llm.set_config({"speculative_type": "telepathy"})
    with pytest.raises(ConfigError, match="speculative_type"):
        llm.load()


def test_lookahead_takes_a_per_call_sampler_only_when_it_is_plain_greedy(lookahead):
    assert isinstance(create_generation(lookahead, lookahead.make_sampler({})), LookaheadGeneration)
    banning_eos = lookahead.make_sampler({"banned_tokens": [2]})
    assert isinstance(create_generation(lookahead, banning_eos), ARGeneration)
    reference = PROMPTS[0]["mnn_cpp_q4_memory_normal"]["gen_ids"]
    assert reference[-1] == 2
    lookahead.reset()
    out = lookahead.generate(PROMPTS[0]["prompt_ids"], len(reference) + 1, sampler=banning_eos)
    assert out[:-2] == reference[:-1] and 2 not in out
