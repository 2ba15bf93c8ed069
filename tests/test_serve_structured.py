"""Structured output and tool calling through `mnnllm serve` with the official `openai` client:
20 JSON schemas (greedy, `response_format` json_schema strict) valid per `jsonschema`, llama.cpp's
`grammar` (GBNF) and `json_schema` fields, json_object mode, logprobs, n with seeds, 400s naming the
field, and a tool-calling round trip (forced with tool_choice, streamed and whole) on a Hermes-family
chat template applied to the shared model."""
from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from constraint_cases import ARITHMETIC_GBNF, HERMES_TEMPLATE, SCHEMAS, TIME_TOOL, WEATHER_TOOL, arithmetic_accepts
from paths import CONFIG
from serve_harness import LiveServer, load_model

pytestmark = pytest.mark.skipif(not CONFIG.exists(), reason=f"{CONFIG} is not here")


@pytest.fixture(scope="module")
def server():
    with LiveServer(load_model(memory="low")) as live:
        yield live


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def tool_client():
    llm = load_model(memory="low", jinja={"chat_template": HERMES_TEMPLATE})
    with LiveServer(llm) as live:
        yield openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=300)


def _ask(prompt):
    return [{"role": "user", "content": f"{prompt} Answer in JSON."}]


@pytest.mark.slow
@pytest.mark.parametrize("name,prompt,schema", SCHEMAS, ids=[s[0] for s in SCHEMAS])
def test_response_format_json_schema_output_is_valid(client, name, prompt, schema):
    answer = client.chat.completions.create(
        model="any", messages=_ask(prompt), temperature=0, max_tokens=160,
        response_format={"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}})
    choice = answer.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    jsonschema.validate(json.loads(choice.message.content), schema)


def test_json_object_mode_and_llama_cpp_json_schema_field(client):
    answer = client.chat.completions.create(model="any", messages=_ask("Give an object with a name and an age."),
                                            temperature=0, max_tokens=120, response_format={"type": "json_object"})
    assert isinstance(json.loads(answer.choices[0].message.content), dict)
    schema = SCHEMAS[1][2]
    answer = client.chat.completions.create(model="any", messages=_ask("Pick a color."), temperature=0,
                                            max_tokens=40, extra_body={"json_schema": schema})
    jsonschema.validate(json.loads(answer.choices[0].message.content), schema)


def test_llama_cpp_gbnf_grammar_field(client):
    answer = client.chat.completions.create(model="any", messages=[{"role": "user", "content": "Write an equation with parentheses."}],
                                            temperature=0, max_tokens=40, extra_body={"grammar": ARITHMETIC_GBNF})
    text = answer.choices[0].message.content
    assert answer.choices[0].finish_reason == "stop" and arithmetic_accepts(text), text
    completion = client.completions.create(model="any", prompt="1 + 2 =", max_tokens=40, temperature=0,
                                           extra_body={"grammar": ARITHMETIC_GBNF})
    assert arithmetic_accepts(completion.choices[0].text)


def test_a_schema_streamed_is_the_same_text(client):
    schema = SCHEMAS[0][2]
    kwargs = dict(model="any", messages=_ask("Describe a person."), temperature=0, max_tokens=80,
                  response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": schema}})
    whole = client.chat.completions.create(**kwargs).choices[0].message.content
    pieces = [c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kwargs)
              if c.choices]
    assert "".join(pieces) == whole


def test_logprobs_with_top_alternatives(client):
    answer = client.chat.completions.create(model="any", messages=[{"role": "user", "content": "Say hi."}],
                                            temperature=0, max_tokens=6, logprobs=True, top_logprobs=3)
    content = answer.choices[0].logprobs.content
    # (a token may hold part of a character: its `bytes` join into the text, as OpenAI's do)
    assert b"".join(bytes(t.bytes) for t in content) == answer.choices[0].message.content.encode()
    for token in content:
        assert token.logprob <= 0 and len(token.top_logprobs) == 3
        assert token.top_logprobs[0].token == token.token  # greedy: the most likely one
    legacy = client.completions.create(model="any", prompt="The capital of France is", max_tokens=4,
                                       temperature=0, logprobs=2)
    assert len(legacy.choices[0].logprobs.token_logprobs) == len(legacy.choices[0].logprobs.tokens)


def test_n_choices_with_a_seed_are_repeatable(client):
    kwargs = dict(model="any", messages=[{"role": "user", "content": "Name a fruit."}], max_tokens=8, n=3,
                  temperature=1.0, seed=11)
    first = client.chat.completions.create(**kwargs)
    again = client.chat.completions.create(**kwargs)
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert [c.message.content for c in first.choices] == [c.message.content for c in again.choices]
    streamed = {}
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for choice in chunk.choices:
            streamed[choice.index] = streamed.get(choice.index, "") + (choice.delta.content or "")
    assert [streamed[i] for i in range(3)] == [c.message.content for c in first.choices]


@pytest.mark.parametrize("fields,param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}}},
     "response_format.json_schema.schema"),
    ({"extra_body": {"grammar": 'root ::= ("a"'}}, "grammar"),
    ({"extra_body": {"json_schema": {"type": 5}}}, "json_schema"),
    ({"tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "function": {"name": "get_time"}}},
     "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "nope"}}}]},
     "tools[0].function.parameters"),
    ({"response_format": {"type": "json_object"}, "extra_body": {"grammar": 'root ::= "a"'}}, "grammar"),
])
def test_bad_constraints_and_tools_are_400s_naming_the_field(client, fields, param):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="any", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                       **fields)
    assert err.value.body["param"] == param


def test_tool_call_arguments_that_are_not_json_are_a_400(tool_client):
    messages = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{bad"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    with pytest.raises(openai.BadRequestError) as err:
        tool_client.chat.completions.create(model="any", messages=messages, tools=[WEATHER_TOOL], max_tokens=4)
    assert err.value.body["param"] == "messages[1].tool_calls[0].function.arguments"


def _check_call(call, schema=WEATHER_TOOL["function"]["parameters"]):
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    jsonschema.validate(json.loads(call.function.arguments), schema)


@pytest.mark.parametrize("choice", [{"type": "function", "function": {"name": "get_weather"}}, "required"],
                         ids=["named", "required"])
def test_tool_round_trip_whole(tool_client, choice):
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    tools = [WEATHER_TOOL] if choice == "required" else [WEATHER_TOOL, TIME_TOOL]
    first = tool_client.chat.completions.create(model="any", messages=messages, tools=tools, tool_choice=choice,
                                                temperature=0, max_tokens=80)
    assert first.choices[0].finish_reason == "tool_calls"
    call = first.choices[0].message.tool_calls[0]
    _check_call(call)
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 18, "sky": "clear"})}]
    final = tool_client.chat.completions.create(model="any", messages=messages, tools=tools, tool_choice="none",
                                                temperature=0, max_tokens=40)
    assert final.choices[0].finish_reason in ("stop", "length")
    assert final.choices[0].message.content and not final.choices[0].message.tool_calls


def test_tool_round_trip_streamed(tool_client):
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    choice = {"type": "function", "function": {"name": "get_weather"}}
    calls, content, finish = {}, "", None
    for chunk in tool_client.chat.completions.create(model="any", messages=messages, tools=[WEATHER_TOOL],
                                                     tool_choice=choice, temperature=0, max_tokens=80, stream=True):
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for part in delta.tool_calls or []:
            slot = calls.setdefault(part.index, {"id": "", "name": "", "arguments": ""})
            slot["id"] += part.id or ""
            slot["name"] += part.function.name or ""
            slot["arguments"] += part.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and content == "" and calls[0]["name"] == "get_weather"
    jsonschema.validate(json.loads(calls[0]["arguments"]), WEATHER_TOOL["function"]["parameters"])
    messages += [{"role": "assistant", "content": None, "tool_calls": [
        {"id": calls[0]["id"], "type": "function",
         "function": {"name": "get_weather", "arguments": calls[0]["arguments"]}}]},
        {"role": "tool", "tool_call_id": calls[0]["id"], "content": '{"temperature": 18}'}]
    text = "".join(c.choices[0].delta.content or "" for c in tool_client.chat.completions.create(
        model="any", messages=messages, tools=[WEATHER_TOOL], temperature=0, max_tokens=40, stream=True)
        if c.choices)
    assert text


def test_auto_tool_choice_parses_a_call_the_model_writes(tool_client):
    """`auto` leaves the model free; a call it writes comes back parsed (forced here by a grammar)."""
    grammar = 'start: "<tool_call>\\n{\\"name\\": \\"get_time\\", \\"arguments\\": {\\"city\\": \\"Oslo\\"}}\\n</tool_call>"\n'
    answer = tool_client.chat.completions.create(model="any", messages=[{"role": "user", "content": "Time?"}],
                                                 tools=[TIME_TOOL], temperature=0, max_tokens=40,
                                                 extra_body={"grammar": grammar})
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls[0].function.name == "get_time"
    assert json.loads(choice.message.tool_calls[0].function.arguments) == {"city": "Oslo"}


def test_a_grammar_that_never_completes_ends_as_length_not_an_error(client):
    answer = client.chat.completions.create(model="any", messages=[{"role": "user", "content": "a"}], max_tokens=30,
                                            temperature=0, extra_body={"grammar": 'root ::= "a" root'})
    assert answer.choices[0].finish_reason == "length" and set(answer.choices[0].message.content) <= {"a"}
