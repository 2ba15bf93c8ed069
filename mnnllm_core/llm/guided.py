"""One reply's sampling under the caller's control: logits processors (llama-cpp-python's
LogitsProcessor: a callable (token ids so far, logits) -> logits), a constraint's mask, then
MNN's sampler stages over what is left, and the log-probabilities of each chosen token with its
top alternatives. The order is fixed: processors, mask, sampler; so greedy takes the best
allowed token and every other sampler draws among allowed tokens only.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from ..errors import ArgumentError, UnsupportedError
from .constraint import Constraint, ConstraintState
from .context import CONSTRAINT_UNFINISHED, CONTEXT_FULL, FINISHED, MAX_TOKENS
from .generation import create_generation
from .generation.ar import ARGeneration
from .generation.speculative import SpeculativeGeneration
from .sampler import Sampler

log = logging.getLogger(__name__)

LogitsProcessor = Callable[[np.ndarray, np.ndarray], np.ndarray]

MAX_TOP_LOGPROBS = 20


@dataclass
class TokenLogprob:
    """A chosen token's log-probability and the `top` most likely tokens (id, log-probability)
    at its step, over the logits the sampler saw (after the processors and the constraint's mask)."""

    token: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


class GuidedSampler:
    """A Sampler's stand-in for one reply (`sample(logits, history)`), wrapping the real one."""

    def __init__(self, sampler: Sampler, constraint: ConstraintState | None = None,
                 processors: Sequence[LogitsProcessor] = (), top_logprobs: int | None = None):
        self.sampler = sampler
        self.config = sampler.config
        self.constraint = constraint
        self.processors = list(processors)
        self.top_logprobs = top_logprobs
        self.logprobs: list[TokenLogprob] = []
        self.mask_times_us: list[float] = []  # per token: computing and applying the constraint's mask
        self.used = False

    @property
    def mask_us(self) -> float:
        return sum(self.mask_times_us)

    def sample(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        row = np.array(logits, dtype=np.float32).reshape(-1)
        if self.processors:
            ids = np.asarray(history, dtype=np.intc)
            for processor in self.processors:
                row = np.asarray(processor(ids, row), dtype=np.float32).reshape(-1)
        allowed = None
        if self.constraint is not None:
            start = time.perf_counter()
            allowed = self.constraint.mask(row)
            self.mask_times_us.append((time.perf_counter() - start) * 1e6)
        token = self.sampler.sample(row, history)
        if allowed is not None and not (token < allowed.size and allowed[token]):
            token = _best_allowed(row, allowed)  # every allowed logit was -inf (a processor's doing)
        if self.top_logprobs is not None:
            self.logprobs.append(_logprob(row, token, self.top_logprobs))
        if self.constraint is not None:
            self.constraint.consume(token)
        return token


def _best_allowed(row: np.ndarray, allowed: np.ndarray) -> int:
    ids = np.flatnonzero(allowed[:row.size])
    if ids.size == 0:
        raise UnsupportedError("the constraint allows no token here", field="constraint")
    return int(ids[np.argmax(row[ids])])


def _logprob(row: np.ndarray, token: int, top: int) -> TokenLogprob:
    finite = np.isfinite(row)
    peak = row[finite].max() if finite.any() else 0.0
    shifted = np.where(finite, row - peak, -np.inf)
    log_total = np.log(np.exp(shifted[finite], dtype=np.float64).sum())
    logprobs = shifted - log_total
    best: list[tuple[int, float]] = []
    if top:
        order = np.argpartition(-logprobs, min(top, row.size - 1))[:top]
        order = order[np.argsort(-logprobs[order], kind="stable")]
        best = [(int(i), float(logprobs[i])) for i in order if np.isfinite(logprobs[i])]
    return TokenLogprob(int(token), float(logprobs[token]), best)


def check_guidance(constraint=None, logits_processor=None, top_logprobs: int | None = None):
    """The arguments of a guided reply, checked (before the model is needed): (Constraint or None,
    list of processors, top_logprobs). `constraint`: a Constraint, or a JSON schema dict as shorthand;
    `logits_processor`: one callable or a list of them."""
    if isinstance(constraint, Mapping):
        constraint = Constraint.json_schema(constraint, field="constraint")
    if constraint is not None and not isinstance(constraint, Constraint):
        raise ArgumentError(f"constraint must be a Constraint or a JSON schema dict, got {type(constraint).__name__}",
                            field="constraint")
    if top_logprobs is not None and (isinstance(top_logprobs, bool) or not isinstance(top_logprobs, int)
                                     or not 0 <= top_logprobs <= MAX_TOP_LOGPROBS):
        raise ArgumentError(f"logprobs must be an int 0..{MAX_TOP_LOGPROBS} (how many top alternatives) or None, "
                            f"got {top_logprobs!r}", field="logprobs")
    if logits_processor is None:
        processors = []
    elif callable(logits_processor):
        processors = [logits_processor]
    elif isinstance(logits_processor, (list, tuple)) and all(callable(p) for p in logits_processor):
        processors = list(logits_processor)
    else:
        raise ArgumentError(f"logits_processor must be a callable or a list of them, got "
                            f"{type(logits_processor).__name__}", field="logits_processor")
    return constraint, processors, top_logprobs


def guided_sampler(target, sampler: Sampler, constraint=None, logits_processor=None,
                   top_logprobs: int | None = None) -> GuidedSampler:
    """A GuidedSampler over `sampler` for one reply on `target`'s tokenizer (arguments as check_guidance)."""
    constraint, processors, top_logprobs = check_guidance(constraint, logits_processor, top_logprobs)
    state = ConstraintState(constraint, target.tokenizer) if constraint is not None else None
    return GuidedSampler(sampler, state, processors, top_logprobs)


def _marking_unfinished(steps: Iterator[int], context, constraint: ConstraintState | None) -> Iterator[int]:
    """The reply's tokens; a constrained reply that ends (max_new_tokens, the context's end, or the
    constraint giving up) before its text is a complete match gets status CONSTRAINT_UNFINISHED."""
    for token in steps:
        if constraint is not None and context.status in (FINISHED, MAX_TOKENS, CONTEXT_FULL) \
                and not constraint.satisfied:
            context.status = CONSTRAINT_UNFINISHED
        yield token


class GuidedGeneration(ARGeneration):
    """Token by token under a GuidedSampler."""

    def __init__(self, target, sampler: GuidedSampler):
        super().__init__(target, sampler)
        self.guided = sampler

    def generate(self, new_ids: list[int], max_new_tokens: int) -> Iterator[int]:
        return _marking_unfinished(super().generate(new_ids, max_new_tokens), self.target.context,
                                   self.guided.constraint)


class ConstrainedSpeculation:
    """A greedy speculative strategy whose tokens and verified guesses are the best allowed ones
    (speculative.py's pick/take under the constraint): the output is token-by-token decoding's."""

    def __init__(self, target, strategy: SpeculativeGeneration, constraint: ConstraintState):
        strategy.constraint = constraint
        self.target, self.strategy, self.constraint = target, strategy, constraint

    def generate(self, new_ids: list[int], max_new_tokens: int) -> Iterator[int]:
        return _marking_unfinished(self.strategy.generate(new_ids, max_new_tokens), self.target.context,
                                   self.constraint)


def guided_generation(target, sampler: GuidedSampler):
    """The strategy for a guided reply. With speculative_type set and a plain greedy sampler, a
    constraint is verified in the speculative loop (each guess against the mask after the ones
    before it); Eagle's token trees, logits processors, logprobs and other samplers decode token by
    token (they need every step's logits or a draw), which a constraint also keeps exact."""
    if sampler.used:
        raise ArgumentError("a guided sampler serves one reply (its constraint follows that reply's tokens): "
                            "make another with Llm.guide()", field="sampler")
    sampler.used = True
    kind = str(target.config.speculative_type or "")
    plain_greedy = sampler.config.sampler_type == "greedy" and not sampler.config.stage_order
    if kind and sampler.constraint is not None and plain_greedy and not sampler.processors \
            and sampler.top_logprobs is None:
        strategy = create_generation(target, sampler.sampler)
        if isinstance(strategy, SpeculativeGeneration) and not getattr(strategy, "tree", False):
            return ConstrainedSpeculation(target, strategy, sampler.constraint)
    if kind:
        log.info("speculative_type %s: this guided reply decodes token by token", kind)
    return GuidedGeneration(target, sampler)
