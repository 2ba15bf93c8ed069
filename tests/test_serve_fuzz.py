"""No request makes `mnnllm serve` answer 5xx: whatever a client sends is its fault, answered
with a 4xx in OpenAI's error shape (or served). The two findings of a reliability review: a body
nested 100,000 deep, and message content that is not valid Unicode ("\\ud800"); then a bounded,
seeded fuzz of both endpoints: hostile values (wrong types, invalid surrogates, huge numbers,
NaN and Infinity, deep nesting) in every field, and hostile raw bodies."""
from __future__ import annotations

import http.client
import json
import logging
import random
from urllib.parse import urlparse

import pytest

from serve_harness import LiveServer, load_model

FUZZ_REQUESTS = 240  # about a minute on two cores: most are refused at once, a few generate two tokens
ERROR_FIELDS = {"message", "type", "param", "code"}


@pytest.fixture(scope="module")
def server():
    with LiveServer(load_model(), default_max_tokens=2) as live:
        yield live


def _post(server, path: str, body: bytes) -> tuple[int, str, bytes]:
    url = urlparse(server.url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=120)
    connection.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    payload = response.read()
    connection.close()
    return response.status, response.getheader("content-type", ""), payload


def _assert_client_fault_or_served(status: int, kind: str, payload: bytes, what: str) -> None:
    assert status < 500, f"{what}: {status} {payload[:300]!r}"
    if status >= 400:
        error = json.loads(payload)["error"]
        assert set(error) == ERROR_FIELDS and error["type"] == "invalid_request_error" and error["message"], what
    elif kind.startswith("text/event-stream"):
        assert b"server_error" not in payload, f"{what}: {payload[:300]!r}"
    else:
        assert json.loads(payload)["choices"], what


# -- the findings ------------------------------------------------------------------------------
@pytest.mark.parametrize("opener, closer", [("[", "]"), ('{"a":', "}")], ids=["arrays", "objects"])
def test_a_body_nested_100000_deep_is_a_400(server, opener, closer):
    body = ('{"messages": ' + opener * 100_000 + "1" + closer * 100_000 + "}").encode()
    status, _, payload = _post(server, "/v1/chat/completions", body)
    error = json.loads(payload)["error"]
    assert status == 400 and error["code"] == "invalid_json" and "nested too deeply" in error["message"]


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "caf\ud800"}]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": "\udfff"}]}]}),
    ("/v1/completions", {"prompt": "\ud800"}),
], ids=["chat content", "chat text part", "completion prompt"])
def test_text_that_is_not_unicode_is_a_400_naming_the_field(server, path, body):
    status, _, payload = _post(server, path, json.dumps(body).encode())
    error = json.loads(payload)["error"]
    assert status == 400 and error["code"] == "invalid_value" and "not valid Unicode" in error["message"]
    assert error["param"] == ("messages" if "chat" in path else "prompt")


# -- the fuzz ----------------------------------------------------------------------------------
def _deep(depth: int, rng: random.Random):
    value = rng.choice([1, "x", None])
    for _ in range(depth):
        value = [value] if rng.random() < 0.5 else {"a": value}
    return value


def _hostile(rng: random.Random):
    """A value no field of the API expects, or one at the edge of what it takes."""
    return rng.choice([
        None, True, False, 0, -1, 1, 2, 10 ** 30, -10 ** 30, 2 ** 64, 1.5, -0.0, 1e308, "", "x", "\ud800",
        "\udcff\x00", "9" * 5000, "²", "١٢", "A" * 10_000, [], {}, [1, 2], ["a", "b"], [None], [{"type": "text"}],
        [{"type": "text", "text": 5}], [{"role": "user"}], {"include_usage": "yes"}, {"1": 1e9}, {"²": 1},
        {"9" * 5000: 1}, {"5": float("inf")}, [10 ** 30], [-1], list(range(3000)), ["x"] * 5,
        _deep(rng.randint(5, 900), rng)])


CHAT_FIELDS = ["model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p",
               "presence_penalty", "frequency_penalty", "repetition_penalty", "seed", "logit_bias", "stop", "stream",
               "stream_options", "n", "user", "response_format", "grammar", "json_schema", "logprobs", "top_logprobs",
               "tools", "tool_choice", "messages", "not_a_field"]
MESSAGE_FIELDS = ["role", "content", "name", "tool_calls", "tool_call_id", "extra"]


def _request(rng: random.Random) -> tuple[str, bytes]:
    chat = rng.random() < 0.6
    body = {"messages": [{"role": "user", "content": "Hi"}]} if chat else {"prompt": "Hi"}
    body["max_tokens"] = rng.randint(1, 2)
    if rng.random() < 0.3:  # the message or the prompt
        if chat:
            body["messages"][0][rng.choice(MESSAGE_FIELDS)] = _hostile(rng)
        else:
            body["prompt"] = _hostile(rng)
    for _ in range(rng.randint(0, 3)):
        body[rng.choice(CHAT_FIELDS[:-2] + ["prompt" if not chat else "messages", "not_a_field"])] = _hostile(rng)
    if rng.random() < 0.2:
        body = rng.choice([_hostile(rng), [body], _deep(rng.randint(1, 50), rng)])
    text = json.dumps(body, allow_nan=True)
    if rng.random() < 0.1:
        text = text.replace("1e+308", "1e999").replace("1.5", rng.choice(["NaN", "Infinity", "-Infinity", "1" * 5000]))
    raw = text.encode("utf-8", "surrogatepass")
    if rng.random() < 0.05:
        raw = rng.choice([raw[: rng.randint(0, len(raw))], raw + b"\xff\xfe", b"\x00" * 64, b"[" * 200_000])
    return ("/v1/chat/completions" if chat else "/v1/completions"), raw


def test_hostile_requests_never_get_a_5xx(server, caplog):
    caplog.set_level(logging.ERROR)
    rng = random.Random(29)
    statuses: dict[int, int] = {}
    for i in range(FUZZ_REQUESTS):
        path, body = _request(rng)
        status, kind, payload = _post(server, path, body)
        statuses[status] = statuses.get(status, 0) + 1
        _assert_client_fault_or_served(status, kind, payload, f"request {i} to {path}: {body[:200]!r}")
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], "the server logged a failure"
    assert statuses.get(400, 0) > FUZZ_REQUESTS // 2 and statuses.get(200, 0) > 0, statuses


@pytest.mark.parametrize("key", ["²", "١٢", "9" * 5000], ids=["superscript", "arabic digits", "5000 digits"])
def test_a_logit_bias_key_that_is_not_a_token_id_is_a_400(server, key):
    body = {"messages": [{"role": "user", "content": "Hi"}], "logit_bias": {key: 1}}
    status, _, payload = _post(server, "/v1/chat/completions", json.dumps(body).encode())
    assert status == 400 and json.loads(payload)["error"]["param"] == "logit_bias"
