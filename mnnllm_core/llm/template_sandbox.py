"""jinja2's immutable sandbox with bounds on what a chat template may cost.

The sandbox stops a template from reaching Python's internals, not from asking for a
gigabyte (`'A' * 10**9`, `'x'|center(10**9)`, `'{:>999999999}'.format(1)`) or looping for
ever (nested `range(100000)`). Here every string or list an operator builds is checked
before it is built, every number passed to a call or a filter is bounded, wide format
specifications are refused, the rendered text is bounded, and rendering has a deadline
(checked on every line the template runs). Any of these is a `TemplateLimit`.
"""
from __future__ import annotations

import functools
import re
import sys
import time
from typing import Any, Callable, Iterator

from jinja2.sandbox import ImmutableSandboxedEnvironment

MAX_ITEMS = 1 << 20  # characters of one string (items of one list) a template may build
MAX_SECONDS = 5.0  # to render one prompt: real templates take milliseconds

_WIDE_PERCENT = re.compile(r"%[-+ #0]*(\*|\d{7,})")
_WIDE_FORMAT = re.compile(r"\{[^{}]*:[^{}]*\d{7,}[^{}]*\}")


class TemplateLimit(Exception):
    """A template asked for more than the bounds allow."""


def _size(value: Any) -> int | None:
    return len(value) if isinstance(value, (str, list, tuple)) else None


def _check_number(value: Any) -> None:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_ITEMS:
        raise TemplateLimit(f"the number {value} is beyond the template's bound of {MAX_ITEMS}")


def _check_binop(op: str, left: Any, right: Any) -> None:
    if op == "*":
        sequence, count = (left, right) if _size(left) is not None else (right, left)
        if _size(sequence) is not None and isinstance(count, int) and _size(sequence) * count > MAX_ITEMS:
            raise TemplateLimit(f"'*' would build {_size(sequence) * count} items (the bound is {MAX_ITEMS})")
    elif op == "+":
        if _size(left) is not None and _size(right) is not None and _size(left) + _size(right) > MAX_ITEMS:
            raise TemplateLimit(f"'+' would build {_size(left) + _size(right)} items (the bound is {MAX_ITEMS})")
    elif op == "**":
        if isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 64:
            raise TemplateLimit(f"'**' with exponent {right} (the bound is 64)")
    elif op == "%" and isinstance(left, str):
        if _WIDE_PERCENT.search(left):
            raise TemplateLimit("a '%' format with a width of a million or more, or a '*' width")


def _check_replace(text: str, args: tuple) -> None:
    if len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        grown = len(text) + text.count(args[0]) * (len(args[1]) - len(args[0])) if args[0] else \
            len(text) + (len(text) + 1) * len(args[1])
        if grown > MAX_ITEMS:
            raise TemplateLimit(f"replace would build {grown} characters (the bound is {MAX_ITEMS})")


def _bounded_filter(name: str, function: Callable) -> Callable:
    @functools.wraps(function)  # keeps jinja's pass_context/pass_eval_context marks
    def bounded(*args, **kwargs):
        for value in (*args, *kwargs.values()):
            _check_number(value)
        if name == "replace":
            text = next((a for a in args if isinstance(a, str)), "")
            _check_replace(text, tuple(a for a in args if isinstance(a, str))[1:])
        return function(*args, **kwargs)
    return bounded


class BoundedSandbox(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "+", "**", "%"})

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.filters = {name: _bounded_filter(name, f) for name, f in self.filters.items()}

    def call_binop(self, context, op: str, left: Any, right: Any) -> Any:
        _check_binop(op, left, right)
        return super().call_binop(context, op, left, right)

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja's own signature)
        for value in (*args, *kwargs.values()):
            _check_number(value)
        if getattr(__obj, "__name__", "") == "replace" and isinstance(getattr(__obj, "__self__", None), str):
            _check_replace(__obj.__self__, args)
        return super().call(__context, __obj, *args, **kwargs)

    def wrap_str_format(self, value: Any):
        wrapped = super().wrap_str_format(value)
        if wrapped is not None and _WIDE_FORMAT.search(value.__self__):
            raise TemplateLimit("a format specification with a width of a million or more")
        return wrapped


def render_bounded(chunks: Iterator[str], max_chars: int, seconds: float | None = None) -> str:
    """Join a template's output (`template.generate(...)`, not yet started), at most `max_chars`
    characters, within `seconds` (MAX_SECONDS): a deadline checked on every line of the template."""
    seconds = MAX_SECONDS if seconds is None else seconds
    deadline = time.monotonic() + seconds

    def on_line(frame, event, arg):
        if time.monotonic() > deadline:
            raise TemplateLimit(f"rendering took longer than {seconds:g} s")
        return on_line

    def on_call(frame, event, arg):
        return on_line if frame.f_code.co_filename == "<template>" else None

    previous = sys.gettrace()
    sys.settrace(on_call)
    try:
        out, total = [], 0
        for chunk in chunks:
            total += len(chunk)
            if total > max_chars:
                raise TemplateLimit(f"the rendered prompt passed {max_chars} characters")
            out.append(chunk)
        return "".join(out)
    finally:
        sys.settrace(previous)
        close = getattr(chunks, "close", None)
        if close is not None:
            close()

