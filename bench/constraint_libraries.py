"""Compile time and per-token mask time of the constrained-decoding libraries (llguidance,
xgrammar, outlines-core) on a model's vocabulary, for JSON schemas: how mnnllm picked its library.

Each library gets the same vocabulary (mnnllm's bytes per token id) and walks the same token
sequence (a valid instance of the schema, tokenized by the model's tokenizer); the mask before
every token is timed. Run: .venv/bin/python bench/constraint_libraries.py [model_dir]
(xgrammar needs `apache-tvm-ffi` and torch, outlines-core nothing more; a library that is not
installed is skipped).
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from mnnllm_core.llm.token_bytes import token_bytes
from mnnllm_core.llm.tokenizer import create_tokenizer

SCHEMAS = {
    "person": ({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "pattern": "^[a-z]+@[a-z]+\\.(com|org)$"},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 4},
        "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                    "required": ["city", "zip"], "additionalProperties": False}},
        "required": ["name", "age", "email", "role", "tags", "address"], "additionalProperties": False},
        {"name": "Ada Lovelace", "age": 36, "email": "ada@math.org", "role": "admin",
         "tags": ["math", "engines"], "address": {"city": "London", "zip": "W1"}}),
    "items": ({"type": "object", "properties": {"items": {"type": "array", "maxItems": 8, "items": {
        "type": "object", "properties": {"id": {"type": "integer"}, "price": {"type": "number"},
                                         "label": {"type": "string"}},
        "required": ["id", "price", "label"], "additionalProperties": False}}},
        "required": ["items"], "additionalProperties": False},
        {"items": [{"id": i, "price": 1.5 * i, "label": f"item number {i}"} for i in range(6)]}),
}


def timed(call):
    start = time.perf_counter()
    result = call()
    return result, time.perf_counter() - start


def bench_llguidance(vocab, eos, special, schema, tokens, encode):
    import llguidance
    import llguidance.numpy as lnp

    class Wrapped:
        eos_token_id, bos_token_id, tokens, special_token_ids = eos, None, vocab, special

        def __call__(self, text):
            return encode(text.decode("utf-8", errors="replace") if isinstance(text, bytes) else text)

    tok, setup = timed(lambda: llguidance.LLTokenizer(llguidance.TokenizerWrapper(Wrapped())))
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema))
    matcher, compile_s = timed(lambda: llguidance.LLMatcher(tok, grammar))
    assert not matcher.is_error(), matcher.get_error()
    mask = lnp.allocate_token_bitmask(1, len(vocab))
    times = []
    for token in tokens:
        _, t = timed(lambda: lnp.fill_next_token_bitmask(matcher, mask))
        times.append(t)
        assert (mask[0, token // 32] >> (token % 32)) & 1, "llguidance refused the instance's token"
        assert matcher.consume_token(token), matcher.get_error()
    return setup, compile_s, times


def bench_xgrammar(vocab, eos, special, schema, tokens, encode):
    import xgrammar

    info, setup = timed(lambda: xgrammar.TokenizerInfo(vocab, xgrammar.VocabType.RAW, vocab_size=len(vocab),
                                                         stop_token_ids=[eos]))
    compiler = xgrammar.GrammarCompiler(info, cache_enabled=False)
    compiled, compile_s = timed(lambda: compiler.compile_json_schema(json.dumps(schema)))
    matcher = xgrammar.GrammarMatcher(compiled)
    mask = xgrammar.allocate_token_bitmask(1, len(vocab))
    times = []
    for token in tokens:
        _, t = timed(lambda: matcher.fill_next_token_bitmask(mask))
        times.append(t)
        assert (int(mask[0, token // 32]) >> (token % 32)) & 1, "xgrammar refused the instance's token"
        assert matcher.accept_token(token)
    return setup, compile_s, times


def bench_outlines(vocab, eos, special, schema, tokens, encode):
    from outlines_core import Guide, Index, Vocabulary
    from outlines_core.json_schema import build_regex_from_schema

    def build():
        table: dict[bytes, list[int]] = {}
        for i, piece in enumerate(vocab):
            if i != eos and i not in special and piece:
                table.setdefault(piece, []).append(i)
        return Vocabulary(eos, table)

    vocabulary, setup = timed(build)
    regex = build_regex_from_schema(json.dumps(schema))
    index, compile_s = timed(lambda: Index(regex, vocabulary))
    guide = Guide(index)
    mask = np.zeros((len(vocab) + 31) // 32, np.int32)
    times = []
    for token in tokens:
        _, t = timed(lambda: guide.write_mask_into(mask.ctypes.data, mask.size, 4))
        times.append(t)
        assert (int(mask[token // 32]) >> (token % 32)) & 1, "outlines-core refused the instance's token"
        guide.advance(token)
    return setup, compile_s, times


LIBRARIES = {"llguidance": bench_llguidance, "xgrammar": bench_xgrammar, "outlines-core": bench_outlines}


def main(model_dir: str) -> None:
    tokenizer = create_tokenizer(str(Path(model_dir) / "tokenizer.mtok"))
    vocab = token_bytes(tokenizer)
    special = [i for i in tokenizer.special_ids if i != tokenizer.eos_id]
    print(f"vocabulary: {len(vocab)} tokens, eos {tokenizer.eos_id}")
    print(f"{'library':14} {'schema':7} {'vocab s':>8} {'compile ms':>10} {'tokens':>6} "
          f"{'mask us median':>14} {'mean':>8} {'max':>8}")
    for name, bench in LIBRARIES.items():
        for label, (schema, instance) in SCHEMAS.items():
            tokens = tokenizer.encode(json.dumps(instance, separators=(",", ":")))
            try:
                setup, compile_s, times = bench(vocab, tokenizer.eos_id, special, schema, tokens,
                                                 tokenizer._encode)
            except ImportError as err:
                print(f"{name:14} skipped: {err}")
                break
            us = [t * 1e6 for t in times]
            print(f"{name:14} {label:7} {setup:8.2f} {compile_s * 1e3:10.1f} {len(tokens):6d} "
                  f"{statistics.median(us):14.0f} {statistics.mean(us):8.0f} {max(us):8.0f}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "../shared/models/smollm2-135m-instruct-mnn-q4")
