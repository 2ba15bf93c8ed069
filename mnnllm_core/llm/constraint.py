"""Constrained decoding on llguidance: a JSON schema, any JSON object, a regular expression, a
Lark grammar (as llguidance reads it) or a llama.cpp GBNF grammar (converted to Lark) limits
which tokens may come next. `Constraint` is the compiled request (checked when made, so a bad
schema fails before any token runs); `ConstraintState` follows one reply token by token and
masks the logits before the sampler's stages, so every sampler works under it.

llguidance was picked by measurement (bench/constraint_libraries.py): on SmolLM2's 49,152-token
vocabulary its mask takes 11-19 us a token (median; xgrammar 2-3 us, outlines-core 2-3 us but
0.3-0.7 s to compile), it compiles a schema in under 1 ms (xgrammar 15-31 ms), it reads Lark and
converts GBNF itself, and it needs neither torch nor a compiler at run time.
"""
from __future__ import annotations

import json
import logging
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from ..errors import MnnllmError
from .token_bytes import token_bytes
from .tokenizer.base import Tokenizer

log = logging.getLogger(__name__)

JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
"""One space after `,` and `:`, no other whitespace: a small model left free to write whitespace
may write nothing else. A schema's own `x-guidance` options override it."""

KINDS = ("json_schema", "json_object", "regex", "lark", "gbnf")


class ConstraintError(MnnllmError):
    """A schema, regular expression or grammar llguidance cannot compile; `field` names the option."""


def _llguidance():
    import llguidance
    return llguidance


@dataclass(frozen=True)
class Constraint:
    """What the reply must match: build with the class methods; `grammar` is llguidance's form."""

    kind: str
    source: str
    grammar: str

    @classmethod
    def json_schema(cls, schema: Mapping[str, Any] | str | bool, field: str = "json_schema") -> "Constraint":
        """A JSON value valid against `schema` (a dict, or its JSON text)."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as err:
                raise ConstraintError(f"the JSON schema is not JSON: {err}", field=field) from None
        if not isinstance(schema, (Mapping, bool)):
            raise ConstraintError(f"a JSON schema is an object, got {type(schema).__name__}", field=field)
        _check_schema(schema, field)
        text = json.dumps(schema)
        try:
            grammar = _llguidance().LLMatcher.grammar_from_json_schema(text, defaults=JSON_LAYOUT)
        except ValueError as err:
            raise ConstraintError(f"the JSON schema is not usable: {err}", field=field) from None
        return cls._checked("json_schema", text, grammar, field)

    @classmethod
    def json_object(cls, field: str = "response_format") -> "Constraint":
        """Any JSON object (OpenAI's `json_object` mode)."""
        grammar = _llguidance().LLMatcher.grammar_from_json_schema('{"type": "object"}', defaults=JSON_LAYOUT)
        return cls._checked("json_object", '{"type": "object"}', grammar, field)

    @classmethod
    def regex(cls, pattern: str, field: str = "regex") -> "Constraint":
        """Text matching `pattern` whole (Rust regex syntax, no look-around or back-references)."""
        _require_text(pattern, field)
        return cls._checked("regex", pattern, _llguidance().LLMatcher.grammar_from_regex(pattern), field)

    @classmethod
    def lark(cls, grammar: str, field: str = "grammar") -> "Constraint":
        """A Lark grammar as llguidance reads it (start rule `start`; `%json {...}` embeds a schema)."""
        _require_text(grammar, field)
        return cls._checked("lark", grammar, _llguidance().LLMatcher.grammar_from_lark(grammar), field)

    @classmethod
    def gbnf(cls, grammar: str, field: str = "grammar") -> "Constraint":
        """A llama.cpp GBNF grammar (start rule `root`), converted to Lark by llguidance."""
        _require_text(grammar, field)
        from llguidance.gbnf_to_lark import GbnfToLarkError, gbnf_to_lark
        try:
            lark = gbnf_to_lark(grammar)
        except (GbnfToLarkError, ValueError, KeyError, IndexError) as err:
            raise ConstraintError(f"the GBNF grammar does not parse: {err}", field=field) from None
        return cls._checked("gbnf", grammar, _llguidance().LLMatcher.grammar_from_lark(lark), field)

    @classmethod
    def grammar_text(cls, grammar: str, field: str = "grammar") -> "Constraint":
        """GBNF (llama.cpp's `::=` rules) or Lark, told apart by llguidance's own test."""
        _require_text(grammar, field)
        from llguidance.gbnf_to_lark import is_lark_syntax
        return cls.lark(grammar, field) if is_lark_syntax(grammar) else cls.gbnf(grammar, field)

    @classmethod
    def _checked(cls, kind: str, source: str, grammar: str, field: str) -> "Constraint":
        failed, messages = _llguidance().LLMatcher.validate_grammar_with_warnings(grammar)
        if failed:
            raise ConstraintError(f"the {kind.replace('_', ' ')} does not compile: {messages[0]}", field=field)
        for message in messages:
            log.warning("%s %s: %s", kind, field, message)
        return cls(kind, source, grammar)


def _require_text(value: object, field: str) -> None:
    if not isinstance(value, str) or not value:
        raise ConstraintError(f"expected a non-empty string, got {type(value).__name__}", field=field)


def _check_schema(schema: Mapping[str, Any] | bool, field: str) -> None:
    """A schema that breaks JSON Schema's own meta-schema, when `jsonschema` is installed to say so."""
    try:
        import jsonschema
    except ImportError:
        return
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as err:
        where = "/".join(str(p) for p in err.absolute_path) or "(root)"
        raise ConstraintError(f"invalid JSON schema at {where}: {err.message}", field=field) from None


class _Vocabularies:
    """llguidance's tokenizer per mnnllm tokenizer, built once (0.3 s for 49k tokens)."""

    def __init__(self):
        self._built: "weakref.WeakKeyDictionary[Tokenizer, Any]" = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def of(self, tokenizer: Tokenizer):
        with self._lock:
            found = self._built.get(tokenizer)
            if found is None:
                found = self._built[tokenizer] = _build_vocabulary(tokenizer)
            return found


def _build_vocabulary(tokenizer: Tokenizer):
    llguidance = _llguidance()
    stops = list(tokenizer.stop_ids) or ([tokenizer.eos_id] if tokenizer.eos_id is not None else [])
    if not stops:
        raise ConstraintError("the tokenizer names no stop token: a constrained reply could not end",
                              file=tokenizer.file, field="stop_ids")

    class Vocabulary:  # what llguidance.TokenizerWrapper reads
        eos_token_id = stops[0]
        bos_token_id = tokenizer.bos_id
        tokens = token_bytes(tokenizer)
        special_token_ids = [i for i in tokenizer.special_ids if i not in stops]

        def __call__(self, text: bytes | str) -> list[int]:
            if isinstance(text, bytes):
                text = text.decode("utf-8", errors="replace")
            return tokenizer._encode(text)

    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(Vocabulary()), eos_token=stops)


VOCABULARIES = _Vocabularies()


class ConstraintState:
    """One reply under a constraint: `mask` the next token's logits, then `consume` the chosen one."""

    def __init__(self, constraint: Constraint, tokenizer: Tokenizer):
        llguidance = _llguidance()
        self.constraint = constraint
        self.vocab_size = tokenizer.vocab_size
        self.matcher = llguidance.LLMatcher(VOCABULARIES.of(tokenizer), constraint.grammar, log_level=0)
        if self.matcher.is_error():
            raise ConstraintError(f"the {constraint.kind} does not compile: {self.matcher.get_error()}",
                                  field=constraint.kind)
        self._words = np.full((self.vocab_size + 31) // 32, -1, np.int32)
        self._stops = [i for i in (tokenizer.stop_ids or [tokenizer.eos_id]) if i is not None]
        self.failed: str | None = None  # llguidance gave up mid-reply (a resource limit): the reply ends

    def allowed(self) -> np.ndarray:
        """A bool per token id: may it come next. Once the matcher has failed, only a stop token."""
        if self.failed is None and self.matcher.is_error():
            self._fail(self.matcher.get_error())
        if self.failed is not None:
            allowed = np.zeros(self.vocab_size, bool)
            allowed[self._stops] = True
            return allowed
        self.matcher.unsafe_compute_mask_ptr(self._words.ctypes.data, self._words.nbytes)
        bits = np.unpackbits(self._words.view(np.uint8), bitorder="little", count=self.vocab_size)
        return bits.view(bool)

    def _fail(self, reason: str) -> None:
        self.failed = reason
        log.warning("the %s gave up mid-reply, which ends here unfinished: %s", self.constraint.kind, reason)

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """Set the logits of every token that may not come next to -inf (in place); the allowed ids."""
        allowed = self.allowed()
        size = min(allowed.size, logits.size)
        np.copyto(logits[:size], np.float32(-np.inf), where=~allowed[:size])
        if logits.size > size:
            logits[size:] = -np.inf
        return allowed

    def consume(self, token: int) -> None:
        if self.failed is None and not self.matcher.consume_token(int(token)):
            self._fail(f"token {token}: {self.matcher.get_error()}")

    @property
    def satisfied(self) -> bool:
        """The text so far is a complete match (it may end here)."""
        return self.failed is None and self.matcher.is_accepting()
