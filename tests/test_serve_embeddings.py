"""`mnnllm serve` on an embedding model (a tiny random BertModel exported as test_embedding_model.py
builds it), driven by the official `openai` client: /v1/embeddings equals `txt_embedding` exactly
(the same ids through the same forward), in float and base64; lists keep their order; token ids
embed as given; usage counts the tokens; bad input is a 400 naming its param; the chat endpoints
refuse an embedding model and /v1/embeddings a chat model (404 on `model`); the queue and the
cancellation of a gone client work as for chat; `mnnllm serve` finds an embedding model by itself."""
from __future__ import annotations

import base64
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from urllib.parse import urlparse

import numpy as np
import openai
import pytest

import mnnllm_core
from mnnllm_core.export.exporter import export_model
from mnnllm_core.llm.model_kind import is_embedding_model
from mnnllm_core.serve.embeddings import MAX_INPUTS
from paths import CONFIG
from serve_harness import LiveServer, load_model
from test_embedding_model import BLOCK, MAX_POSITIONS, TEXTS, build_bert, hf_ids

DIM = 64


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve-embedding")
    build_bert(root / "hf")
    export_model(str(root / "hf"), str(root / "tiny-bert"), quant_bit=16, quant_block=BLOCK)
    return root


@pytest.fixture(scope="module")
def model(folder):
    embedder = mnnllm_core.create(folder / "tiny-bert", embedding_model=True)
    embedder.set_config({"thread_num": 2})
    return embedder.load()


@pytest.fixture(scope="module")
def server(model):
    with LiveServer(model, queue_size=1) as live:
        yield live


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _expected(model, text: str) -> np.ndarray:
    return model.txt_embedding(text)[0]


def _post(server, path: str, body: dict) -> tuple[int, dict]:
    url = urlparse(server.url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=120)
    connection.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    payload = json.loads(response.read())
    connection.close()
    return response.status, payload


def test_models_lists_the_one_model(client):
    assert [m.id for m in client.models.list().data] == ["tiny-bert"]


def test_a_text_embeds_as_txt_embedding_does_in_float_and_base64(client, model, folder):
    text = TEXTS[1]
    floats = client.embeddings.create(model="any-name", input=text, encoding_format="float")
    assert floats.object == "list" and floats.model == "tiny-bert" and len(floats.data) == 1
    assert floats.data[0].object == "embedding" and floats.data[0].index == 0
    got = np.array(floats.data[0].embedding, np.float32)
    np.testing.assert_array_equal(got, _expected(model, text))  # exact: the same ids through the same forward
    ids = model.text_ids(text)
    assert ids == hf_ids(folder / "hf", text)
    assert floats.usage.prompt_tokens == floats.usage.total_tokens == len(ids)
    decoded = client.embeddings.create(model="any-name", input=text)  # the client asks base64 and decodes it
    np.testing.assert_array_equal(np.array(decoded.data[0].embedding, np.float32), got)


def test_base64_is_little_endian_float32(server, model):
    status, body = _post(server, "/v1/embeddings", {"input": "hello world", "encoding_format": "base64"})
    assert status == 200
    raw = base64.b64decode(body["data"][0]["embedding"])
    assert len(raw) == 4 * DIM
    np.testing.assert_array_equal(np.frombuffer(raw, "<f4"), _expected(model, "hello world"))


def test_a_list_keeps_its_order_and_usage_counts_every_token(client, model):
    texts = TEXTS + [" "]  # whitespace is a text, as in the API and `mnnllm embed -p " "`
    answer = client.embeddings.create(model="m", input=texts, encoding_format="float", user="someone")
    assert [d.index for d in answer.data] == list(range(len(texts)))
    for text, row in zip(texts, answer.data):
        np.testing.assert_array_equal(np.array(row.embedding, np.float32), _expected(model, text))
    assert answer.usage.prompt_tokens == sum(len(model.text_ids(t)) for t in texts)


def test_token_ids_embed_as_given(client, model):
    ids = model.text_ids(TEXTS[2])  # [CLS] ... [SEP]: the ids the text's template encodes to
    one = client.embeddings.create(model="m", input=ids, encoding_format="float")
    np.testing.assert_array_equal(np.array(one.data[0].embedding, np.float32), _expected(model, TEXTS[2]))
    assert one.usage.prompt_tokens == len(ids)
    several = client.embeddings.create(model="m", input=[ids, ids[1:-1]], encoding_format="float")
    assert [d.index for d in several.data] == [0, 1] and several.usage.prompt_tokens == 2 * len(ids) - 2
    np.testing.assert_array_equal(np.array(several.data[1].embedding, np.float32),
                                  model.ids_embedding(ids[1:-1])[0])  # no template added to ids


def test_dimensions_equal_to_the_models_are_served(client):
    assert len(client.embeddings.create(model="m", input="a", dimensions=DIM).data[0].embedding) == DIM


FULL = [2] + [5] * (MAX_POSITIONS - 2) + [3]


@pytest.mark.parametrize("body, param, code", [
    ({"input": ""}, "input", "invalid_value"),
    ({"input": []}, "input", "invalid_value"),
    ({"input": ["hello", ""]}, "input[1]", "invalid_value"),
    ({"input": [[2, 3], []]}, "input[1]", "invalid_value"),
    ({"input": [2, 10_000]}, "input", "invalid_value"),
    ({"input": [2, -1]}, "input", "invalid_value"),
    ({"input": [[2, 3], [2, 37]]}, "input[1]", "invalid_value"),  # 37 tokens in the vocabulary: ids 0..36
    ({"input": ["a"] * (MAX_INPUTS + 1)}, "input", "invalid_value"),
    ({"input": "hello " * MAX_POSITIONS}, "input", "context_length_exceeded"),
    ({"input": ["a", "hello " * MAX_POSITIONS]}, "input[1]", "context_length_exceeded"),
    ({"input": FULL + [5]}, "input", "context_length_exceeded"),
    ({"input": ["caf\ud800"]}, "input[0]", "invalid_value"),
    ({"input": 5}, "input", "invalid_value"),
    ({"input": [1, "a"]}, "input", "invalid_value"),
    ({"model": "m"}, "input", "missing_required_parameter"),
    ({"input": "a", "dimensions": 32}, "dimensions", "invalid_value"),
    ({"input": "a", "dimensions": 0}, "dimensions", "invalid_value"),
    ({"input": "a", "encoding_format": "int8"}, "encoding_format", "invalid_value"),
    ({"input": "a", "truncate": True}, "truncate", "unknown_parameter"),
], ids=lambda v: None if isinstance(v, dict) else str(v))
def test_bad_input_is_a_400_naming_the_param(server, body, param, code):
    status, answer = _post(server, "/v1/embeddings", body)
    assert status == 400, answer
    error = answer["error"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, code)
    assert error["message"]


def test_a_full_context_is_served(client):
    assert client.embeddings.create(model="m", input=FULL).usage.prompt_tokens == MAX_POSITIONS


def test_the_openai_client_sees_the_400(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model="m", input=["fine", ""])
    assert caught.value.body["param"] == "input[1]"


def test_the_chat_endpoints_refuse_an_embedding_model(client):
    with pytest.raises(openai.NotFoundError, match="is an embedding model.*/v1/embeddings") as caught:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert (caught.value.body["param"], caught.value.body["code"]) == ("model", "model_not_supported")
    with pytest.raises(openai.NotFoundError, match="is an embedding model"):
        client.completions.create(model="m", prompt="hi")


def test_embeddings_are_refused_on_a_chat_model():
    with LiveServer(load_model()) as chat_server:
        chat = openai.OpenAI(base_url=chat_server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        with pytest.raises(openai.NotFoundError, match="is not an embedding model") as caught:
            chat.embeddings.create(model="m", input="hello")
        assert (caught.value.body["param"], caught.value.body["code"]) == ("model", "model_not_supported")
        assert [m.id for m in chat.models.list().data] == ["smollm2-135m-instruct-mnn-q4"]


def test_requests_queue_a_full_queue_answers_503_and_a_gone_client_is_dropped(server, client, model, monkeypatch):
    """The worker busy on one embedding (held), one waits (queue size 1), the next gets 503; a
    waiting client that gives up is dropped from the queue."""
    release, entered = threading.Event(), threading.Event()
    embed = model.ids_embedding

    def held(ids):
        entered.set()
        assert release.wait(60)
        return embed(ids)

    monkeypatch.setattr(model, "ids_embedding", held)
    results = {}
    first = threading.Thread(target=lambda: results.setdefault("first", client.embeddings.create(model="m", input="a")))
    first.start()
    try:
        assert entered.wait(60)
        impatient = client.with_options(timeout=1.5)
        with pytest.raises(openai.APITimeoutError):  # waits behind the first, gives up
            impatient.embeddings.create(model="m", input="b")
        _wait_for(lambda: server.worker.status()["waiting"] == 0)  # withdrawn from the queue
        assert server.worker.status()["cancelled"] >= 1
        second = threading.Thread(target=lambda: results.setdefault("second",
                                                                    client.embeddings.create(model="m", input="c")))
        second.start()
        _wait_for(lambda: server.worker.status()["waiting"] == 1)
        with pytest.raises(openai.InternalServerError) as caught:
            client.embeddings.create(model="m", input="d")
        assert caught.value.status_code == 503 and caught.value.body["code"] == "queue_full"
    finally:
        release.set()
        first.join(60)
    second.join(60)
    for key, text in (("first", "a"), ("second", "c")):
        np.testing.assert_array_equal(np.array(results[key].data[0].embedding, np.float32), _expected(model, text))


def _wait_for(condition, timeout=60):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_serve_finds_an_embedding_model_by_itself(folder):
    assert is_embedding_model(folder / "tiny-bert") and not is_embedding_model(CONFIG)
    command = [sys.executable, "-m", "mnnllm_core.cli", "serve", str(folder / "tiny-bert"), "--port", "0",
               "--set", "thread_num=2"]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(process.stderr), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 300
        while not any("Uvicorn running on" in line for line in lines):
            assert process.poll() is None and time.monotonic() < deadline, "".join(lines)
            time.sleep(0.1)
        port = int(re.search(r"Uvicorn running on http://127\.0\.0\.1:(\d+)", "".join(lines)).group(1))
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=120)
        assert len(client.embeddings.create(model="m", input="hello").data[0].embedding) == DIM
        process.send_signal(signal.SIGINT)
        assert process.wait(60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert "an embedding model: /v1/embeddings" in "".join(lines)
