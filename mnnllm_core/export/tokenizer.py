"""Write the tokenizer as MNN's exporter does: `tokenizer.mtok` (type 4) or `tokenizer.txt` (type 3).

Both start with MNN's text header: `430 <type>`, `<special> <stop> <prefix>` counts, then
those ids on one line. The `.mtok` body is the tokenizer.json pipeline in binary (the
layout `mnnllm_core.llm.tokenizer.pipeline` reads): normalizer, pre-tokenizer, model
(vocabulary sorted by string; BPE merges as (left id, right id, rank) sorted by
(left, right)), decoder, added tokens, then the tail MNN 3.6.1 writes: an empty chat
template (the template lives in llm_config.json), eos, flags, bos.
`tokenizer.txt` is the GPT-2 byte-level BPE text form: vocabulary by id, then merges.
"""
from __future__ import annotations

import functools
import struct
import unicodedata
from typing import Any, BinaryIO

from mnnllm_core.errors import UnsupportedError

from .sources import TokenizerSpec

MAGIC = 430
PIPELINE, HUGGINGFACE = 4, 3
_CLEAN_UP_SPACES = 0x01


def _u8(v: int) -> bytes:
    return struct.pack("<B", v)


def _u32(v: int) -> bytes:
    return struct.pack("<I", v & 0xFFFFFFFF)


def _str(s: str) -> bytes:
    raw = s.encode("utf-8")
    return struct.pack("<H", len(raw)) + raw


def header(kind: int, spec: TokenizerSpec) -> bytes:
    special = special_ids(spec)
    ids = special + spec.stop_ids + spec.prefix_ids
    return (f"{MAGIC} {kind}\n{len(special)} {len(spec.stop_ids)} {len(spec.prefix_ids)}\n"
            + " ".join(str(i) for i in ids) + "\n").encode("utf-8")


def special_ids(spec: TokenizerSpec) -> list[int]:
    """The ids of special added tokens and of bos/eos, ascending."""
    tj = spec.tokenizer_json
    ids = {t["id"] for t in tj.get("added_tokens", []) if t.get("special")}
    vocab = tj.get("model", {}).get("vocab", {})
    if isinstance(vocab, dict):
        ids |= {vocab[t] for t in (spec.bos_token, spec.eos_token) if t in vocab}
    return sorted(ids)


def write_mtok(out: BinaryIO, spec: TokenizerSpec) -> None:
    tj = spec.tokenizer_json
    out.write(header(PIPELINE, spec))
    out.write(_normalizer(tj.get("normalizer")))
    out.write(_pre_tokenizer(tj.get("pre_tokenizer")))
    out.write(_model(tj))
    out.write(_decoder(tj.get("decoder")))
    added = tj.get("added_tokens", [])
    out.write(_u32(len(added)))
    for t in added:
        out.write(_u32(t["id"]) + _u8(bool(t.get("special"))) + _u8(bool(t.get("lstrip")))
                  + _u8(bool(t.get("rstrip"))) + _str(t["content"]))
    out.write(_u32(0))
    out.write(_str(spec.eos_token or ""))
    out.write(_u8(_CLEAN_UP_SPACES if spec.clean_up_spaces else 0))
    out.write(_str(spec.bos_token or ""))


def write_txt(out: BinaryIO, spec: TokenizerSpec) -> None:
    """MNN's HUGGINGFACE text form; only for byte-level BPE."""
    tj = spec.tokenizer_json
    model = tj.get("model", {})
    if model.get("type", "BPE") != "BPE" or "ByteLevel" not in _kinds(tj.get("pre_tokenizer")):
        raise UnsupportedError("tokenizer.txt holds only byte-level BPE tokenizers; use mtok", field="tokenizer")
    by_id = {i: t for t, i in _full_vocab(tj).items()}
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    out.write(header(HUGGINGFACE, spec))
    out.write(f"{len(by_id)} {len(merges)}\n".encode("utf-8"))
    for i in range(len(by_id)):
        out.write(by_id.get(i, "<unk>").encode("utf-8") + b"\n")
    for m in merges:
        out.write(m.encode("utf-8") + b"\n")


def _kinds(node: Any) -> list[str]:
    if not isinstance(node, dict):
        return []
    children = node.get("pretokenizers") or node.get("normalizers") or node.get("decoders") or []
    return [node.get("type", "")] + [k for c in children for k in _kinds(c)]


def _full_vocab(tj: dict[str, Any]) -> dict[str, int]:
    vocab = dict(tj.get("model", {}).get("vocab", {}))
    for t in tj.get("added_tokens", []):
        vocab[t["content"]] = t["id"]
    return vocab


def _normalizer(n: dict[str, Any] | None) -> bytes:
    if n is None:
        return _u8(0)
    kind = n.get("type")
    if kind == "Prepend":
        return _u8(2) + _str(n.get("prepend", ""))
    if kind == "Replace":
        return _u8(3) + _str(_pattern(n.get("pattern"), "String")) + _str(n.get("content", ""))
    if kind == "Sequence":
        children = n.get("normalizers", [])
        return _u8(4) + _u32(len(children)) + b"".join(_normalizer(c) for c in children)
    if kind == "Strip":
        return _u8(8) + _u8(bool(n.get("strip_left", True))) + _u8(bool(n.get("strip_right", True)))
    if kind == "BertNormalizer":
        lowercase = bool(n.get("lowercase", True))
        strip = n.get("strip_accents")  # HF: None follows lowercase (every uncased BERT strips accents)
        strip = lowercase if strip is None else bool(strip)
        flags = bytes([bool(n.get("clean_text", True)), bool(n.get("handle_chinese_chars", True)), strip, lowercase])
        # Stripping accents is kind 7: MNN's runtime decomposes with the NFD table that follows.
        return _u8(7) + flags + _nfd_table() if strip else _u8(5) + flags
    if kind == "Lowercase":
        return _u8(5) + bytes([0, 0, 0, 1])
    raise UnsupportedError(f"tokenizer normalizer {kind!r}", field="normalizer")


@functools.lru_cache(maxsize=1)
def _nfd_table() -> bytes:
    """u32 count, then (u32 code point, u16 length, UTF-8) of every code point NFD changes."""
    entries = []
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        decomposed = unicodedata.normalize("NFD", chr(cp))
        if decomposed != chr(cp):
            raw = decomposed.encode("utf-8")
            entries.append(struct.pack("<IH", cp, len(raw)) + raw)
    return _u32(len(entries)) + b"".join(entries)


def _pattern(p: Any, key: str) -> str:
    if isinstance(p, dict):
        return p.get(key, p.get("String", ""))
    return p if isinstance(p, str) else ""


_BEHAVIOR = {"Isolated": 0, "MergedWithPrevious": 2}


def _pre_tokenizer(p: dict[str, Any] | None) -> bytes:
    if p is None:
        return _u8(0)
    kind = p.get("type")
    if kind == "ByteLevel":
        return _u8(1) + _u8(bool(p.get("use_regex", True)))
    if kind == "Digits":
        return _u8(2) + _u8(bool(p.get("individual_digits", False)))
    if kind == "Metaspace":
        return _u8(3) + _str(p.get("str_rep") or p.get("replacement", "\u2581")) + _u8(
            bool(p.get("add_prefix_space", True)))
    if kind == "Split":
        return (_u8(4) + _str(_pattern(p.get("pattern"), "Regex")) + _u8(bool(p.get("invert", False)))
                + _u8(_BEHAVIOR.get(p.get("behavior", "Isolated"), 1)))
    if kind == "BertPreTokenizer":
        return _u8(5)
    if kind == "Sequence":
        children = p.get("pretokenizers", [])
        return _u8(6) + _u32(len(children)) + b"".join(_pre_tokenizer(c) for c in children)
    if kind == "WhitespaceSplit":
        return _u8(4) + _str("\\s+") + _u8(0) + _u8(1)
    raise UnsupportedError(f"tokenizer pre-tokenizer {kind!r}", field="pre_tokenizer")


def _model(tj: dict[str, Any]) -> bytes:
    model = tj.get("model", {})
    kind = model.get("type", "BPE")
    if kind == "BPE":
        vocab = model.get("vocab", {})
        pre = tj.get("pre_tokenizer") or {}
        # MNN's BPE maps raw bytes itself when only the decoder is ByteLevel.
        byte_level = int(pre.get("type") == "Sequence" and "ByteLevel" not in _kinds(pre)
                         and "ByteLevel" in _kinds(tj.get("decoder")))
        pairs = []
        for rank, m in enumerate(model.get("merges", [])):
            left, right = m.split(" ", 1) if isinstance(m, str) else m[:2]
            pairs.append((vocab.get(left, -1), vocab.get(right, -1), rank))
        pairs.sort(key=lambda p: ((p[0] & 0xFFFFFFFF) << 32) | (p[1] & 0xFFFFFFFF))
        body = [_u8(0), _u32(len(vocab)), _u8(bool(model.get("byte_fallback", False))), _u8(byte_level),
                _u32(len(pairs))]
        body += [_str(t) + _u32(i) for t, i in sorted(vocab.items())]
        body += [struct.pack("<III", l & 0xFFFFFFFF, r & 0xFFFFFFFF, k) for l, r, k in pairs]
        return b"".join(body)
    if kind == "WordPiece":
        vocab = model.get("vocab", {})
        body = [_u8(1), _u32(len(vocab)), _str(model.get("unk_token", "[UNK]")),
                _str(model.get("continuing_subword_prefix", "##")), _u32(model.get("max_input_chars_per_word", 100))]
        body += [_str(t) + _u32(i) for t, i in sorted(vocab.items())]
        return b"".join(body)
    if kind == "Unigram":
        entries = sorted((item[0], i, item[1]) for i, item in enumerate(model.get("vocab", [])))
        body = [_u8(2), _u32(len(entries)), _u32(model.get("unk_id") or 0), _u8(bool(model.get("byte_fallback")))]
        body += [_str(t) + _u32(i) + struct.pack("<d", s) for t, i, s in entries]
        return b"".join(body)
    raise UnsupportedError(f"tokenizer model {kind!r}", field="model")


def _decoder(d: dict[str, Any] | None) -> bytes:
    if d is None:
        return _u8(0)
    kind = d.get("type")
    if kind == "ByteLevel":
        return _u8(0)
    if kind == "ByteFallback":
        return _u8(1)
    if kind == "Metaspace":
        return _u8(2) + _str(d.get("replacement", "\u2581")) + _u8(bool(d.get("add_prefix_space", True)))
    if kind == "WordPiece":
        return _u8(3) + _str(d.get("prefix", "##")) + _u8(bool(d.get("cleanup", True)))
    if kind == "Fuse":
        return _u8(4)
    if kind == "Replace":
        return _u8(5) + _str(_pattern(d.get("pattern"), "String")) + _str(d.get("content", ""))
    if kind == "Strip":
        return _u8(6) + _str(d.get("content", "")) + _u32(d.get("start", 0)) + _u32(d.get("stop", 0))
    if kind == "Sequence":
        children = d.get("decoders", [])
        return _u8(7) + _u32(len(children)) + b"".join(_decoder(c) for c in children)
    raise UnsupportedError(f"tokenizer decoder {kind!r}", field="decoder")
