"""Type 1, tiktoken: `<count>` then one base64 token per line; the line number is id and rank.

MNN itself encodes this format by greedy longest match; we encode as tiktoken
does (split by the pre-tokenizer regex, then byte-level BPE merging the pair
whose concatenation has the lowest rank), expressed as HF BPE merges. The file
does not carry the regex: MNN exports this format only for Qwen(-1), so its
pattern is used.
"""
from __future__ import annotations


from .base import Tokenizer, build_backend, bytes_to_unicode, special_added_tokens
from .reader import Header, TextLines

QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


class Tiktoken(Tokenizer):
    """MNN's `Tiktoken` tokenizer."""

    @classmethod
    def load(cls, data: bytes, header: Header, file: str, pattern: str = QWEN_PATTERN) -> Tiktoken:
        lines = TextLines(data, header.body_offset, file)
        count = lines.count("vocab_size", 1)
        tokens = [lines.base64(f"vocab[{i}]") for i in range(count)]
        special = set(header.ids.special)
        ranks: dict[bytes, int] = {}
        for rank, token in enumerate(tokens):
            if rank not in special:
                ranks.setdefault(token, rank)
        to_unicode = bytes_to_unicode()

        def byte_level(raw: bytes) -> str:
            return "".join(to_unicode[b] for b in raw)

        spec = {
            "added_tokens": special_added_tokens(
                header.ids.special, {i: t.decode("utf-8", errors="replace") for i, t in enumerate(tokens)}, file),
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
            "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
            "model": {"type": "BPE", "vocab": {byte_level(t): r for t, r in ranks.items()},
                      "merges": [(byte_level(a), byte_level(b)) for a, b in _merges_by_rank(ranks)],
                      "unk_token": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False},
        }
        return cls(build_backend(spec, file), header.ids, file=file, byte_level=True)


def _merges_by_rank(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """Every split of a token into two ranked tokens, ordered by the rank of the token they form."""
    found = []
    for token, rank in ranks.items():
        for k in range(1, len(token)):
            if token[:k] in ranks and token[k:] in ranks:
                found.append((rank, k, token))
    found.sort()
    return [(token[:k], token[k:]) for _, k, token in found]
