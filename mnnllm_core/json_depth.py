"""JSON nested no deeper than MAX_DEPTH. Python's parser recurses once per level, and so does every
later walk of the value, so a file nested 100,000 deep would end in a RecursionError; files of
every kind the project reads (configs, tokenizers, safetensors headers) nest a few levels."""
from __future__ import annotations

import json
from typing import Any

from .errors import MnnllmError

MAX_DEPTH = 64


def _too_deep(error: type[MnnllmError], file: str, field: str | None = None) -> MnnllmError:
    return error(f"malformed JSON: nested deeper than {MAX_DEPTH}", file=file, field=field)


def check_depth(value: Any, file: str, error: type[MnnllmError], field: str | None = None) -> None:
    """Raise `error` naming `file` when `value`'s objects and lists nest deeper than MAX_DEPTH."""
    level = [value]
    for _ in range(MAX_DEPTH):
        level = [child for item in level if isinstance(item, (dict, list))
                 for child in (item.values() if isinstance(item, dict) else item)]
        if not level:
            return
    raise _too_deep(error, file, field)


def loads_bounded(text: str | bytes, file: str, error: type[MnnllmError], field: str | None = None,
                  **options: Any) -> Any:
    """`json.loads(text, **options)`, a value nested deeper than MAX_DEPTH refused as `error` naming
    `file`; a JSONDecodeError or ValueError is left to the caller to word."""
    try:
        value = json.loads(text, **options)
    except RecursionError:
        raise _too_deep(error, file, field) from None
    check_depth(value, file, error, field)
    return value
