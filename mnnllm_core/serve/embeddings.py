"""OpenAI's /v1/embeddings on an embedding model (MNN's Embedding, llm/text_embedding.py).

A string is embedded as `txt_embedding` embeds it (the chat template, e.g. [CLS] ... [SEP], then
the tokens); token ids are embedded as given, as `ids_embedding` does (no template: send the ids
the template's text encodes to for the same vector). Each input is one forward; the request runs
on the worker in turn with the others and stops between inputs when its client leaves. Vectors
are the model's pooled, L2-normalized float32 rows, sent as JSON numbers or, with
encoding_format "base64", as their little-endian float32 bytes in base64 (what OpenAI's client
decodes). `dimensions` must be the model's: truncating a vector (and normalizing it again) is
right only for models trained for it (Matryoshka), which the config does not say.
"""
from __future__ import annotations

import base64
from typing import Any, Callable

import numpy as np

from ..errors import ContextLengthError
from ..llm.llm import Llm
from ..llm.text_embedding import Embedding
from .errors import ApiError, refused_as_bad_request
from .schemas import EmbeddingRequest
from .worker import Task

MAX_INPUTS = 2048  # OpenAI's bound on the inputs of one request


def is_embedding_model(llm: Llm) -> bool:
    return isinstance(llm, Embedding)


def not_served(path: str, model_id: str, embedding: bool) -> ApiError:
    """The endpoint the served model's kind does not answer: a 404 on `model`, as OpenAI answers
    a chat request for a model that is not a chat model."""
    if embedding:
        message = (f"The served model '{model_id}' is an embedding model: it answers /v1/embeddings, "
                   f"not {path}.")
    else:
        message = (f"The served model '{model_id}' is not an embedding model: it answers /v1/chat/completions "
                   f"and /v1/completions, not {path}. Serve an embedding model for embeddings.")
    return ApiError(404, message, param="model", code="model_not_supported")


def input_ids(model: Embedding, request: EmbeddingRequest) -> list[list[int]]:
    """Each input's token ids (strings through the chat template), or a 400 naming the input."""
    given = request.input
    if isinstance(given, str):
        return [_text_ids(model, given, "input")]
    if not given:
        raise ApiError(400, "input must not be empty: give a string, strings, or token ids.", param="input",
                       code="invalid_value")
    if isinstance(given[0], int):  # one list of token ids
        return [_checked_ids(model, list(given), "input")]
    if len(given) > MAX_INPUTS:
        raise ApiError(400, f"input has {len(given)} items; at most {MAX_INPUTS} are embedded per request.",
                       param="input", code="invalid_value")
    return [_text_ids(model, item, f"input[{i}]") if isinstance(item, str) else
            _checked_ids(model, item, f"input[{i}]") for i, item in enumerate(given)]


def check_dimensions(model: Embedding, request: EmbeddingRequest) -> None:
    if request.dimensions is not None and request.dimensions != model.dim():
        raise ApiError(400, f"dimensions must be this model's, {model.dim()}, or left out (got {request.dimensions}): "
                            f"its vectors are not truncated.", param="dimensions", code="invalid_value")


def _text_ids(model: Embedding, text: str, param: str) -> list[int]:
    if not text:  # OpenAI refuses an empty string; whitespace is a text like any other
        raise ApiError(400, f"{param} is an empty string; it must have at least one character.", param=param,
                       code="invalid_value")
    with refused_as_bad_request(param):  # text the tokenizer refuses (e.g. a lone surrogate)
        try:
            ids = model.text_ids(text)
        except ContextLengthError:
            raise _too_long(model, param, None) from None
    return _checked_ids(model, ids, param)


def _checked_ids(model: Embedding, ids: list[int], param: str) -> list[int]:
    if not ids:
        raise ApiError(400, f"{param} has no tokens; an embedding needs at least one.", param=param,
                       code="invalid_value")
    vocab = model.tokenizer.vocab_size
    bad = next((t for t in ids if not 0 <= t < vocab), None)
    if bad is not None:
        raise ApiError(400, f"{param} names token id {bad}, outside the vocabulary (ids 0 to {vocab - 1}).",
                       param=param, code="invalid_value")
    if len(ids) > model.config.max_all_tokens:
        raise _too_long(model, param, len(ids))
    return ids


def _too_long(model: Embedding, param: str, tokens: int | None) -> ApiError:
    limit = model.config.max_all_tokens
    has = f"{tokens} tokens" if tokens is not None else "more tokens"
    return ApiError(400, f"This model's maximum context length is {limit} tokens; {param} has {has}. "
                         f"Please shorten it.", param=param, code="context_length_exceeded")


def embedding_task(ids: list[list[int]]) -> Task:
    """The worker's work: one forward per input, in order; None when the client has gone."""
    def run(model: Llm, cancelled: Callable[[], bool]) -> list[np.ndarray] | None:
        rows = []
        for one in ids:
            if cancelled():
                return None
            rows.append(model.ids_embedding(one)[0])
        return rows
    return Task(run, f"{len(ids)} embedding{'s' if len(ids) != 1 else ''}")


def response(rows: list[np.ndarray], ids: list[list[int]], encoding_format: str, model_id: str) -> dict[str, Any]:
    tokens = sum(len(one) for one in ids)
    return {"object": "list", "model": model_id,
            "data": [{"object": "embedding", "index": i, "embedding": _encoded(row, encoding_format)}
                     for i, row in enumerate(rows)],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def _encoded(row: np.ndarray, encoding_format: str) -> list[float] | str:
    row = np.asarray(row, "<f4")
    if encoding_format == "base64":
        return base64.b64encode(row.tobytes()).decode("ascii")
    return row.tolist()
