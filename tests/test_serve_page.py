"""The chat page at / in headless Chromium (Debian's chromium and chromium-driver, driven by
selenium): type a question, see the answer arrive in pieces, ask a follow-up that reuses the
KV cache, and stop a long answer with the Stop button, which cancels it on the server."""
import json
import shutil
import time
import urllib.request

import pytest

from paths import REFERENCE
from serve_harness import LiveServer, load_model

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER),
    reason="needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver, as .ci/setup does)")

PROMPTS = json.loads(REFERENCE.read_text())["prompts"]
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--window-size=1000,800")


@pytest.fixture(scope="module")
def server():
    with LiveServer(load_model(sampler_type="greedy")) as live:
        yield live


@pytest.fixture
def page(server, tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for flag in CHROMIUM_FLAGS + (f"--user-data-dir={tmp_path / 'profile'}",):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.get(server.url + "/")
    yield driver
    driver.quit()


def _ask(page, question):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    box = page.find_element(By.ID, "prompt")
    box.send_keys(question)
    box.send_keys(Keys.ENTER)
    return page.find_elements(By.CSS_SELECTOR, ".message.assistant")[-1]


def _wait(page, condition, timeout=300):
    from selenium.webdriver.support.ui import WebDriverWait
    return WebDriverWait(page, timeout, poll_frequency=0.05).until(lambda _: condition())


def _stats(page):
    from selenium.webdriver.common.by import By
    return [e.text for e in page.find_elements(By.CSS_SELECTOR, ".stats")]


def test_a_typed_question_gets_the_streamed_answer_and_a_follow_up_reuses_the_cache(page):
    from selenium.webdriver.common.by import By

    _wait(page, lambda: page.find_element(By.ID, "model").text == "smollm2-135m-instruct-mnn-q4")
    answer = _ask(page, PROMPTS[0]["prompt"])
    _wait(page, lambda: answer.get_attribute("data-done"))
    assert answer.text == "The capital of France is Paris."  # greedy: reference.json's tokens
    assert int(answer.get_attribute("data-chunks")) > 1  # it arrived in pieces
    assert _stats(page)[0].startswith(f"{len(PROMPTS[0]['prompt_ids'])} prompt tokens (0 cached)")
    follow_up = _ask(page, "And of Italy?")
    _wait(page, lambda: follow_up.get_attribute("data-done"))
    assert "Italy" in follow_up.text or "Rome" in follow_up.text
    cached = int(_stats(page)[1].split("(")[1].split(" ")[0])
    assert cached > len(PROMPTS[0]["prompt_ids"])  # the first turn and its answer came from the KV cache


def _health(server):
    with urllib.request.urlopen(server.url + "/health", timeout=30) as response:
        return json.load(response)


def test_the_stop_button_cancels_the_answer_on_the_server(page, server):
    from selenium.webdriver.common.by import By

    before = _health(server)["cancelled"]
    page.find_element(By.ID, "max-tokens").send_keys("1500")
    # greedy, this one runs past 400 tokens (the reference prompts end at 64-72: the answer could
    # finish before the button is read)
    answer = _ask(page, "Write a very long essay about the history of Rome.")
    _wait(page, lambda: int(answer.get_attribute("data-chunks") or 0) >= 2)
    stop = page.find_element(By.ID, "send")
    assert stop.text == "Stop"
    stop.click()
    _wait(page, lambda: answer.get_attribute("data-done"))
    assert stop.text == "Send" and answer.text
    assert "stopped" in answer.get_attribute("class").split() and _stats(page)[-1].startswith("stopped · ")
    marker = page.execute_script("return getComputedStyle(arguments[0], '::after').content", answer)
    assert "stopped" in marker
    deadline = time.monotonic() + 120
    while (health := _health(server))["cancelled"] == before or health["busy"]:
        assert time.monotonic() < deadline, "the server never cancelled the answer"
        time.sleep(0.05)


def test_the_empty_page_has_a_hint_and_a_cut_reply_says_so(page):
    from selenium.webdriver.common.by import By

    hint = page.execute_script("return getComputedStyle(document.getElementById('messages'), '::before').content")
    assert "Enter sends" in hint
    page.find_element(By.ID, "max-tokens").send_keys("3")
    answer = _ask(page, PROMPTS[0]["prompt"])
    _wait(page, lambda: answer.get_attribute("data-done"))
    assert _stats(page)[-1].endswith("3 tokens in " + _stats(page)[-1].split("tokens in ")[1].split(" s")[0]
                                     + " s · cut at max tokens")
    assert page.execute_script("return getComputedStyle(document.getElementById('messages'), '::before').content") \
        in ("none", "normal")  # the hint leaves with the first message


def test_the_favicon_is_served(server):
    with urllib.request.urlopen(server.url + "/favicon.ico", timeout=30) as response:
        assert response.status == 200 and response.headers["content-type"].startswith("image/svg+xml")
        assert response.read().startswith(b"<svg")
