"""Tokenizers: the real SmolLM2 `.mtok` against MNN's own encoder, and every other format from small files."""
from __future__ import annotations

import base64
import json
import random
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mnnllm_core.errors import TokenizerError
from mnnllm_core.llm.tokenizer import Tokenizer, TokenizerType, create_tokenizer
from mnnllm_core.llm.tokenizer.base import bytes_to_unicode, unicode_to_bytes
from paths import MODEL_DIR

MODEL = MODEL_DIR
MTOK = MODEL / "tokenizer.mtok"
SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"

needs_model = pytest.mark.skipif(not MTOK.exists(), reason=f"{MTOK} is not here")


@pytest.fixture(scope="module")
def smol() -> Tokenizer:
    return create_tokenizer(str(MTOK))


# ---------------------------------------------------------------- generated strings

_SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
_CJK = "你好世界中文分词测试模型语言日本語のテキスト한국어텍스트"
_ACCENTS = "éèêëàâäôöûüçñÉÀÇØøÅåßœæ"
_RTL = "مرحبا بالعالم שלום עולם"
_COMBINING = ["e\u0301", "a\u0308", "n\u0303", "o\u0302\u0323", "\u0915\u093f", "Z\u0351\u0352\u0357"]
_EMOJI = ["😀", "🎉", "👍🏽", "👨\u200d👩\u200d👧\u200d👦", "🏳️\u200d🌈", "❤️", "🇯🇵", "🤖", "👩🏾\u200d💻"]
_WORDS = ["the", "quick", "brown", "fox", "Hello", "world", "don't", "it's", "we'll", "I'm", "GPT", "tokenizer",
          "MNN", "naïve", "café", "HTTP", "x86_64", "camelCase", "snake_case"]
_CODE = ["def f(x):\n    return x * 2\n", "for (int i = 0; i < n; ++i) { sum += a[i]; }",
         "if __name__ == '__main__':\n\tmain()", "SELECT * FROM users WHERE id = 42;",
         "const x = () => { return `${a}`; };", "#include <stdio.h>\nint main(){printf(\"hi\\n\");}",
         "    x = [1, 2, 3]\n    y = {'a': 1}", "<div class=\"a\">&nbsp;</div>"]
_PUNCT = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~…—–«»¿¡“”‘’"
_SPACES = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \t ", "\t\t", " \n ", "\u3000", "\u00a0"]
_CHAR_RANGES = [(0x20, 0x7E), (0xA0, 0x24F), (0x370, 0x52F), (0x4E00, 0x9FFF), (0x1F300, 0x1FAFF), (0x2000, 0x2BFF)]


def _piece(rng: random.Random) -> str:
    kind = rng.randrange(12)
    if kind == 0:
        return "".join(rng.choice(_CJK) for _ in range(rng.randint(1, 6)))
    if kind == 1:
        return rng.choice(_WORDS) + "".join(rng.choice(_ACCENTS) for _ in range(rng.randint(0, 3)))
    if kind == 2:
        return _RTL[rng.randrange(len(_RTL)):][:rng.randint(1, 12)]
    if kind == 3:
        return rng.choice(_COMBINING)
    if kind == 4:
        return "".join(rng.choice(_SPACES) for _ in range(rng.randint(1, 4)))
    if kind == 5:
        return str(rng.randrange(10 ** rng.randint(1, 25)))
    if kind == 6:
        return rng.choice(_CODE)
    if kind == 7:
        return "".join(rng.choice(_EMOJI) for _ in range(rng.randint(1, 3)))
    if kind == 8:
        return rng.choice(_SPECIALS)
    if kind == 9:
        return "".join(rng.choice(_PUNCT) for _ in range(rng.randint(1, 4)))
    if kind == 10:
        return chr(rng.randint(*rng.choice(_CHAR_RANGES)))
    return rng.choice(_WORDS)


def generated_strings(count: int = 1200, seed: int = 20240501) -> list[str]:
    """Deterministic mix of scripts, whitespace runs, numbers, code, emoji and special tokens."""
    rng = random.Random(seed)
    out = ["", " ", "\n", "<|im_start|>", "<|im_start|><|im_end|>", "a<|endoftext|>b", "1234567890123",
           "a\x04b\U00040000c"]
    while len(out) < count:
        sep = rng.choice(["", " ", "", "\n"])
        out.append(sep.join(_piece(rng) for _ in range(rng.randint(1, 8))))
    return out


_ORACLE = textwrap.dedent("""
    import json, os, sys, tempfile
    import MNN.llm as llm
    work = tempfile.mkdtemp()
    config = os.path.join(work, "config.json")
    with open(config, "w") as f:
        json.dump({"base_dir": sys.argv[1] + "/", "llm_model": "llm.mnn", "llm_weight": "llm.mnn.weight",
                   "tokenizer_file": "tokenizer.mtok"}, f)
    model = llm.create(config)
    model.load()
    texts = json.load(sys.stdin)
    sys.stdout.write("\\n@@IDS@@\\n")
    json.dump([list(model.tokenizer_encode(t)) for t in texts], sys.stdout)
    sys.stdout.flush()
    os._exit(0)  # MNN's buffered stdout would follow our JSON at exit
""")


def mnn_encode(texts: list[str]) -> list[list[int]]:
    """MNN's own `tokenizer_encode` for all texts, in one subprocess (one model per process)."""
    done = subprocess.run([sys.executable, "-c", _ORACLE, str(MODEL)], input=json.dumps(texts),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.split("@@IDS@@\n", 1)[1])  # MNN prints device info to stdout first


# ---------------------------------------------------------------- the real SmolLM2 tokenizer.mtok

@needs_model
@pytest.mark.oracle
def test_mtok_encodes_exactly_like_mnn_on_generated_strings(smol: Tokenizer) -> None:
    texts = generated_strings()
    expected = mnn_encode(texts)
    ours = [smol.encode(t) for t in texts]
    identical = sum(a == b for a, b in zip(ours, expected))
    mismatches = [(t, a, b) for t, a, b in zip(texts, ours, expected) if a != b]
    assert identical == len(texts), f"{identical}/{len(texts)} identical; first: {mismatches[:3]}"


@needs_model
def test_mtok_decode_inverts_encode_on_generated_strings(smol: Tokenizer) -> None:
    texts = [t for t in generated_strings() if _spellable(smol, t)]
    broken = [t for t in texts if smol.decode(smol.encode(t), skip_special_tokens=False) != t]
    assert len(texts) > 1000 and broken == []


# SmolLM2's vocabulary lacks the bytes 04 06 13 14 16 1D (controls) and the UTF-8 lead bytes
# F1 F2 (U+40000-U+BFFFF, unassigned); HF and MNN both drop them, so such text cannot come back.
_SMOL_LOSSLESS = st.characters(codec="utf-8", max_codepoint=0x3FFFF, exclude_characters="\x04\x06\x13\x14\x16\x1d")


def _spellable(tok: Tokenizer, text: str) -> bool:
    """Whether every UTF-8 byte of the text has a byte-level token."""
    chars = bytes_to_unicode()
    return all(tok.token_to_id(chars[b]) is not None for b in set(text.encode()))


@needs_model
@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet=_SMOL_LOSSLESS))
def test_mtok_decode_inverts_encode_on_any_text(smol: Tokenizer, text: str) -> None:
    # Byte-level BPE with no normalizer loses nothing the vocabulary can spell.
    assert smol.decode(smol.encode(text), skip_special_tokens=False) == text


@needs_model
def test_mtok_drops_bytes_missing_from_the_vocabulary_as_hf_does(smol: Tokenizer) -> None:
    assert smol.decode(smol.encode("a\x04b")) == "ab"


@needs_model
def test_reference_prompts_encode_to_their_prompt_ids(smol: Tokenizer) -> None:
    reference = json.loads((MODEL / "reference.json").read_text())
    for case in reference["prompts"]:
        text = f"{SYSTEM}<|im_start|>user\n{case['prompt']}<|im_end|>\n<|im_start|>assistant\n"
        assert smol.encode(text) == case["prompt_ids"]


@needs_model
def test_reference_generations_decode_to_their_text(smol: Tokenizer) -> None:
    reference = json.loads((MODEL / "reference.json").read_text())
    for case in reference["prompts"]:
        run = case["transformers_fp32"]
        assert smol.decode(run["gen_ids"], skip_special_tokens=False) == run["text"]


@needs_model
def test_header_gives_special_stop_bos_and_eos_ids(smol: Tokenizer) -> None:
    assert smol.vocab_size == 49152
    assert smol.special_ids == list(range(17))
    assert smol.stop_ids == [2] and smol.is_stop(2) and not smol.is_stop(1)
    assert smol.is_special(0) and not smol.is_special(17)
    assert (smol.bos_id, smol.eos_id) == (1, 2)
    assert smol.token_to_id("<|im_end|>") == 2
    assert smol.token_to_id("Ġthe") == 260
    assert smol.token_to_id("no such token") is None


@needs_model
def test_decode_skips_special_ids_by_default_like_mnn(smol: Tokenizer) -> None:
    ids = smol.encode("<|im_start|>hi<|im_end|>")
    assert smol.decode(ids) == "hi"
    assert smol.decode(ids, skip_special_tokens=False) == "<|im_start|>hi<|im_end|>"


@needs_model
def test_decode_id_bytes_of_a_split_character_join_into_utf8(smol: Tokenizer) -> None:
    ids = smol.encode("你")
    assert len(ids) == 2
    assert b"".join(smol.decode_id_bytes(i) for i in ids).decode("utf-8") == "你"
    assert smol.decode_id(ids[0]) == "\ufffd"  # half a character alone


@needs_model
@pytest.mark.parametrize("text", ["你好, 世界", "naïve café ☕ e\u0301", "👨\u200d👩\u200d👧\u200d👦 family",
                                  "مرحبا 🇯🇵 日本語", "plain ascii", "tail 😀"])
def test_stream_pieces_concatenate_to_full_decode(smol: Tokenizer, text: str) -> None:
    ids = smol.encode(text)
    stream = smol.stream()
    pieces = [stream.put(i) for i in ids] + [stream.flush()]
    assert "".join(pieces) == smol.decode(ids) == text
    assert all("\ufffd" not in p for p in pieces)


@needs_model
def test_stream_flush_returns_an_unfinished_character(smol: Tokenizer) -> None:
    first_half = smol.encode("你")[:1]
    stream = smol.stream()
    assert stream.put(first_half[0]) == ""
    assert stream.flush() == smol.decode(first_half) == "\ufffd"


@needs_model
def test_tokenizer_json_export_of_the_mtok_tokenizes_the_same(smol: Tokenizer, tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text(smol.backend.to_str())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<|im_start|>",
                                                                "eos_token": {"content": "<|im_end|>"}}))
    plain = create_tokenizer(str(tmp_path / "tokenizer.json"))
    texts = generated_strings(300)
    assert [plain.encode(t) for t in texts] == [smol.encode(t) for t in texts]
    assert (plain.bos_id, plain.eos_id, plain.stop_ids) == (1, 2, [2])
    assert plain.special_ids == smol.special_ids


@needs_model
def test_a_tokenizer_config_json_that_is_not_an_object_is_ignored(smol: Tokenizer, tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text(smol.backend.to_str())
    (tmp_path / "tokenizer_config.json").write_text('["<|im_start|>"]')
    plain = create_tokenizer(str(tmp_path / "tokenizer.json"))
    assert (plain.bos_id, plain.eos_id, plain.stop_ids) == (None, None, [])


@needs_model
def test_mtok_without_its_optional_tail_still_loads(tmp_path: Path) -> None:
    data = MTOK.read_bytes()
    tail = 4 + 2 + len("<|im_end|>") + 1 + 2 + len("<|im_start|>")  # template, eos, flags, bos
    path = tmp_path / "tokenizer.mtok"
    path.write_bytes(data[:-tail])
    tok = create_tokenizer(str(path))
    assert tok.encode("Hello world") == [19556, 905]
    assert tok.eos_id == 2  # from the stop ids instead


# ---------------------------------------------------------------- the other formats, from small files

def _header(kind: TokenizerType, special: list[int] = (), stop: list[int] = (), prefix: list[int] = ()) -> str:
    ids = " ".join(str(i) for i in (*special, *stop, *prefix))
    return f"430 {int(kind)}\n{len(special)} {len(stop)} {len(prefix)}\n{ids}\n"


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


SP_NORMAL = [("▁", -50), ("h", -60), ("e", -61), ("l", -62), ("o", -63), ("w", -64), ("r", -65), ("d", -66),
             ("ll", -1), ("he", -2), ("hell", -3), ("hello", -4), ("▁hello", -5), ("or", -6), ("wor", -7),
             ("worl", -8), ("world", -9), ("▁world", -10)]


def write_sentencepiece(path: Path) -> dict[str, int]:
    """<unk>, <s>, </s>, the 256 byte pieces, then SP_NORMAL; spaces written for U+2581 as MNN's exporter does."""
    pieces = [("<unk>", 0.0, 2), ("<s>", 0.0, 3), ("</s>", 0.0, 3)]
    pieces += [(f"<0x{b:02X}>", 0.0, 6) for b in range(256)]
    pieces += [(p, s, 1) for p, s in SP_NORMAL]
    lines = [f"{_b64(p.replace('▁', ' ').encode())} {s} {t}" for p, s, t in pieces]
    path.write_text(_header(TokenizerType.SENTENCEPIECE, [0, 1, 2], [2], [1]) + f"{len(lines)}\n"
                    + "\n".join(lines) + "\n")
    return {p: i for i, (p, _, _) in enumerate(pieces)}


def test_sentencepiece_file_merges_by_score_and_falls_back_to_bytes(tmp_path: Path) -> None:
    ids = write_sentencepiece(tmp_path / "tokenizer.txt")
    tok = create_tokenizer(str(tmp_path / "tokenizer.txt"))
    assert tok.encode("hello world") == [1, ids["▁hello"], ids["▁world"]]
    assert tok.encode("hé") == [1, ids["▁"], ids["h"], ids["<0xC3>"], ids["<0xA9>"]]
    assert tok.encode("world</s>") == [1, ids["▁world"], 2]
    assert tok.decode(tok.encode("hello world hé")) == "hello world hé"
    assert (tok.bos_id, tok.eos_id, tok.stop_ids) == (1, 2, [2])
    stream = tok.stream()
    assert "".join([stream.put(i) for i in tok.encode("hé world")] + [stream.flush()]) == "hé world"


def _tiktoken_ranks() -> list[bytes]:
    merged = [b"he", b"ll", b"hell", b"hello", b" w", b"or", b" wor", b" worl", b" world", b"\xe4\xbd",
              b"\xe4\xbd\xa0", b"  ", b"lo", b"el"]
    return [bytes([b]) for b in range(256)] + merged


def write_tiktoken(path: Path) -> int:
    ranks = _tiktoken_ranks()
    lines = [_b64(t) for t in ranks] + [_b64(b"<|endoftext|>")]
    eot = len(ranks)
    path.write_text(_header(TokenizerType.TIKTOKEN, [eot], [eot]) + f"{len(lines)}\n" + "\n".join(lines) + "\n")
    return eot


def rank_bpe(piece: bytes, ranks: dict[bytes, int]) -> list[int]:
    """tiktoken's algorithm, plainly: merge the adjacent pair whose concatenation ranks lowest, leftmost first."""
    parts = [piece[i:i + 1] for i in range(len(piece))]
    while len(parts) > 1:
        candidates = [(ranks.get(parts[i] + parts[i + 1], len(ranks)), i) for i in range(len(parts) - 1)]
        rank, i = min(candidates)
        if rank == len(ranks):
            break
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    return [ranks[p] for p in parts]


@pytest.fixture(scope="module")
def tiktoken_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiktoken") / "tokenizer.txt"
    write_tiktoken(path)
    return path


def test_tiktoken_file_encodes_and_decodes(tiktoken_file: Path) -> None:
    tok = create_tokenizer(str(tiktoken_file))
    ranks = {t: r for r, t in enumerate(_tiktoken_ranks())}
    eot = len(ranks)
    assert tok.encode("hello world<|endoftext|>") == [ranks[b"hello"], ranks[b" world"], eot]
    assert tok.is_stop(eot) and tok.eos_id == eot
    assert tok.decode(tok.encode("你好 hello  world")) == "你好 hello  world"


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet="helowrd 你好\n", max_size=24))
def test_tiktoken_file_merges_like_tiktoken_rank_bpe(tiktoken_file: Path, text: str) -> None:
    tok = create_tokenizer(str(tiktoken_file))
    ranks = {t: r for r, t in enumerate(_tiktoken_ranks())}
    to_bytes = unicode_to_bytes()
    expected = []
    for word, _ in tok.backend.pre_tokenizer.pre_tokenize_str(text):
        expected += rank_bpe(bytes(to_bytes[c] for c in word), ranks)
    assert tok.encode(text) == expected
    assert tok.decode(expected) == text


BERT_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world", ",", "!", "un", "##aff", "##able",
              "##s", "你", "好", "cafe"]


def test_bert_file_lowercases_splits_and_uses_wordpiece(tmp_path: Path) -> None:
    path = tmp_path / "tokenizer.txt"
    lines = [_b64(t.encode()) for t in BERT_VOCAB]
    path.write_text(_header(TokenizerType.BERT, [0, 1, 2, 3, 4], [3]) + f"{len(lines)}\n" + "\n".join(lines) + "\n")
    tok = create_tokenizer(str(path))
    ids = {t: i for i, t in enumerate(BERT_VOCAB)}
    assert tok.encode("Hello, Worlds! unaffable 你好 Café zzz") == [
        ids[t] for t in ["hello", ",", "world", "##s", "!", "un", "##aff", "##able", "你", "好", "cafe", "[UNK]"]]
    assert tok.decode(tok.encode("hello, worlds!")) == "hello, worlds!"
    assert tok.encode("[CLS] hello [SEP]") == [2, 5, 3]


def write_huggingface(path: Path) -> dict[str, int]:
    chars = list(bytes_to_unicode().values())
    merged = ["he", "ll", "hell", "hello", "Ġw", "or", "Ġwor", "Ġworl", "Ġworld", "<|endoftext|>"]
    vocab = chars + merged
    merges = ["#version: 0.2", "h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "Ġwor l", "Ġworl d"]
    eot = vocab.index("<|endoftext|>")
    path.write_text(_header(TokenizerType.HUGGINGFACE, [eot], [eot]) + f"{len(vocab)} {len(merges)}\n"
                    + "\n".join(vocab + merges) + "\n", encoding="utf-8")
    return {t: i for i, t in enumerate(vocab)}


def test_huggingface_file_is_byte_level_bpe(tmp_path: Path) -> None:
    ids = write_huggingface(tmp_path / "tokenizer.txt")
    tok = create_tokenizer(str(tmp_path / "tokenizer.txt"))
    assert tok.encode("hello world<|endoftext|>") == [ids["hello"], ids["Ġworld"], ids["<|endoftext|>"]]
    assert tok.decode(tok.encode("héllo 世界 <|endoftext|>!")) == "héllo 世界 !"
    assert tok.decode_id_bytes(ids["Ġworld"]) == b" world"


def _str(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<H", len(raw)) + raw


def _mtok_vocab(tokens: list[str], scores: list[float] | None = None) -> bytes:
    """Vocabulary entries sorted by string, as the exporter writes them."""
    order = sorted(range(len(tokens)), key=lambda i: tokens[i].encode())
    return b"".join(_str(tokens[i]) + struct.pack("<I", i) + (struct.pack("<d", scores[i]) if scores else b"")
                    for i in order)


def _mtok_added(tokens: list[tuple[int, str]]) -> bytes:
    return struct.pack("<I", len(tokens)) + b"".join(struct.pack("<IBBB", i, 1, 0, 0) + _str(t) for i, t in tokens)


UNIGRAM = [("<unk>", 0.0), ("</s>", 0.0), ("▁", -3.0), ("▁hello", -1.0), ("▁world", -1.5), ("fi", -1.0),
           ("h", -5.0), ("e", -5.0), ("l", -5.0), ("o", -5.0), ("w", -5.0), ("r", -5.0), ("d", -5.0)]


def test_mtok_with_unigram_metaspace_and_nfkc_table(tmp_path: Path) -> None:
    nfkc_table = struct.pack("<I", 2) + struct.pack("<I", 0xA0) + _str(" ") + struct.pack("<I", 0xFB01) + _str("fi")
    body = (b"\x04" + struct.pack("<I", 1) + b"\x06" + nfkc_table    # normalizer: Sequence[NFKC table]
            + b"\x03" + _str("▁") + b"\x01"                            # pre-tokenizer: Metaspace, prefix space
            + b"\x02" + struct.pack("<II", len(UNIGRAM), 0) + b"\x00"    # Unigram, unk id 0, no byte fallback
            + _mtok_vocab([t for t, _ in UNIGRAM], [s for _, s in UNIGRAM])
            + b"\x02" + _str("▁") + b"\x01"                            # decoder: Metaspace
            + _mtok_added([(1, "</s>")]) + struct.pack("<I", 0) + _str("</s>") + b"\x00" + _str(""))
    path = tmp_path / "tokenizer.mtok"
    path.write_bytes(_header(TokenizerType.PIPELINE, [0, 1], [1]).encode() + body)
    tok = create_tokenizer(str(path))
    ids = {t: i for i, (t, _) in enumerate(UNIGRAM)}
    assert tok.encode("hello\u00a0world</s>") == [ids["▁hello"], ids["▁world"], 1]
    assert tok.encode("\ufb01") == [ids["▁"], ids["fi"]]
    assert tok.decode(tok.encode("hello world")) == "hello world"
    assert tok.eos_id == 1 and tok.is_stop(1)


WORDPIECE = ["[UNK]", "[CLS]", "[SEP]", "hello", "world", "##s", "cafe", ",", "!"]


def test_mtok_with_wordpiece_and_accent_stripping_bert_normalizer(tmp_path: Path) -> None:
    nfd_table = struct.pack("<I", 1) + struct.pack("<I", 0xE9) + _str("e\u0301")
    body = (b"\x07\x01\x01\x01\x01" + nfd_table                        # BertNormalizer, strip accents
            + b"\x05"                                                   # BertPreTokenizer
            + b"\x01" + struct.pack("<I", len(WORDPIECE)) + _str("[UNK]") + _str("##") + struct.pack("<I", 100)
            + _mtok_vocab(WORDPIECE)
            + b"\x03" + _str("##") + b"\x01"                           # WordPiece decoder, cleanup
            + _mtok_added([(0, "[UNK]"), (1, "[CLS]"), (2, "[SEP]")]))
    path = tmp_path / "tokenizer.mtok"
    path.write_bytes(_header(TokenizerType.PIPELINE, [0, 1, 2], [2]).encode() + body)
    tok = create_tokenizer(str(path))
    assert tok.encode("[CLS] Hello, Café worlds!") == [1, 3, 7, 6, 4, 5, 8]
    assert tok.decode(tok.encode("hello, worlds!")) == "hello, worlds!"
    assert tok.encode("zzz") == [0]


# ---------------------------------------------------------------- malformed input

def _assert_rejected(path: Path, field_prefix: str | None = None) -> TokenizerError:
    with pytest.raises(TokenizerError) as caught:
        create_tokenizer(str(path))
    error = caught.value
    assert error.file == str(path) and error.field, (error.file, error.field)
    if field_prefix:
        assert error.field.startswith(field_prefix), error.field
    assert str(path) in str(error)
    return error


@pytest.mark.parametrize("content, field", [
    (b"", "magic"),
    (b"431 4\n0 0 0\n\n", "magic"),
    (b"hello\n", "magic"),
    (b"430 9\n0 0 0\n\n", "type"),
    (b"430 4\n", "counts"),
    (b"430 4\n1 x 0\n5\n", "counts"),
    (b"430 4\n2 1 0\n5 6\n", "special_ids"),
    (b"430 0\n0 0 0\n\n", "vocab_size"),
    (b"430 0\n0 0 0\n\n99999999\nAA== 0 1\n", "vocab_size"),
    (b"430 0\n0 0 0\n\n1\nAA==\n", "vocab[0]"),
    (b"430 1\n0 0 0\n\n1\n!!!=\n", "vocab[0]"),
    (b"430 2\n0 0 0\n\n1\nAA==\n", "vocab"),
    (b"430 3\n0 0 0\n\n5 0\na\n", "counts"),
    (b"430 3\n0 0 0\n\n2 1\na\n\xff\xfe\nx y\n", "vocab[1]"),
    (b"430 4\n0 0 0\n\n\x00\x01\x01\x00\xff\xff\xff\xff\x00\x00\x00\x00\x00\x00", "model.vocab_size"),
    (b"430 4\n0 0 0\n\n\x09", "normalizer"),
    (b'{"model": ', "json"),
    (b'{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [["a", "b"]]}}', "model"),
])
def test_malformed_files_raise_tokenizer_error_naming_file_and_field(tmp_path: Path, content: bytes,
                                                                      field: str) -> None:
    path = tmp_path / "tokenizer.bin"
    path.write_bytes(content)
    _assert_rejected(path, field)


def test_missing_file_raises_tokenizer_error(tmp_path: Path) -> None:
    _assert_rejected(tmp_path / "absent.mtok", "path")


@needs_model
@pytest.mark.parametrize("fraction", [0.0, 0.00002, 0.0001, 0.01, 0.2, 0.45, 0.5, 0.75, 0.95, 0.9995])
def test_truncated_mtok_raises_tokenizer_error(tmp_path: Path, fraction: float) -> None:
    data = MTOK.read_bytes()
    cut = 40 + int(fraction * (len(data) - 40 - 40))  # past the header, before the optional tail
    path = tmp_path / "tokenizer.mtok"
    path.write_bytes(data[:cut])
    _assert_rejected(path)


@needs_model
def test_mtok_with_out_of_range_vocab_id_is_rejected(tmp_path: Path) -> None:
    data = bytearray(MTOK.read_bytes())
    first_id = data.index(b"\x01\x00!") + 3  # the first vocab entry, "!" -> id 17
    data[first_id:first_id + 4] = (10 ** 6).to_bytes(4, "little")
    path = tmp_path / "tokenizer.mtok"
    path.write_bytes(bytes(data))
    _assert_rejected(path, "model.vocab[0].id")
