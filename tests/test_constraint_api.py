"""Constrained decoding through the Python API on the shared model: 20 JSON schemas (greedy) whose
outputs `jsonschema` validates, a GBNF grammar, regex, logits processors, log-probabilities,
a reply cut short, bad constraints, and speculative decoding verifying its guesses against the mask."""
from __future__ import annotations

import json
import re

import jsonschema
import numpy as np
import pytest

from constraint_cases import ARITHMETIC_GBNF, LIST_ACCEPTS, LIST_GBNF, SCHEMAS, arithmetic_accepts
from mnnllm_core.errors import ArgumentError
from mnnllm_core.llm.constraint import Constraint, ConstraintError
from mnnllm_core.llm.context import FINISHED
from mnnllm_core.llm.guided import CONSTRAINT_UNFINISHED, ConstrainedSpeculation
from paths import CONFIG, load_shared_greedy

pytestmark = pytest.mark.skipif(not CONFIG.exists(), reason=f"{CONFIG} is not here")


@pytest.fixture(scope="module")
def llm():
    return load_shared_greedy()


@pytest.mark.slow
@pytest.mark.parametrize("name,prompt,schema", SCHEMAS, ids=[s[0] for s in SCHEMAS])
def test_greedy_output_is_valid_against_its_json_schema(llm, name, prompt, schema):
    text = llm.response(f"{prompt} Answer in JSON.", max_new_tokens=160, constraint=Constraint.json_schema(schema))
    assert llm.context.status == FINISHED, text
    jsonschema.validate(json.loads(text), schema)


def test_a_schema_dict_is_shorthand_for_a_json_schema_constraint(llm):
    schema = SCHEMAS[0][2]
    text = llm.response("Describe a person.", max_new_tokens=60, constraint=schema)
    jsonschema.validate(json.loads(text), schema)


def test_json_object_mode_gives_an_object(llm):
    text = llm.response("Give a JSON object with a name and an age.", max_new_tokens=120,
                        constraint=Constraint.json_object())
    assert llm.context.status == FINISHED
    assert isinstance(json.loads(text), dict)


@pytest.mark.parametrize("grammar", [ARITHMETIC_GBNF], ids=["arithmetic"])
def test_gbnf_grammar_output_is_accepted_by_the_grammar(llm, grammar):
    constraint = Constraint.gbnf(grammar)
    text = llm.response("Write an equation with parentheses.", max_new_tokens=40, constraint=constraint)
    assert llm.context.status == FINISHED, text
    assert arithmetic_accepts(text), text
    assert Constraint.grammar_text(grammar).kind == "gbnf"


def test_gbnf_list_grammar_with_negated_classes_and_bounded_repeats(llm):
    text = llm.response("List three fruits.", max_new_tokens=80, constraint=Constraint.gbnf(LIST_GBNF))
    assert re.fullmatch(LIST_ACCEPTS, text), text


def test_lark_grammar_and_regex(llm):
    lark = 'start: "yes" | "no"\n'
    assert llm.response("Is the sky blue?", max_new_tokens=8, constraint=Constraint.lark(lark)) in ("yes", "no")
    assert Constraint.grammar_text(lark).kind == "lark"
    text = llm.response("Give a date.", max_new_tokens=20, constraint=Constraint.regex(r"\d{4}-\d{2}-\d{2}"))
    assert len(text) == 10 and text[4] == "-" and text.replace("-", "").isdigit()


def test_every_sampler_stays_inside_the_constraint(llm):
    schema = SCHEMAS[4][2]
    for config in ({"sampler_type": "mixed", "temperature": 1.5, "seed": 3},
                   {"sampler_type": "topK", "top_k": 5, "seed": 4}, {"sampler_type": "penalty", "penalty": 1.5}):
        guided = llm.guide(schema, sampler=llm.make_sampler(config))
        ids = llm.generate(llm.tokenizer_encode(llm.apply_chat_template("List fruits.")), 160, guided)
        assert llm.tokenizer.is_stop(ids[-1]), config
        jsonschema.validate(json.loads(llm.tokenizer_decode(ids)), schema)


def test_a_constraint_cut_short_by_max_new_tokens_says_so(llm):
    text = llm.response("Describe a book.", max_new_tokens=4, constraint=Constraint.json_schema(SCHEMAS[5][2]))
    assert llm.context.status == CONSTRAINT_UNFINISHED
    assert text.startswith("{")


def test_a_grammar_llguidance_gives_up_on_ends_the_reply_unfinished(llm):
    """A rule that only ever recurses never completes: llguidance stops at its item limit mid-reply."""
    text = llm.response("Say a.", max_new_tokens=300, constraint=Constraint.gbnf('root ::= "a" root'))
    assert llm.context.status == CONSTRAINT_UNFINISHED
    assert set(text) <= {"a"}


def test_logits_processor_sees_the_history_and_edits_the_logits(llm):
    seen = []
    prompt_ids = llm.tokenizer_encode(llm.apply_chat_template("Say hello."))
    plain = llm.generate(prompt_ids, 3)

    def ban_first(ids: np.ndarray, logits: np.ndarray) -> np.ndarray:
        seen.append(ids.copy())
        logits[plain[0]] = -np.inf
        return logits

    guided = llm.guide(logits_processor=ban_first)
    out = llm.generate(prompt_ids, 3, guided)
    assert out[0] != plain[0]
    assert list(seen[0]) == prompt_ids and list(seen[1]) == prompt_ids + out[:1]


def test_logprobs_name_the_chosen_token_and_sorted_alternatives(llm):
    prompt_ids = llm.tokenizer_encode(llm.apply_chat_template("Say hello."))
    guided = llm.guide(logprobs=3)
    out = llm.generate(prompt_ids, 4, guided)
    llm.reset()
    logits = llm.forward(prompt_ids)  # the first step again, for its distribution
    expected = logits.astype(np.float64) - logits.max()
    expected -= np.log(np.exp(expected).sum())
    first = guided.logprobs[0]
    assert [lp.token for lp in guided.logprobs] == out
    assert first.top[0][0] == out[0] and len(first.top) == 3
    assert [t for t, _ in first.top] == list(np.argsort(-expected, kind="stable")[:3])
    assert abs(first.logprob - expected[out[0]]) < 1e-4
    assert all(a[1] >= b[1] for a, b in zip(first.top, first.top[1:]))


def test_logprobs_under_a_constraint_are_over_the_allowed_tokens(llm):
    llm.response("Pick a color.", max_new_tokens=20, constraint=Constraint.json_schema(SCHEMAS[1][2]), logprobs=5)
    for step in llm.last_guided.logprobs:
        assert step.logprob <= 1e-6
        assert sum(np.exp(lp) for _, lp in step.top) <= 1 + 1e-5


@pytest.mark.parametrize("build,field", [
    (lambda: Constraint.json_schema({"type": "objekt"}), "json_schema"),
    (lambda: Constraint.json_schema("{not json"), "json_schema"),
    (lambda: Constraint.json_schema({"properties": {"a": {"minLength": "x"}}}), "json_schema"),
    (lambda: Constraint.regex("(unclosed"), "regex"),
    (lambda: Constraint.gbnf("root ::= (\"a\""), "grammar"),
    (lambda: Constraint.lark("start: undefined_rule\n"), "grammar"),
], ids=["type", "not-json", "keyword", "regex", "gbnf", "lark"])
def test_a_bad_constraint_is_an_error_naming_its_field(build, field):
    with pytest.raises(ConstraintError) as err:
        build()
    assert err.value.field == field


def test_a_guided_sampler_serves_one_reply(llm):
    guided = llm.guide(SCHEMAS[0][2])
    ids = llm.tokenizer_encode(llm.apply_chat_template("Describe a person."))
    llm.generate(ids, 60, guided)
    with pytest.raises(ArgumentError):
        llm.generate(ids, 60, guided)


@pytest.mark.parametrize("schema_index", [10, 17], ids=lambda i: SCHEMAS[i][0])
def test_lookahead_under_a_constraint_verifies_guesses_and_equals_token_by_token(llm, schema_index):
    """Speculative decoding checks each guess against the mask: the output is AR's, guesses were taken."""
    prompt, schema = SCHEMAS[schema_index][1], SCHEMAS[schema_index][2]
    ids = llm.tokenizer_encode(llm.apply_chat_template(f"{prompt} Answer in JSON."))
    token_by_token = llm.generate(ids, 120, llm.guide(schema))
    # guesses from the reply's n-grams, every step (MNN's way: guesses must have been kept)
    llm.set_config({"speculative_type": "lookahead", "ngram_update": True, "draft_adaptive": False})
    try:
        generation = llm._generation_for(llm.guide(schema))
        assert isinstance(generation, ConstrainedSpeculation)
        speculative = list(generation.generate(llm._start(ids), 120))
        assert speculative == token_by_token
        assert generation.strategy.accepted > 0, "no guess was verified and kept"
        jsonschema.validate(json.loads(llm.tokenizer_decode(speculative)), schema)
        # processors and logprobs need every step's logits: token by token
        llm.response("Say hi.", max_new_tokens=4, logprobs=1)
        assert len(llm.last_guided.logprobs) == llm.context.gen_seq_len
    finally:
        llm.set_config({"speculative_type": "", "ngram_update": False, "draft_adaptive": True})
