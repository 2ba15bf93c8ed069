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


def render(template: str, content: str = "hello", context: dict | None = None) -> str:
    jinja = {"chat_template": template, **({"context": context} if context else {})}
    return Prompt(LlmConfig({"jinja": jinja})).apply_chat_template(content)


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


# One case per operation that builds a string or a list, each asking for more than the bound
# (about 2**20 items with a short message): `s` is 600 000 characters, so two of it pass.
S = "{% set s = 'a' * 600000 %}"
BUILDERS = {
    "op ~ (doubling)": "{% set ns = namespace(s='a') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
                       "{% endfor %}{{ ns.s|length }}",
    "op ~": S + "{{ (s ~ s)|length }}",
    "op +": S + "{{ (s + s)|length }}",
    "op * string": "{{ ('ab' * 600000)|length }}",
    "op * list": "{{ ([0] * 2000000)|length }}",
    "op * integer": "{% set ns = namespace(x=3) %}{% for i in range(40) %}{% set ns.x = ns.x * ns.x %}{% endfor %}"
                    "{{ ns.x > 0 }}",
    "op ** integer": "{{ ((10 ** 64) ** 64) ** 64 > 0 }}",
    "op % values": S + "{{ ('%s%s' % (s, s))|length }}",
    "op % mapping": S + "{{ ('%(a)s%(a)s' % {'a': s})|length }}",
    "op % widths": "{{ ('%999999d%999999d' % (1, 1))|length }}",
    "op % precision": "{{ ('%.999999f%.999999f' % (1.0, 1.0))|length }}",
    "output": S + "{{ [s, s] }}",
    "captured block": S + "{% set t %}{{ s }}{{ s }}{% endset %}{{ t|length }}",
    "macro": S + "{% macro twice(x) %}{{ x }}{{ x }}{% endmacro %}{{ twice(s)|length }}",
    "lipsum": "{{ lipsum(1000000)|length }}",
    "method center": "{{ 'x'.center(2000000)|length }}",
    "method ljust": "{{ 'x'.ljust(2000000)|length }}",
    "method rjust": "{{ 'x'.rjust(2000000)|length }}",
    "method zfill": "{{ '1'.zfill(2000000)|length }}",
    "method expandtabs": "{{ ('\t' * 100000).expandtabs(100)|length }}",
    "method join": S + "{{ ''.join([s, s])|length }}",
    "method join of a generator": S + "{{ ''.join(([s] * 4)|map('string'))|length }}",
    "method replace": S + "{{ s.replace('a', 'aa')|length }}",
    "method translate": "{{ ('a' * 100000).translate({97: 'b' * 100})|length }}",
    "method format": S + "{{ '{0}{0}'.format(s)|length }}",
    "method format widths": "{{ '{:>999999}{:>999999}'.format(1, 2)|length }}",
    "method format_map": S + "{{ '{a}{a}'.format_map({'a': s})|length }}",
    "filter batch": "{{ ('a' * 1000000)|batch(1)|list|length }}",
    "filter capitalize": S + "{{ [s, s]|capitalize|length }}",
    "filter center": "{{ 'x'|center(2000000)|length }}",
    "filter e": "{{ ('<' * 300000)|e|length }}",
    "filter escape": S + "{{ [s, s]|escape|length }}",
    "filter forceescape": "{{ ('<' * 300000)|forceescape|length }}",
    "filter format": S + "{{ '%s%s'|format(s, s)|length }}",
    "filter indent": "{{ ('x\n' * 300000)|indent(8, true, true)|length }}",
    "filter join": S + "{{ [s, s]|join|length }}",
    "filter join of a generator": S + "{{ ([s] * 4)|map('string')|join|length }}",
    "filter list": "{{ items|list|length }}",
    "filter lower": "{{ ('\u0130' * 700000)|lower|length }}",
    "filter pprint": S + "{{ [s, s]|pprint|length }}",
    "filter replace": S + "{{ s|replace('a', 'aa')|length }}",
    "filter safe": S + "{{ [s, s]|safe|length }}",
    "filter slice": "{{ ('a' * 1000000)|slice(1000000, 'x')|list|length }}",
    "filter string": S + "{{ [s, s]|string|length }}",
    "filter striptags": S + "{{ [s, s]|striptags|length }}",
    "filter sum": "{{ [[0] * 600000, [0] * 600000]|sum(start=[])|length }}",
    "filter title": "{{ ('\u00df ' * 500000)|title|length }}",
    "filter tojson": S + "{{ [s, s]|tojson|length }}",
    "filter tojson indent": "{{ [[[[[[[[[[0]]]]]]]]]]|tojson(indent=1000000)|length }}",
    "filter trim": S + "{{ [s, s]|trim|length }}",
    "filter truncate": S + "{{ [s, s]|truncate(1000000)|length }}",
    "filter upper": "{{ ('\u00df' * 700000)|upper|length }}",
    "filter urlencode": "{{ (' ' * 400000)|urlencode|length }}",
    "filter urlize": "{{ ('www.a.com ' * 50000)|urlize|length }}",
    "filter wordcount": S + "{{ [s, s]|wordcount }}",
    "filter wordwrap": "{{ ('a ' * 400000)|wordwrap(1, wrapstring='--------')|length }}",
    "filter xmlattr": S + "{{ {'a': s, 'b': s}|xmlattr|length }}",
}
CONTEXT = {"items": iter(range(10**9))}  # `items|list` reads a billion items unless it stops at the bound


@pytest.mark.parametrize("name", BUILDERS)
def test_every_building_operation_is_measured_before_it_builds_past_the_bound(name):
    start = time.perf_counter()
    with pytest.raises(ConfigError, match="TemplateLimit") as err:
        render(BUILDERS[name], context=dict(CONTEXT) if "items" in BUILDERS[name] else None)
    assert err.value.field == "jinja.chat_template"
    assert time.perf_counter() - start < 2


def test_every_jinja_filter_and_bounded_method_has_a_case():
    """A filter jinja adds later must be classified (building, with an estimator, or plain) and
    each building one is tried above."""
    from mnnllm_core.llm.template_bounds import BUILDING_FILTERS, PLAIN_FILTERS, STR_METHODS
    from mnnllm_core.llm.template_sandbox import BoundedSandbox
    filters = set(BoundedSandbox().filters) | {"tojson"}
    assert filters == set(BUILDING_FILTERS) | PLAIN_FILTERS
    assert not set(BUILDING_FILTERS) & PLAIN_FILTERS
    cases = {name.split()[1] for name in BUILDERS if name.split()[0] in ("filter", "method")}
    assert set(BUILDING_FILTERS) <= cases
    assert set(STR_METHODS) <= cases


def test_doubling_with_tilde_allocates_no_more_than_the_bound():
    import tracemalloc
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError, match="TemplateLimit"):
            render(BUILDERS["op ~ (doubling)"])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32 << 20


def test_long_contents_pass_through_real_templates_operators():
    """The bound grows with the message contents given: a 2 MB message goes through `+` and `~`."""
    long = "word " * 400_000
    template = ("{% for m in messages %}{{ '<|' + m.role + '|>' + m.content ~ '\n' }}{% endfor %}"
                "{{ messages[0].content|trim|length }}")
    assert render(template, long) == f"<|user|>{long}\n{len(long.strip())}"
    assert render("{{ messages|tojson }}", "a\"b") == '[{"role": "user", "content": "a\\"b"}]'
