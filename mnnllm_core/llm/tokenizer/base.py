"""The `Tokenizer` every format returns, and the streaming decoder.

Each format module turns its file into a tokenizer.json-shaped description and
hands it to the HF `tokenizers` library, so encoding is HF-exact; this class
adds what MNN's `Tokenizer` adds on top: prefix ids, the special and stop id
lists from the file header, and per-token decode for streaming.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache

from typing import Sequence

import numpy as np
import tokenizers

from mnnllm_core.errors import NOT_ERRORS, TokenizerError, shorten

_BYTE_FALLBACK_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
# The replacements transformers' clean_up_tokenization applies (MNN's flag 0x01).
_CLEAN_UP_SPACES = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"),
                    (" n't", "n't"), (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map that byte-level BPE vocabularies are written in."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


@lru_cache(maxsize=1)
def unicode_to_bytes() -> dict[str, int]:
    """Inverse of `bytes_to_unicode`, to turn a byte-level token back into its raw bytes."""
    return {c: b for b, c in bytes_to_unicode().items()}


@dataclass
class SpecialIds:
    """The id lists of MNN's text header: special (skipped by decode), stop, and prefix (prepended by encode)."""

    special: list[int] = field(default_factory=list)
    stop: list[int] = field(default_factory=list)
    prefix: list[int] = field(default_factory=list)


def special_added_tokens(ids: list[int], content: dict[int, str], file: str) -> list[dict]:
    """tokenizer.json `added_tokens` for the header's special ids, matched on the raw text as MNN does."""
    missing = [i for i in ids if i not in content]
    if missing:
        raise TokenizerError(f"special id {missing[0]} is not in the vocabulary", file=file, field="special_ids")
    return [{"id": i, "content": content[i], "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True} for i in dict.fromkeys(ids) if content[i]]


def build_backend(spec: dict, file: str) -> tokenizers.Tokenizer:
    """Turn a tokenizer.json-shaped dict into a HF tokenizer; its errors become TokenizerError.

    The pipeline goes through JSON, but the model is built as an object: serialising a
    49k-token vocabulary and merge list to JSON and parsing it back would double the
    load time. Added tokens get their ids by being in the model vocabulary, which is
    checked afterwards.
    """
    model = spec["model"]
    added = spec.get("added_tokens", [])
    pipeline = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
                "normalizer": spec.get("normalizer"), "pre_tokenizer": spec.get("pre_tokenizer"),
                "post_processor": None, "decoder": spec.get("decoder"),
                "model": {"type": "BPE", "vocab": {}, "merges": []}}
    try:
        backend = tokenizers.Tokenizer.from_str(json.dumps(pipeline, ensure_ascii=False))
        backend.model = _model(model, added)
        backend.add_special_tokens([_added_token(t) for t in added if t["special"]])
        backend.add_tokens([_added_token(t) for t in added if not t["special"]])
    except Exception as exc:  # tokenizers raises plain Exception subclasses from Rust
        raise TokenizerError(f"rejected by HF tokenizers: {exc}", file=file, field="model") from exc
    for token in added:
        if backend.token_to_id(token["content"]) != token["id"]:
            raise TokenizerError(f"added token {token['content']!r} cannot keep id {token['id']}", file=file,
                                 field="added_tokens")
    return backend


def _model(spec: dict, added: list[dict]) -> tokenizers.models.Model:
    """The HF model object for a tokenizer.json `model` dict, with the added tokens in its vocabulary."""
    kind = spec["type"]
    if kind in ("BPE", "WordPiece"):
        vocab = spec["vocab"]
        for token in added:
            vocab.setdefault(token["content"], token["id"])
    if kind == "BPE":
        return tokenizers.models.BPE(vocab=spec["vocab"], merges=spec["merges"],
                                     unk_token=spec["unk_token"], fuse_unk=spec["fuse_unk"],
                                     byte_fallback=spec["byte_fallback"], ignore_merges=spec["ignore_merges"])
    if kind == "WordPiece":
        return tokenizers.models.WordPiece(vocab=spec["vocab"], unk_token=spec["unk_token"],
                                           continuing_subword_prefix=spec["continuing_subword_prefix"],
                                           max_input_chars_per_word=spec["max_input_chars_per_word"])
    return tokenizers.models.Unigram(spec["vocab"], spec["unk_id"], spec["byte_fallback"])


def _added_token(token: dict) -> tokenizers.AddedToken:
    return tokenizers.AddedToken(token["content"], single_word=token["single_word"], lstrip=token["lstrip"],
                                 rstrip=token["rstrip"], normalized=token["normalized"],
                                 special=token["special"])


class Tokenizer:
    """MNN's `Tokenizer`: encode/decode plus the special, stop and prefix ids of the export.

    Without an explicit bos/eos (the `.mtok` names them), bos is the first prefix id and
    eos the first stop id. `bos_token`: the bos string the file names ("" when it names none),
    which MNN's chat template renders as `bos_token`.
    """

    def __init__(self, backend: tokenizers.Tokenizer, ids: SpecialIds, *, file: str,
                 byte_level: bool = False, bos_id: int | None = None, eos_id: int | None = None,
                 clean_up_spaces: bool = False, chat_template: str = "", bos_token: str = "") -> None:
        self.backend = backend
        self.file = file
        self.byte_level = byte_level
        self.special_ids = list(ids.special)
        self.stop_ids = list(ids.stop)
        self.prefix_ids = list(ids.prefix)
        self.bos_id = bos_id if bos_id is not None else (ids.prefix[0] if ids.prefix else None)
        self.eos_id = eos_id if eos_id is not None else (ids.stop[0] if ids.stop else None)
        self.clean_up_spaces = clean_up_spaces
        self.chat_template = chat_template
        self.bos_token = bos_token
        self._special = frozenset(ids.special)
        self._stop = frozenset(ids.stop)
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)
        for name, values in (("special_ids", ids.special), ("stop_ids", ids.stop), ("prefix_ids", ids.prefix)):
            outside = [i for i in values if not 0 <= i < self.vocab_size]
            if outside:
                raise TokenizerError(f"{len(outside)} of the {name} are outside the vocabulary of "
                                     f"{self.vocab_size}, e.g. {outside[0]}", file=file, field=name)

    def is_stop(self, token_id: int) -> bool:
        return token_id in self._stop

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special

    def token_to_id(self, token: str) -> int | None:
        """Id of a vocabulary entry as written in the vocabulary (byte-level form for byte-level models)."""
        return self.backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)

    def _native(self, what: str, call, *args, **kwargs):
        """A call into HF tokenizers; its Rust errors, and pyo3's PanicException (a BaseException
        that would pass every `except Exception`), become a TokenizerError."""
        try:
            return call(*args, **kwargs)
        except NOT_ERRORS:
            raise
        except BaseException as exc:
            raise TokenizerError(f"{what} failed: {type(exc).__name__}: {shorten(str(exc), 120)}",
                                 file=self.file, field=what) from exc

    def _text(self, text: str) -> str:
        if not isinstance(text, str):
            raise TokenizerError(f"encode needs a str, got {type(text).__name__}", field="text")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate: bytes that were not UTF-8 (e.g. argv b"\xff")
            raise TokenizerError(f"the text is not valid Unicode: {exc.reason} at character {exc.start}",
                                 field="text") from None
        return text

    def encode(self, text: str) -> list[int]:
        """Prefix ids, then the text split on added tokens and run through the pipeline (as MNN)."""
        return self.prefix_ids + self._encode(self._text(text))

    def _encode(self, text: str) -> list[int]:
        return self._native("encode", self.backend.encode, text, add_special_tokens=False).ids

    def exceeds(self, text: str, limit: int, piece: int = 1 << 14) -> bool:
        """Whether `text` surely encodes to more than `limit` tokens, found piece by piece, cut
        before spaces (where the pre-tokenizers cut too), stopping once past the limit: a huge
        prompt is refused without being tokenized whole. Short texts answer False (encode them)."""
        text = self._text(text)
        count, pieces, start = len(self.prefix_ids), 0, 0
        while len(text) - start > piece:
            end = text.find(" ", start + piece, start + 2 * piece)
            end = start + piece if end < 0 else end
            count += len(self._encode(text[start:end]))
            pieces += 1
            if count - 2 * pieces > limit:  # a cut changes at most the tokens on either side of it
                return True
            start = end
        return False

    def check_ids(self, ids: Sequence[int]) -> list[int]:
        """`ids` as ints inside the vocabulary, else a TokenizerError naming the first bad one."""
        size, checked = self.vocab_size, []
        for token in ids:
            if isinstance(token, bool) or not isinstance(token, (int, np.integer)) or not 0 <= token < size:
                raise TokenizerError(f"token id {shorten(repr(token), 40)} is not in the vocabulary of {size}",
                                     file=self.file, field="ids")
            checked.append(int(token))
        return checked

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """Text of a sequence; like MNN's `decode(ids)` it leaves out special ids by default."""
        ids = self.check_ids(ids)
        if skip_special_tokens:
            ids = [i for i in ids if i not in self._special]
        text = self._native("decode", self.backend.decode, ids, skip_special_tokens=False)
        if self.clean_up_spaces:
            for before, after in _CLEAN_UP_SPACES:
                text = text.replace(before, after)
        return text

    def decode_id_bytes(self, token_id: int) -> bytes:
        """Raw bytes of one token (MNN's `decode(id)`); a byte-level piece may be part of a UTF-8 character."""
        token_id = self.check_ids([token_id])[0]
        token = self.backend.id_to_token(token_id)
        if token is None:
            return b""
        if self.byte_level:
            table = unicode_to_bytes()
            return b"".join(bytes([table[c]]) if c in table else c.encode("utf-8") for c in token)
        piece = _BYTE_FALLBACK_PIECE.fullmatch(token)
        if piece:
            return bytes([int(piece.group(1), 16)])
        return self.backend.decode([token_id], skip_special_tokens=False).encode("utf-8")

    def decode_id(self, token_id: int) -> str:
        """Text of one token; an incomplete UTF-8 piece shows as U+FFFD, so stream with `stream()` instead."""
        return self.decode_id_bytes(token_id).decode("utf-8", errors="replace")

    def stream(self, skip_special_tokens: bool = True) -> StreamDecoder:
        """A decoder that turns ids arriving one by one into text pieces whose concatenation is `decode(all)`."""
        return StreamDecoder(self, skip_special_tokens)


class StreamDecoder:
    """Incremental decode: holds back text while the last tokens end inside a UTF-8 character.

    Decoding one token alone is wrong for byte-level pieces of a multibyte character and for
    decoders that look at neighbours (SentencePiece's leading space, WordPiece's joins), so each
    step decodes a short window of recent ids and emits only what the new id added.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._window: list[int] = []
        self._emitted = ""

    def put(self, token_id: int) -> str:
        """Feed one id; return the new text it completes (maybe empty)."""
        if self._skip and self._tokenizer.is_special(token_id):
            return ""
        self._window.append(token_id)
        text = self._tokenizer.decode(self._window, skip_special_tokens=False)
        if text.endswith("\ufffd"):
            return ""
        piece = self._new_text(text)
        self._window = self._window[-1:]
        self._emitted = self._tokenizer.decode(self._window, skip_special_tokens=False)
        return piece

    def flush(self) -> str:
        """Text still held back at the end of the stream (an unfinished character decodes as U+FFFD)."""
        piece = self._new_text(self._tokenizer.decode(self._window, skip_special_tokens=False))
        self._window = []
        self._emitted = ""
        return piece

    def _new_text(self, text: str) -> str:
        """What `text` adds after the already emitted text of the window (never drops text)."""
        if text.startswith(self._emitted):
            return text[len(self._emitted):]
        common = 0
        while common < min(len(text), len(self._emitted)) and text[common] == self._emitted[common]:
            common += 1
        return text[common:]
