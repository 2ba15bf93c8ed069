"""Type 2, BERT: `<count>` then one base64 WordPiece token per line (line number = id).

MNN's own encoder lower-cases ASCII and splits on spaces and punctuation; we run
HF's uncased BERT pipeline (BertNormalizer, BertPreTokenizer, WordPiece), which
does the same and also handles accents and CJK as HF does. Like MNN, no
[CLS]/[SEP] are added: the chat template decides.
"""
from __future__ import annotations


from mnnllm_core.errors import TokenizerError

from .base import Tokenizer, build_backend, special_added_tokens
from .reader import Header, TextLines

UNK = "[UNK]"
PREFIX = "##"


class BertTokenizer(Tokenizer):
    """MNN's `BertTokenizer`."""

    @classmethod
    def load(cls, data: bytes, header: Header, file: str) -> BertTokenizer:
        lines = TextLines(data, header.body_offset, file)
        count = lines.count("vocab_size", 1)
        tokens = []
        for i in range(count):
            try:
                tokens.append(lines.base64(f"vocab[{i}]").decode("utf-8"))
            except UnicodeDecodeError:
                raise TokenizerError("token is not UTF-8", file=file, field=f"vocab[{i}]") from None
        vocab: dict[str, int] = {}
        for i, token in enumerate(tokens):
            vocab.setdefault(token, i)  # the exporter fills ids it has no token for with '<unk>'
        if UNK not in vocab:
            raise TokenizerError(f"no {UNK} token", file=file, field="vocab")
        spec = {
            "added_tokens": special_added_tokens(header.ids.special, dict(enumerate(tokens)), file),
            "normalizer": {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                           "strip_accents": None, "lowercase": True},
            "pre_tokenizer": {"type": "BertPreTokenizer"},
            "decoder": {"type": "WordPiece", "prefix": PREFIX, "cleanup": True},
            "model": {"type": "WordPiece", "vocab": vocab, "unk_token": UNK,
                      "continuing_subword_prefix": PREFIX, "max_input_chars_per_word": 100},
        }
        return cls(build_backend(spec, file), header.ids, file=file)
