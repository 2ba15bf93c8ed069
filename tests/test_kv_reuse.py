"""KV reuse across turns (MNN's `reuse_kv` / `prompt_cache`, kv_reuse.py) on every backend, the
static-shape ones included: a 4-turn chat with reuse gives the greedy tokens of a fresh prefill of
each whole prompt, prefills only the new turn, and leaves every layer's cache holding exactly the
history; with reuse off every prompt is prefilled whole; a conversation that forks drops exactly
the cached tokens past the common prefix."""
import subprocess
import sys

import numpy as np
import pytest

import mnnllm_core
from mnnllm_core.llm.prefix_cache import model_caches
from mnnllm_core.plugins.manager import registry
from paths import CONFIG

QUESTIONS = ["What is the capital of France?", "And of Italy?", "Name a river there.", "Thanks!"]
# (new tokens per reply, whether turns are chat-templated messages): lavapipe takes about a second
# per token, so the vulkan chat is raw text of a few tokens a turn
CHATS = {"cpu": (8, True), "opencl": (6, True), "vulkan": (2, False)}


def backend_param(name: str):
    available, reason = registry().get(name).is_available()
    return pytest.param(name, marks=pytest.mark.skipif(not available, reason=f"{name} unavailable: {reason}"))


BACKENDS = [backend_param(name) for name in CHATS]


def load(backend: str, **keys):
    llm = mnnllm_core.create(CONFIG)
    llm.set_config({"backend_type": backend, "sampler_type": "greedy", "thread_num": 2, **keys})
    return llm.load()


def cache_length(llm) -> int:
    """The number of tokens every layer's cache holds (the same in all of them)."""
    lengths = {c.length for c in model_caches(llm.module)}
    assert len(lengths) == 1, lengths
    return lengths.pop()


def record_prefills(llm) -> list[int]:
    """The length of every forward call with more than one token, in order."""
    seen: list[int] = []
    forward = llm.forward

    def recording(ids, *args, **kwargs):
        if len(ids) > 1:
            seen.append(len(ids))
        return forward(ids, *args, **kwargs)
    llm.forward = recording
    return seen


def chat(llm, new_tokens: int, templated: bool) -> tuple[list[list[int]], list[int]]:
    """A 4-turn conversation: each reply's tokens and each whole prompt's length. Templated, the
    turns are messages; else each prompt is the last one, its reply and a word of the next question."""
    messages, ids, replies, prompt_lengths = [], [], [], []
    for question in QUESTIONS:
        if templated:
            messages.append({"role": "user", "content": question})
            ids = llm.tokenizer_encode(llm.apply_chat_template(messages))
        else:
            ids = ids + (replies[-1] if replies else llm.tokenizer_encode("Tell me")) + \
                llm.tokenizer_encode(" " + question.split()[0])
        reply = llm.generate(ids, new_tokens)
        assert cache_length(llm) == len(llm.context.history_tokens)  # the cache holds exactly the history
        replies.append(reply)
        prompt_lengths.append(len(ids))
        text = llm.tokenizer_decode([t for t in reply if not llm.tokenizer.is_stop(t)])
        messages.append({"role": "assistant", "content": text})
    return replies, prompt_lengths


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_four_turn_chat_reuses_the_cache_and_gives_the_tokens_of_a_fresh_prefill(backend):
    new_tokens, templated = CHATS[backend]
    llm = load(backend)
    assert model_caches(llm.module), "no Attention with a KV cache found"
    prefills = record_prefills(llm)
    reused, lengths = chat(llm, new_tokens, templated)
    assert prefills[0] == lengths[0]
    assert all(p <= n - before for p, n, before in zip(prefills[1:], lengths[1:], lengths)), (prefills, lengths)

    llm.set_config({"reuse_kv": False})
    llm.reset()
    prefills.clear()
    fresh, fresh_lengths = chat(llm, new_tokens, templated)
    assert prefills == fresh_lengths == lengths  # reuse off: every prompt prefilled whole
    assert reused == fresh


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_forked_conversation_drops_exactly_the_cache_past_the_common_prefix(backend):
    llm = load(backend)
    llm.generate(llm.tokenizer_encode("The capital of France is"), 2)
    held = len(llm.context.history_tokens)
    ids = llm.tokenizer_encode("The capital of Spain is")
    common = llm.cached_prefix(ids)
    assert 0 < common < held
    new = llm._start(ids)
    assert len(new) == len(ids) - common
    reused = llm.forward(new)
    assert cache_length(llm) == len(ids)
    llm.reset()
    fresh = llm.forward(ids)
    np.testing.assert_allclose(reused, fresh, rtol=1e-3, atol=2e-3)
    assert reused.argmax() == fresh.argmax()


@pytest.mark.parametrize("keys,reuse", [({}, True), ({"reuse_kv": False}, False), ({"prompt_cache": False}, False),
                                        ({"reuse_kv": False, "prompt_cache": True}, True),
                                        ({"reuse_kv": True, "prompt_cache": False}, True)])
def test_reuse_follows_mnns_keys_and_is_on_when_neither_is_set(keys, reuse):
    from mnnllm_core.llm.config import LlmConfig
    from mnnllm_core.llm.kv_reuse import reuse_enabled
    assert reuse_enabled(LlmConfig(keys)) is reuse


def mnnllm_chat(*sets: str) -> list[str]:
    args = [arg for s in sets for arg in ("--set", s)]
    done = subprocess.run([sys.executable, "-m", "mnnllm_core.cli", "chat", str(CONFIG), "--set", "sampler_type=greedy",
                           "--max-new-tokens", "12", *args], capture_output=True, text=True,
                          input="\n".join(QUESTIONS) + "\n/exit\n", timeout=600)
    assert done.returncode == 0, done.stderr
    return [line.strip() for line in done.stdout.split("> ") if line.strip()]


def test_mnnllm_chat_answers_four_turns_the_same_with_and_without_reuse():
    with_reuse = mnnllm_chat("reuse_kv=true")
    assert len(with_reuse) == 4
    assert with_reuse == mnnllm_chat("reuse_kv=false")
