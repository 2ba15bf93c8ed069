"""`mnnllm serve --parallel N` live on 127.0.0.1 (batch_worker.py): 16 concurrent `openai` clients
against 4 slots each get the greedy answer the same prompt gets alone; /health and /metrics
(Prometheus text) report the slots; a cancelled stream frees its slot at once and the queue's next
request takes it; a request that cannot fit max_all_tokens is a 400; the slot count `auto` and an
explicit one that does not fit the memory (slots.py)."""
import concurrent.futures
import http.client
import json
import re
import threading
import time
from urllib.parse import urlparse

import openai
import pytest

from mnnllm_core.errors import ConfigError
from mnnllm_core.serve import slots
from paths import REFERENCE, load_shared_greedy
from serve_harness import LiveServer

PROMPTS = [p["prompt"] for p in json.loads(REFERENCE.read_text())["prompts"]] + ["List three colors."]
TOKENS = 10
NO_EOS = {"logit_bias": {"2": -100}}


@pytest.fixture(scope="module")
def llm():
    return load_shared_greedy()  # the exported config (memory "low"), greedy


@pytest.fixture(scope="module")
def alone(llm):
    return {p: llm.response([{"role": "user", "content": p}], max_new_tokens=TOKENS) for p in PROMPTS}


@pytest.fixture(scope="module")
def server(llm, alone):
    with LiveServer(llm, parallel=4, queue_size=16) as live:
        yield live


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=600)


def _get(server, path):
    url = urlparse(server.url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    connection.request("GET", path)
    response = connection.getresponse()
    payload = response.read().decode()
    connection.close()
    return response.status, response.getheader("content-type"), payload


def _health(server):
    return json.loads(_get(server, "/health")[2])


def _wait_for(condition, timeout=300):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_sixteen_concurrent_clients_on_four_slots_each_get_the_answer_run_alone(server, client, alone):
    def ask(prompt):
        answer = client.chat.completions.create(model="any", messages=[{"role": "user", "content": prompt}],
                                                temperature=0, max_tokens=TOKENS)
        return prompt, answer.choices[0].message.content

    seen_in_use = []
    watching = threading.Event()

    def watch():
        while not watching.is_set():
            seen_in_use.append(_health(server)["slots_in_use"])
            time.sleep(0.05)
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(ask, PROMPTS * 4))
    finally:
        watching.set()
        watcher.join()
    assert [text for _, text in answers] == [alone[prompt] for prompt, _ in answers]
    assert max(seen_in_use) > 1  # they did decode together
    assert max(seen_in_use) <= 4


def test_health_and_metrics_report_the_slots(server):
    health = _health(server)
    assert health["slots"] == 4 and health["slots_in_use"] == 0
    status, kind, text = _get(server, "/metrics")
    assert status == 200 and kind.startswith("text/plain; version=0.0.4")
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    model = 'model="smollm2-135m-instruct-mnn-q4"'
    assert samples[f"mnnllm_slots{{{model}}}"] == 4
    assert samples[f"mnnllm_slots_in_use{{{model}}}"] == 0
    assert samples[f'mnnllm_requests_total{{{model},outcome="served"}}'] == health["served"]
    assert samples[f"mnnllm_completion_tokens_total{{{model}}}"] >= 0
    assert f"mnnllm_completion_tokens_per_second{{{model}}}" in samples
    assert f"mnnllm_queue_waiting{{{model}}}" in samples
    assert re.search(r"# TYPE mnnllm_requests_total counter", text)


def test_a_cancelled_stream_frees_its_slot_at_once(server, client, alone):
    before = _health(server)["cancelled"]
    streams = [client.chat.completions.create(model="any", messages=[{"role": "user", "content": PROMPTS[1]}],
                                              temperature=0, max_tokens=1500, stream=True, extra_body=NO_EOS)
               for _ in range(4)]
    chunks = [iter(s) for s in streams]
    for each in chunks:
        next(each), next(each)  # all four slots decode
    assert _health(server)["slots_in_use"] == 4
    got = {}
    queued = threading.Thread(target=lambda: got.setdefault("answer", client.chat.completions.create(
        model="any", messages=[{"role": "user", "content": PROMPTS[0]}], temperature=0, max_tokens=TOKENS)))
    queued.start()
    _wait_for(lambda: _health(server)["waiting"] == 1)
    streams[0].close()  # one client goes: the queued request takes its slot while three still decode
    queued.join(600)
    assert got["answer"].choices[0].message.content == alone[PROMPTS[0]]
    assert _health(server)["slots_in_use"] == 3
    for stream in streams[1:]:
        stream.close()
    _wait_for(lambda: _health(server)["slots_in_use"] == 0)
    assert _health(server)["cancelled"] == before + 4


def test_a_request_that_cannot_fit_the_context_is_a_400(client, llm):
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="any", messages=[{"role": "user", "content": PROMPTS[0]}],
                                       max_tokens=llm.config.max_all_tokens)
    assert refused.value.status_code == 400


def test_auto_takes_the_slots_that_fit_and_an_explicit_count_that_does_not_fit_is_refused(llm, monkeypatch):
    per_slot = llm.config.max_all_tokens * 30 * 2 * 3 * 64 * 4
    monkeypatch.setattr(slots, "available_memory", lambda: 5 * per_slot)
    assert slots.plan_slots(llm, "auto").parallel == 2  # half of 5 slots' worth
    assert slots.plan_slots(llm, 5).kv_bytes == 5 * per_slot
    with pytest.raises(ConfigError, match="parallel"):
        slots.plan_slots(llm, 6)
    monkeypatch.setattr(slots, "available_memory", lambda: 100 * per_slot)
    assert slots.plan_slots(llm, "auto").parallel == slots.AUTO_MAX


def test_a_model_whose_attention_is_not_slot_aware_serves_one_at_a_time_or_is_refused_naming_it(llm, monkeypatch):
    """What a plugin's Attention gives (webgpu's, torch's: `Execution.slot_aware` False): auto
    serves one request at a time and says why; an explicit --parallel and the engine are typed
    errors naming the op and its backend."""
    from mnnllm_core.errors import UnsupportedError
    from mnnllm_core.llm.batch_engine import BatchEngine

    pipeline = llm.module.static_module.session.pipeline
    attention = next(e for node, (_, e) in pipeline.executions.items()
                     if pipeline.info.nodes[node].op.type == "Attention")
    monkeypatch.setattr(type(attention), "slot_aware", False)
    plan = slots.plan_slots(llm, "auto")
    assert plan.parallel == 1 and f"one at a time: {type(attention).__name__} on cpu" in plan.describe()
    with pytest.raises(ConfigError, match="not slot-aware"):
        slots.plan_slots(llm, 2)
    with pytest.raises(UnsupportedError, match=f"{type(attention).__name__} on cpu .*not slot-aware"):
        BatchEngine(llm, slots=2)
