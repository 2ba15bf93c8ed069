"""Errors answered in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

from ..errors import MnnllmError

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"


class ApiError(MnnllmError):
    """A request the server refuses, with the HTTP status and OpenAI's error fields."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 kind: str = INVALID_REQUEST, headers: dict[str, str] | None = None):
        super().__init__(message, field=param)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.message, kind=self.kind, param=self.param, code=self.code)


@contextmanager
def refused_as_bad_request(param: str) -> Iterator[None]:
    """What the engine refuses while reading the request's own content (a template that refuses
    the conversation, text that is not valid Unicode) is the client's fault: a 400 on `param`."""
    try:
        yield
    except ApiError:
        raise
    except MnnllmError as err:
        raise ApiError(400, str(err), param=param, code="invalid_value") from None


def error_body(message: str, *, kind: str = INVALID_REQUEST, param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
