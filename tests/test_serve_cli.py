"""`mnnllm serve FOLDER` as a user starts it: it logs the load and its KV slots, binds 127.0.0.1, requires the
--api-key on /v1/ (not on the page or /health), logs each request, and stops on Ctrl-C."""
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import openai
import pytest

from paths import MODEL_DIR

KEY = "test-key-0123"


@pytest.fixture(scope="module")
def served():
    command = [sys.executable, "-m", "mnnllm_core.cli", "serve", str(MODEL_DIR), "--port", "0", "--api-key", KEY,
               "--set", "memory=normal", "--set", "thread_num=2"]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(process.stderr), daemon=True)
    reader.start()
    deadline = time.monotonic() + 300
    while not any("Uvicorn running on" in line for line in lines):
        assert process.poll() is None, "".join(lines)
        assert time.monotonic() < deadline, "".join(lines)
        time.sleep(0.1)
    port = int(re.search(r"Uvicorn running on http://127\.0\.0\.1:(\d+)", "".join(lines)).group(1))
    yield port, lines, process
    if process.poll() is None:
        process.kill()
        process.wait()


def _get(port, path, headers=None):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.request("GET", path, headers=headers or {})
    response = connection.getresponse()
    body = response.read()
    connection.close()
    return response.status, body


def test_the_load_is_logged_before_serving_on_loopback(served):
    _, lines, _ = served
    log = "".join(lines)
    assert log.index("loading " + str(MODEL_DIR / "config.json")) < log.index("loaded ") < log.index("Uvicorn running")
    assert "serving smollm2-135m-instruct-mnn-q4 on backend cpu" in log
    # --parallel auto: the slots that fit, and the KV memory they may take of what is available
    slots = re.search(r"\((\d) slot\(s\): KV cache up to \d+ MiB of \d+ MiB available", log)
    assert slots and 1 <= int(slots.group(1)) <= 4
    assert json.loads(_get(served[0], "/health")[1])["slots"] == int(slots.group(1))


def test_the_api_needs_the_key_and_the_page_and_health_do_not(served):
    port = served[0]
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        status, body = _get(port, "/v1/models", headers)
        assert status == 401 and json.loads(body)["error"]["code"] == "invalid_api_key"
    assert _get(port, "/v1/models", {"Authorization": f"Bearer {KEY}"})[0] == 200
    assert _get(port, "/health")[0] == 200
    status, page = _get(port, "/")
    assert status == 200 and b"<textarea" in page and b"/static/chat.js" in page
    assert _get(port, "/static/chat.js")[0] == 200


def test_requests_are_logged_and_ctrl_c_stops_the_server(served):
    port, lines, process = served
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0, timeout=300)
    answer = client.chat.completions.create(model="any", messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    assert answer.usage.completion_tokens <= 2
    process.send_signal(signal.SIGINT)
    assert process.wait(60) == 0
    log = "".join(lines)
    assert f"{answer.id}: queued" in log and re.search(re.escape(answer.id) + r": finish \w+; \d+ prompt tokens", log)
    assert '"POST /v1/chat/completions HTTP/1.1" 200' in log
