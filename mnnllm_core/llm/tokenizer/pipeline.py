"""Type 4, MNN's `.mtok` (`PipelineTokenizer`): a binary copy of a HF tokenizer.json pipeline.

Body layout after the text header, as `llmexport` writes it and MNN 3.6.1 reads it
(all little-endian, strings are u16 length + UTF-8 bytes):

- normalizer, pre-tokenizer: a u8 kind and its arguments, `Sequence` nests;
- model: u8 kind (0 BPE, 1 WordPiece, 2 Unigram), u32 vocab size, kind-specific
  fields, the vocabulary sorted by string as (string, u32 id[, f64 score]), and for
  BPE the merges as (u32 left id, u32 right id, u32 rank);
- decoder: u8 kind and arguments, `Sequence` nests;
- added tokens: u32 count, then (u32 id, u8 special, u8 lstrip, u8 rstrip, string);
- optional tail: u32-length chat template, eos string, u8 flags (bit 0: clean up
  tokenization spaces), bos string. Later exporters append more; MNN 3.6.1 ignores it, so do we.

We rebuild the equivalent tokenizer.json and let HF `tokenizers` run it.
"""
from __future__ import annotations

import logging
import struct
from collections.abc import Callable

import numpy as np

from mnnllm_core.errors import TokenizerError

from .base import Tokenizer, build_backend
from .reader import BinaryReader, Header

logger = logging.getLogger(__name__)

_MAX_NESTING = 16
_NO_TOKEN = 0xFFFFFFFF  # the exporter writes -1 for a merge half missing from the vocabulary
_SPLIT_BEHAVIOR = {0: "Isolated", 2: "MergedWithPrevious"}  # everything else was written as 1


class PipelineTokenizer(Tokenizer):
    """MNN's `PipelineTokenizer`, loaded from the `.mtok` body."""

    @classmethod
    def load(cls, data: bytes, header: Header, file: str) -> PipelineTokenizer:
        r = BinaryReader(data, header.body_offset, file)
        normalizer = _read_normalizer(r, "normalizer", 0)
        pre_tokenizer = _read_pre_tokenizer(r, "pre_tokenizer", 0)
        model, model_maps_bytes = _read_model(r)
        if model_maps_bytes:
            # MNN's BPE maps raw bytes itself when only the decoder is ByteLevel.
            byte_map = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
            parts = [pre_tokenizer] if pre_tokenizer else []
            pre_tokenizer = {"type": "Sequence", "pretokenizers": [*parts, byte_map]}
        decoder_kinds: list[int] = []
        decoder = _read_decoder(r, "decoder", 0, decoder_kinds)
        added_tokens = _read_added_tokens(r)
        chat_template, eos, flags, bos = _read_tail(r)
        backend = build_backend({"added_tokens": added_tokens, "normalizer": normalizer,
                                 "pre_tokenizer": pre_tokenizer, "decoder": decoder, "model": model}, file)
        return cls(backend, header.ids, file=file, byte_level=0 in decoder_kinds,
                   bos_id=backend.token_to_id(bos) if bos else None,
                   eos_id=backend.token_to_id(eos) if eos else None,
                   clean_up_spaces=bool(flags & 0x01), chat_template=chat_template, bos_token=bos)


def _nested(r: BinaryReader, field: str, depth: int,
            read_one: Callable[[BinaryReader, str, int], dict | None]) -> list[dict]:
    """Children of a `Sequence`; MNN skips null children, and so do we."""
    if depth >= _MAX_NESTING:
        raise TokenizerError(f"Sequence nested deeper than {_MAX_NESTING}", file=r.file, field=field)
    count = r.count(f"{field}.count", 1)
    children = (read_one(r, f"{field}[{i}]", depth + 1) for i in range(count))
    return [c for c in children if c is not None]


def _skip_norm_table(r: BinaryReader, field: str) -> set[int]:
    """Skip an embedded (code point -> UTF-8) table, keeping the code points to tell NFKC from NFC."""
    count = r.count(f"{field}.table", 6)
    points = set()
    for i in range(count):
        points.add(r.u32(f"{field}.table[{i}]"))
        r.raw(r.u16(f"{field}.table[{i}]"), f"{field}.table[{i}]")
    return points


def _read_normalizer(r: BinaryReader, field: str, depth: int) -> dict | None:
    kind = r.u8(field)
    if kind == 0:
        return None
    if kind == 1:
        return {"type": "NFKC"}
    if kind == 2:
        return {"type": "Prepend", "prepend": r.string(f"{field}.prepend")}
    if kind == 3:
        pattern = r.string(f"{field}.pattern")
        return {"type": "Replace", "pattern": {"String": pattern}, "content": r.string(f"{field}.content")}
    if kind == 4:
        return {"type": "Sequence", "normalizers": _nested(r, field, depth, _read_normalizer)}
    if kind in (5, 7):
        clean, chinese, strip, lower = (r.u8(f"{field}.flags") for _ in range(4))
        if kind == 7 and strip:
            _skip_norm_table(r, field)
        return {"type": "BertNormalizer", "clean_text": bool(clean), "handle_chinese_chars": bool(chinese),
                "strip_accents": bool(strip), "lowercase": bool(lower)}
    if kind == 6:
        # NFKC, NFKD and Precompiled are written as an NFKC table, NFC as an NFC table;
        # only compatibility forms map NO-BREAK SPACE.
        return {"type": "NFKC" if 0xA0 in _skip_norm_table(r, field) else "NFC"}
    if kind == 8:
        left, right = r.u8(f"{field}.strip_left"), r.u8(f"{field}.strip_right")
        return {"type": "Strip", "strip_left": bool(left), "strip_right": bool(right)}
    raise TokenizerError(f"unknown normalizer kind {kind}", file=r.file, field=field)


def _read_pre_tokenizer(r: BinaryReader, field: str, depth: int) -> dict | None:
    kind = r.u8(field)
    if kind == 0:
        return None
    if kind == 1:
        return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                "use_regex": bool(r.u8(f"{field}.use_regex"))}
    if kind == 2:
        return {"type": "Digits", "individual_digits": bool(r.u8(f"{field}.individual_digits"))}
    if kind == 3:
        replacement = r.string(f"{field}.replacement")
        prefix = r.u8(f"{field}.add_prefix_space")
        # MNN prefixes every split and never splits on the replacement.
        return {"type": "Metaspace", "replacement": replacement,
                "prepend_scheme": "always" if prefix else "never", "split": False}
    if kind == 4:
        pattern = r.string(f"{field}.pattern")
        invert, behavior = r.u8(f"{field}.invert"), r.u8(f"{field}.behavior")
        return {"type": "Split", "pattern": {"Regex": pattern}, "invert": bool(invert),
                "behavior": _SPLIT_BEHAVIOR.get(behavior, "Removed")}
    if kind == 5:
        return {"type": "BertPreTokenizer"}
    if kind == 6:
        return {"type": "Sequence", "pretokenizers": _nested(r, field, depth, _read_pre_tokenizer)}
    raise TokenizerError(f"unknown pre-tokenizer kind {kind}", file=r.file, field=field)


def _read_vocab(r: BinaryReader, size: int, with_scores: bool) -> tuple[list[str], dict[str, int], list[float]]:
    """Entries (string, u32 id[, f64 score]) in string order -> strings by id, string -> id, scores by id.

    This is the hot loop of loading (49k entries for SmolLM2), so it reads the buffer
    directly and checks bounds once per entry.
    """
    data, pos, end, file = r.data, r.pos, len(r.data), r.file
    tail = 12 if with_scores else 4
    tokens: list[str | None] = [None] * size
    vocab: dict[str, int] = {}
    scores = [0.0] * size if with_scores else []
    unpack = struct.unpack_from
    for i in range(size):
        if pos + 2 > end:
            raise TokenizerError("file ends inside the vocabulary", file=file, field=f"model.vocab[{i}]")
        start = pos + 2
        stop = start + (data[pos] | data[pos + 1] << 8)
        if stop + tail > end:
            raise TokenizerError("file ends inside the vocabulary", file=file, field=f"model.vocab[{i}]")
        token_id = unpack("<I", data, stop)[0]
        if token_id >= size or tokens[token_id] is not None:
            raise TokenizerError(f"id {token_id} out of range or repeated (vocab size {size})", file=file,
                                 field=f"model.vocab[{i}].id")
        try:
            token = data[start:stop].decode("utf-8")
        except UnicodeDecodeError:
            raise TokenizerError("token is not UTF-8", file=file, field=f"model.vocab[{i}]") from None
        tokens[token_id] = token
        vocab[token] = token_id
        if with_scores:
            scores[token_id] = unpack("<d", data, stop + 4)[0]
        pos = stop + tail
    r.pos = pos
    if len(vocab) != size:
        raise TokenizerError("the same token string appears under two ids", file=file, field="model.vocab")
    return tokens, vocab, scores  # type: ignore[return-value]


def _read_merges(r: BinaryReader, count: int, tokens: list[str], vocab: dict[str, int]) -> list[tuple[str, str]]:
    """(left id, right id, rank) rows -> merges in rank order, as HF's BPE wants them."""
    table = r.u32_table(count, 3, "model.merges")
    table = table[(table[:, 0] != _NO_TOKEN) & (table[:, 1] != _NO_TOKEN)]
    if table.size and int(table[:, :2].max()) >= len(tokens):
        raise TokenizerError("merge refers to an id beyond the vocabulary", file=r.file, field="model.merges")
    pairs = table[np.argsort(table[:, 2], kind="stable"), :2]
    strings = np.array(tokens, dtype=object)
    left, right = strings[pairs[:, 0]], strings[pairs[:, 1]]
    merges = list(zip(left.tolist(), right.tolist()))
    if vocab.keys() >= set((left + right).tolist()):
        return merges
    # HF refuses a merge whose result is not a token; MNN can never apply one either.
    kept = [m for m in merges if m[0] + m[1] in vocab]
    logger.warning("%s: dropped %d merges whose result is not in the vocabulary", r.file, len(merges) - len(kept))
    return kept


def _read_model(r: BinaryReader) -> tuple[dict, bool]:
    """The model section -> (tokenizer.json model, whether MNN's model maps raw bytes itself)."""
    kind = r.u8("model.type")
    size = r.count("model.vocab_size", 6)
    if kind == 0:
        byte_fallback, byte_level = r.u8("model.byte_fallback"), r.u8("model.byte_level")
        merge_count = r.u32("model.merge_count")
        tokens, vocab, _ = _read_vocab(r, size, with_scores=False)
        merges = _read_merges(r, merge_count, tokens, vocab)
        return {"type": "BPE", "vocab": vocab, "merges": merges, "byte_fallback": bool(byte_fallback),
                "unk_token": None, "fuse_unk": False, "ignore_merges": False}, bool(byte_level)
    if kind == 1:
        unk = r.string("model.unk_token")
        prefix = r.string("model.continuing_subword_prefix")
        max_chars = r.u32("model.max_input_chars_per_word")
        _, vocab, _ = _read_vocab(r, size, with_scores=False)
        return {"type": "WordPiece", "vocab": vocab, "unk_token": unk,
                "continuing_subword_prefix": prefix, "max_input_chars_per_word": max_chars}, False
    if kind == 2:
        unk_id = r.u32("model.unk_id")
        byte_fallback = r.u8("model.byte_fallback")
        tokens, _, scores = _read_vocab(r, size, with_scores=True)
        if unk_id >= size:
            raise TokenizerError(f"unk id {unk_id} beyond vocabulary", file=r.file, field="model.unk_id")
        return {"type": "Unigram", "vocab": list(zip(tokens, scores)), "unk_id": unk_id,
                "byte_fallback": bool(byte_fallback)}, False
    raise TokenizerError(f"unknown model kind {kind}", file=r.file, field="model.type")


def _read_decoder(r: BinaryReader, field: str, depth: int, kinds: list[int]) -> dict | None:
    kind = r.u8(field)
    kinds.append(kind)
    if kind == 0:
        return {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    if kind == 1:
        return {"type": "ByteFallback"}
    if kind == 2:
        replacement = r.string(f"{field}.replacement")
        prefix = r.u8(f"{field}.add_prefix_space")
        return {"type": "Metaspace", "replacement": replacement,
                "prepend_scheme": "always" if prefix else "never", "split": True}
    if kind == 3:
        prefix = r.string(f"{field}.prefix")
        return {"type": "WordPiece", "prefix": prefix, "cleanup": bool(r.u8(f"{field}.cleanup"))}
    if kind == 4:
        return {"type": "Fuse"}
    if kind == 5:
        pattern = r.string(f"{field}.pattern")
        return {"type": "Replace", "pattern": {"String": pattern}, "content": r.string(f"{field}.content")}
    if kind == 6:
        content = r.string(f"{field}.content")
        start, stop = r.u32(f"{field}.start"), r.u32(f"{field}.stop")
        return {"type": "Strip", "content": content, "start": start, "stop": stop}
    if kind == 7:
        children = _nested(r, field, depth, lambda rr, f, d: _read_decoder(rr, f, d, kinds))
        return {"type": "Sequence", "decoders": children}
    raise TokenizerError(f"unknown decoder kind {kind}", file=r.file, field=field)


def _read_added_tokens(r: BinaryReader) -> list[dict]:
    count = r.count("added_tokens.count", 9)
    added = []
    for i in range(count):
        field = f"added_tokens[{i}]"
        token_id = r.u32(f"{field}.id")
        special, lstrip, rstrip = r.u8(field), r.u8(field), r.u8(field)
        # MNN matches added tokens on the raw text, hence normalized=False.
        added.append({"id": token_id, "content": r.string(f"{field}.content"), "single_word": False,
                      "lstrip": bool(lstrip), "rstrip": bool(rstrip), "normalized": False,
                      "special": bool(special)})
    return added


def _read_tail(r: BinaryReader) -> tuple[str, str, int, str]:
    """The optional (chat template, eos, flags, bos) sections: each absent when the file ends before it."""
    template = eos = bos = ""
    flags = 0
    if r.remaining:
        raw = r.raw(r.u32("chat_template"), "chat_template")
        try:
            template = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise TokenizerError("chat template is not UTF-8", file=r.file, field="chat_template") from None
        if r.remaining:
            eos = r.string("eos")
    if r.remaining:
        flags = r.u8("flags")
    if r.remaining:
        bos = r.string("bos")
    return template, eos, flags, bos
