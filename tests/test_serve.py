"""`mnnllm serve` live on 127.0.0.1, driven by the official `openai` client: greedy answers
equal reference.json's tokens (mnn_cpp_q4_memory_normal), streamed and whole; stop sequences;
usage and the KV cache reused across turns; OpenAI's error shapes; a cancelled request frees
the model at once; a full queue answers 503; the same answers on the opencl and vulkan backends."""
import http.client
import json
import logging
import re
import threading
import time
from urllib.parse import urlparse

import openai
import pytest

from mnnllm_core.errors import ConfigError
from mnnllm_core.plugins.manager import registry
from paths import REFERENCE
from serve_harness import LiveServer, load_model

PROMPTS = json.loads(REFERENCE.read_text())["prompts"]
EOS = 2
NO_EOS = {"logit_bias": {str(EOS): -100}}  # an answer that runs until its budget or its cancellation


@pytest.fixture(scope="module")
def llm():
    return load_model()  # the model's own sampler (mixed, temperature 0.8): requests choose greedy


@pytest.fixture(scope="module")
def server(llm):
    with LiveServer(llm, queue_size=1) as live:
        yield live


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)


def _user(index):
    return [{"role": "user", "content": PROMPTS[index]["prompt"]}]


def _reference_text(llm, index, count=None):
    ids = PROMPTS[index]["mnn_cpp_q4_memory_normal"]["gen_ids"][:count]
    return llm.tokenizer.decode([t for t in ids if t != EOS])


def _raw(server, method, path, body=None, headers=None):
    url = urlparse(server.url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=300)
    connection.request(method, path, body=body, headers=headers or {})
    response = connection.getresponse()
    payload = response.read()
    connection.close()
    return response.status, json.loads(payload)


def _health(server):
    return _raw(server, "GET", "/health")[1]


def _wait_for(condition, timeout=120):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_models_lists_the_one_model(client, server):
    models = client.models.list().data
    assert [m.id for m in models] == ["smollm2-135m-instruct-mnn-q4"]
    assert client.models.retrieve(models[0].id).id == models[0].id
    status, body = _raw(server, "GET", "/v1/models/another")
    assert status == 404 and body["error"]["code"] == "model_not_found"
    assert _health(server)["status"] == "ok"


def test_greedy_chat_answers_with_the_reference_tokens(client, llm):
    reference = PROMPTS[0]
    answer = client.chat.completions.create(model="any", messages=_user(0), temperature=0, max_tokens=64)
    assert answer.choices[0].message.content == _reference_text(llm, 0)
    assert answer.choices[0].message.role == "assistant" and answer.choices[0].finish_reason == "stop"
    gen = reference["mnn_cpp_q4_memory_normal"]["gen_ids"]
    assert answer.usage.prompt_tokens == len(reference["prompt_ids"])
    assert answer.usage.completion_tokens == len(gen)  # the stop token counts, as MNN counts it
    assert answer.usage.total_tokens == len(reference["prompt_ids"]) + len(gen)
    assert answer.object == "chat.completion" and answer.id.startswith("chatcmpl-")


def test_streamed_greedy_chat_answers_with_the_reference_tokens(client, llm):
    reference = PROMPTS[2]
    gen = reference["mnn_cpp_q4_memory_normal"]["gen_ids"]
    assert EOS not in gen  # the reference ran out of budget: finish "length"
    chunks = list(client.chat.completions.create(model="any", messages=_user(2), temperature=0, max_tokens=len(gen),
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(pieces) > 10 and "".join(pieces) == _reference_text(llm, 2)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(gen)
    assert chunks[-1].usage.prompt_tokens == len(reference["prompt_ids"])


def test_completions_take_the_prompt_as_given(client, llm):
    templated = llm.apply_chat_template(PROMPTS[0]["prompt"])
    for prompt in (templated, PROMPTS[0]["prompt_ids"]):
        answer = client.completions.create(model="any", prompt=prompt, temperature=0, max_tokens=5)
        assert answer.choices[0].text == _reference_text(llm, 0, 5)
        assert answer.choices[0].finish_reason == "length" and answer.usage.completion_tokens == 5
        assert answer.usage.prompt_tokens == len(PROMPTS[0]["prompt_ids"])
    streamed = client.completions.create(model="any", prompt=templated, temperature=0, max_tokens=5, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == _reference_text(llm, 0, 5)


def test_stop_sequences_end_the_answer_before_them(client):
    whole = client.chat.completions.create(model="any", messages=_user(0), temperature=0, stop="Paris")
    assert whole.choices[0].message.content == "The capital of France is "
    assert whole.choices[0].finish_reason == "stop" and whole.usage.completion_tokens == 6
    # " of Fr" spans two tokens (" of", " France"): no part of it may be streamed
    chunks = list(client.chat.completions.create(model="any", messages=_user(0), temperature=0,
                                                 stop=["zzz", " of Fr"], stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "The capital"
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_sampling_fields_reach_the_sampler(client, llm):
    def ask(**fields):
        return client.chat.completions.create(model="any", messages=_user(0), max_tokens=8,
                                              **fields).choices[0].message.content
    assert ask(temperature=1.5, extra_body={"top_k": 1}) == _reference_text(llm, 0)  # top-1 of any softmax
    assert ask(temperature=1.0, seed=11) == ask(temperature=1.0, seed=11)
    unstoppable = client.chat.completions.create(model="any", messages=_user(0), temperature=0, max_tokens=12,
                                                 **NO_EOS)
    assert unstoppable.choices[0].message.content.startswith(_reference_text(llm, 0))
    assert unstoppable.choices[0].finish_reason == "length" and unstoppable.usage.completion_tokens == 12


def test_a_follow_up_turn_reuses_the_kv_cache_and_answers_as_a_fresh_prefill(client, llm, caplog):
    caplog.set_level(logging.INFO, logger="mnnllm_core.serve")
    reference = PROMPTS[0]
    first = client.chat.completions.create(model="any", messages=_user(0), temperature=0)
    conversation = _user(0) + [{"role": "assistant", "content": first.choices[0].message.content},
                               {"role": "user", "content": "And of Italy?"}]
    follow_up = client.chat.completions.create(model="any", messages=conversation, temperature=0, max_tokens=12)
    # the cache holds the first prompt and the answer (all but its stop token, never run)
    kept = reference["prompt_ids"] + reference["mnn_cpp_q4_memory_normal"]["gen_ids"][:-1]
    ids = llm.tokenizer_encode(llm.apply_chat_template(conversation))
    assert ids[:len(kept)] == kept and follow_up.usage.prompt_tokens == len(ids)
    assert follow_up.usage.prompt_tokens_details.cached_tokens == len(kept)
    assert any(f"{len(kept)} from the KV cache" in r.getMessage() and follow_up.id in r.getMessage()
               for r in caplog.records)
    client.completions.create(model="any", prompt="Hi", max_tokens=1)  # another conversation: no common prefix
    fresh = client.chat.completions.create(model="any", messages=conversation, temperature=0, max_tokens=12)
    assert fresh.usage.prompt_tokens_details.cached_tokens == 0
    assert fresh.choices[0].message.content == follow_up.choices[0].message.content


CHAT = {"messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("body, status, param, code", [
    (b"{not json", 400, None, "invalid_json"),
    (json.dumps({**CHAT, "max_tokens": "5"}), 400, "max_tokens", "invalid_type"),
    (json.dumps({**CHAT, "temperature": 3}), 400, "temperature", "invalid_value"),
    (json.dumps({**CHAT, "best_of": 2}), 400, "best_of", "unknown_parameter"),
    (json.dumps({"messages": [{"role": "user", "content": 5}]}), 400, "messages[0].content", "invalid_type"),
    (json.dumps({"model": "x"}), 400, "messages", "missing_required_parameter"),
    (json.dumps({"messages": [{"role": "user", "content": "word " * 3000}]}), 400, "messages",
     "context_length_exceeded"),
    (json.dumps({**CHAT, "max_tokens": 100000}), 400, "max_tokens", "invalid_value"),
    (json.dumps({**CHAT, "max_tokens": 2040}), 400, "max_tokens", "context_length_exceeded"),
    (json.dumps({**CHAT, "logit_bias": {"99999999": 1}}), 400, "logit_bias", "invalid_value"),
    (b"x" * ((1 << 20) + 1024), 413, None, "request_too_large"),
])
def test_bad_requests_get_openai_error_shapes(server, body, status, param, code):
    got, answer = _raw(server, "POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    assert got == status
    assert set(answer["error"]) == {"message", "type", "param", "code"} and answer["error"]["message"]
    assert (answer["error"]["type"], answer["error"]["param"], answer["error"]["code"]) == (
        "invalid_request_error", param, code)


def test_unknown_routes_and_methods_get_openai_error_shapes(server, client):
    assert _raw(server, "GET", "/v1/nothing")[0] == 404
    status, answer = _raw(server, "GET", "/v1/chat/completions")
    assert status == 405 and answer["error"]["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="any", messages=_user(0), max_tokens=100000)
    assert caught.value.status_code == 400 and caught.value.code == "invalid_value"


def test_a_cancelled_stream_frees_the_model_at_once_and_a_full_queue_answers_503(server, client, llm, caplog):
    caplog.set_level(logging.INFO, logger="mnnllm_core.serve")
    before = _health(server)
    long_answer = client.chat.completions.create(model="any", messages=_user(1), temperature=0, max_tokens=1900,
                                                 stream=True, extra_body=NO_EOS)
    chunks = iter(long_answer)
    next(chunks), next(chunks)  # it runs
    waiting = {}
    queued = threading.Thread(target=lambda: waiting.setdefault("answer", client.chat.completions.create(
        model="any", messages=_user(0), temperature=0, max_tokens=16)))
    queued.start()
    _wait_for(lambda: _health(server)["waiting"] == 1)
    with pytest.raises(openai.APIStatusError) as refused:  # queue size 1: one waits, the next is refused
        client.chat.completions.create(model="any", messages=_user(0), max_tokens=1)
    assert refused.value.status_code == 503 and refused.value.body["code"] == "queue_full"
    assert refused.value.response.headers["retry-after"] == "1"
    long_answer.close()  # the client goes away mid-stream
    queued.join(300)
    # served at once (the long answer had 1900 tokens to go) on a consistent engine: the reference answer
    assert waiting["answer"].choices[0].message.content == _reference_text(llm, 0)
    after = _health(server)
    assert after["cancelled"] == before["cancelled"] + 1 and after["rejected"] == before["rejected"] + 1
    cancelled = [r.getMessage() for r in caplog.records if "cancelled (client gone)" in r.getMessage()]
    assert len(cancelled) == 1
    assert int(re.search(r"(\d+) completion tokens", cancelled[0]).group(1)) < 200


def test_a_client_that_gives_up_on_a_whole_answer_cancels_it(server, client, llm):
    before = _health(server)["cancelled"]
    impatient = client.with_options(timeout=3)
    with pytest.raises(openai.APITimeoutError):
        impatient.chat.completions.create(model="any", messages=_user(1), temperature=0, max_tokens=1900,
                                          extra_body=NO_EOS)
    _wait_for(lambda: _health(server)["cancelled"] == before + 1 and not _health(server)["busy"])
    answer = client.chat.completions.create(model="any", messages=_user(0), temperature=0)
    assert answer.choices[0].message.content == _reference_text(llm, 0)


def test_a_conversation_the_chat_template_refuses_is_a_bad_request(server, llm, monkeypatch):
    def refuse(messages, tools=None):
        raise ConfigError("chat template failed: TemplateError: roles must alternate", field="jinja")
    monkeypatch.setattr(llm, "apply_chat_template", refuse)
    status, answer = _raw(server, "POST", "/v1/chat/completions", json.dumps(CHAT))
    assert status == 400 and answer["error"]["param"] == "messages" and "alternate" in answer["error"]["message"]


@pytest.mark.parametrize("backend", ["opencl", "vulkan"])
def test_the_server_answers_on_the_other_backends_too(backend, llm):
    available, reason = registry().get(backend).is_available()
    if not available:
        pytest.skip(f"{backend} unavailable: {reason}")
    with LiveServer(load_model(backend_type=backend)) as other:
        client = openai.OpenAI(base_url=other.url + "/v1", api_key="unused", max_retries=0, timeout=300)
        assert client.models.list().data[0].model_dump()["backend"] == backend
        answer = client.chat.completions.create(model="any", messages=_user(0), temperature=0, max_tokens=8)
        assert answer.choices[0].message.content == _reference_text(llm, 0)
