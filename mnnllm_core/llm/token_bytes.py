"""The vocabulary as bytes per token id: what a constraint library needs to know which tokens
may come next. Every tokenizer format MNN reads (mtok, tokenizer.json, tiktoken, sentencepiece,
BERT) ends up as an HF tokenizers backend here; a token's bytes are what decoding adds for it
inside a text, which is not always what it decodes to alone (sentencepiece strips a leading
space, WordPiece joins `##` pieces to the word before and puts a space before others).
"""
from __future__ import annotations

import logging
import time

from .tokenizer.base import _BYTE_FALLBACK_PIECE, Tokenizer, unicode_to_bytes

log = logging.getLogger(__name__)

ANCHOR_TEXT = "a"
"""A plain word whose token is put before each token when decoding it in context."""


def token_bytes(tokenizer: Tokenizer) -> list[bytes]:
    """Bytes per token id, `vocab_size` entries. A special token's entry is its text (the
    constraint library is told which ids are special and never matches them as text); an id the
    vocabulary has no entry for gets b""."""
    start = time.perf_counter()
    backend = tokenizer.backend
    table = unicode_to_bytes() if tokenizer.byte_level else None
    in_context = None if table is not None else _ContextDecoder(tokenizer)
    out: list[bytes] = []
    for token_id in range(tokenizer.vocab_size):
        token = backend.id_to_token(token_id)
        if token is None:
            out.append(b"")
        elif tokenizer.is_special(token_id):
            out.append(token.encode("utf-8"))
        elif table is not None:
            out.append(_byte_level(token, table))
        else:
            piece = _BYTE_FALLBACK_PIECE.fullmatch(token)
            out.append(bytes([int(piece.group(1), 16)]) if piece else in_context.bytes_of(token_id))
    log.debug("token bytes of %d ids in %.3f s", len(out), time.perf_counter() - start)
    return out


def _byte_level(token: str, table: dict[str, int]) -> bytes:
    """A byte-level BPE entry maps each character to one byte (an added token is plain text)."""
    if all(c in table for c in token):
        return bytes(table[c] for c in token)
    return token.encode("utf-8")


class _ContextDecoder:
    """Bytes a token adds after an anchor token: decode([anchor, t]) less decode([anchor])."""

    def __init__(self, tokenizer: Tokenizer):
        self.backend = tokenizer.backend
        self.clean_up = tokenizer.clean_up_spaces
        ids = self.backend.encode(ANCHOR_TEXT, add_special_tokens=False).ids
        self.anchor = ids[-1] if ids else None
        self.prefix = self._decode([self.anchor]) if self.anchor is not None else ""

    def _decode(self, ids: list[int]) -> str:
        return self.backend.decode(ids, skip_special_tokens=False)

    def bytes_of(self, token_id: int) -> bytes:
        if self.anchor is not None:
            text = self._decode([self.anchor, token_id])
            if text.startswith(self.prefix):
                return text[len(self.prefix):].encode("utf-8")
        return self._decode([token_id]).encode("utf-8")
