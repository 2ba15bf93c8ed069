"""Sampler: MNN's config keys and defaults, each stage's kept set, penalties, order, seeds.

Expected kept sets are computed here independently, in float64, from each stage's
definition; cases that sit within a rounding error of a threshold are skipped
(`TooClose`), since the sampler works in float32 as MNN does.
"""
from __future__ import annotations

import json
import statistics
import time

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from mnnllm_core.errors import ConfigError
from mnnllm_core.llm.sampler import MAX_PENALTY, Sampler, SamplerConfig
from paths import CONFIG

MODEL_CONFIG = CONFIG
MARGIN = 1e-4  # how far from a threshold a float64 decision must be to be checked


class TooClose(Exception):
    """A float64 reference decision is within rounding distance of its threshold."""


def logits_strategy(min_size: int = 2, max_size: int = 40) -> st.SearchStrategy[np.ndarray]:
    """Distinct logits on a 0.005 grid in [-10, 10]: no ties, exact in float32."""
    return st.lists(st.integers(-2000, 2000), min_size=min_size, max_size=max_size,
                    unique=True).map(lambda v: (np.array(v, dtype=np.float64) / 200)
                                     .astype(np.float32))


def sampler(seed: int = 0, **keys) -> Sampler:
    return Sampler(SamplerConfig.from_config({"seed": seed, **keys}))


def kept(s: Sampler, logits: np.ndarray, history=()) -> set[int]:
    return set(s.candidates(logits, history).token_ids().tolist())


def draws(s: Sampler, logits: np.ndarray, n: int = 20, history=()) -> list[int]:
    return [s.sample(logits, history) for _ in range(n)]


# --- float64 references: positions kept, given float64 logits ---

def softmax64(logits: np.ndarray, temperature: float) -> np.ndarray:
    z = (logits.astype(np.float64) - logits.max()) / temperature
    e = np.exp(z)
    return e / e.sum()


def prefix_reaching(order: np.ndarray, probs: np.ndarray, p: float) -> np.ndarray:
    cumulative = np.cumsum(probs[order])
    if np.min(np.abs(cumulative - p)) < MARGIN:
        raise TooClose
    reached = np.flatnonzero(cumulative >= p)
    return order[: reached[0] + 1] if reached.size else order


def ref_top_k(logits: np.ndarray, k: int, temperature: float) -> np.ndarray:
    order = np.argsort(-logits.astype(np.float64), kind="stable")
    return order[:k]


def ref_top_p(logits: np.ndarray, p: float, temperature: float) -> np.ndarray:
    probs = softmax64(logits, temperature)
    return prefix_reaching(np.argsort(-probs, kind="stable"), probs, p)


def ref_min_p(logits: np.ndarray, min_p: float, temperature: float) -> np.ndarray:
    probs = softmax64(logits, temperature)
    if np.min(np.abs(probs - min_p)) < MARGIN * min_p:
        raise TooClose
    above = np.flatnonzero(probs >= min_p)
    return above if above.size else np.array([np.argmax(probs)])


def ref_tfs(logits: np.ndarray, z: float, temperature: float) -> np.ndarray:
    probs = softmax64(logits, temperature)
    if probs.size < 3:
        return np.arange(probs.size)
    order = np.argsort(-probs, kind="stable")
    p = probs[order]
    second = np.abs(p[:-2] - 2 * p[1:-1] + p[2:])
    if second.sum() < 1e-2:
        raise TooClose
    cumulative = np.cumsum(second / second.sum())
    if p.size > 3 and np.min(np.abs(cumulative[1:] - z)) < 1e-3:
        raise TooClose
    # token i of the first n-2 is kept until the running mass reaches z; the top one always
    keep = p.size - 2
    for i in range(1, p.size - 2):
        if cumulative[i] >= z:
            keep = i
            break
    return order[:keep]


def ref_typical(logits: np.ndarray, mass: float, temperature: float) -> np.ndarray:
    probs = softmax64(logits, temperature)
    entropy = -np.sum(probs * np.log(probs))
    distance = np.abs(entropy + np.log(probs))
    order = np.argsort(distance, kind="stable")
    if order.size > 1 and np.min(np.diff(distance[order])) < MARGIN:
        raise TooClose
    return prefix_reaching(order, probs, mass)


REFERENCES = {"topK": ref_top_k, "topP": ref_top_p, "minP": ref_min_p, "min_p": ref_min_p,
              "tfs": ref_tfs, "typical": ref_typical}


def reference_tokens(logits: np.ndarray, stages: list[tuple[str, float]],
                     temperature: float) -> set[int]:
    """Apply reference stages in the given order, each to the previous one's survivors."""
    tokens = np.arange(logits.size)
    for name, value in stages:
        local = REFERENCES[name](logits[tokens], value, temperature)
        tokens = tokens[local]
    return set(tokens.tolist())


# --- config ---

def test_empty_config_gives_mnn_llmconfig_defaults():
    config = SamplerConfig.from_config({})
    assert config == SamplerConfig()
    assert (config.sampler_type, config.mixed_samplers) == (
        "mixed", ("topK", "tfs", "typical", "topP", "min_p", "temperature"))
    assert (config.temperature, config.top_k, config.top_p, config.min_p, config.tfs_z,
            config.typical) == (1.0, 40, 0.9, 0.1, 1.0, 1.0)
    assert (config.repetition_penalty, config.presence_penalty, config.frequency_penalty,
            config.penalty_window, config.n_gram, config.ngram_factor,
            config.penalty_sampler) == (1.0, 0.0, 0.0, 0, 8, 1.0, "greedy")
    assert (config.logit_bias, config.banned_tokens, config.seed) == ({}, (), None)


def test_real_model_config_reads_every_sampler_key():
    config = SamplerConfig.from_config(json.loads(MODEL_CONFIG.read_text()), file=str(MODEL_CONFIG))
    assert config.sampler_type == "mixed"
    assert (config.temperature, config.top_k, config.top_p, config.min_p, config.tfs_z,
            config.typical) == (0.8, 40, 0.9, 0.05, 1.0, 0.95)
    assert (config.n_gram, config.ngram_factor, config.penalty_window) == (8, 1.0, 0)
    assert config.stage_order == ("topK", "tfs", "typical", "topP", "minP")
    assert config.select_type == "temperature"


@pytest.mark.parametrize("keys, attr, expected", [
    ({"topK": 5}, "top_k", 5),
    ({"top_k": 3, "topK": 7}, "top_k", 3),
    ({"top_k": -1, "topK": 7}, "top_k", 7),
    ({"top_k": -1}, "top_k", 40),
    ({"topP": 0.5}, "top_p", 0.5),
    ({"minP": 0.2}, "min_p", 0.2),
    ({"tfsZ": 0.7}, "tfs_z", 0.7),
    ({"penalty": 1.3}, "repetition_penalty", 1.3),
    ({"repetition_penalty": 1.1, "penalty": 1.3}, "repetition_penalty", 1.1),
])
def test_new_keys_win_over_legacy_aliases_only_when_non_negative(keys, attr, expected):
    assert getattr(SamplerConfig.from_config(keys), attr) == pytest.approx(expected)


def test_unknown_sampler_type_is_a_config_error_naming_the_field_and_file():
    with pytest.raises(ConfigError) as caught:
        SamplerConfig.from_config({"sampler_type": "beam"}, file="config.json")
    assert caught.value.field == "sampler_type"
    assert caught.value.file == "config.json"
    assert "beam" in str(caught.value) and "config.json" in str(caught.value)


@pytest.mark.parametrize("keys, field", [
    ({"mixed_samplers": ["topK", "nucleus"]}, "mixed_samplers"),
    ({"mixed_samplers": ["topK", "mixed"]}, "mixed_samplers"),
    ({"mixed_samplers": []}, "mixed_samplers"),
    ({"mixed_samplers": "topK"}, "mixed_samplers"),
    ({"temperature": 0}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"temperature": True}, "temperature"),
    ({"top_k": 0}, "top_k"),
    ({"top_k": 2.5}, "top_k"),
    ({"topK": 0}, "topK"),
    ({"top_p": 1.5}, "top_p"),
    ({"min_p": -0.1, "minP": -0.2}, "minP"),
    ({"typical": 2}, "typical"),
    ({"tfs_z": float("inf")}, "tfs_z"),
    ({"repetition_penalty": float("nan")}, "repetition_penalty"),
    ({"penalty": -2.0}, "penalty"),
    ({"presence_penalty": "x"}, "presence_penalty"),
    ({"frequency_penalty": float("inf")}, "frequency_penalty"),
    ({"penalty_window": -1}, "penalty_window"),
    ({"n_gram": 0}, "n_gram"),
    ({"ngram_factor": None}, "ngram_factor"),
    ({"penalty_sampler": "beam"}, "penalty_sampler"),
    ({"logit_bias": {"abc": 1.0}}, "logit_bias"),
    ({"logit_bias": {"3": "up"}}, "logit_bias"),
    ({"logit_bias": {"-3": 1.0}}, "logit_bias"),
    ({"logit_bias": [1, 2]}, "logit_bias"),
    ({"banned_tokens": [1, "2"]}, "banned_tokens"),
    ({"banned_tokens": [-1]}, "banned_tokens"),
    ({"seed": "abc"}, "seed"),
    ({"seed": -5}, "seed"),
])
def test_bad_value_is_a_config_error_naming_the_key(keys, field):
    with pytest.raises(ConfigError) as caught:
        SamplerConfig.from_config(keys, file="config.json")
    assert caught.value.field == field


def test_hand_built_bad_config_is_refused_by_the_sampler():
    with pytest.raises(ConfigError) as caught:
        Sampler(SamplerConfig(top_k=0))
    assert caught.value.field == "top_k"


def test_logit_bias_reads_json_string_token_ids():
    assert SamplerConfig.from_config({"logit_bias": {"7": -2, "9": 1.5}}).logit_bias == {
        7: -2.0, 9: 1.5}


@pytest.mark.parametrize("keys, select_type", [
    ({"sampler_type": "greedy"}, "greedy"),
    ({"sampler_type": "topK"}, "temperature"),
    ({"sampler_type": "penalty"}, "greedy"),
    ({"sampler_type": "penalty", "penalty_sampler": "temperature"}, "temperature"),
    ({"sampler_type": "mixed", "mixed_samplers": ["topK", "greedy"]}, "greedy"),
    ({"sampler_type": "mixed", "mixed_samplers": ["greedy", "topK"]}, "temperature"),
    ({"sampler_type": "mixed", "mixed_samplers": ["greedy", "penalty"]}, "greedy"),
])
def test_select_type_follows_the_type_or_the_last_mixed_sampler(keys, select_type):
    assert SamplerConfig.from_config(keys).select_type == select_type


@pytest.mark.parametrize("keys, temperature", [
    ({"sampler_type": "temperature", "temperature": 0.5}, 0.5),
    ({"sampler_type": "topP", "temperature": 0.5}, 0.5),
    ({"sampler_type": "topK", "temperature": 0.5}, 0.8),
    ({"sampler_type": "penalty", "penalty_sampler": "temperature", "temperature": 0.5}, 0.8),
    ({"sampler_type": "mixed", "mixed_samplers": ["topK", "min_p"], "temperature": 0.5}, 0.5),
    ({"sampler_type": "mixed", "mixed_samplers": ["penalty", "topK"], "temperature": 0.5}, 0.8),
])
def test_temperature_key_is_used_only_when_a_stage_reads_it_as_in_mnn(keys, temperature):
    assert Sampler(SamplerConfig.from_config(keys)).temperature == pytest.approx(temperature)


# --- greedy and temperature ---

@given(st.lists(st.integers(-3, 3), min_size=1, max_size=60))
def test_greedy_returns_the_argmax_lowest_index_on_ties(values):
    logits = np.array(values, dtype=np.float32)
    assert sampler(sampler_type="greedy").sample(logits) == int(np.argmax(logits))


def test_greedy_on_a_full_vocabulary_row_picks_the_first_of_tied_maxima():
    logits = np.zeros((1, 49152), dtype=np.float32)
    logits[0, [30000, 1234, 40000]] = 5.0
    assert sampler(sampler_type="greedy").sample(logits) == 1234


def test_more_than_one_row_of_logits_is_refused():
    with pytest.raises(ValueError):
        sampler(sampler_type="greedy").sample(np.zeros((2, 8), dtype=np.float32))


@given(logits_strategy(min_size=2, max_size=30))
def test_probability_of_the_argmax_rises_to_one_as_temperature_falls(logits):
    top = int(np.argmax(logits))
    probs_at = [sampler(sampler_type="temperature", temperature=t).candidates(logits)
                .ensure_probs(t)[top] for t in (2.0, 1.0, 0.3, 0.1, 0.01, 1e-5)]
    assert all(a <= b + 1e-6 for a, b in zip(probs_at, probs_at[1:]))
    assert probs_at[-1] == pytest.approx(1.0)


@given(logits_strategy(min_size=2, max_size=30), st.integers(0, 2**32))
def test_near_zero_temperature_samples_like_greedy(logits, seed):
    s = sampler(seed, sampler_type="temperature", temperature=1e-5)
    assert set(draws(s, logits)) == {int(np.argmax(logits))}


def test_high_temperature_samples_nearly_uniformly():
    # 10 tokens, 20000 draws: each count ~ Binomial(20000, 0.1), sd ~ 42; allow 6 sd.
    logits = np.linspace(-5, 5, 10, dtype=np.float32)
    s = sampler(1234, sampler_type="temperature", temperature=1e4)
    np.testing.assert_allclose(s.candidates(logits).ensure_probs(1e4), 0.1, atol=1e-4)
    counts = np.bincount(draws(s, logits, 20000), minlength=10)
    assert np.all(np.abs(counts - 2000) < 6 * np.sqrt(20000 * 0.1 * 0.9))


@settings(deadline=None)  # 4000 draws per example: over hypothesis's 200 ms on a loaded 2-core machine
@given(logits_strategy(min_size=2, max_size=8))
def test_temperature_draws_follow_the_softmax(logits):
    s = sampler(99, sampler_type="temperature", temperature=1.0)
    n = 4000
    freq = np.bincount(draws(s, logits, n), minlength=logits.size) / n
    p = softmax64(logits, 1.0)
    assert np.all(np.abs(freq - p) < 6 * np.sqrt(p * (1 - p) / n) + 1e-3)


# --- filtering stages: the kept set and the draws ---

@given(logits_strategy(), st.integers(1, 50), st.integers(0, 2**32))
def test_top_k_never_returns_a_token_outside_the_k_largest(logits, k, seed):
    s = sampler(seed, sampler_type="topK", top_k=k)
    kth = np.sort(logits)[::-1][min(k, logits.size) - 1]
    assert len(kept(s, logits)) == min(k, logits.size)
    assert kept(s, logits) == set(ref_top_k(logits, k, 1.0).tolist())
    assert all(logits[t] >= kth for t in draws(s, logits))


def test_top_k_keeps_the_lowest_token_ids_among_ties_at_the_boundary():
    logits = np.zeros(49152, dtype=np.float32)
    logits[[5, 6]] = 1.0
    assert kept(sampler(sampler_type="topK", top_k=4), logits) == {5, 6, 0, 1}


@given(logits_strategy(), st.floats(0.0, 1.0), st.floats(0.3, 3.0), st.integers(0, 2**32))
def test_top_p_keeps_the_smallest_sorted_prefix_reaching_p(logits, p, temperature, seed):
    try:
        expected = set(ref_top_p(logits, p, temperature).tolist())
    except TooClose:
        assume(False)
    s = sampler(seed, sampler_type="topP", top_p=p, temperature=temperature)
    assert kept(s, logits) == expected
    assert set(draws(s, logits)) <= expected


@given(logits_strategy(), st.floats(0.0, 1.0), st.floats(0.3, 3.0), st.integers(0, 2**32))
def test_min_p_never_returns_a_token_below_min_p_times_the_top_probability(
        logits, min_p, temperature, seed):
    try:
        expected = set(ref_min_p(logits, min_p, temperature).tolist())
    except TooClose:
        assume(False)
    s = sampler(seed, sampler_type="minP", min_p=min_p, temperature=temperature)
    probs = softmax64(logits, temperature)
    # MNN's threshold is absolute (prob >= min_p, the top token always), which implies
    # the relative one (prob >= min_p * max prob).
    assert kept(s, logits) == expected
    assert all(probs[t] >= min_p * probs.max() * (1 - 1e-6) for t in draws(s, logits))


@given(logits_strategy(min_size=1), st.floats(0.05, 1.0), st.floats(0.3, 3.0),
       st.integers(0, 2**32))
def test_tfs_keeps_tokens_until_the_second_derivative_mass_reaches_z(logits, z, temperature,
                                                                        seed):
    try:
        expected = set(ref_tfs(logits, z, temperature).tolist())
    except TooClose:
        assume(False)
    s = sampler(seed, sampler_type="tfs", tfs_z=z, temperature=temperature)
    assert kept(s, logits) == expected
    assert set(draws(s, logits)) <= expected


@given(logits_strategy(), st.floats(0.05, 1.0), st.floats(0.3, 3.0), st.integers(0, 2**32))
def test_typical_keeps_the_tokens_closest_to_the_entropy_until_mass_reaches_p(
        logits, mass, temperature, seed):
    try:
        expected = set(ref_typical(logits, mass, temperature).tolist())
    except TooClose:
        assume(False)
    s = sampler(seed, sampler_type="typical", typical=mass, temperature=temperature)
    assert kept(s, logits) == expected
    assert set(draws(s, logits)) <= expected


def test_filtering_stages_on_a_full_vocabulary_match_the_float64_reference():
    logits = (np.random.default_rng(5).standard_normal(49152) * 3).astype(np.float32)
    for name, key, value in [("topK", "top_k", 40), ("topP", "top_p", 0.2),
                             ("minP", "min_p", 0.001)]:
        s = sampler(sampler_type=name, **{key: value, "temperature": 0.7})
        assert kept(s, logits) == set(REFERENCES[name](logits, value, 0.7).tolist()), name


def test_typical_on_a_full_vocabulary_keeps_a_closest_to_entropy_set_of_mass_p():
    logits = (np.random.default_rng(6).standard_normal(49152) * 3).astype(np.float32)
    s = sampler(sampler_type="typical", typical=0.3, temperature=0.7)
    chosen = np.array(sorted(kept(s, logits)))
    probs = softmax64(logits, 0.7)
    distance = np.abs(-np.sum(probs * np.log(probs)) + np.log(probs))
    others = np.setdiff1d(np.arange(logits.size), chosen)
    assert distance[chosen].max() <= distance[others].min() + 1e-5
    farthest = chosen[np.argmax(distance[chosen])]
    assert probs[chosen].sum() >= 0.3 - 1e-5
    assert probs[chosen].sum() - probs[farthest] < 0.3 + 1e-5


# --- mixed: MNN's order ---

def test_mixed_stage_order_is_bias_banned_penalty_then_the_listed_filters():
    config = SamplerConfig.from_config({
        "mixed_samplers": ["topK", "tfs", "typical", "topP", "min_p", "penalty", "temperature"],
        "logit_bias": {"1": 1.0}, "banned_tokens": [2]})
    assert config.stage_order == ("logit_bias", "banned_tokens", "penalty", "topK", "tfs",
                                  "typical", "topP", "minP")


@settings(max_examples=200)
@given(logits_strategy(min_size=3, max_size=40),
       st.permutations(["topK", "tfs", "typical", "topP", "min_p"]),
       st.integers(1, 30), st.floats(0.3, 1.0), st.floats(0.0, 0.2), st.floats(0.3, 1.0),
       st.floats(0.3, 1.0), st.floats(0.5, 2.0))
def test_mixed_applies_each_stage_to_the_previous_stages_survivors_in_list_order(
        logits, order, top_k, top_p, min_p, tfs_z, typical, temperature):
    values = {"topK": top_k, "topP": top_p, "min_p": min_p, "tfs": tfs_z, "typical": typical}
    try:
        expected = reference_tokens(logits, [(n, values[n]) for n in order], temperature)
    except TooClose:
        assume(False)
    s = sampler(sampler_type="mixed", mixed_samplers=list(order) + ["temperature"],
                temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                tfs_z=tfs_z, typical=typical)
    assert kept(s, logits) == expected


def test_top_k_then_top_p_differs_from_top_p_then_top_k():
    logits = np.log(np.array([0.3, 0.25, 0.2, 0.15, 0.1], dtype=np.float32))
    keys = {"top_k": 2, "top_p": 0.5, "temperature": 1.0}
    # topP on the renormalised top two (0.55, 0.45) stops at the first token;
    # on the full distribution it needs two (0.3 + 0.25).
    assert kept(sampler(mixed_samplers=["topK", "topP", "temperature"], **keys), logits) == {0}
    assert kept(sampler(mixed_samplers=["topP", "topK", "temperature"], **keys), logits) == {0, 1}


def test_penalty_listed_last_in_mixed_still_runs_first():
    logits = np.array([5.0, 4.0, 1.0], dtype=np.float32)
    s = sampler(mixed_samplers=["topK", "penalty", "greedy"], top_k=1, repetition_penalty=2.0)
    # penalty first: 5/2 < 4, so topK keeps token 1; after topK it could only be token 0
    assert s.sample(logits, history=[0]) == 1


def test_default_mixed_draws_only_from_the_top_k():
    logits = (np.random.default_rng(3).standard_normal(49152) * 3).astype(np.float32)
    top40 = set(np.argsort(-logits)[:40].tolist())
    s = Sampler(SamplerConfig.from_config({**json.loads(MODEL_CONFIG.read_text()), "seed": 4}))
    assert set(draws(s, logits, 200)) <= top40


# --- penalties ---

def penalized(history, logits, **keys) -> np.ndarray:
    s = sampler(sampler_type="penalty", **keys)
    return s.candidates(logits, history).logits


@given(st.lists(st.integers(-40, 40), min_size=8, max_size=8),
       st.lists(st.integers(0, 9), max_size=20), st.floats(1.01, 20.0))
def test_repetition_penalty_divides_positive_and_multiplies_negative_logits(values, history,
                                                                            penalty):
    logits = np.array(values, dtype=np.float32) / 4
    out = penalized(history, logits, repetition_penalty=penalty)
    p = np.float32(min(penalty, MAX_PENALTY))
    for token in range(8):
        if token in history:
            expected = logits[token] / p if logits[token] >= 0 else logits[token] * p
            assert out[token] == expected
        else:
            assert out[token] == logits[token]


@given(logits_strategy(min_size=3, max_size=20), st.data(), st.floats(1.05, 5.0),
       st.one_of(st.just(0.0), st.floats(0.01, 2.0)), st.one_of(st.just(0.0), st.floats(0.01, 1.0)))
def test_penalty_lowers_the_probability_of_repeated_tokens(logits, data, repetition,
                                                           presence, frequency):
    n = logits.size
    history = data.draw(st.lists(st.integers(0, n - 2), min_size=1, max_size=12))
    s = sampler(sampler_type="penalty", penalty_sampler="temperature",
                repetition_penalty=repetition, presence_penalty=presence,
                frequency_penalty=frequency)
    before = softmax64(logits, s.temperature)
    after = softmax64(s.candidates(logits, history).logits, s.temperature)
    repeated = np.isin(np.arange(n), history)
    assume(presence > 0 or frequency > 0 or np.any(logits[repeated] != 0))
    assert after[repeated].sum() < before[repeated].sum()
    assert np.all(after[~repeated] >= before[~repeated] * (1 - 1e-9))


@given(st.lists(st.integers(0, 5), max_size=30), st.floats(0.0, 2.0), st.floats(0.0, 1.0))
def test_presence_subtracts_once_and_frequency_per_occurrence(history, presence, frequency):
    logits = np.linspace(-3, 3, 6, dtype=np.float32)
    out = penalized(history, logits, presence_penalty=presence, frequency_penalty=frequency)
    count = np.bincount(np.array(history, dtype=np.int64), minlength=6)
    active = presence > 0 or frequency > 0
    expected = np.where((count > 0) & active, logits - presence - frequency * count, logits)
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-5)


@given(st.lists(st.integers(0, 7), min_size=1, max_size=30), st.integers(1, 10))
def test_penalty_window_limits_the_history_considered(history, window):
    logits = np.full(8, 2.0, dtype=np.float32)
    out = penalized(history, logits, repetition_penalty=2.0, presence_penalty=0.5,
                    penalty_window=window)
    recent = set(history[-window:])
    for token in range(8):
        assert (out[token] < 2.0) == (token in recent)


def test_ngram_penalty_caps_the_token_that_would_complete_a_repeated_ngram():
    history = [1, 2, 3, 9, 1, 2]  # "1 2" again: "3" would repeat "1 2 3"
    out = penalized(history, np.full(10, 3.0, dtype=np.float32), repetition_penalty=1.5,
                    n_gram=3, ngram_factor=2.0)
    assert out[3] == pytest.approx(3.0 / MAX_PENALTY)
    assert out[[1, 2, 9]] == pytest.approx([2.0, 2.0, 2.0])
    assert out[0] == 3.0


def ref_ngram_penalties(history, window, n_gram, factor, repetition) -> dict[int, float]:
    """MNN's n-gram rule from its definition: an occurrence preceded by m tokens equal
    to the history's last m gets repetition * factor**m, or MAX_PENALTY at m = n_gram - 1."""
    if repetition <= 1:
        return {}  # MNN skips the step when no penalty is active
    end = len(history)
    start = max(end - window, 0) if window else 0
    repetition = min(repetition, MAX_PENALTY)
    penalties: dict[int, float] = {}
    for i in range(start, end):
        m = 0
        while m + 1 < n_gram and i - (m + 1) >= 0 and history[i - m - 1] == history[end - m - 1]:
            m += 1
        value = repetition
        if factor > 1 and end >= n_gram:
            value = MAX_PENALTY if n_gram > 1 and m == n_gram - 1 else repetition * factor**m
        penalties[history[i]] = max(penalties.get(history[i], repetition), value)
    return penalties


@given(st.lists(st.integers(0, 3), max_size=40), st.integers(1, 6), st.floats(1.0, 3.0),
       st.floats(1.0, 3.0), st.integers(0, 12))
def test_ngram_penalty_grows_with_the_length_of_the_repeated_suffix(history, n_gram, factor,
                                                                   repetition, window):
    assume(repetition > 1 or factor > 1)
    logits = np.full(4, 5.0, dtype=np.float32)
    out = penalized(history, logits, repetition_penalty=repetition, n_gram=n_gram,
                    ngram_factor=factor, penalty_window=window)
    expected = np.full(4, 5.0)
    for token, penalty in ref_ngram_penalties(history, window, n_gram, factor,
                                              repetition).items():
        if penalty > 1:
            expected[token] = 5.0 / penalty
    np.testing.assert_allclose(out, expected, rtol=1e-5)


def test_penalty_is_not_applied_unless_configured_as_a_stage():
    logits = np.array([3.0, 2.0], dtype=np.float32)
    s = sampler(sampler_type="mixed", mixed_samplers=["greedy"], repetition_penalty=5.0)
    assert s.sample(logits, history=[0, 0, 0]) == 0


# --- logit bias and banned tokens ---

@pytest.mark.parametrize("sampler_type", ["greedy", "temperature", "topK", "topP", "minP",
                                          "tfs", "typical", "penalty", "mixed"])
@given(logits=logits_strategy(min_size=3, max_size=30), data=st.data())
@settings(max_examples=30)
def test_banned_tokens_are_never_returned(sampler_type, logits, data):
    n = logits.size
    banned = {int(np.argmax(logits))} | set(data.draw(st.lists(st.integers(0, n - 1),
                                                               max_size=n - 2)))
    assume(len(banned) < n)
    s = sampler(data.draw(st.integers(0, 2**32)), sampler_type=sampler_type,
                banned_tokens=sorted(banned), top_k=2, min_p=0.0, typical=0.5)
    assert not set(draws(s, logits, 30)) & banned


@given(logits_strategy(min_size=2, max_size=30), st.data())
def test_logit_bias_shifts_the_biased_tokens_logits(logits, data):
    n = logits.size
    bias = data.draw(st.dictionaries(st.integers(0, n + 5), st.floats(-5, 5), max_size=4))
    out = sampler(sampler_type="greedy", logit_bias=bias).candidates(logits).logits
    expected = logits.copy()
    for token, amount in bias.items():
        if token < n:
            expected[token] += np.float32(amount)
    np.testing.assert_array_equal(out, expected)


def test_large_logit_bias_makes_greedy_choose_the_biased_token():
    logits = np.array([4.0, 1.0, 0.0], dtype=np.float32)
    assert sampler(sampler_type="greedy", logit_bias={"2": 10.0}).sample(logits) == 2


# --- seeds ---

def test_same_seed_gives_the_same_sequence_and_reset_seed_replays_it():
    logits = np.zeros(1000, dtype=np.float32)
    a, b = sampler(7, sampler_type="temperature"), sampler(7, sampler_type="temperature")
    first = draws(a, logits, 100)
    assert first == draws(b, logits, 100)
    a.reset_seed()
    assert draws(a, logits, 100) == first


def test_different_seeds_give_different_sequences():
    # 100 uniform draws over 1000 tokens: equal sequences have probability 1e-300.
    logits = np.zeros(1000, dtype=np.float32)
    sequences = {tuple(draws(sampler(seed, sampler_type="temperature"), logits, 100))
                 for seed in range(10)}
    assert len(sequences) == 10


# --- speed ---

@pytest.mark.parametrize("keys", [{"sampler_type": "greedy"}, {}],
                         ids=["greedy", "model-config-mixed"])
def test_sampling_a_49152_token_row_costs_well_under_a_millisecond(keys):
    config = {**json.loads(MODEL_CONFIG.read_text()), "seed": 0, **keys}
    s = Sampler(SamplerConfig.from_config(config))
    logits = (np.random.default_rng(0).standard_normal(49152) * 3).astype(np.float32)
    history = list(range(0, 49152, 97))
    timings = []
    for _ in range(100):
        t0 = time.perf_counter()
        s.sample(logits, history)
        timings.append(time.perf_counter() - t0)
    assert statistics.median(timings) < 1e-3, f"median {statistics.median(timings) * 1e6:.0f} us"
