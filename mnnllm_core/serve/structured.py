"""What a request asks beyond plain sampling: a constraint (`response_format`, llama.cpp's
`grammar` / `json_schema`, or a forced tool call), tools for the chat template, log-probabilities,
several choices; checked into a `RequestPlan` before the job is queued, so a bad schema, grammar
or tool is a 400 naming its field. Also the per-choice answer: tool calls parsed out of the text
and log-probabilities in OpenAI's shape."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable

from ..llm.constraint import Constraint, ConstraintError
from ..llm.guided import TokenLogprob
from .errors import ApiError
from .schemas import ChatCompletionRequest, SamplingRequest
from .tools import ParsedCall, ToolFormat, ToolStream, tool_format


@dataclass
class ToolPlan:
    fmt: ToolFormat
    tools: list[dict[str, Any]]  # OpenAI tool objects, for the template
    forced: bool  # tool_choice required or named: the reply is one call


@dataclass
class RequestPlan:
    constraint: Constraint | None = None
    tools: ToolPlan | None = None
    top_logprobs: int | None = None
    render_tools: list[dict[str, Any]] | None = field(default=None)

    def tool_stream(self) -> ToolStream | None:
        return ToolStream(self.tools.fmt, self.tools.forced) if self.tools is not None else None


def _compiled(build: Callable[[], Constraint], param: str) -> Constraint:
    try:
        return build()
    except ConstraintError as err:
        raise ApiError(400, f"Invalid '{param}': {err.reason}", param=param, code="invalid_value") from None


def plan_request(request: SamplingRequest, chat_template: str) -> RequestPlan:
    """The request's constraint, tools and logprobs, or a 400 naming the field at fault."""
    asked = []
    plan = RequestPlan(top_logprobs=request.top_logprobs_asked)
    fmt = request.response_format
    if fmt is not None and fmt.type == "json_object":
        asked.append(("response_format", lambda: Constraint.json_object("response_format")))
    elif fmt is not None and fmt.type == "json_schema":
        if fmt.json_schema is None or fmt.json_schema.schema_ is None:
            raise ApiError(400, "response_format of type json_schema needs json_schema.schema.",
                           param="response_format.json_schema", code="missing_required_parameter")
        schema = fmt.json_schema.schema_
        asked.append(("response_format.json_schema.schema",
                      lambda: Constraint.json_schema(schema, "response_format.json_schema.schema")))
    if request.grammar is not None:
        asked.append(("grammar", lambda: Constraint.grammar_text(request.grammar, "grammar")))
    if request.json_schema is not None:
        asked.append(("json_schema", lambda: Constraint.json_schema(request.json_schema, "json_schema")))
    if isinstance(request, ChatCompletionRequest):
        tools = _tool_plan(request, chat_template)
        if tools is not None:
            plan.render_tools = tools.tools
            if tools.forced:
                grammar = tools.fmt.forced_grammar([t["function"] for t in _chosen(request, tools.tools)])
                asked.append(("tool_choice", lambda: Constraint.lark(grammar, "tool_choice")))
            plan.tools = tools
    if len(asked) > 1:
        names = ", ".join(name for name, _ in asked)
        raise ApiError(400, f"Only one output constraint per request: got {names}.", param=asked[1][0],
                       code="invalid_value")
    if asked:
        plan.constraint = _compiled(asked[0][1], asked[0][0])
    return plan


def _tool_plan(request: ChatCompletionRequest, chat_template: str) -> ToolPlan | None:
    choice = request.tool_choice
    if not request.tools:
        if choice is not None and choice != "none":
            raise ApiError(400, "tool_choice is set but no tools are given.", param="tool_choice",
                           code="invalid_value")
        return None
    tools = [tool.model_dump(by_alias=True, exclude_none=True) for tool in request.tools]
    names = [tool["function"]["name"] for tool in tools]
    for i, tool in enumerate(request.tools):
        if names.index(tool.function.name) != i:
            raise ApiError(400, f"Two tools are named '{tool.function.name}'.", param=f"tools[{i}].function.name",
                           code="invalid_value")
        if tool.function.parameters is not None:
            param = f"tools[{i}].function.parameters"
            _compiled(lambda: Constraint.json_schema(tool.function.parameters, param), param)
    if choice is not None and not isinstance(choice, str) and choice.function.name not in names:
        raise ApiError(400, f"tool_choice names '{choice.function.name}', which is not among the tools "
                            f"({', '.join(names)}).", param="tool_choice", code="invalid_value")
    if choice == "none":
        return None
    fmt = tool_format(chat_template)
    if fmt is None:
        raise ApiError(400, "This model's chat template does not render tools (no tool-call format of a known "
                            "family in it).", param="tools", code="invalid_value")
    return ToolPlan(fmt, tools, forced=choice == "required" or not isinstance(choice, (str, type(None))))


def _chosen(request: ChatCompletionRequest, tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    choice = request.tool_choice
    if isinstance(choice, str) or choice is None:
        return tools
    return [t for t in tools if t["function"]["name"] == choice.function.name]


def template_messages(request: ChatCompletionRequest) -> list[dict[str, Any]]:
    """The messages for the chat template, an assistant's tool_calls with their arguments as dicts
    (what templates read); arguments that are not a JSON object are a 400 naming them."""
    out = []
    for i, message in enumerate(request.messages):
        rendered = message.as_template_message()
        if message.tool_calls:
            calls = []
            for j, call in enumerate(message.tool_calls):
                param = f"messages[{i}].tool_calls[{j}].function.arguments"
                try:
                    arguments = json.loads(call.function.arguments)
                except json.JSONDecodeError as err:
                    raise ApiError(400, f"Invalid '{param}': not JSON ({err}).", param=param,
                                   code="invalid_value") from None
                if not isinstance(arguments, dict):
                    raise ApiError(400, f"Invalid '{param}': the arguments are a JSON object.", param=param,
                                   code="invalid_value")
                calls.append({"id": call.id, "type": "function",
                              "function": {"name": call.function.name, "arguments": arguments}})
            rendered["tool_calls"] = calls
        out.append(rendered)
    return out


def openai_calls(calls: list[ParsedCall], plan: ToolPlan) -> list[dict[str, Any]]:
    """Parsed calls as OpenAI tool_calls; a call of a tool that was not offered stays out."""
    offered = {tool["function"]["name"] for tool in plan.tools}
    return [call.as_openai() for call in calls if call.name in offered]


class LogprobText:
    """Token ids -> the text OpenAI shows for them (each token's bytes, decoded with replacement)."""

    def __init__(self, vocab: list[bytes]):
        self.vocab = vocab

    def _entry(self, token: int, logprob: float) -> dict[str, Any]:
        raw = self.vocab[token] if token < len(self.vocab) else b""
        return {"token": raw.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(raw)}

    def chat(self, steps: list[TokenLogprob]) -> dict[str, Any]:
        return {"content": [{**self._entry(step.token, step.logprob),
                             "top_logprobs": [self._entry(t, lp) for t, lp in step.top]} for step in steps]}

    def completion(self, steps: list[TokenLogprob]) -> dict[str, Any]:
        tokens, offsets, at = [], [], 0
        for step in steps:
            text = self._entry(step.token, step.logprob)["token"]
            tokens.append(text)
            offsets.append(at)
            at += len(text)
        return {"tokens": tokens, "token_logprobs": [step.logprob for step in steps],
                "top_logprobs": [{self._entry(t, lp)["token"]: lp for t, lp in step.top} for step in steps],
                "text_offset": offsets}
