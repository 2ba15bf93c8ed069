"""jinja2's immutable sandbox with bounds on what a chat template may cost.

The sandbox stops a template from reaching Python's internals, not from asking for a
gigabyte (`'A' * 10**9`, `s ~ s` doubled thirty times, `'x'|center(10**9)`,
`'{:>999999999}'.format(1)`) or looping for ever (nested `range(100000)`). Here every
operation that builds a string or a list is measured before it builds (template_bounds.py):
the operators `*`, `+`, `%`, `~`, every filter and string method that builds, `join` and
`format`, the text of each `{{ }}` output and of each captured block (macros, `{% set %}`
blocks); every number passed to a call or a filter is bounded; integers are bounded in bits;
nothing is evaluated at compile time; the rendered text is bounded, and rendering has a
deadline (checked on every line the template runs). Any of these is a `TemplateLimit`.
"""
from __future__ import annotations

import functools
import sys
import time
from collections.abc import Iterator as IteratorABC, Sized
from typing import Any, Callable, Iterator

from jinja2.compiler import CodeGenerator
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import _PassArg, pass_context

from .template_bounds import (BUILDING_FILTERS, GLOBALS, MAX_INT_BITS, MAX_ITEMS, STR_METHODS, TemplateLimit,
                              bounded_items, check, check_built, check_number, estimated, format_size, percent_size,
                              render_bound, text_size)

MAX_SECONDS = 5.0  # to render one prompt: real templates take milliseconds

__all__ = ["MAX_ITEMS", "MAX_SECONDS", "BoundedSandbox", "TemplateLimit", "render_bounded"]


def _size(value: Any) -> int | None:
    return len(value) if isinstance(value, (str, list, tuple)) else None


def _check_binop(op: str, left: Any, right: Any) -> None:
    if op == "*":
        sequence, count = (left, right) if _size(left) is not None else (right, left)
        if _size(sequence) is not None and isinstance(count, int):
            check(_size(sequence) * count, "'*'")
        elif _is_int(left) and _is_int(right) and left.bit_length() + right.bit_length() > MAX_INT_BITS:
            raise TemplateLimit(f"'*' would build an integer of more than {MAX_INT_BITS} bits")
    elif op == "+":
        if _size(left) is not None and _size(right) is not None:
            check(_size(left) + _size(right), "'+'")
    elif op == "**":
        if _is_int(left) and _is_int(right) and abs(left) > 1 and right > 0 \
                and left.bit_length() * right > MAX_INT_BITS:
            raise TemplateLimit(f"'**' would build an integer of more than {MAX_INT_BITS} bits")
    elif op == "%" and isinstance(left, str):
        check(estimated(percent_size, left, right), "'%'")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _bounded_filter(name: str, function: Callable) -> Callable:
    """`function` with its arguments' numbers bounded, what it builds estimated before it runs
    (BUILDING_FILTERS) and measured after."""
    estimate = BUILDING_FILTERS.get(name)
    passed = 1 if _PassArg.from_obj(function) is not None else 0  # jinja's context, eval context or environment

    @functools.wraps(function)  # keeps jinja's pass_context/pass_eval_context marks
    def bounded(*args, **kwargs):
        for value in (*args, *kwargs.values()):
            check_number(value)
        if estimate is not None:
            if len(args) > passed and isinstance(args[passed], IteratorABC):
                args = (*args[:passed], bounded_items(args[passed]), *args[passed + 1:])
            check(estimated(estimate, *args[passed:], **kwargs), f"the filter {name!r}")
        return check_built(function(*args, **kwargs), f"the filter {name!r}")
    return bounded


def _method_size(method: Any, args: tuple, kwargs: dict) -> int:
    """At least what a str method (or a global such as lipsum) builds; 0 for other calls."""
    owner = getattr(method, "__self__", None)
    name = getattr(method, "__name__", "")
    estimate = STR_METHODS.get(name) if isinstance(owner, str) else GLOBALS.get(name)
    if estimate is None:
        return 0
    return estimated(estimate, *((owner,) if isinstance(owner, str) else ()), *args, **kwargs)


class _BoundedCodeGenerator(CodeGenerator):
    """jinja's code generator with `~` going through the environment's measured join (jinja
    writes a bare `str_join`, which no sandbox hook sees)."""

    def visit_Concat(self, node, frame) -> None:
        if frame.eval_ctx.volatile:
            join = "(markup_join if context.eval_ctx.volatile else str_join)"
        else:
            join = "markup_join" if frame.eval_ctx.autoescape else "str_join"
        self.write(f"environment.bounded_concat({join}, (")
        for argument in node.nodes:
            self.visit(argument, frame)
            self.write(", ")
        self.write("))")


@pass_context
def _finalize(context, value: Any) -> Any:
    """Each `{{ }}` output's text is measured before it is made (pass_context: never at compile time)."""
    check(text_size(value), "an output '{{ }}'")
    return value


class BoundedSandbox(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "+", "**", "%"})
    code_generator_class = _BoundedCodeGenerator

    def __init__(self, **options: Any) -> None:
        super().__init__(finalize=_finalize, optimized=False, **options)
        self.filters = _BoundedFilters(self.filters)

    @staticmethod
    def concat(parts: Any) -> str:
        """A captured block's text (a macro's, a `{% set %}` block's), measured before it is joined."""
        parts = list(parts)
        check(sum(len(part) for part in parts), "a captured block")
        return "".join(parts)

    @staticmethod
    def bounded_concat(join: Callable, items: tuple) -> str:
        """`a ~ b ~ c`: the text of all of them, measured before it is joined."""
        check(sum(text_size(item) for item in items), "'~'")
        return check_built(join(items), "'~'")

    def call_binop(self, context, op: str, left: Any, right: Any) -> Any:
        _check_binop(op, left, right)
        return check_built(super().call_binop(context, op, left, right), f"{op!r}")

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja's own signature)
        for value in (*args, *kwargs.values()):
            check_number(value)
        if isinstance(getattr(__obj, "__self__", None), str) and __obj.__name__ == "join" and args \
                and not isinstance(args[0], Sized):
            args = (bounded_items(args[0]), *args[1:])
        check(_method_size(__obj, args, kwargs), f"calling {getattr(__obj, '__name__', 'a function')!r}")
        return check_built(super().call(__context, __obj, *args, **kwargs),
                           f"calling {getattr(__obj, '__name__', 'a function')!r}")

    def wrap_str_format(self, value: Any):
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        text, is_map = value.__self__, value.__name__ == "format_map"

        def bounded_format(*args, **kwargs):
            mapping = args[0] if is_map and args else kwargs
            check(estimated(format_size, text, () if is_map else args, mapping), "str.format")
            return wrapped(*args, **kwargs)
        return bounded_format


class _BoundedFilters(dict):
    """The environment's filters: one set later (`env.filters["tojson"] = ...`) is bounded as well."""

    def __init__(self, filters: dict) -> None:
        super().__init__()
        for name, function in filters.items():
            self[name] = function

    def __setitem__(self, name: str, function: Callable) -> None:
        if not getattr(function, "_template_bounded", False):
            function = _bounded_filter(name, function)
            function._template_bounded = True
        super().__setitem__(name, function)


def render_bounded(chunks: Iterator[str], max_chars: int, seconds: float | None = None) -> str:
    """Join a template's output (`template.generate(...)`, not yet started), at most `max_chars`
    characters, within `seconds` (MAX_SECONDS): a deadline checked on every line of the template.
    `max_chars` is also the bound of each string or list the template builds on the way."""
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
        with render_bound(max_chars):
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

