"""Type 3, HuggingFace byte-level BPE: `<vocab count> <merge count>`, the vocabulary one token per
line in GPT-2's byte-to-character form (line number = id), then `merges.txt` lines `left right`.

The exporter copies merges.txt whole, so its `#version` line is skipped.
"""
from __future__ import annotations


from mnnllm_core.errors import TokenizerError

from .base import Tokenizer, build_backend, special_added_tokens, unicode_to_bytes
from .reader import Header, TextLines


class HuggingfaceTokenizer(Tokenizer):
    """MNN's `HuggingfaceTokenizer` (GPT-2 style byte-level BPE)."""

    @classmethod
    def load(cls, data: bytes, header: Header, file: str) -> HuggingfaceTokenizer:
        lines = TextLines(data, header.body_offset, file)
        vocab_count, merge_count = lines.ints("counts", 2)
        if vocab_count < 0 or merge_count < 0 or vocab_count + merge_count > len(data) - lines.pos:
            raise TokenizerError(f"counts {vocab_count} {merge_count} do not fit in the file", file=file,
                                 field="counts")
        tokens = [_utf8(lines.line(f"vocab[{i}]"), file, f"vocab[{i}]") for i in range(vocab_count)]
        vocab: dict[str, int] = {}
        for i, token in enumerate(tokens):
            vocab.setdefault(token, i)
        merges = []
        for i in range(merge_count):
            line = _utf8(lines.line(f"merges[{i}]"), file, f"merges[{i}]")
            if line.startswith("#version") or not line:
                continue
            left, _, right = line.partition(" ")
            if left in vocab and right in vocab and left + right in vocab:
                merges.append((left, right))
        to_bytes = unicode_to_bytes()

        def text(token: str) -> str:
            raw = bytes(to_bytes[c] if c in to_bytes else ord(c) & 0xFF for c in token)
            return raw.decode("utf-8", errors="replace")

        spec = {
            "added_tokens": special_added_tokens(header.ids.special,
                                                 {i: text(t) for i, t in enumerate(tokens)}, file),
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                              "use_regex": True},
            "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
            "model": {"type": "BPE", "vocab": vocab, "merges": merges, "unk_token": None, "fuse_unk": False,
                      "byte_fallback": False, "ignore_merges": False},
        }
        return cls(build_backend(spec, file), header.ids, file=file, byte_level=True)


def _utf8(raw: bytes, file: str, field: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise TokenizerError("line is not UTF-8", file=file, field=field) from None
