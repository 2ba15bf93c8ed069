"""Bytes per token id (llm/token_bytes.py) for every tokenizer format, against decoding: the
bytes of a text's tokens, joined, are the bytes of its decoded text."""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mnnllm_core.llm.token_bytes import token_bytes
from mnnllm_core.llm.tokenizer import Tokenizer, TokenizerType, create_tokenizer
from test_tokenizer import (BERT_VOCAB, MTOK, _b64, _header, generated_strings, needs_model, write_huggingface,
                            write_sentencepiece, write_tiktoken)


def joined(tok: Tokenizer, vocab: list[bytes], ids: list[int]) -> bytes:
    return b"".join(vocab[i] for i in ids if not tok.is_special(i))


@pytest.fixture(scope="module")
def smol() -> tuple[Tokenizer, list[bytes]]:
    tok = create_tokenizer(str(MTOK))
    return tok, token_bytes(tok)


@needs_model
def test_mtok_vocabulary_has_one_entry_per_id_and_specials_by_name(smol) -> None:
    tok, vocab = smol
    assert len(vocab) == tok.vocab_size == 49152
    assert vocab[tok.eos_id] == b"<|im_end|>"
    assert vocab[tok.token_to_id("Ġworld")] == b" world"


@needs_model
def test_mtok_token_bytes_join_into_the_decoded_text(smol) -> None:
    tok, vocab = smol
    for text in generated_strings(300):
        ids = tok.encode(text)
        # (bytes the vocabulary lacks whole characters for decode as U+FFFD)
        assert joined(tok, vocab, ids).decode("utf-8", errors="replace") == tok.decode(ids), text


@needs_model
@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=40))
def test_mtok_token_bytes_join_into_any_decoded_text(smol, text: str) -> None:
    tok, vocab = smol
    ids = tok.encode(text)
    decoded = tok.decode(ids)
    if decoded == text:  # texts the vocabulary can spell (HF drops bytes it has no token for)
        assert joined(tok, vocab, ids) == text.encode("utf-8")


@needs_model
def test_tokenizer_json_export_gives_the_same_bytes(smol, tmp_path: Path) -> None:
    tok, vocab = smol
    path = tmp_path / "tokenizer.json"
    path.write_text(tok.backend.to_str(), encoding="utf-8")
    assert token_bytes(create_tokenizer(str(path))) == vocab


def test_sentencepiece_pieces_carry_their_space_and_byte_pieces_one_byte(tmp_path: Path) -> None:
    ids = write_sentencepiece(tmp_path / "tokenizer.txt")
    tok = create_tokenizer(str(tmp_path / "tokenizer.txt"))
    vocab = token_bytes(tok)
    assert vocab[ids["▁hello"]] == b" hello" and vocab[ids["hell"]] == b"hell"
    assert vocab[ids["<0xC3>"]] == b"\xc3"
    for text in ["hello world", "hé world", "hello  wor ld é"]:
        ids_ = tok.encode(text)
        assert joined(tok, vocab, ids_) == b" " + tok.decode(ids_).encode("utf-8")  # SentencePiece's prepended space


def test_tiktoken_vocabulary_is_raw_bytes(tmp_path: Path) -> None:
    eot = write_tiktoken(tmp_path / "tokenizer.txt")
    tok = create_tokenizer(str(tmp_path / "tokenizer.txt"))
    vocab = token_bytes(tok)
    assert vocab[:256] == [bytes([b]) for b in range(256)] and vocab[eot] == b"<|endoftext|>"
    for text in ["hello world", "你好 hello  world"]:
        ids = tok.encode(text)
        assert joined(tok, vocab, ids) == text.encode("utf-8")


def test_bert_pieces_join_words_and_space_others(tmp_path: Path) -> None:
    path = tmp_path / "tokenizer.txt"
    lines = [_b64(t.encode()) for t in BERT_VOCAB]
    path.write_text(_header(TokenizerType.BERT, [0, 1, 2, 3, 4], [3]) + f"{len(lines)}\n" + "\n".join(lines) + "\n")
    tok = create_tokenizer(str(path))
    vocab = token_bytes(tok)
    assert vocab[BERT_VOCAB.index("##able")] == b"able" and vocab[BERT_VOCAB.index("world")] == b" world"
    ids = tok.encode("hello worlds unaffable")
    assert joined(tok, vocab, ids) == b" " + tok.decode(ids).encode("utf-8")


def test_huggingface_byte_level_vocabulary(tmp_path: Path) -> None:
    ids = write_huggingface(tmp_path / "tokenizer.txt")
    tok = create_tokenizer(str(tmp_path / "tokenizer.txt"))
    vocab = token_bytes(tok)
    assert vocab[ids["Ġworld"]] == b" world"
    text = "héllo 世界 world"
    assert joined(tok, vocab, tok.encode(text)) == text.encode("utf-8")
