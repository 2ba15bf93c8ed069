"""Twenty JSON schemas (nested objects, arrays with bounds, enums, patterns, optional fields,
$ref) with a prompt each, and a GBNF grammar written after llama.cpp's arithmetic example: what
the constrained-decoding tests run through the API and the server."""
from __future__ import annotations

import re

NAME = {"type": "string", "minLength": 1, "maxLength": 24}

SCHEMAS: list[tuple[str, str, dict]] = [
    ("flat", "Describe a person.", {
        "type": "object", "properties": {"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
        "required": ["name", "age"], "additionalProperties": False}),
    ("enum", "Pick a color for the sky.", {
        "type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"],
        "additionalProperties": False}),
    ("boolean", "Is water wet?", {
        "type": "object", "properties": {"answer": {"type": "boolean"}, "reason": NAME},
        "required": ["answer", "reason"], "additionalProperties": False}),
    ("number_range", "Give the temperature of a warm day in Celsius.", {
        "type": "object", "properties": {"celsius": {"type": "number", "minimum": -50, "maximum": 60}},
        "required": ["celsius"], "additionalProperties": False}),
    ("array_bounds", "List some fruits.", {
        "type": "object", "properties": {"fruits": {"type": "array", "items": NAME, "minItems": 2, "maxItems": 4}},
        "required": ["fruits"], "additionalProperties": False}),
    ("nested", "Describe a book.", {
        "type": "object", "properties": {
            "title": NAME,
            "author": {"type": "object", "properties": {"first": NAME, "last": NAME},
                       "required": ["first", "last"], "additionalProperties": False}},
        "required": ["title", "author"], "additionalProperties": False}),
    ("pattern", "Give a US phone number.", {
        "type": "object", "properties": {"phone": {"type": "string", "pattern": "^[0-9]{3}-[0-9]{3}-[0-9]{4}$"}},
        "required": ["phone"], "additionalProperties": False}),
    ("date_pattern", "When did the first moon landing happen?", {
        "type": "object", "properties": {"date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}},
        "required": ["date"], "additionalProperties": False}),
    ("optional", "Describe a city.", {
        "type": "object", "properties": {"city": NAME, "country": NAME,
                                         "population": {"type": "integer", "minimum": 0}},
        "required": ["city"], "additionalProperties": False}),
    ("ref", "Describe two points on a plane.", {
        "$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                            "required": ["x", "y"], "additionalProperties": False}},
        "type": "object", "properties": {"a": {"$ref": "#/$defs/point"}, "b": {"$ref": "#/$defs/point"}},
        "required": ["a", "b"], "additionalProperties": False}),
    ("array_of_objects", "List two animals and their legs.", {
        "type": "object", "properties": {"animals": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
            "type": "object", "properties": {"name": NAME, "legs": {"type": "integer", "minimum": 0, "maximum": 8}},
            "required": ["name", "legs"], "additionalProperties": False}}},
        "required": ["animals"], "additionalProperties": False}),
    ("top_level_array", "List three numbers.", {
        "type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 100}, "minItems": 3, "maxItems": 3}),
    ("enum_array", "Which days are weekend days?", {
        "type": "object", "properties": {"days": {
            "type": "array", "items": {"enum": ["Saturday", "Sunday", "Monday"]}, "minItems": 1, "maxItems": 2}},
        "required": ["days"], "additionalProperties": False}),
    ("const", "Report the status of a job that succeeded.", {
        "type": "object", "properties": {"status": {"const": "ok"}, "code": {"type": "integer"}},
        "required": ["status", "code"], "additionalProperties": False}),
    ("anyof", "Give an identifier.", {
        "type": "object", "properties": {"id": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 12}]}},
        "required": ["id"], "additionalProperties": False}),
    ("nullable", "Describe a user who has no middle name.", {
        "type": "object", "properties": {"first": NAME, "middle": {"type": ["string", "null"], "maxLength": 12}},
        "required": ["first", "middle"], "additionalProperties": False}),
    ("deep", "Describe a company with its address.", {
        "type": "object", "properties": {"company": {"type": "object", "properties": {
            "name": NAME, "address": {"type": "object", "properties": {
                "street": NAME, "city": NAME, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                "required": ["street", "city", "zip"], "additionalProperties": False}},
            "required": ["name", "address"], "additionalProperties": False}},
        "required": ["company"], "additionalProperties": False}),
    ("ref_chain", "Describe a folder and the files in it.", {
        "$defs": {"file": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10}},
                           "required": ["name"], "additionalProperties": False},
                  "folder": {"type": "object", "properties": {
                      "name": {"type": "string", "maxLength": 10},
                      "files": {"type": "array", "maxItems": 2, "items": {"$ref": "#/$defs/file"}}},
                      "required": ["name", "files"], "additionalProperties": False}},
        "$ref": "#/$defs/folder"}),
    ("mixed_types", "Describe a product.", {
        "type": "object", "properties": {
            "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"}, "price": {"type": "number", "minimum": 0},
            "in_stock": {"type": "boolean"},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3}},
        "required": ["sku", "price", "in_stock", "tags"], "additionalProperties": False}),
    ("integer_bounds", "Rate a movie from 1 to 5 and give the year.", {
        "type": "object", "properties": {"stars": {"type": "integer", "minimum": 1, "maximum": 5},
                                         "year": {"type": "integer", "minimum": 1900, "maximum": 2030}},
        "required": ["stars", "year"], "additionalProperties": False}),
]

ARITHMETIC_GBNF = r"""
# After llama.cpp's grammars/arithmetic.gbnf: one equation whose left side nests parentheses
# (at most three terms an expression, so a small greedy model cannot go on for ever).
root  ::= expr " = " num
expr  ::= term (ws op ws term)? (ws op ws term)?
term  ::= num | "(" expr ")"
op    ::= [-+*/]
num   ::= [0-9] [0-9]? [0-9]?
ws    ::= " "?
"""


def arithmetic_accepts(text: str) -> bool:
    """ARITHMETIC_GBNF's language, by recursive descent (independent of the grammar engine). An
    expression's optional space is taken before an operator only (the grammar's one reading)."""
    tokens = re.findall(r"\d+|[-+*/()=]| ", text)
    if "".join(tokens) != text:
        return False
    at = 0

    def peek() -> str | None:
        return tokens[at] if at < len(tokens) else None

    def take(expected=None) -> str | None:
        nonlocal at
        token = peek()
        if token is None or (expected is not None and token != expected):
            return None
        at += 1
        return token

    def num() -> bool:
        token = peek()
        return token is not None and token.isdigit() and len(token) <= 3 and take() is not None

    def term() -> bool:
        if peek() == "(":
            take()
            return expr() and take(")") is not None
        return num()

    def expr() -> bool:
        nonlocal at
        if not term():
            return False
        for _ in range(2):
            mark = at
            if peek() == " ":
                take()
            if peek() in ("+", "-", "*", "/"):
                take()
                if peek() == " ":
                    take()
                if not term():
                    return False
            else:
                at = mark
                return True
        return True

    if not expr():
        return False
    return take(" ") is not None and take("=") is not None and take(" ") is not None and num() and at == len(tokens)

HERMES_TEMPLATE = """\
{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}You can call functions. Their signatures are inside <tools></tools>:
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>

To call one, answer with a JSON object of its name and arguments inside <tool_call></tool_call>:
<tool_call>
{"name": <function name>, "arguments": <arguments object>}
</tool_call><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'system' %}{% continue %}{% endif %}
{%- if message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant
{% if message.content %}{{ message.content }}
{% endif %}{% for call in message.tool_calls %}<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
</tool_call>{% endfor %}<|im_end|>
{% elif message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""
"""A chat template of the Hermes/Qwen family (tools in <tools>, calls in <tool_call>, answers in
<tool_response>), written for these tests; applied to the shared SmolLM2 model."""

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
TIME_TOOL = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                   "required": ["city"], "additionalProperties": False}}}

LIST_GBNF = r"""
# After llama.cpp's grammars/list.gbnf: dash items, one a line (at most four here).
root ::= item item? item? item?
item ::= "- " [^\r\n\x0b\x0c\x85\u2028\u2029]{1,40} "\n"
"""
LIST_ACCEPTS = r"(- [^\r\n\x0b\x0c\x85\u2028\u2029]{1,40}\n){1,4}"
