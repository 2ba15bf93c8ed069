"""One rule for unknown config keys, for the CLI's --set and the API's set_config: a key mnnllm
does not read (and the config file does not hold) is a typo far more often than a new key, so it
is refused with the closest known key suggested."""
from __future__ import annotations

import difflib
from typing import Any, Mapping

from ..errors import ConfigError, Origin


def check_keys(updates: Mapping[str, Any], present: Mapping[str, Any], source: str) -> None:
    """Refuse a key of `updates` that is neither a key mnnllm reads nor one of `present` (the config)."""
    from .config import LlmConfig
    known = LlmConfig.key_names() | set(present)
    for key in updates:
        if key not in known:
            close = difflib.get_close_matches(str(key), sorted(known), n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise ConfigError(f"unknown config key {key!r}{hint}", file=Origin(source), field=str(key))
