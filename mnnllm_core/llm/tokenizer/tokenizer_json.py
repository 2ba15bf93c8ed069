"""A plain HuggingFace `tokenizer.json` (no MNN header), loaded as it is by HF `tokenizers`.

The file itself names no stop or bos/eos ids; a `tokenizer_config.json` beside it
(as HF ships them) supplies the bos and eos tokens when present.
"""
from __future__ import annotations

import json
import logging
import os

import tokenizers

from mnnllm_core.errors import TokenizerError
from mnnllm_core.files import CONFIG_LIMIT, read_bounded

from .base import SpecialIds, Tokenizer

logger = logging.getLogger(__name__)


class JsonTokenizer(Tokenizer):
    """A tokenizer.json; special ids are its added tokens marked special."""

    @classmethod
    def load(cls, data: bytes, file: str) -> JsonTokenizer:
        try:
            spec = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise TokenizerError(f"invalid JSON: {exc}", file=file, field="json") from None
        if not isinstance(spec, dict) or not isinstance(spec.get("model"), dict):
            raise TokenizerError("no model object", file=file, field="model")
        try:
            backend = tokenizers.Tokenizer.from_str(data.decode("utf-8"))
        except Exception as exc:  # tokenizers raises plain Exception subclasses from Rust
            raise TokenizerError(f"rejected by HF tokenizers: {exc}", file=file, field="model") from None
        special = [t["id"] for t in spec.get("added_tokens") or [] if isinstance(t, dict) and t.get("special")]
        bos, eos = _config_tokens(file)
        bos_id = backend.token_to_id(bos) if bos else None
        eos_id = backend.token_to_id(eos) if eos else None
        ids = SpecialIds(special=special, stop=[eos_id] if eos_id is not None else [])
        return cls(backend, ids, file=file, byte_level=_has_byte_level(spec.get("decoder")),
                   bos_id=bos_id, eos_id=eos_id)


def _has_byte_level(decoder: object) -> bool:
    if not isinstance(decoder, dict):
        return False
    if decoder.get("type") == "ByteLevel":
        return True
    return any(_has_byte_level(d) for d in decoder.get("decoders") or [])


def _config_tokens(file: str) -> tuple[str, str]:
    """(bos, eos) strings from a sibling tokenizer_config.json, empty when there is none."""
    path = os.path.join(os.path.dirname(os.path.abspath(file)), "tokenizer_config.json")
    if not os.path.exists(path):
        return "", ""
    try:
        config = json.loads(read_bounded(path, CONFIG_LIMIT, TokenizerError, "tokenizer config").decode("utf-8"))
    except (TokenizerError, ValueError, RecursionError) as exc:
        logger.warning("%s: ignoring unreadable tokenizer_config.json: %s", path, exc)
        return "", ""
    if not isinstance(config, dict):
        logger.warning("%s: ignoring tokenizer_config.json, not a JSON object", path)
        return "", ""

    def content(value: object) -> str:
        if isinstance(value, dict):
            value = value.get("content")
        return value if isinstance(value, str) else ""

    return content(config.get("bos_token")), content(config.get("eos_token"))
