"""The checks of what callers pass to the public API (`create`, and the public methods of Llm,
Omni and Embedding): each helper takes a value and the argument's name and returns it in the
form the engine uses, or raises ArgumentError naming the argument, before anything changes, so
a bad call leaves the Llm as it was. A method calls one helper per argument, in one line.

What is checked here is the type and the shape; what only the model knows (a token id inside
the vocabulary, a template that refuses a role) is checked where the model is.
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Set
from typing import Any, Sequence

import numpy as np

from ..errors import ArgumentError, NotLoadedError, shorten

MESSAGES_FORM = ("a str, or a list of messages: {'role': str, 'content': str or a list of parts}, "
                 "or (role, content) pairs")


def _got(value: Any) -> str:
    """The value as an error quotes it: its type, and a short repr of a scalar."""
    if value is None or isinstance(value, (bool, int, float, np.integer, np.floating)):
        return shorten(repr(value), 40)
    return type(value).__name__


def _refuse(field: str, wanted: str, value: Any) -> ArgumentError:
    return ArgumentError(f"{field} must be {wanted}, got {_got(value)}", field=field)


def text(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise _refuse(field, "a str", value)
    return value


def texts(value: Any, field: str) -> list[str]:
    """A sequence of str (not one str, which would be its characters)."""
    if isinstance(value, (str, bytes, bytearray, Mapping, Set)) or not isinstance(value, Sequence):
        raise _refuse(field, "a list of str", value)
    return [text(item, f"{field}[{i}]") for i, item in enumerate(value)]


def flag(value: Any, field: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise _refuse(field, "True or False", value)
    return bool(value)


def optional_flag(value: Any, field: str) -> bool | None:
    return None if value is None else flag(value, field)


def _is_token(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def token_ids(value: Any, field: str = "input_ids", plural: str = "token ids") -> list[int]:
    """A sequence of int token ids (list, tuple, range, 1-D integer array) as a list of int;
    the vocabulary's bounds are the tokenizer's to check."""
    if isinstance(value, np.ndarray):
        if value.ndim != 1 or not np.issubdtype(value.dtype, np.integer):
            raise ArgumentError(f"{field} must be a 1-D array of integer {plural}, got "
                                f"{value.ndim}-D {value.dtype}", field=field)
        return [int(t) for t in value]
    if isinstance(value, (str, bytes, bytearray, Mapping, Set)) or not isinstance(value, Sequence):
        raise _refuse(field, f"a list of int {plural}", value)
    ids = list(value)
    for i, token in enumerate(ids):
        if not _is_token(token):
            raise _refuse(f"{field}[{i}]", "an int", token)
    return [int(t) for t in ids]


def token_id_or_ids(value: Any, field: str = "ids") -> int | list[int]:
    """One token id (an int) or a sequence of them."""
    return int(value) if _is_token(value) else token_ids(value, field)


def optional_indices(value: Any, field: str) -> list[int] | None:
    """None, or a sequence of int indices (forward's `parents`)."""
    return None if value is None else token_ids(value, field, "indices")


def messages(value: Any, field: str = "prompt") -> str | list:
    """A prompt: a str, or a list of chat messages, each a mapping with a str "role" and a
    "content" that is a str or a list of parts (mappings: {"type": "text", "text"},
    {"type": "image", "image", ...}), or a (role, content) pair of str. Other keys of a
    message reach the chat template unchanged."""
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray, Mapping, Set)) or not isinstance(value, Sequence):
        raise _refuse(field, MESSAGES_FORM, value)
    chat = list(value)
    for i, message in enumerate(chat):
        _message(message, f"{field}[{i}]")
    return [_as_system(message) for message in chat]


def _as_system(message: Any) -> Any:
    """"developer" is OpenAI's new name for "system": the template sees "system", as the server does."""
    if isinstance(message, tuple):
        return ("system", message[1]) if message[0] == "developer" else message
    return {**message, "role": "system"} if message["role"] == "developer" else message


CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")  # the server's too (serve/schemas.py)


def _role(value: Any, field: str) -> None:
    if text(value, field) not in CHAT_ROLES:
        raise ArgumentError(f"{field} must be one of {', '.join(CHAT_ROLES)}, got {value[:40]!r}", field=field)


def _message(message: Any, field: str) -> None:
    if isinstance(message, tuple):
        if len(message) != 2:
            raise ArgumentError(f"{field} must be a (role, content) pair, got {len(message)} items", field=field)
        _role(message[0], f"{field}[0]")
        text(message[1], f"{field}[1]")
        return
    if not isinstance(message, Mapping):
        raise _refuse(field, "a message: {'role': str, 'content': ...}", message)
    for key in ("role", "content"):
        if key not in message:
            raise ArgumentError(f"{field} has no '{key}': a message is {{'role': str, 'content': ...}}",
                                field=f"{field}.{key}")
    _role(message["role"], f"{field}.role")
    content = message["content"]
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise _refuse(f"{field}.content", "a str or a list of parts", content)
    for j, part in enumerate(content):
        if not isinstance(part, Mapping):
            raise _refuse(f"{field}.content[{j}]", "a part: {'type': 'text', 'text': str} or an image part", part)


def mapping(value: Any, field: str) -> Mapping:
    if not isinstance(value, Mapping):
        raise _refuse(field, "a dict", value)
    return value


def optional_mapping(value: Any, field: str) -> Mapping | None:
    return None if value is None else mapping(value, field)


def optional_mappings(value: Any, field: str) -> list[Mapping] | None:
    """None, or a list of dicts (e.g. OpenAI tool objects)."""
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or not all(isinstance(item, Mapping) for item in value):
        raise _refuse(field, "a list of dicts", value)
    return list(value)


def path(value: Any, field: str) -> str | os.PathLike:
    if not isinstance(value, (str, os.PathLike)):
        raise _refuse(field, "a path (str or os.PathLike)", value)
    return value


def instance(value: Any, kinds: type | tuple[type, ...], field: str, optional: bool = True) -> Any:
    """`value` when it is one of `kinds` (or None, when optional)."""
    if (value is None and optional) or isinstance(value, kinds):
        return value
    names = " or ".join(k.__name__ for k in (kinds if isinstance(kinds, tuple) else (kinds,)))
    raise _refuse(field, f"a {names}" + (" or None" if optional else ""), value)


def require_loaded(llm: Any, call: str) -> None:
    """A call that needs the loaded model, made before load() (or after a load that failed)."""
    if llm.module is None:
        raise NotLoadedError(f"the model is not loaded: call load() before {call}", field="load")

