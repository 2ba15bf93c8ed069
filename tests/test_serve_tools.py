"""Tool-call formats per chat-template family (serve/tools.py): detection from the template,
parsing the model's text into calls, streaming that holds a call back, and the forced-call
grammar llguidance compiles (and whose every output parses back)."""
from __future__ import annotations

import json

import pytest

from constraint_cases import HERMES_TEMPLATE
from mnnllm_core.llm.constraint import Constraint
from mnnllm_core.serve.tools import (HermesFormat, Llama3Format, MistralFormat, ParsedCall, ToolStream,
                                     tool_format)

TOOLS = [{"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                "required": ["city"]}},
         {"name": "get_time", "parameters": {"type": "object", "properties": {}}}]


def test_the_family_is_read_from_the_template():
    assert isinstance(tool_format(HERMES_TEMPLATE), HermesFormat)
    assert isinstance(tool_format("{{ '[TOOL_CALLS]' }}"), MistralFormat)
    assert isinstance(tool_format("Environment: ipython\n<|python_tag|>"), Llama3Format)
    assert tool_format("{{ messages[0].content }}") is None


@pytest.mark.parametrize("fmt,text,content,calls", [
    (HermesFormat(), 'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
     "Sure.", [ParsedCall("get_weather", {"city": "Oslo"})]),
    (HermesFormat(), '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b", '
                     '"arguments": "{\\"x\\": 1}"}</tool_call>', "", [ParsedCall("a", {}), ParsedCall("b", {"x": 1})]),
    (HermesFormat(), "no call here", "no call here", []),
    (HermesFormat(), "<tool_call>{broken</tool_call>", "<tool_call>{broken</tool_call>", []),
    (Llama3Format(), '{"name": "get_time", "parameters": {}}', "", [ParsedCall("get_time", {})]),
    (Llama3Format(), '<|python_tag|>{"name": "get_time", "parameters": {"tz": "UTC"}}', "",
     [ParsedCall("get_time", {"tz": "UTC"})]),
    (Llama3Format(), "The time is noon.", "The time is noon.", []),
    (MistralFormat(), '[TOOL_CALLS][{"name": "get_time", "arguments": {}}, {"name": "x", "arguments": {"a": 1}}]',
     "", [ParsedCall("get_time", {}), ParsedCall("x", {"a": 1})]),
])
def test_calls_are_parsed_out_of_the_text(fmt, text, content, calls):
    assert fmt.parse(text) == (content, calls)


def test_streaming_shows_text_before_a_call_and_holds_a_possible_marker():
    stream = ToolStream(HermesFormat(), forced=False)
    shown = [stream.feed(p) for p in ["Let me ", "check.<tool", "_call>\n{\"name\": \"get_time\", ",
                                      "\"arguments\": {}}\n</tool_call>"]]
    assert shown == ["Let me ", "check.", "", ""]
    rest, calls = stream.finish()
    assert rest == "" and calls == [ParsedCall("get_time", {})]
    plain = ToolStream(HermesFormat(), forced=False)
    assert plain.feed("a <tool") == "a " and plain.finish() == ("<tool", [])


@pytest.mark.parametrize("fmt", [HermesFormat(), Llama3Format(), MistralFormat()], ids=["hermes", "llama3", "mistral"])
def test_the_forced_grammar_compiles_and_a_valid_call_parses_back(fmt):
    Constraint.lark(fmt.forced_grammar(TOOLS))
    call = {"name": "get_weather", fmt.arguments_key: {"city": "Oslo"}}
    body = json.dumps(call)
    text = {"hermes": f"<tool_call>\n{body}\n</tool_call>", "llama3": body,
            "mistral": f"[TOOL_CALLS][{body}]"}[fmt.name]
    assert fmt.parse(text)[1] == [ParsedCall("get_weather", {"city": "Oslo"})]


def test_llama3_streaming_holds_a_bare_call_from_its_first_brace():
    stream = ToolStream(Llama3Format(), forced=False)
    assert [stream.feed(p) for p in ['{"na', 'me": "get_time", "parameters": {}}']] == ["", ""]
    assert stream.finish() == ("", [ParsedCall("get_time", {})])
    text = ToolStream(Llama3Format(), forced=False)
    assert text.feed("It is ") == "It is "
