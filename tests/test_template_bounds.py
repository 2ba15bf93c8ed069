"""A chat template is bounded in what it builds, what it renders and how long it runs: a
hostile template is a ConfigError on jinja.chat_template in well under a second, never
gigabytes, a native panic, or a render that never ends."""
from __future__ import annotations

import time

import pytest

from mnnllm_core.errors import ConfigError
from mnnllm_core.llm import template_sandbox
from mnnllm_core.llm.config import LlmConfig
from mnnllm_core.llm.prompt import Prompt


def render(template: str, content: str = "hello") -> str:
    return Prompt(LlmConfig({"jinja": {"chat_template": template}})).apply_chat_template(content)


HOSTILE = {
    "repeat 10**9": "{{ 'A' * 10**9 }}",
    "repeat 10**8": "{{ 'A' * 10**8 }}",
    "list repeat": "{{ ([0] * 10**7)|length }}",
    "concatenation": "{% set s = 'a' * 1000000 %}{{ s + s }}",
    "center": "{{ 'x'|center(10**9) }}",
    "ljust method": "{{ 'x'.ljust(10**9) }}",
    "str.format width": "{{ '{:>999999999}'.format(1) }}",
    "percent width": "{{ '%999999999d' % 1 }}",
    "percent star": "{{ '%*d' % (999999999, 1) }}",
    "power": "{{ 7 ** 100000000 }}",
    "replace method": "{% set s = 'a' * 1000000 %}{{ s.replace('a', s) }}",
    "replace filter": "{% set s = 'a' * 1000000 %}{{ s|replace('a', s) }}",
    "output": "{% for i in range(100000) %}{{ 'A' * 100000 }}{% endfor %}",
}


@pytest.mark.parametrize("name", HOSTILE)
def test_a_template_asking_for_too_much_is_a_config_error_at_once(name):
    start = time.perf_counter()
    with pytest.raises(ConfigError, match="TemplateLimit") as err:
        render(HOSTILE[name])
    assert err.value.field == "jinja.chat_template"
    assert time.perf_counter() - start < 2


def test_a_template_that_loops_for_ever_stops_at_the_deadline(monkeypatch):
    monkeypatch.setattr(template_sandbox, "MAX_SECONDS", 0.3)
    start = time.perf_counter()
    with pytest.raises(ConfigError, match="longer than 0.3 s"):
        render("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}")
    assert time.perf_counter() - start < 3


def test_the_deadline_leaves_an_outer_tracer_in_place():
    import sys
    calls = []

    def tracer(frame, event, arg):
        calls.append(event)
        return None

    sys.settrace(tracer)
    try:
        render("{{ messages[0].content }}")
        assert sys.gettrace() is tracer
    finally:
        sys.settrace(None)


def test_ordinary_templates_render_as_before_and_long_contents_pass():
    assert render("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}") == "<user>hello"
    long = "word " * 400_000  # 2 MB of content: the bound grows with what was given
    assert render("{{ messages[0].content }}", long) == long
    assert render("{{ 'ab' * 3 }}|{{ 2 ** 10 }}|{{ '%5d' % 42 }}|{{ '{:>4}'.format(7) }}") == "ababab|1024|   42|   7"
