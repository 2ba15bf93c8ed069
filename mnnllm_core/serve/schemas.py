"""OpenAI's wire format for what mnnllm serves: the request bodies, validated as strictly as
OpenAI does (a string where a number belongs is an error, not a conversion; an unknown field
is an error), and the response, chunk and usage objects."""
from __future__ import annotations

import json
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .errors import ApiError
from .format_schemas import FIELD_NAMES as FORMAT_FIELD_NAMES
from .format_schemas import MAX_TOOLS, NamedToolChoice, ResponseFormat, Tool, ToolCall

MAX_STOP_SEQUENCES = 4
MAX_TOKEN_DIGITS = 12  # a logit_bias key is a token id: ASCII digits, no vocabulary is larger
MAX_CHOICES = 8  # n: the choices run one after another on the one model
MAX_TOP_LOGPROBS = 20


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's calls
    tool_call_id: str | None = None  # a tool's answer: to which call

    def as_template_message(self) -> dict[str, Any]:
        """{role, content} for the chat template; "developer" is OpenAI's new name for system.
        An assistant's tool_calls and a tool message's tool_call_id go along (tools.py)."""
        content = self.content or ""
        text = content if isinstance(content, str) else "".join(p.text for p in content)
        message: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role, "content": text}
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        if self.name is not None and self.role == "tool":
            message["name"] = self.name
        return message


class StreamOptions(_Strict):
    include_usage: bool = False


class SamplingRequest(_Strict):
    """The fields both endpoints share. top_k, min_p and repetition_penalty are not OpenAI's
    but llama.cpp's and vLLM's servers take them too; they map to MNN's sampler keys."""

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0, le=1)
    presence_penalty: float | None = Field(None, ge=0, le=2)
    frequency_penalty: float | None = Field(None, ge=0, le=2)
    repetition_penalty: float | None = Field(None, gt=0, le=10)
    seed: int | None = Field(None, ge=0, lt=2 ** 64)
    logit_bias: dict[str, float] | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=MAX_CHOICES)
    user: str | None = None
    response_format: ResponseFormat | None = None
    grammar: str | None = None  # llama.cpp's server: GBNF (or Lark) the output must match
    json_schema: dict[str, Any] | None = None  # llama.cpp's server: a schema the output must match

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, value: str | list[str] | None) -> list[str]:
        stops = [value] if isinstance(value, str) else list(value or [])
        if len(stops) > MAX_STOP_SEQUENCES or any(not s for s in stops):
            raise ValueError(f"stop takes up to {MAX_STOP_SEQUENCES} non-empty strings")
        return stops

    @field_validator("logit_bias")
    @classmethod
    def _bias_by_token_id(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        for token, bias in (value or {}).items():
            if not (token.isascii() and token.isdigit() and len(token) <= MAX_TOKEN_DIGITS) or not -100 <= bias <= 100:
                raise ValueError("logit_bias maps token ids to biases in [-100, 100]")
        return value

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def completion_budget(self) -> int | None:
        return self.max_tokens

    @property
    def budget_field(self) -> str:
        return "max_tokens"


class ChatCompletionRequest(SamplingRequest):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[Tool] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None

    @property
    def top_logprobs_asked(self) -> int | None:
        """How many alternatives per token, or None when no logprobs are asked for."""
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def completion_budget(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def budget_field(self) -> str:
        return "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"


class CompletionRequest(SamplingRequest):
    prompt: str | list[int] | list[str]
    logprobs: int | None = Field(None, ge=0, le=5)  # the legacy endpoint's: how many alternatives

    @property
    def top_logprobs_asked(self) -> int | None:
        return self.logprobs

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value: str | list[int] | list[str]) -> str | list[int]:
        if isinstance(value, list) and value and isinstance(value[0], str):
            if len(value) != 1:
                raise ValueError("only one prompt per request is served")
            return value[0]
        if isinstance(value, list) and any(t < 0 for t in value):
            raise ValueError("token ids must be >= 0")
        return value


class EmbeddingRequest(_Strict):
    """/v1/embeddings: a text, texts, token ids, or lists of token ids (embeddings.py checks their
    content against the model)."""

    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = None

    @field_validator("input", mode="wrap")
    @classmethod
    def _input_shape(cls, value: Any, check: Any) -> str | list[str] | list[int] | list[list[int]]:
        try:
            return check(value)
        except ValidationError:  # pydantic names only the union's first member; say what input may be
            raise ValueError("input is a string, a list of strings, a list of token ids (integers) or a list of "
                             "lists of token ids") from None


Request = TypeVar("Request", bound=BaseModel)

_FIELD_NAMES = frozenset(name for model in (ChatCompletionRequest, CompletionRequest, Message, TextPart,
                                            StreamOptions, EmbeddingRequest)
                         for name in model.model_fields) | FORMAT_FIELD_NAMES


def parse_json(body: bytes) -> Any:
    """The request body as JSON; NaN and Infinity are not JSON and are refused."""
    def refuse(constant: str) -> Any:
        raise ValueError(f"{constant} is not valid JSON")
    try:
        return json.loads(body, parse_constant=refuse)
    except (ValueError, UnicodeDecodeError) as err:
        raise ApiError(400, f"We could not parse the JSON body of your request: {err}",
                       code="invalid_json") from None
    except RecursionError:  # arrays or objects nested thousands deep: no request needs more than a few
        raise ApiError(400, "We could not parse the JSON body of your request: it is nested too deeply.",
                       code="invalid_json") from None


def validate(model: type[Request], data: Any) -> Request:
    """`data` as `model`, or an ApiError naming the first bad field as OpenAI does."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise _as_api_error(err.errors(include_url=False)[0]) from None


def _as_api_error(error: dict[str, Any]) -> ApiError:
    kind, loc = error["type"], error["loc"]
    if kind == "extra_forbidden":
        return ApiError(400, f"Unrecognized request argument supplied: {_param(loc, keep_last=True)}",
                        param=_param(loc, keep_last=True), code="unknown_parameter")
    param = _param(loc)
    if kind == "missing":
        return ApiError(400, f"Missing required parameter: '{param}'.", param=param,
                        code="missing_required_parameter")
    message = error["msg"].removeprefix("Value error, ")
    code = "invalid_type" if kind.endswith("_type") else "invalid_value"
    where = f"Invalid {'type' if code == 'invalid_type' else 'value'} for '{param}': " if param else ""
    return ApiError(400, f"{where}{message}.", param=param, code=code)


def _param(loc: tuple, keep_last: bool = False) -> str | None:
    """pydantic's error location as OpenAI writes a param: messages[0].content. Union member
    tags in the location ('str', 'list[str]') are not fields and are left out."""
    text = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            text += f"[{part}]"
        elif part in _FIELD_NAMES or (keep_last and i == len(loc) - 1):
            text += f".{part}" if text else part
    return text or None


# -- responses -----------------------------------------------------------------------------

def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


class ChatFormat:
    """chat.completion and chat.completion.chunk objects of one request; `logprobs` is the
    choice's {"content": [...]} (chat) or the legacy object (completions), None when not asked."""

    id_prefix = "chatcmpl-"

    def __init__(self, request_id: str, created: int, model: str):
        self.head = {"id": request_id, "created": created, "model": model}

    def choice(self, index: int, text: str | None, finish_reason: str | None, logprobs: dict | None = None,
               tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if tool_calls:
            message["tool_calls"] = tool_calls
        return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish_reason}

    def response(self, choices: list[dict[str, Any]], usage_: dict[str, Any]) -> dict[str, Any]:
        return {**self.head, "object": "chat.completion", "choices": choices, "usage": usage_}

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None, index: int = 0,
               logprobs: dict | None = None) -> dict[str, Any]:
        return {**self.head, "object": "chat.completion.chunk",
                "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}]}

    def opening(self, index: int = 0) -> list[dict[str, Any]]:
        return [self._chunk({"role": "assistant", "content": ""}, index=index)]

    def piece(self, text: str, index: int = 0) -> dict[str, Any]:
        return self._chunk({"content": text}, index=index)

    def tool_calls(self, calls: list[dict[str, Any]], index: int = 0) -> dict[str, Any]:
        """The calls as deltas (each whole: its id, name and arguments in one piece)."""
        return self._chunk({"tool_calls": [{"index": i, **call} for i, call in enumerate(calls)]}, index=index)

    def closing(self, finish_reason: str | None, index: int = 0, logprobs: dict | None = None) -> dict[str, Any]:
        return self._chunk({}, finish_reason, index, logprobs)

    def usage_chunk(self, usage_: dict[str, Any]) -> dict[str, Any]:
        return {**self.head, "object": "chat.completion.chunk", "choices": [], "usage": usage_}


class CompletionFormat(ChatFormat):
    """text_completion objects (the legacy completions endpoint); chunks share the object name."""

    id_prefix = "cmpl-"

    def choice(self, index: int, text: str | None, finish_reason: str | None, logprobs: dict | None = None,
               tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        return {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish_reason}

    def response(self, choices: list[dict[str, Any]], usage_: dict[str, Any]) -> dict[str, Any]:
        return {**self.head, "object": "text_completion", "choices": choices, "usage": usage_}

    def _text(self, text: str, finish_reason: str | None = None, index: int = 0,
              logprobs: dict | None = None) -> dict[str, Any]:
        return {**self.head, "object": "text_completion",
                "choices": [{"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}]}

    def opening(self, index: int = 0) -> list[dict[str, Any]]:
        return []

    def piece(self, text: str, index: int = 0) -> dict[str, Any]:
        return self._text(text, index=index)

    def closing(self, finish_reason: str | None, index: int = 0, logprobs: dict | None = None) -> dict[str, Any]:
        return self._text("", finish_reason, index, logprobs)

    def usage_chunk(self, usage_: dict[str, Any]) -> dict[str, Any]:
        return {**self.head, "object": "text_completion", "choices": [], "usage": usage_}
