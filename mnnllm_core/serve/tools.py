"""Tool calling per chat-template family: how a model writes its calls, how to read them back
into OpenAI `tool_calls`, and the grammar that forces a valid call (tool_choice `required` or a
named function). The tools reach the model through its own chat template (the `tools` variable
MNN's and Hugging Face's templates read); the family is recognised from that template's text.

Families: Hermes/Qwen (`<tool_call>{"name", "arguments"}</tool_call>`), Llama 3.x (a bare
`{"name", "parameters"}` object, after `<|python_tag|>` or not), Mistral
(`[TOOL_CALLS][{"name", "arguments"}, ...]`). To add one: subclass `ToolFormat` (its `markers`
in a template, where a call `starts` and how streaming holds it back (`held_from`), `parse`,
`forced_grammar`) and put it in `FORMATS` before the families it must win over.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any, Sequence

from ..llm.constraint import JSON_LAYOUT


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: dict[str, Any]

    def as_openai(self) -> dict[str, Any]:
        return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                "function": {"name": self.name, "arguments": json.dumps(self.arguments, ensure_ascii=False)}}


def _objects(text: str) -> list[Any]:
    """Every JSON value written one after another in `text` (whitespace between); [] on anything else."""
    decoder, values, at = json.JSONDecoder(), [], 0
    text = text.strip()
    while at < len(text):
        try:
            value, end = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            return []
        values.append(value)
        at = end
        while at < len(text) and text[at] in " \t\r\n,;":
            at += 1
    return values


def _call(value: Any, arguments_key: str) -> ParsedCall | None:
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get(arguments_key, value.get("arguments", {}))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    return ParsedCall(value["name"], arguments) if isinstance(arguments, dict) else None


def call_schema(tools: Sequence[dict[str, Any]], arguments_key: str) -> dict[str, Any]:
    """A JSON schema of one call of any of `tools` ({name, parameters} each)."""
    options = [{"type": "object", "properties": {
        "name": {"const": tool["name"]},
        arguments_key: tool.get("parameters") or {"type": "object"}},
        "required": ["name", arguments_key], "additionalProperties": False} for tool in tools]
    return options[0] if len(options) == 1 else {"anyOf": options}


def _lark_json(schema: dict[str, Any]) -> str:
    """llguidance's Lark form of a JSON schema, laid out as the JSON constraints are (no free whitespace)."""
    return "%json " + json.dumps({**schema, "x-guidance": JSON_LAYOUT})


class ToolFormat:
    """One family's way of writing calls."""

    name = ""
    markers: tuple[str, ...] = ()  # text in a chat template that says the family
    start = ""  # where the calls begin in the model's output
    arguments_key = "arguments"

    @classmethod
    def detect(cls, template: str) -> bool:
        return any(marker in template for marker in cls.markers)

    def starts(self, text: str) -> int:
        """Where a call begins in `text`, or -1."""
        return text.find(self.start) if self.start else -1

    def held_from(self, text: str) -> int:
        """Where streamed text must be held back: a call, or an end that may begin one."""
        at = self.starts(text)
        return at if at >= 0 else len(text) - _partial_prefix(text, self.start)

    def parse(self, text: str) -> tuple[str, list[ParsedCall]]:
        """The text before the calls, and the calls ([] when there are none, or they do not parse)."""
        raise NotImplementedError

    def forced_grammar(self, tools: Sequence[dict[str, Any]]) -> str:
        """A Lark grammar (llguidance's, with %json) of exactly one call of one of `tools`."""
        raise NotImplementedError


class HermesFormat(ToolFormat):
    name = "hermes"
    markers = ("<tool_call>",)
    start = "<tool_call>"
    _call_re = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.S)

    def parse(self, text: str) -> tuple[str, list[ParsedCall]]:
        at = self.starts(text)
        if at < 0:
            return text, []
        calls = []
        for body in self._call_re.findall(text[at:]):
            values = _objects(body)
            call = _call(values[0], self.arguments_key) if len(values) == 1 else None
            if call is None:
                return text, []
            calls.append(call)
        return text[:at].rstrip(), calls

    def forced_grammar(self, tools: Sequence[dict[str, Any]]) -> str:
        return (f'start: "<tool_call>\\n" call "\\n</tool_call>"\n'
                f"call: {_lark_json(call_schema(tools, self.arguments_key))}\n")


class MistralFormat(ToolFormat):
    name = "mistral"
    markers = ("[TOOL_CALLS]",)
    start = "[TOOL_CALLS]"

    def parse(self, text: str) -> tuple[str, list[ParsedCall]]:
        at = self.starts(text)
        if at < 0:
            return text, []
        values = _objects(text[at + len(self.start):])
        items = values[0] if len(values) == 1 and isinstance(values[0], list) else values
        calls = [_call(v, self.arguments_key) for v in items]
        if not calls or None in calls:
            return text, []
        return text[:at].rstrip(), calls

    def forced_grammar(self, tools: Sequence[dict[str, Any]]) -> str:
        schema = {"type": "array", "items": call_schema(tools, self.arguments_key), "minItems": 1, "maxItems": 1}
        return f'start: "[TOOL_CALLS]" calls\ncalls: {_lark_json(schema)}\n'


class Llama3Format(ToolFormat):
    """Llama 3.1-3.3's JSON tool calls: the whole reply is `{"name": ..., "parameters": {...}}`."""

    name = "llama3"
    markers = ("<|python_tag|>", "Environment: ipython")
    start = "<|python_tag|>"
    arguments_key = "parameters"

    def starts(self, text: str) -> int:
        tag = text.find(self.start)
        if tag >= 0:
            return tag
        return 0 if text.lstrip().startswith(self.bare_start) else -1

    bare_start = '{"name"'

    def held_from(self, text: str) -> int:
        if self.bare_start.startswith(text.lstrip()):  # a bare call may be beginning
            return 0
        return super().held_from(text)

    def parse(self, text: str) -> tuple[str, list[ParsedCall]]:
        at = self.starts(text)
        if at < 0:
            return text, []
        body = text[at:].removeprefix(self.start)
        calls = [_call(v, self.arguments_key) for v in _objects(body)]
        if not calls or None in calls:
            return text, []
        return text[:at].rstrip(), calls

    def forced_grammar(self, tools: Sequence[dict[str, Any]]) -> str:
        return f"start: call\ncall: {_lark_json(call_schema(tools, self.arguments_key))}\n"


FORMATS: list[type[ToolFormat]] = [HermesFormat, MistralFormat, Llama3Format]


def tool_format(template: str) -> ToolFormat | None:
    """The family whose markers the chat template has, or None."""
    for kind in FORMATS:
        if kind.detect(template):
            return kind()
    return None


class ToolStream:
    """A reply streamed while it may hold calls: text before a call is shown at once; from where a
    call may begin (or the start of one is still possible) it is held, then parsed at the end."""

    def __init__(self, fmt: ToolFormat, forced: bool):
        self.fmt = fmt
        self.held = ""
        self.shown = 0  # characters of `held` already given out
        self.forced = forced  # the whole reply is a call: show nothing

    def feed(self, piece: str) -> str:
        self.held += piece
        if self.forced:
            return ""
        safe = self.fmt.held_from(self.held)
        out = self.held[self.shown:max(safe, self.shown)]
        self.shown = max(safe, self.shown)
        return out

    def finish(self) -> tuple[str, list[ParsedCall]]:
        """What is left to show and the calls. When the reply holds no call it is all text."""
        content, calls = self.fmt.parse(self.held)
        if not calls:
            return self.held[self.shown:], []
        return content[self.shown:], calls


def _partial_prefix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that begins `marker`."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-k:]):
            return k
    return 0


def template_tool_calls(calls: Sequence[Any]) -> list[dict[str, Any]]:
    """An assistant message's OpenAI tool_calls as templates read them: arguments as a dict."""
    out = []
    for call in calls:
        arguments = json.loads(call.function.arguments)
        out.append({"id": call.id, "type": "function",
                    "function": {"name": call.function.name, "arguments": arguments}})
    return out
