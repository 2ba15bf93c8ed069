"""Type 0, SentencePiece: `<count>` then one `<base64 piece> <score> <type>` line per id.

MNN's exporter writes U+2581 as a plain space; we restore it. MNN encodes with
SentencePiece's BPE (merge the adjacent pair forming the highest-scoring piece,
leftmost first), which is HF's BPE with merges ranked by that score, as HF's own
SentencePiece converter builds them. SentencePiece's re-segmentation of UNUSED
pieces is not reproduced (MNN-exported vocabularies carry none in practice).
"""
from __future__ import annotations


from mnnllm_core.errors import TokenizerError

from .base import Tokenizer, build_backend, special_added_tokens
from .reader import Header, TextLines, decode_base64

SPACE = "\u2581"
NORMAL, UNKNOWN, BYTE = 1, 2, 6  # piece types; 3 CONTROL, 4 USER_DEFINED, 5 UNUSED need no handling


class Sentencepiece(Tokenizer):
    """MNN's `Sentencepiece` tokenizer."""

    @classmethod
    def load(cls, data: bytes, header: Header, file: str) -> Sentencepiece:
        lines = TextLines(data, header.body_offset, file)
        count = lines.count("vocab_size", 4)
        pieces, scores, kinds = [], [], []
        for i in range(count):
            field = f"vocab[{i}]"
            parts = lines.line(field).split(b" ")
            if len(parts) != 3:
                raise TokenizerError("expected '<base64> <score> <type>'", file=file, field=field)
            piece = _utf8(decode_base64(parts[0], file, field), file, field)
            try:
                scores.append(float(parts[1]))
                kinds.append(int(parts[2]))
            except ValueError:
                raise TokenizerError("score or type is not a number", file=file, field=field) from None
            pieces.append(piece.replace(" ", SPACE))
        vocab: dict[str, int] = {}
        for i, piece in enumerate(pieces):
            vocab.setdefault(piece, i)
        unk = next((i for i, k in enumerate(kinds) if k == UNKNOWN), None)
        model = {"type": "BPE", "vocab": vocab, "merges": _merges_by_score(pieces, scores, kinds, vocab),
                 "unk_token": pieces[unk] if unk is not None else None, "fuse_unk": False,
                 "byte_fallback": BYTE in kinds, "ignore_merges": False}
        spec = {
            "added_tokens": special_added_tokens(header.ids.special,
                                                 {i: p.replace(SPACE, " ") for i, p in enumerate(pieces)}, file),
            "normalizer": {"type": "Sequence", "normalizers": [
                {"type": "Prepend", "prepend": SPACE},
                {"type": "Replace", "pattern": {"String": " "}, "content": SPACE}]},
            "decoder": {"type": "Sequence", "decoders": [
                {"type": "Replace", "pattern": {"String": SPACE}, "content": " "},
                {"type": "ByteFallback"}, {"type": "Fuse"},
                {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
            "model": model,
        }
        return cls(build_backend(spec, file), header.ids, file=file)


def _utf8(raw: bytes, file: str, field: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise TokenizerError("piece is not UTF-8", file=file, field=field) from None


def _merges_by_score(pieces: list[str], scores: list[float], kinds: list[int],
                     vocab: dict[str, int]) -> list[tuple[str, str]]:
    """Every split of a NORMAL piece into two vocabulary pieces, best-scoring result first."""
    ranked = []
    for pid, piece in enumerate(pieces):
        if kinds[pid] != NORMAL or len(piece) < 2:
            continue
        for k in range(1, len(piece)):
            if piece[:k] in vocab and piece[k:] in vocab:
                ranked.append((-scores[pid], pid, k))
    ranked.sort()
    return [(pieces[pid][:k], pieces[pid][k:]) for _, pid, k in ranked]
