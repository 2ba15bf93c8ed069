"""The conversation's state cannot go stale: the history owns the KV cache's length (checked
after every step), resets really forget, and a second user of one Llm (a thread, or a second
live stream) gets ConcurrentUseError while the state stays right for the next answer."""
from __future__ import annotations

import threading

import pytest

from mnnllm_core.core.kv_meta import KVMeta
from mnnllm_core.errors import ConcurrentUseError, ContextLengthError, KVStateError
from mnnllm_core.llm.context import CONTEXT_FULL, FINISHED, MAX_TOKENS
from mnnllm_backends.cpu.ops.attention import AttentionExecution
from paths import load_shared_greedy

QUESTION, ANSWER = "What is the capital of France?", "The capital of France is Paris."
OTHER = "Tell me about cats."


@pytest.fixture(scope="module")
def llm():
    return load_shared_greedy()


def consistent(llm) -> bool:
    return llm.kv_meta.previous - llm.kv_meta.remove == len(llm.context.history_tokens) or \
        len(llm.context.history_tokens) == 0


def ids_of(llm, text: str) -> list[int]:
    return llm.tokenizer_encode(llm.apply_chat_template(text))


def test_two_resets_forget_the_conversation(llm):
    llm.reset()
    llm.response(OTHER, max_new_tokens=12)
    llm.reset()
    llm.reset()
    assert llm.response(QUESTION, max_new_tokens=12) == ANSWER


def test_a_failed_request_then_a_reset_forgets_the_conversation(llm):
    llm.reset()
    llm.response(OTHER, max_new_tokens=12)
    with pytest.raises(ContextLengthError):
        llm.generate(list(range(10, 10 + llm.config.max_all_tokens + 1)), 4)
    llm.reset()
    assert llm.response(QUESTION, max_new_tokens=12) == ANSWER


def test_a_second_stream_supersedes_the_first_which_then_refuses_to_continue(llm):
    llm.reset()
    first = llm.stream_ids(ids_of(llm, QUESTION), 8)
    next(first)
    second = llm.response(OTHER, stream=True, max_new_tokens=4)
    next(second)
    with pytest.raises(ConcurrentUseError, match="superseded"):
        next(first)
    assert "".join(second)  # the newer stream goes on
    assert consistent(llm)
    llm.reset()
    assert llm.response(QUESTION) == ANSWER


@pytest.mark.parametrize("change", ["reset", "forward"])
def test_a_stream_resumed_after_the_conversation_changed_is_refused(llm, change):
    llm.reset()
    stream = llm.stream_ids(ids_of(llm, QUESTION), 8)
    next(stream)
    if change == "reset":
        llm.reset()
    else:
        llm.forward([42])
    with pytest.raises(ConcurrentUseError):
        next(stream)
    llm.reset()
    assert llm.response(QUESTION) == ANSWER


def test_another_thread_inside_a_step_makes_every_state_change_an_error(llm, monkeypatch):
    llm.reset()
    inside, release = threading.Event(), threading.Event()
    original, original_before_run = AttentionExecution.on_execute, AttentionExecution.before_run

    def hold() -> None:
        if threading.current_thread().name == "holder" and not inside.is_set():
            inside.set()
            release.wait(60)

    def held(self, inputs, outputs):
        hold()
        return original(self, inputs, outputs)

    def held_before_run(self):  # a replayed step (cpu) keeps the KV books here, not in on_execute
        hold()
        return original_before_run(self)

    monkeypatch.setattr(AttentionExecution, "on_execute", held)
    monkeypatch.setattr(AttentionExecution, "before_run", held_before_run)
    answers = []
    holder = threading.Thread(target=lambda: answers.append(llm.response(QUESTION)), name="holder")
    holder.start()
    try:
        assert inside.wait(60)
        for call in (llm.reset, lambda: llm.forward([42]), lambda: llm.generate(ids_of(llm, OTHER), 2)):
            with pytest.raises(ConcurrentUseError, match="another thread"):
                call()
    finally:
        release.set()
        holder.join(120)
    assert answers == [ANSWER]
    assert consistent(llm)


def test_two_threads_racing_on_one_llm_never_corrupt_it(llm):
    llm.reset()
    outcomes: list = []

    def ask(text):
        try:
            outcomes.append(llm.response(text, max_new_tokens=6))
        except ConcurrentUseError as err:
            outcomes.append(err)

    threads = [threading.Thread(target=ask, args=(text,)) for text in (QUESTION, OTHER, QUESTION, OTHER)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert len(outcomes) == 4 and all(isinstance(o, (str, ConcurrentUseError)) for o in outcomes)
    assert consistent(llm)
    llm.reset()
    assert llm.response(QUESTION) == ANSWER


def test_a_kv_cache_that_disagrees_with_the_history_is_an_error_and_forgets(llm, monkeypatch):
    llm.reset()
    original = KVMeta.sync

    def off_by_one(self):
        original(self)
        self.previous += 1

    with monkeypatch.context() as patch:
        patch.setattr(KVMeta, "sync", off_by_one)
        with pytest.raises(KVStateError, match="conversation was reset"):
            llm.generate(ids_of(llm, QUESTION), 2)
    assert llm.context.history_tokens == []
    assert llm.response(QUESTION) == ANSWER


@pytest.mark.parametrize("max_all_tokens, max_new_tokens, status, count", [
    (40, 20, CONTEXT_FULL, 3),  # the 37-token prompt leaves room for 3: the context ends the reply
    (400, 3, MAX_TOKENS, 3),
    (400, 20, FINISHED, 8)])
def test_how_a_reply_ended_is_told_apart(llm, max_all_tokens, max_new_tokens, status, count):
    saved = llm.config.max_all_tokens
    llm.set_config({"max_all_tokens": max_all_tokens})
    try:
        llm.reset()
        tokens = llm.generate(ids_of(llm, QUESTION), max_new_tokens)
        assert (llm.context.status, len(tokens)) == (status, count)
    finally:
        llm.set_config({"max_all_tokens": saved})
