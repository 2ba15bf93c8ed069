"""The ASGI app: OpenAI's /v1/models, /v1/chat/completions and /v1/completions (or, for an
embedding model, /v1/embeddings: embeddings.py), /health (with the slots), /metrics (Prometheus
text: metrics.py), and the chat page at /, on Starlette.
Streaming answers are server-sent events; a client that disconnects (mid-stream, or while
waiting for a whole answer) cancels its job."""
from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import os
import time
import uuid
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, TypeVar

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from ..errors import ConfigError
from ..llm.llm import Llm
from ..llm.sampler import Sampler
from . import embeddings as embed
from .errors import SERVER_ERROR, ApiError, error_body, refused_as_bad_request
from .sampling import sampler_overrides
from .schemas import (ChatCompletionRequest, ChatFormat, CompletionFormat, CompletionRequest, EmbeddingRequest,
                      SamplingRequest, parse_json, usage, validate)
from .structured import LogprobText, RequestPlan, openai_calls, plan_request, template_messages
from .batch_worker import BatchWorker
from .metrics import render as render_metrics
from .worker import ChoiceEnd, Generation, Job, Outcome, QueueFull, Worker

log = logging.getLogger(__name__)

STATIC = Path(__file__).with_name("static")
MAX_BODY_BYTES = 1 << 20


class ModelService:
    """The served model: its name, its limits, and the worker in front of it."""

    def __init__(self, llm: Llm, worker: Worker, model_id: str, default_max_tokens: int | None):
        self.llm, self.worker, self.model_id = llm, worker, model_id
        self.context_length = llm.config.max_all_tokens
        self.default_max_tokens = default_max_tokens or llm.config.max_new_tokens
        self.created = int(os.path.getmtime(llm.config.llm_model))
        self._logprob_text: LogprobText | None = None

    @property
    def logprob_text(self) -> LogprobText:
        if self._logprob_text is None:
            from ..llm.token_bytes import token_bytes
            self._logprob_text = LogprobText(token_bytes(self.llm.tokenizer))
        return self._logprob_text

    def plan(self, request: SamplingRequest) -> RequestPlan:
        return plan_request(request, str(self.llm.config.jinja.get("chat_template") or ""))

    def model_card(self) -> dict[str, Any]:
        return {"id": self.model_id, "object": "model", "created": self.created, "owned_by": "mnnllm",
                "backend": self.llm.runtime_manager.config.backend_type, "context_length": self.context_length}

    def chat_prompt(self, request: ChatCompletionRequest, plan: RequestPlan) -> list[int]:
        messages = template_messages(request)
        with refused_as_bad_request("messages"):  # the template refuses the conversation, or its text
            return self._encode(self.llm.apply_chat_template(messages, tools=plan.render_tools))

    def _encode(self, text: str) -> list[int]:
        """Text as text: a client's <img>PATH</img> never makes a vision model (Omni) read a server file."""
        return self.llm.tokenizer.encode(text)

    def completion_prompt(self, request: CompletionRequest) -> list[int]:
        prompt = request.prompt
        if isinstance(prompt, list):
            return list(prompt)
        with refused_as_bad_request("prompt"):
            return self._encode(prompt)

    def generation(self, request: SamplingRequest, prompt_ids: list[int], prompt_field: str,
                   plan: RequestPlan | None = None) -> Generation:
        """The job a validated request asks for, or a 400 when it does not fit the model."""
        limit, prompt = self.context_length, len(prompt_ids)
        if not prompt_ids:
            raise ApiError(400, "The prompt encodes to no tokens.", param=prompt_field, code="invalid_value")
        if prompt >= limit:
            raise ApiError(400, f"This model's maximum context length is {limit} tokens. However, your prompt has "
                                f"{prompt} tokens. Please shorten it.", param=prompt_field,
                           code="context_length_exceeded")
        asked, field = request.completion_budget, request.budget_field
        if asked is not None and asked >= limit:
            raise ApiError(400, f"{field} is too large: {asked}. This model supports at most {limit - 1} completion "
                                f"tokens, whereas you provided {asked}.", param=field, code="invalid_value")
        if asked is not None and prompt + asked > limit:
            raise ApiError(400, f"This model's maximum context length is {limit} tokens. However, you requested "
                                f"{prompt + asked} tokens ({prompt} in the prompt, {asked} in the completion). "
                                f"Please reduce the prompt or the completion length.", param=field,
                           code="context_length_exceeded")
        self._check_token_ids(prompt_ids, prompt_field)
        self._check_token_ids([int(t) for t in request.logit_bias or {}], "logit_bias")
        budget = asked if asked is not None else min(self.default_max_tokens, limit - prompt)
        sampler = self._sampler(request)
        return Generation(prompt_ids, budget, sampler, tuple(request.stop or ()), request.n,
                          self._choice_sampler(request, sampler, plan or RequestPlan()))

    def _choice_sampler(self, request: SamplingRequest, sampler: Sampler | None, plan: RequestPlan):
        """Per choice: its own seed (seed + index) when there are several; the plan's constraint and
        logprobs on top. None when one plain sampler serves every choice."""
        guided = plan.constraint is not None or plan.top_logprobs is not None
        if not guided and (request.n == 1 or request.seed is None):
            return None

        def build(index: int):
            chosen = sampler
            if index and request.seed is not None:
                overrides = sampler_overrides(request, self.llm.sampler.config) or {}
                chosen = self.llm.make_sampler({**overrides, "seed": request.seed + index})
            if not guided:
                return chosen
            return self.llm.guide(plan.constraint, None, plan.top_logprobs, chosen)
        return build

    def _check_token_ids(self, ids: list[int], field: str) -> None:
        vocab = self.llm.tokenizer.vocab_size
        if ids and max(ids) >= vocab:
            raise ApiError(400, f"{field} names token id {max(ids)}, beyond the vocabulary ({vocab} tokens).",
                           param=field, code="invalid_value")

    def _sampler(self, request: SamplingRequest) -> Sampler | None:
        overrides = sampler_overrides(request, self.llm.sampler.config)
        if overrides is None:
            return None
        try:
            return self.llm.make_sampler(overrides)
        except ConfigError as err:
            raise ApiError(400, str(err), param=err.field, code="invalid_value") from None


async def _read_json(request: Request) -> Any:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise _too_large()
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise _too_large()
    return parse_json(bytes(body))


def _too_large() -> ApiError:
    return ApiError(413, f"The request body is larger than {MAX_BODY_BYTES} bytes.", code="request_too_large")


def _sse(data: dict[str, Any] | str) -> str:
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"data: {text}\n\n"


class EventStream(StreamingResponse):
    """Server-sent events of one job; however the response ends (done, or the client gone,
    which Starlette sees as a disconnect and answers by cancelling the stream), the job is
    cancelled, which is a no-op for a finished one."""

    def __init__(self, job: Job, events: AsyncIterator[str]):
        super().__init__(events, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.job = job

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.job.cancel()


async def _answer(request: Request, service: ModelService, body: SamplingRequest, prompt_ids: list[int],
                  prompt_field: str, fmt_class: type[ChatFormat], plan: RequestPlan) -> Response:
    generation = service.generation(body, prompt_ids, prompt_field, plan)
    job = _submit(service, Job(f"{fmt_class.id_prefix}{uuid.uuid4().hex[:24]}", generation))
    log.info("%s: queued (%d prompt tokens, up to %d new, stream %s)", job.id, len(prompt_ids),
             generation.max_tokens, body.stream)
    fmt = fmt_class(job.id, int(time.time()), service.model_id)
    answer = _Answer(service, fmt, plan)
    if body.stream:
        return EventStream(job, _stream(job, answer, body.include_usage))
    return await _whole(request, job, answer)


def _submit(service: ModelService, job: Job) -> Job:
    try:
        service.worker.submit(job)
    except QueueFull as err:
        raise ApiError(503, f"{err}; try again later.", code="queue_full", kind=SERVER_ERROR,
                       headers={"Retry-After": "1"}) from None
    return job


class _Answer:
    """Turns a job's per-choice text and ends into choices: tool calls parsed out of the text
    (streamed: text before a call at once, the calls as deltas at the end), logprobs attached."""

    def __init__(self, service: ModelService, fmt: ChatFormat, plan: RequestPlan):
        self.service, self.fmt, self.plan = service, fmt, plan
        self.streams: dict[int, Any] = {}

    def _logprobs(self, end: ChoiceEnd) -> dict | None:
        if end.logprobs is None:
            return None
        text = self.service.logprob_text
        return text.completion(end.logprobs) if isinstance(self.fmt, CompletionFormat) else text.chat(end.logprobs)

    def _calls(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        stream = self.plan.tool_stream()
        if stream is None:
            return text, []
        stream.feed(text)
        content, calls = stream.finish()
        calls = openai_calls(calls, self.plan.tools)
        return (content if calls else text), calls

    def whole(self, index: int, text: str, end: ChoiceEnd) -> dict[str, Any]:
        content, calls = self._calls(text)
        finish = "tool_calls" if calls else end.finish_reason
        return self.fmt.choice(index, content if (content or not calls) else None, finish, self._logprobs(end),
                               calls or None)

    def opening(self, index: int) -> list[dict[str, Any]]:
        self.streams[index] = self.plan.tool_stream()
        return self.fmt.opening(index)

    def piece(self, index: int, text: str) -> list[dict[str, Any]]:
        stream = self.streams.get(index)
        shown = text if stream is None else stream.feed(text)
        return [self.fmt.piece(shown, index)] if shown else []

    def closing(self, end: ChoiceEnd) -> list[dict[str, Any]]:
        chunks, finish = [], end.finish_reason
        stream = self.streams.get(end.index)
        if stream is not None:
            rest, calls = stream.finish()
            calls = openai_calls(calls, self.plan.tools)
            if rest:
                chunks.append(self.fmt.piece(rest, end.index))
            if calls:
                chunks.append(self.fmt.tool_calls(calls, end.index))
                finish = "tool_calls"
        chunks.append(self.fmt.closing(finish, end.index, self._logprobs(end)))
        return chunks


async def _stream(job: Job, answer: _Answer, include_usage: bool) -> AsyncIterator[str]:
    opened: set[int] = set()

    def open_choice(index: int) -> list[dict[str, Any]]:
        if index in opened:
            return []
        opened.add(index)
        return answer.opening(index)

    for chunk in open_choice(0):
        yield _sse(chunk)
    async for kind, value in job.events():
        if kind == "text":
            index, text = value
            for chunk in open_choice(index) + answer.piece(index, text):
                yield _sse(chunk)
        elif kind == "choice":
            for chunk in open_choice(value.index) + answer.closing(value):
                yield _sse(chunk)
        elif kind == "done":
            if value.finish_reason is None and value.choices == [] and 0 in opened:
                yield _sse(answer.fmt.closing(None))
            if include_usage:
                yield _sse(answer.fmt.usage_chunk(_usage(value)))
        else:
            yield _sse(error_body(f"generation failed: {value}", kind=SERVER_ERROR))
    yield _sse("[DONE]")


async def _whole(request: Request, job: Job, answer: _Answer) -> Response:
    """The whole answer; if the client disconnects first, the job is cancelled."""
    collected = await _unless_gone(request, job, _collect(job))
    if collected is None:
        return Response(status_code=499)  # nobody reads it: the client has gone
    texts, outcome = collected
    choices = [answer.whole(end.index, texts.get(end.index, ""), end) for end in outcome.choices]
    return JSONResponse(answer.fmt.response(choices, _usage(outcome)))


Result = TypeVar("Result")


async def _unless_gone(request: Request, job: Job, result: Awaitable[Result]) -> Result | None:
    """`result`, or None when the client disconnects first (the job is then cancelled)."""
    collect = asyncio.ensure_future(result)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({collect, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if not collect.done():
        job.cancel()
        collect.cancel()
        return None
    return collect.result()


async def _collect(job: Job) -> tuple[dict[int, str], Outcome]:
    pieces: dict[int, list[str]] = {}
    async for kind, value in job.events():
        if kind == "text":
            pieces.setdefault(value[0], []).append(value[1])
        elif kind == "done":
            return {index: "".join(texts) for index, texts in pieces.items()}, value
        elif kind == "error":
            raise ApiError(500, f"generation failed: {value}", kind=SERVER_ERROR)
    raise AssertionError("a job's events end with done or error")


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _usage(outcome: Outcome) -> dict[str, Any]:
    return usage(outcome.prompt_tokens, outcome.completion_tokens, outcome.cached_tokens)


class BearerAuth:
    """Requires `Authorization: Bearer KEY` on /v1/ (the page and /health stay open)."""

    def __init__(self, app: ASGIApp, api_key: str | None):
        self.app = app
        self.expected = f"Bearer {api_key}".encode() if api_key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.expected is not None and scope["type"] == "http" and scope["path"].startswith("/v1/"):
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                response = JSONResponse(error_body("Incorrect or missing API key: send Authorization: Bearer KEY.",
                                                   code="invalid_api_key"), 401,
                                        headers={"WWW-Authenticate": "Bearer"})
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(llm: Llm, *, api_key: str | None = None, queue_size: int = 8, model_id: str | None = None,
               default_max_tokens: int | None = None, parallel: int = 1) -> Starlette:
    """The server's app around a loaded Llm; its worker thread runs while the app is served.
    `parallel` > 1: that many requests decode together (batch_worker.py)."""
    worker = BatchWorker(llm, queue_size, parallel) if parallel > 1 else Worker(llm, queue_size)
    service = ModelService(llm, worker, model_id or Path(llm.config.llm_model).parent.name, default_max_tokens)

    embedding = embed.is_embedding_model(llm)

    def refuse_kind(request: Request, serves_embeddings: bool) -> None:
        if embedding != serves_embeddings:
            raise embed.not_served(request.url.path, service.model_id, embedding)

    async def chat_completions(request: Request) -> Response:
        refuse_kind(request, False)
        body = validate(ChatCompletionRequest, await _read_json(request))
        plan = await run_in_threadpool(service.plan, body)  # compiling a grammar may take a moment
        prompt_ids = await run_in_threadpool(service.chat_prompt, body, plan)  # nor may a long prompt stall streams
        return await _answer(request, service, body, prompt_ids, "messages", ChatFormat, plan)

    async def completions(request: Request) -> Response:
        refuse_kind(request, False)
        body = validate(CompletionRequest, await _read_json(request))
        plan = await run_in_threadpool(service.plan, body)
        prompt_ids = await run_in_threadpool(service.completion_prompt, body)
        return await _answer(request, service, body, prompt_ids, "prompt", CompletionFormat, plan)

    async def embeddings(request: Request) -> Response:
        refuse_kind(request, True)
        body = validate(EmbeddingRequest, await _read_json(request))
        embed.check_dimensions(llm, body)
        ids = await run_in_threadpool(embed.input_ids, llm, body)  # tokenizing many texts takes a moment
        job = _submit(service, Job(f"embd-{uuid.uuid4().hex[:24]}", embed.embedding_task(ids)))
        collected = await _unless_gone(request, job, _collect(job))
        if collected is None:
            return Response(status_code=499)
        return JSONResponse(embed.response(collected[1], ids, body.encoding_format, service.model_id))

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [service.model_card()]})

    async def model(request: Request) -> Response:
        if request.path_params["model"] != service.model_id:
            raise ApiError(404, f"The model '{request.path_params['model']}' does not exist; this server serves "
                                f"'{service.model_id}'.", param="model", code="model_not_found")
        return JSONResponse(service.model_card())

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "model": service.model_id, **worker.status()})

    async def metrics(request: Request) -> Response:
        return Response(render_metrics(worker.status(), worker.throughput, service.model_id),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    async def page(request: Request) -> Response:
        return FileResponse(STATIC / "index.html")

    async def favicon(request: Request) -> Response:  # browsers ask for /favicon.ico whatever the page says
        return FileResponse(STATIC / "favicon.svg", media_type="image/svg+xml")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        worker.start()
        try:
            yield
        finally:
            worker.stop()

    app = Starlette(
        routes=[Route("/", page), Route("/favicon.ico", favicon), Mount("/static", StaticFiles(directory=STATIC), name="static"),
                Route("/health", health), Route("/metrics", metrics), Route("/v1/models", models), Route("/v1/models/{model:path}", model),
                Route("/v1/chat/completions", chat_completions, methods=["POST"]),
                Route("/v1/completions", completions, methods=["POST"]),
                Route("/v1/embeddings", embeddings, methods=["POST"])],
        middleware=[Middleware(BearerAuth, api_key=api_key)],
        exception_handlers={ApiError: _api_error, HTTPException: _http_error, Exception: _server_error},
        lifespan=lifespan)
    app.state.service = service
    return app


async def _api_error(request: Request, err: ApiError) -> Response:
    log.info("%s %s -> %d %s", request.method, request.url.path, err.status, err.message)
    return JSONResponse(err.body(), err.status, headers=err.headers)


async def _http_error(request: Request, err: HTTPException) -> Response:
    return JSONResponse(error_body(f"{request.method} {request.url.path}: {err.detail}"), err.status_code,
                        headers=err.headers)


async def _server_error(request: Request, err: Exception) -> Response:
    log.exception("%s %s failed", request.method, request.url.path)
    return JSONResponse(error_body(f"internal error: {err}", kind=SERVER_ERROR), 500)
