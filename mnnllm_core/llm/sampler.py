"""Token sampling as MNN's `Sampler` does it (transformers/llm/engine/src/sampler.cpp).

A sample is a pipeline of steps over a `SamplerState`: the surviving candidates'
token ids and logits. Filtering steps (topK, topP, minP, tfs, typical) replace the
state by an ordered subset of itself, so every later step sees only the
survivors, renormalised; logit edits (penalty, logit bias, banned tokens) change
logits in place. The last step, select, takes the argmax (greedy) or draws from
the softmax of the survivors at the configured temperature, scanning the
cumulative probabilities in the state's order.

For `sampler_type: "mixed"` MNN's order is: logit bias, banned tokens, then the
`mixed_samplers` list with "penalty" moved to the front; "greedy" and
"temperature" in the list are not steps, the list's last name picks the select.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mnnllm_core.errors import ConfigError

logger = logging.getLogger(__name__)

SAMPLER_TYPES = ("greedy", "temperature", "topK", "topP", "minP", "min_p", "tfs", "typical",
                 "penalty", "mixed")
"""Values MNN's `configSampler` recognises; "min_p" is its alias of "minP"."""

DEFAULT_MIXED_SAMPLERS = ("topK", "tfs", "typical", "topP", "min_p", "temperature")
MAX_PENALTY = 10.0
"""MNN's `SamplerConfig::max_penalty`: the cap on repetition penalty and the penalty of a
token that would complete an n-gram repeat. Not a config key in MNN."""

MNN_STRUCT_TEMPERATURE = 0.8
"""`SamplerConfig::temperature`'s built-in value, kept when no configured stage reads
the `temperature` key (see `SamplerConfig.sampling_temperature`)."""

_READS_TEMPERATURE = frozenset({"temperature", "topP", "minP", "min_p", "tfs", "typical"})
_BLOCK = 64  # block size of the block-maxima bound in `_top_positions`
_KEYED_SORT_FROM = 4096  # `_descending_order` sorts packed keys above this size


@dataclass(frozen=True)
class SamplerConfig:
    """The sampler keys of MNN's config, with `LlmConfig`'s defaults.

    Keys and aliases as MNN 3.6 reads them: `top_k`/`top_p`/`min_p`/`tfs_z` win over the
    legacy `topK`/`topP`/`minP`/`tfsZ` when they are >= 0, and `repetition_penalty` over the
    legacy `penalty`. `logit_bias` ({token id: added logit}) and `banned_tokens` (token ids
    that can never be chosen) are MNN's own keys. `seed` is mnnllm's: MNN seeds from
    `std::random_device`; here None means fresh OS entropy, an int makes runs repeatable.

    Differences from MNN, on purpose: MNN applies `logit_bias` and `banned_tokens` only
    when `sampler_type` is "mixed", mnnllm for every type, so a banned token is never
    returned; sampler names MNN silently ignores are a ConfigError here.
    """

    sampler_type: str = "mixed"
    mixed_samplers: tuple[str, ...] = DEFAULT_MIXED_SAMPLERS
    temperature: float = 1.0
    top_k: int = 40
    top_p: float = 0.9
    min_p: float = 0.1
    tfs_z: float = 1.0
    typical: float = 1.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    penalty_window: int = 0
    n_gram: int = 8
    ngram_factor: float = 1.0
    penalty_sampler: str = "greedy"
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    banned_tokens: tuple[int, ...] = ()
    seed: int | None = None

    @classmethod
    def from_config(cls, d: Mapping[str, Any], file: str | None = None) -> SamplerConfig:
        """Read the sampler keys of a merged MNN config dict; other keys are ignored."""
        reader = _KeyReader(d, file)
        config = cls(
            sampler_type=reader.string("sampler_type", cls.sampler_type),
            mixed_samplers=reader.names("mixed_samplers", DEFAULT_MIXED_SAMPLERS),
            temperature=reader.number("temperature", cls.temperature),
            top_k=reader.aliased("top_k", "topK", cls.top_k, integer=True),
            top_p=reader.aliased("top_p", "topP", cls.top_p),
            min_p=reader.aliased("min_p", "minP", cls.min_p),
            tfs_z=reader.aliased("tfs_z", "tfsZ", cls.tfs_z),
            typical=reader.number("typical", cls.typical),
            repetition_penalty=reader.aliased("repetition_penalty", "penalty",
                                              cls.repetition_penalty),
            presence_penalty=reader.number("presence_penalty", cls.presence_penalty),
            frequency_penalty=reader.number("frequency_penalty", cls.frequency_penalty),
            penalty_window=reader.integer("penalty_window", cls.penalty_window),
            n_gram=reader.integer("n_gram", cls.n_gram),
            ngram_factor=reader.number("ngram_factor", cls.ngram_factor),
            penalty_sampler=reader.string("penalty_sampler", cls.penalty_sampler),
            logit_bias=reader.logit_bias("logit_bias"),
            banned_tokens=reader.token_ids("banned_tokens"),
            seed=reader.seed("seed"),
        )
        config.validate(file, key_of=reader.used_keys)
        return config

    def validate(self, file: str | None = None, key_of: Mapping[str, str] | None = None) -> None:
        """Raise ConfigError naming the key of the first out-of-range value.

        `key_of` maps an attribute to the config key it was read from (a legacy alias).
        """
        key_of = key_of or {}

        def check(attr: str, ok: bool, requirement: str) -> None:
            if not ok:
                raise ConfigError(f"{requirement}, got {getattr(self, attr)!r}",
                                  file=file, field=key_of.get(attr, attr))

        check("sampler_type", self.sampler_type in SAMPLER_TYPES,
              f"unknown sampler type; expected one of {', '.join(SAMPLER_TYPES)}")
        check("mixed_samplers", len(self.mixed_samplers) > 0
              and all(n in SAMPLER_TYPES and n != "mixed" for n in self.mixed_samplers),
              "mixed_samplers must be a non-empty list of sampler types other than 'mixed'")
        check("temperature", _finite(self.temperature) and self.temperature > 0,
              "temperature must be a finite number > 0")
        check("top_k", self.top_k >= 1, "top_k must be an integer >= 1")
        for name in ("top_p", "min_p", "typical"):
            value = getattr(self, name)
            check(name, _finite(value) and 0.0 <= value <= 1.0, f"{name} must be in [0, 1]")
        check("tfs_z", _finite(self.tfs_z) and self.tfs_z >= 0,
              "tfs_z must be a finite number >= 0")
        check("repetition_penalty",
              _finite(self.repetition_penalty) and self.repetition_penalty >= 0,
              "repetition_penalty must be a finite number >= 0")
        for name in ("presence_penalty", "frequency_penalty", "ngram_factor"):
            check(name, _finite(getattr(self, name)), f"{name} must be a finite number")
        check("penalty_window", self.penalty_window >= 0, "penalty_window must be an integer >= 0")
        check("n_gram", self.n_gram >= 1, "n_gram must be an integer >= 1")
        check("penalty_sampler", self.penalty_sampler in ("greedy", "temperature"),
              "penalty_sampler must be 'greedy' or 'temperature'")
        check("logit_bias", all(t >= 0 and not math.isnan(b) for t, b in self.logit_bias.items()),
              "logit_bias needs token ids >= 0 and numeric biases")
        check("banned_tokens", all(t >= 0 for t in self.banned_tokens),
              "banned_tokens must be token ids >= 0")
        check("seed", self.seed is None or self.seed >= 0, "seed must be an integer >= 0")

    @property
    def stage_order(self) -> tuple[str, ...]:
        """The filtering/editing steps in the order `Sampler` runs them (select excluded)."""
        edits = tuple(name for name, present in (("logit_bias", self.logit_bias),
                                                 ("banned_tokens", self.banned_tokens)) if present)
        if self.sampler_type == "mixed":
            names = _penalty_first(self.mixed_samplers)
        else:
            names = (self.sampler_type,)
        return edits + tuple(_canonical(n) for n in names if n not in ("greedy", "temperature"))

    @property
    def select_type(self) -> str:
        """How the final token is taken: "greedy" (argmax) or "temperature" (a draw)."""
        if self.sampler_type == "greedy":
            return "greedy"
        if self.sampler_type == "penalty":
            return self.penalty_sampler
        if self.sampler_type == "mixed" and _penalty_first(self.mixed_samplers)[-1] == "greedy":
            return "greedy"
        return "temperature"

    @property
    def sampling_temperature(self) -> float:
        """The temperature of every softmax (stages and the final draw), as MNN picks it.

        MNN copies the `temperature` key only when a configured stage reads it
        (temperature, topP, minP, tfs, typical); otherwise, e.g. `sampler_type` "topK" or
        "penalty" with `penalty_sampler` "temperature", its SamplerConfig keeps 0.8.
        """
        names = self.mixed_samplers if self.sampler_type == "mixed" else (self.sampler_type,)
        if any(n in _READS_TEMPERATURE for n in names):
            return self.temperature
        return MNN_STRUCT_TEMPERATURE


@dataclass
class SamplerState:
    """The surviving candidates between steps (MNN's `SamplerState`).

    `indices` holds the candidates' token ids in the state's order; None means the whole
    vocabulary in token order. `probs` caches the temperature softmax of `logits`.
    """

    logits: np.ndarray
    indices: np.ndarray | None = None
    probs: np.ndarray | None = None

    def token_ids(self) -> np.ndarray:
        """Token ids of the candidates, in the state's order."""
        return self.indices if self.indices is not None else np.arange(self.logits.size)

    def token_at(self, position: int) -> int:
        return int(self.indices[position]) if self.indices is not None else position

    def ensure_probs(self, temperature: float) -> np.ndarray:
        """softmax(logits / temperature) in float32, computed once until the logits change."""
        if self.probs is None:
            probs = self.logits - self.logits.max()
            probs *= np.float32(1.0) / np.float32(temperature)
            np.exp(probs, out=probs)
            probs *= np.float32(1.0) / probs.sum(dtype=np.float32)
            self.probs = probs
        return self.probs

    def invalidate_probs(self) -> None:
        self.probs = None

    def keep(self, positions: np.ndarray) -> None:
        """Replace the state by the candidates at `positions`, in that order."""
        self.logits = self.logits[positions]
        self.indices = positions if self.indices is None else self.indices[positions]
        self.probs = None


class Sampler:
    """Chooses the next token from one row of logits, following MNN's pipeline."""

    def __init__(self, config: SamplerConfig):
        config.validate()
        self.config = config
        self.temperature = config.sampling_temperature
        self._bias_tokens = np.fromiter(config.logit_bias.keys(), np.int64, len(config.logit_bias))
        self._bias_values = np.fromiter(config.logit_bias.values(), np.float32,
                                        len(config.logit_bias))
        self._banned = np.asarray(config.banned_tokens, dtype=np.int64)
        self._pipeline = self.build_pipeline()
        self.reset_seed()

    def build_pipeline(self) -> list[Callable[[SamplerState, np.ndarray], None]]:
        """Map `config.stage_order` to step methods (MNN's `buildPipeline`)."""
        steps = {
            "logit_bias": self.step_logit_bias, "banned_tokens": self.step_banned_tokens,
            "penalty": self.step_penalty, "topK": self.step_top_k, "topP": self.step_top_p,
            "minP": self.step_min_p, "tfs": self.step_tfs, "typical": self.step_typical,
        }
        logger.debug("sampler pipeline: %s -> %s (temperature %g)",
                     " -> ".join(self.config.stage_order) or "(none)",
                     self.config.select_type, self.temperature)
        return [steps[name] for name in self.config.stage_order]

    def reset_seed(self, seed: int | None = None) -> None:
        """Restart the random stream from `seed`, else `config.seed` (None: OS entropy)."""
        self._rng = np.random.default_rng(self.config.seed if seed is None else seed)

    def candidates(self, logits: np.ndarray, history: Sequence[int] = ()) -> SamplerState:
        """Run every step but select: what the final token is chosen from."""
        row = np.asarray(logits, dtype=np.float32)
        if row.ndim != 1:
            if row.size != row.shape[-1]:
                raise ValueError(f"expected one row of logits, got shape {row.shape}")
            row = row.reshape(-1)
        state = SamplerState(row.copy())
        prev = np.asarray(history, dtype=np.int64).reshape(-1)
        for step in self._pipeline:
            step(state, prev)
        return state

    def sample(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        """The next token id.

        `history` is what MNN keeps in its context's `history_tokens`: every prompt and
        generated token so far (earlier turns too, until the context is reset). Only the
        penalty step reads it.
        """
        return self.select(self.candidates(logits, history))

    def select(self, state: SamplerState) -> int:
        """Argmax (first on ties) or a draw from the candidates' temperature softmax."""
        if self.config.select_type == "greedy":
            position = int(np.argmax(state.logits))
        else:
            cumulative = np.cumsum(state.ensure_probs(self.temperature), dtype=np.float32)
            target = self._rng.random(dtype=np.float32)
            position = int(np.searchsorted(cumulative, target, side="right"))
            if position == cumulative.size:
                # Rounding left the total below the target: MNN takes the last candidate;
                # take the last one with non-zero probability so a banned token never wins.
                position = int(np.argmax(cumulative >= cumulative[-1]))
        return state.token_at(position)

    # --- steps, each (state, history) -> None, editing the state in place. Logit edits
    # (bias, banned, penalty) always run before any filter, on the whole vocabulary. ---

    def step_logit_bias(self, state: SamplerState, history: np.ndarray) -> None:
        found = _in_vocab(self._bias_tokens, state.logits.size)
        state.logits[self._bias_tokens[found]] += self._bias_values[found]
        state.invalidate_probs()

    def step_banned_tokens(self, state: SamplerState, history: np.ndarray) -> None:
        state.logits[self._banned[_in_vocab(self._banned, state.logits.size)]] = -np.inf
        state.invalidate_probs()

    def step_penalty(self, state: SamplerState, history: np.ndarray) -> None:
        """Repetition (x or / on the logit), presence and frequency penalties, n-gram boost.

        Every token in the last `penalty_window` history tokens (all if 0) gets penalty
        `repetition_penalty` (capped at MAX_PENALTY); with `ngram_factor` > 1 and at least
        `n_gram` tokens of history, an occurrence preceded by m tokens equal to the last m of
        the history gets repetition_penalty * ngram_factor**m, and MAX_PENALTY once m
        reaches n_gram - 1 (it would complete a repeated n-gram); a token keeps its largest.
        A penalty > 1 divides a logit >= 0 and multiplies a negative one; then every such
        token loses `presence_penalty`, and `frequency_penalty` times its count.
        """
        c = self.config
        if c.repetition_penalty <= 1 and c.presence_penalty <= 0 and c.frequency_penalty <= 0:
            return
        if history.size == 0:
            return
        start = max(history.size - c.penalty_window, 0) if c.penalty_window > 0 else 0
        tokens, occurrence_token, counts = np.unique(history[start:], return_inverse=True,
                                                     return_counts=True)
        repetition = np.float32(min(c.repetition_penalty, MAX_PENALTY))
        penalties = np.full(tokens.size, repetition, dtype=np.float32)
        if c.ngram_factor > 1 and history.size >= c.n_gram:
            np.maximum.at(penalties, occurrence_token,
                          self._ngram_penalties(history, start, repetition))
        found = _in_vocab(tokens, state.logits.size)
        positions = tokens[found]
        logit = state.logits[positions]
        penalty = penalties[found]
        with np.errstate(divide="ignore", invalid="ignore"):
            scaled = np.where(logit >= 0, logit / penalty, logit * penalty)
        logit = np.where(penalty > 1, scaled, logit) - np.float32(c.presence_penalty)
        if c.frequency_penalty > 0:
            logit = logit - np.float32(c.frequency_penalty) * counts[found].astype(np.float32)
        state.logits[positions] = logit
        state.invalidate_probs()

    def _ngram_penalties(self, history: np.ndarray, start: int,
                         repetition: np.float32) -> np.ndarray:
        """Penalty of each history position from `start`: see `step_penalty`."""
        n_gram, end = self.config.n_gram, history.size
        at = np.arange(start, end)
        matched = np.zeros(at.size, dtype=np.int64)
        alive = np.ones(at.size, dtype=bool)
        for back in range(1, n_gram):
            earlier = at - back
            alive &= (earlier >= 0) & (history[np.maximum(earlier, 0)] == history[end - back])
            matched += alive
        table = np.empty(n_gram, dtype=np.float32)
        table[0] = repetition
        for m in range(1, n_gram):
            table[m] = table[m - 1] * np.float32(self.config.ngram_factor)
        if n_gram > 1:
            table[n_gram - 1] = MAX_PENALTY
        return table[matched]

    def step_top_k(self, state: SamplerState, history: np.ndarray) -> None:
        """Keep the `top_k` largest logits (lowest token first on ties), largest first."""
        k = self.config.top_k
        if k >= state.logits.size:
            return
        state.keep(_top_positions(state.logits, k)[:k])

    def step_top_p(self, state: SamplerState, history: np.ndarray) -> None:
        """Keep the shortest most-probable-first prefix whose probability reaches `top_p`."""
        probs = state.ensure_probs(self.temperature)
        state.keep(_shortest_prefix_reaching(probs, probs, self.config.top_p))

    def step_min_p(self, state: SamplerState, history: np.ndarray) -> None:
        """Keep tokens with probability >= `min_p` (absolute, as MNN), at least the top one."""
        probs = state.ensure_probs(self.temperature)
        kept = np.flatnonzero(probs >= np.float32(self.config.min_p))
        if kept.size == 0:
            kept = np.array([np.argmax(probs)])
        state.keep(kept[np.argsort(-probs[kept], kind="stable")])

    def step_tfs(self, state: SamplerState, history: np.ndarray) -> None:
        """Tail-free sampling: cut where the normalised |second difference| mass reaches z.

        With probabilities sorted high to low, d_i = |(p_i - p_i+1) - (p_i+1 - p_i+2)|
        normalised to sum 1; token i (of the first n-2) is kept while the running sum of
        d up to i stays below `tfs_z`, and the top token always. Fewer than 3: untouched.
        """
        probs = state.ensure_probs(self.temperature)
        if probs.size < 3:
            return
        order = _descending_order(probs)
        p = probs[order]
        derivatives = np.abs((p[:-2] - p[1:-1]) - (p[1:-1] - p[2:]))
        total = derivatives.sum(dtype=np.float32)
        if total > 0:
            derivatives = derivatives * (np.float32(1.0) / total)
        reached = np.flatnonzero(np.cumsum(derivatives, dtype=np.float32)[1:]
                                 >= np.float32(self.config.tfs_z))
        state.keep(order[: int(reached[0]) + 1 if reached.size else p.size - 2])

    def step_typical(self, state: SamplerState, history: np.ndarray) -> None:
        """Locally typical sampling: keep the tokens whose -log p is closest to the entropy,
        closest first, until their probability reaches `typical`."""
        probs = state.ensure_probs(self.temperature)
        with np.errstate(divide="ignore", invalid="ignore"):
            log_p = np.log(probs)
            entropy = -np.sum(probs * log_p, where=probs > 0, dtype=np.float32)
        closeness = -np.abs(entropy + log_p)
        state.keep(_shortest_prefix_reaching(closeness, probs, self.config.typical))


def _top_positions(scores: np.ndarray, k: int) -> np.ndarray:
    """Positions of the k largest scores and of any ties with the k-th, ordered by
    descending score then position: a prefix of `_descending_order`, without a full sort.

    Each of k blocks whose maxima are the k largest maxima holds a score >= the k-th
    largest of those maxima, so that value bounds the k-th largest score from below and
    only the scores above it need partitioning.
    """
    n = scores.size
    if k >= n:
        return _descending_order(scores)
    blocks = n // _BLOCK
    if blocks >= 4 * k:
        maxima = scores[: blocks * _BLOCK].reshape(blocks, _BLOCK).max(axis=1)
        pool = np.flatnonzero(scores >= np.partition(maxima, blocks - k)[blocks - k])
    else:
        pool = np.arange(n)
    pooled = scores[pool]
    if pool.size > k:
        kth = np.partition(pooled, pool.size - k)[pool.size - k]
        pool = pool[pooled >= kth]
    return pool[_descending_order(scores[pool])]


def _descending_order(scores: np.ndarray) -> np.ndarray:
    """Stable descending argsort. Large arrays sort one uint64 key per element
    (order-preserving bits of the score, then the position), about 3x faster than
    numpy's stable argsort of float32."""
    if scores.size <= _KEYED_SORT_FROM:
        return np.argsort(-scores, kind="stable")
    bits = (scores.astype(np.float32) + np.float32(0.0)).view(np.uint32)  # -0.0 -> +0.0
    ascending = bits ^ np.where(bits >> 31 != 0, np.uint32(0xFFFFFFFF), np.uint32(0x80000000))
    keys = (~ascending).astype(np.uint64) << np.uint64(32)
    keys |= np.arange(scores.size, dtype=np.uint64)
    return (np.sort(keys) & np.uint64(0xFFFFFFFF)).astype(np.intp)


def _shortest_prefix_reaching(scores: np.ndarray, probs: np.ndarray, p: float) -> np.ndarray:
    """Positions in descending-`scores` order, up to the first where the running sum of
    `probs` reaches p (all of them if it never does). Grows the sorted prefix as needed."""
    target = np.float32(p)
    k = 64
    while True:
        order = _top_positions(scores, k)
        reached = np.flatnonzero(np.cumsum(probs[order], dtype=np.float32) >= target)
        if reached.size:
            return order[: reached[0] + 1]
        if order.size == scores.size:
            return order
        k *= 8


def _in_vocab(tokens: np.ndarray, vocab_size: int) -> np.ndarray:
    """Mask of the token ids that index the vocabulary; MNN skips the others."""
    return (tokens >= 0) & (tokens < vocab_size)


def _penalty_first(names: Sequence[str]) -> tuple[str, ...]:
    """MNN's configMixed: a "penalty" anywhere in the list runs first."""
    rest = tuple(n for n in names if n != "penalty")
    return ("penalty",) + rest if len(rest) < len(names) else rest


def _canonical(name: str) -> str:
    return "minP" if name == "min_p" else name


def _finite(value: float) -> bool:
    return math.isfinite(value)


class _KeyReader:
    """Typed reads of config keys; a wrong type raises ConfigError naming the key."""

    def __init__(self, d: Mapping[str, Any], file: str | None):
        self.d, self.file = d, file
        self.used_keys: dict[str, str] = {}

    def _fail(self, key: str, requirement: str) -> ConfigError:
        return ConfigError(f"{key} must be {requirement}, got {self.d[key]!r}",
                           file=self.file, field=key)

    def number(self, key: str, default: float) -> float:
        value = self.d.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self._fail(key, "a number")
        return float(value)

    def integer(self, key: str, default: int) -> int:
        value = self.d.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._fail(key, "an integer")
        return value

    def aliased(self, key: str, legacy: str, default: float, integer: bool = False) -> Any:
        """MNN's rule: `key` if present and >= 0, else the legacy key, else the default."""
        read = self.integer if integer else self.number
        if key in self.d:
            value = read(key, default)
            if not value < 0:  # a NaN is kept, so validation reports it
                return value
        if legacy in self.d:
            self.used_keys[key] = legacy
            return read(legacy, default)
        return default

    def string(self, key: str, default: str) -> str:
        value = self.d.get(key, default)
        if not isinstance(value, str):
            raise self._fail(key, "a string")
        return value

    def names(self, key: str, default: tuple[str, ...]) -> tuple[str, ...]:
        value = self.d.get(key, default)
        if isinstance(value, str) or not isinstance(value, Sequence) \
                or not all(isinstance(v, str) for v in value):
            raise self._fail(key, "a list of sampler names")
        return tuple(value)

    def token_ids(self, key: str) -> tuple[int, ...]:
        value = self.d.get(key, ())
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise self._fail(key, "a list of token ids")
        return tuple(value)

    def logit_bias(self, key: str) -> dict[int, float]:
        value = self.d.get(key, {})
        if not isinstance(value, Mapping):
            raise self._fail(key, "an object {token id: bias}")
        bias: dict[int, float] = {}
        for token, amount in value.items():
            try:
                token_id = int(token)
            except (TypeError, ValueError):
                raise self._fail(key, "an object {token id: bias}") from None
            if isinstance(amount, bool) or not isinstance(amount, (int, float)):
                raise self._fail(key, "an object {token id: bias}")
            bias[token_id] = float(amount)
        return bias

    def seed(self, key: str) -> int | None:
        value = self.d.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise self._fail(key, "an integer or null")
        return value
