"""How much a chat template's operations would build, measured before they build it.

One bound holds for every string or list a template builds (characters of a string, items of a
list): the render's own text bound (MAX_ITEMS plus four times the message contents given, set by
`render_bound`), so a template may copy what it was given but not grow it without limit. Each
estimator here returns at least the size its operation builds (string operations may build a few
times that: an escape or an upper-case, whose result is checked once built); an estimate past the
bound is a `TemplateLimit` before anything is allocated. A string's size inside a container is its
text: a list of a million references to one long string is small until it is printed.
"""
from __future__ import annotations

import itertools
import re
import string
from collections.abc import Iterator, Mapping, Sized
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Callable

from jinja2.runtime import Undefined

MAX_ITEMS = 1 << 20  # the bound without given contents: characters of a string, items of a list
MAX_INT_BITS = 4096  # an integer a template computes (the bound's text is ~1233 digits)
MAX_COPIES = 16  # `sum` of lists copies each partial list: at most this many bounds' worth of items

_BOUND: ContextVar[int] = ContextVar("template_bound", default=MAX_ITEMS)
_PERCENT_SPEC = re.compile(r"%(?:\(([^)]*)\))?[-+ #0]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?([diouxXeEfFgGcrsa%])")
_DIGITS = re.compile(r"\d+")


class TemplateLimit(Exception):
    """A template asked for more than the bounds allow."""


@contextmanager
def render_bound(items: int) -> Iterator[None]:
    """Every operation of the render inside builds at most `items` (never under MAX_ITEMS)."""
    token = _BOUND.set(max(int(items), MAX_ITEMS))
    try:
        yield
    finally:
        _BOUND.reset(token)


def bound() -> int:
    return _BOUND.get()


def check(size: int, what: str) -> None:
    limit = bound()
    if size > limit:
        raise TemplateLimit(f"{what} would build at least {size} items (the bound is {limit})")


def check_number(value: Any) -> None:
    """A number given to a call or filter (a width, a count) is at most the bound."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > bound():
        raise TemplateLimit(f"the number {value} is beyond the template's bound of {bound()}")


def check_built(value: Any, what: str) -> Any:
    """`value` (just built by `what`), when its length is within the bound."""
    if isinstance(value, (str, bytes, list, tuple, dict, set, frozenset)):
        check(len(value), what)
    return value


def estimated(estimator: Callable[..., int], *args: Any, **kwargs: Any) -> int:
    """`estimator(*args, **kwargs)`, or 0 when the arguments are ones the operation itself will
    refuse (its own error then says why); a TemplateLimit goes through."""
    try:
        return estimator(*args, **kwargs)
    except (TypeError, ValueError, LookupError, AttributeError):
        return 0


def text_size(value: Any, limit: int | None = None) -> int:
    """At least len(str(value)), without building it: a string's length, a container's items'
    sizes plus two per item; counting stops once past `limit` (the bound)."""
    limit = bound() if limit is None else limit
    total, stack = 0, [value]
    while stack and total <= limit:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, Undefined):
            continue
        elif isinstance(item, int) and not isinstance(item, bool):
            total += 1 + item.bit_length() // 4  # at least its decimal digits
        elif isinstance(item, Mapping):
            total += 2
            for key in item:
                stack.append(key)
                stack.append(item[key])
                total += 4
                if total > limit:
                    break
        elif isinstance(item, (list, tuple, set, frozenset)):
            total += 2 + 2 * len(item)
            if total <= limit:
                stack.extend(item)
        else:
            total += 1
    return total


def _length(value: Any) -> int:
    return len(value) if isinstance(value, Sized) else 0


def percent_size(text: str, args: Any) -> int:
    """At least the length of `text % args`: the literal text, every width and precision, and
    the text of each value a conversion prints."""
    total = len(text)
    position = 0
    for match in _PERCENT_SPEC.finditer(text):
        name, width, precision, kind = match.groups()
        if "*" in (width, precision):
            raise TemplateLimit("a '%' format that takes its width or precision from an argument ('*')")
        total += int(width or 0) + int(precision or 0)
        if kind == "%":
            continue
        if name is not None and isinstance(args, Mapping):
            value = args.get(name, "")
        elif isinstance(args, tuple):
            value = args[position] if position < len(args) else ""
            position += 1
        else:
            value = args
        total += text_size(value) if kind in "sra" else 1
    return total


def format_size(text: str, args: tuple, kwargs: Mapping[str, Any]) -> int:
    """At least the length of `text.format(*args, **kwargs)` (`str.format`, `format_map`)."""
    total, auto = 0, 0
    try:
        fields = list(string.Formatter().parse(text))
    except ValueError:
        return len(text)  # str.format raises its own error
    for literal, field, spec, _conversion in fields:
        total += len(literal)
        if field is None:
            continue
        if spec and "{" in spec:
            raise TemplateLimit("a format specification that takes its width from an argument")
        total += sum(int(d) for d in _DIGITS.findall(spec or ""))
        head = re.split(r"[.\[]", field, maxsplit=1)[0]
        if head == "":
            head, auto = str(auto), auto + 1
        if head.isdigit():
            value = args[int(head)] if int(head) < len(args) else ""
        else:
            value = kwargs.get(head, "")
        total += text_size(value)
    return total


def replace_size(text: str, old: Any, new: Any) -> int:
    if not isinstance(old, str) or not isinstance(new, str):
        return len(text)
    if not old:
        return len(text) + (len(text) + 1) * len(new)
    return len(text) + text.count(old) * (len(new) - len(old))


def join_size(items: Any, separator: Any) -> int:
    """The text of `separator.join(items)`; `items` must be a sized collection (a generator is
    measured by the filter's result instead)."""
    if not isinstance(items, (list, tuple, str, Mapping, set, frozenset)):
        return 0
    gaps = max(len(items) - 1, 0) * (len(separator) if isinstance(separator, str) else 1)
    return gaps + text_size(list(items) if isinstance(items, Mapping) else items) - 2 - 2 * len(items)


def _lines(text: str) -> int:
    return text.count("\n") + text.count("\r") + 1


def _wordwrap(s, width=79, break_long_words=True, wrapstring=None, break_on_hyphens=True) -> int:
    text = s if isinstance(s, str) else ""
    breaks = len(text) // max(int(width), 1) + len(text.split()) if isinstance(width, int) else 0
    return text_size(s) + breaks * len(wrapstring if isinstance(wrapstring, str) else "\n")


def _indent(s, width=4, first=False, blank=False) -> int:
    prefix = len(width) if isinstance(width, str) else int(width) if isinstance(width, int) else 0
    return text_size(s) + (_lines(s) if isinstance(s, str) else 1) * prefix


def _batch(value, linecount, fill_with=None) -> int:
    count, per = _length(value), max(int(linecount), 1) if isinstance(linecount, int) else 1
    groups = -(-count // per)
    return (groups * per if fill_with is not None else count) + groups


def _slice(value, slices, fill_with=None) -> int:
    slices = int(slices) if isinstance(slices, int) else 0
    return _length(value) + 2 * max(slices, 0)


def _sum(iterable, attribute=None, start=0) -> int:
    """Items of a sum of lists (and the copies Python's sum makes of each partial list)."""
    if attribute is not None or not isinstance(start, (list, tuple)) or not isinstance(iterable, (list, tuple)):
        return 0
    total, copies = len(start), 0
    for item in iterable:
        total += _length(item)
        copies += total
    if copies > MAX_COPIES * bound():
        raise TemplateLimit(f"sum would copy {copies} items of partial lists (the bound is {MAX_COPIES * bound()})")
    return total


def _json(value, indent=None, separators=None, sort_keys=False) -> int:
    """Text plus, with `indent`, one indentation per item (at its depth at least once)."""
    step = len(indent) if isinstance(indent, str) else int(indent) if isinstance(indent, int) else 0
    size = text_size(value)
    if step and isinstance(value, (list, tuple, Mapping)) and size <= bound():
        size += step * _items(value)
    return size


def _items(value: Any) -> int:
    count, stack = 0, [value]
    while stack and count <= bound():
        item = stack.pop()
        if isinstance(item, Mapping):
            count += len(item)
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            count += len(item)
            stack.extend(item)
    return count


def _center(value, width=80) -> int:
    return max(text_size(value), int(width) if isinstance(width, int) else 0)


def _text(value, *args, **kwargs) -> int:
    return text_size(value)


def _longest_value(table: Any) -> int:
    """The longest string a str.translate table maps a character to (at least 1)."""
    values = table.values() if isinstance(table, Mapping) else ()
    return max([1] + [len(v) for v in values if isinstance(v, str)])


def bounded_items(value: Any) -> list:
    """An iterator's items as a list, refused once past the bound (read no further than that)."""
    items = list(itertools.islice(value, bound() + 1))
    check(len(items), "reading an iterator")
    return items


def _lipsum(n=5, html=True, min=20, max=100) -> int:
    words = int(min) if isinstance(min, int) else 0
    return int(n) * words * 2 if isinstance(n, int) else 0


# jinja's filters that build a string or a list, each with an estimator taking the filter's own
# arguments (after the context jinja passes some of them first)
BUILDING_FILTERS: dict[str, Callable[..., int]] = {
    "batch": _batch,
    "capitalize": _text,
    "center": _center,
    "e": _text,
    "escape": _text,
    "forceescape": _text,
    "format": lambda value, *args, **kwargs: percent_size(value, kwargs or args) if isinstance(value, str) else 0,
    "indent": _indent,
    "join": lambda value, d="", attribute=None: join_size(value, d) if attribute is None else 0,
    "list": lambda value: _length(value),  # an iterator is first read into a bounded list
    "lower": _text,
    "pprint": lambda value: _json(value, 1),
    "replace": lambda s, old, new, count=None: replace_size(s, old, new) if isinstance(s, str) else text_size(s),
    "safe": _text,
    "slice": _slice,
    "string": _text,
    "striptags": _text,
    "sum": _sum,
    "title": _text,
    "tojson": _json,
    "trim": _text,
    "truncate": _text,
    "upper": _text,
    "urlencode": _text,
    "urlize": _text,
    "wordcount": _text,
    "wordwrap": _wordwrap,
    "xmlattr": _text,
}

# jinja's filters that build nothing larger than their input, or a number or truth value
PLAIN_FILTERS = frozenset({
    "abs", "attr", "count", "d", "default", "dictsort", "filesizeformat", "first", "float", "groupby", "int",
    "items", "last", "length", "map", "max", "min", "random", "reject", "rejectattr", "reverse", "round",
    "select", "selectattr", "sort", "unique",
})

# str methods that build a string or a list, with their estimators (`text` is the string)
STR_METHODS: dict[str, Callable[..., int]] = {
    "center": lambda text, width=0, fill=" ": max(len(text), width if isinstance(width, int) else 0),
    "ljust": lambda text, width=0, fill=" ": max(len(text), width if isinstance(width, int) else 0),
    "rjust": lambda text, width=0, fill=" ": max(len(text), width if isinstance(width, int) else 0),
    "zfill": lambda text, width=0: max(len(text), width if isinstance(width, int) else 0),
    "expandtabs": lambda text, tabsize=8: len(text) + text.count("\t") * (tabsize if isinstance(tabsize, int) else 0),
    "join": lambda text, iterable: join_size(iterable, text),
    "replace": lambda text, old, new, count=-1: replace_size(text, old, new),
    "translate": lambda text, table: len(text) * _longest_value(table),
}

GLOBALS: dict[str, Callable[..., int]] = {"generate_lorem_ipsum": _lipsum}
