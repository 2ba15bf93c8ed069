"""The Llm engine on the shared model: greedy tokens equal MNN's (memory "normal") for the
reference prompts, streaming, multi-turn KV reuse, the module pool, and its limits."""
import json
import os

import numpy as np
import pytest

import mnnllm_core
from mnnllm_core.errors import BackendError, ConfigError, ContextLengthError, UnsupportedError
from mnnllm_core.llm.omni import Omni
from paths import CONFIG, REFERENCE, load_shared_greedy

PROMPTS = json.loads(REFERENCE.read_text())["prompts"]


@pytest.fixture(scope="module")
def llm():
    return load_shared_greedy()


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(PROMPTS)))
def test_greedy_64_tokens_equal_mnn_memory_normal(llm, index):
    prompt = PROMPTS[index]
    llm.reset()
    ids = llm.tokenizer_encode(llm.apply_chat_template(prompt["prompt"]))
    assert ids == prompt["prompt_ids"]
    assert llm.generate(ids, 64) == prompt["mnn_cpp_q4_memory_normal"]["gen_ids"]


def test_response_answers_and_stream_pieces_join_to_the_answer(llm):
    llm.reset()
    answer = llm.response("What is the capital of France?")
    assert answer == "The capital of France is Paris."
    llm.reset()
    assert "".join(llm.response("What is the capital of France?", stream=True)) == answer
    ctx = llm.context
    assert ctx.prompt_len == 37 and ctx.gen_seq_len == 8 and ctx.status == 1
    assert ctx.prefill_us > 0 and ctx.decode_us > 0 and ctx.sample_us > 0 and ctx.load_us > 0


def test_multi_turn_reuses_the_kv_cache_of_the_conversation(llm):
    llm.reset()
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    first = llm.response(messages)
    cached = len(llm.context.history_tokens)
    messages += [{"role": "assistant", "content": first}, {"role": "user", "content": "And of Italy?"}]
    full_ids = llm.tokenizer_encode(llm.apply_chat_template(messages))
    new_ids = llm._start(full_ids)
    assert len(new_ids) < len(full_ids) - cached + 3  # only the new turn is prefilled
    # the same conversation from scratch gives the same next-token logits
    reused = llm.forward(new_ids)
    llm.reset()
    fresh = llm.forward(full_ids)
    np.testing.assert_allclose(reused, fresh, rtol=1e-4, atol=1e-3)


def test_decode_logits_equal_a_fresh_prefill_of_the_same_tokens(llm):
    ids = PROMPTS[0]["prompt_ids"]
    llm.reset()
    llm.forward(ids)
    step = llm.forward([504])
    llm.reset()
    whole = llm.forward(ids + [504])
    np.testing.assert_allclose(step, whole, rtol=1e-4, atol=1e-3)


def test_module_pool_keys_by_seq_len_and_never_resizes_a_clone_twice(llm):
    llm.reset()
    llm.generate(PROMPTS[0]["prompt_ids"], 4)
    llm.reset()
    llm.generate(PROMPTS[0]["prompt_ids"], 4)
    counts = llm.pool.resize_counts()
    assert (1, False) in counts and (37, False) in counts
    assert counts[(1, False)] == 1 and counts[(37, False)] == 1


def test_prompt_longer_than_the_context_is_a_clear_error(llm):
    llm.set_config({"max_all_tokens": 16})
    try:
        llm.reset()
        with pytest.raises(ContextLengthError, match="max_all_tokens"):
            llm.generate(PROMPTS[0]["prompt_ids"], 4)
    finally:
        llm.set_config({"max_all_tokens": 2048})


def test_generation_stops_at_max_all_tokens(llm):
    llm.set_config({"max_all_tokens": 40})
    try:
        llm.reset()
        out = llm.generate(PROMPTS[1]["prompt_ids"], 64)  # 38 prompt tokens
        assert len(out) <= 40 - 38 + 1
    finally:
        llm.set_config({"max_all_tokens": 2048})


def test_embedding_reads_only_the_requested_rows(llm):
    embedding = llm.embedding
    before = embedding.bytes_read
    rows = embedding.embedding([1, 9690, 198])
    assert rows.shape == (3, 1, 576)
    per_row = embedding.row_bytes + embedding.alpha_row_bytes
    assert embedding.bytes_read - before == 3 * per_row == 3 * (288 + 36)
    assert embedding.file.size > 1000 * per_row


def test_sampler_config_takes_effect_through_set_config(llm):
    llm.set_config({"sampler_type": "mixed", "seed": 7, "temperature": 0.8})
    try:
        llm.reset()
        a = llm.generate(PROMPTS[1]["prompt_ids"], 8)
        llm.set_config({"seed": 7})
        llm.reset()
        b = llm.generate(PROMPTS[1]["prompt_ids"], 8)
        assert a == b
    finally:
        llm.set_config({"sampler_type": "greedy"})


def test_tokenizer_round_trip_through_the_api(llm):
    ids = llm.tokenizer_encode("Hello, world!")
    assert llm.tokenizer_decode(ids) == "Hello, world!"
    assert llm.tokenizer_decode(ids[0]) == "Hello"


def test_visual_config_routes_to_omni_with_a_clear_error(tmp_path):
    """Omni loads visual.mnn beside the LLM: a visual config without one names the missing file."""
    config = json.loads(CONFIG.read_text())
    config.update({"is_visual": True, "base_dir": str(CONFIG.parent) + "/"})
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    model = mnnllm_core.create(path)
    assert isinstance(model, Omni)
    with pytest.raises(ConfigError, match="visual_model.*visual.mnn"):
        model.load()


@pytest.mark.parametrize("key", ["is_audio", "has_talker"])
def test_audio_and_talker_configs_name_what_is_missing(tmp_path, key):
    config = json.loads(CONFIG.read_text())
    config.update({key: True, "base_dir": str(CONFIG.parent) + "/"})
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    model = mnnllm_core.create(path)
    assert isinstance(model, Omni)
    with pytest.raises(UnsupportedError, match=key) as err:
        model.load()
    assert err.value.field == key


def test_unknown_backend_is_a_clear_error_listing_the_available_ones():
    model = mnnllm_core.create(CONFIG)
    model.set_config({"backend_type": "tpu9000"})
    with pytest.raises(BackendError, match="tpu9000.*cpu"):
        model.load()


def test_set_config_after_load_reaches_the_prompt(llm):
    llm.set_config({"system_prompt": "You are terse."})
    try:
        text = llm.apply_chat_template("Hi")
    finally:
        llm.set_config({"system_prompt": ""})
    assert "You are terse." in text


def test_an_empty_prompt_is_a_clear_error(llm):
    from mnnllm_core.errors import MnnllmError
    with pytest.raises(MnnllmError, match="no tokens"):
        llm.generate([], 4)
    with pytest.raises(MnnllmError, match="at least one token"):
        llm.forward([])


def test_a_per_call_sampler_leaves_the_model_sampler_and_config_alone(llm):
    prompt = PROMPTS[0]
    reference = prompt["mnn_cpp_q4_memory_normal"]["gen_ids"]
    banning_first = llm.make_sampler({"banned_tokens": [reference[0]]})
    llm.reset()
    assert llm.generate(prompt["prompt_ids"], 2, sampler=banning_first)[0] != reference[0]
    assert "banned_tokens" not in llm.config and llm.sampler.config.banned_tokens == ()
    llm.reset()
    assert llm.generate(prompt["prompt_ids"], 16) == reference


def test_closing_a_stream_early_leaves_history_and_kv_cache_in_step(llm):
    first, second = PROMPTS[1], PROMPTS[0]
    llm.reset()
    stream = llm.stream_ids(first["prompt_ids"], 32)
    for _ in range(3):
        next(stream)
    stream.close()  # a cancelled request: the third token was sampled but never run
    assert llm.kv_meta.previous == len(llm.context.history_tokens) == len(first["prompt_ids"]) + 2
    shared = len(os.path.commonprefix([first["prompt_ids"], second["prompt_ids"]]))
    assert shared > 10  # the system prompt
    assert llm.cached_prefix(second["prompt_ids"]) == shared
    assert llm.generate(second["prompt_ids"], 16) == second["mnn_cpp_q4_memory_normal"]["gen_ids"]


def test_cached_prefix_always_leaves_the_last_prompt_token_to_run(llm):
    prompt = PROMPTS[0]["prompt_ids"]
    llm.reset()
    llm.generate(prompt, 2)
    assert llm.cached_prefix(prompt) == len(prompt) - 1
    assert llm.cached_prefix(prompt[:5]) == 4
    assert llm.cached_prefix([prompt[0] + 1] + prompt[1:]) == 0


def test_reset_also_drops_a_pending_kv_removal(llm):
    first, second = PROMPTS[1], PROMPTS[0]
    llm.reset()
    llm.generate(first["prompt_ids"], 2)
    llm._start(second["prompt_ids"])  # trims the history to the shared prefix; the KV drop is pending
    llm.reset()
    assert llm.kv_meta.remove == llm.kv_meta.previous
    assert llm.generate(second["prompt_ids"], 16) == second["mnn_cpp_q4_memory_normal"]["gen_ids"]
