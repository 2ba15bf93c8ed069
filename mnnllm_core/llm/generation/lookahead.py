"""MNN's lookahead (prompt n-gram) speculative decoding, greedy and exact.

Decode is memory-bound: one forward over a few tokens costs about what one token costs.
So: guess the next tokens by finding the latest n-gram of the context earlier in the
context and copying what followed it, run the pending token plus the guess through the
model at once (all logits), keep the guessed tokens the model agrees with, and drop the
rest from the KV cache (KV meta `remove`). With the greedy sampler the output is exactly
what token-by-token decoding gives.
"""
from __future__ import annotations

import logging
import time
from collections import Counter
from typing import TYPE_CHECKING, Iterator, Sequence

import numpy as np

from ..context import RUNNING, end_status

if TYPE_CHECKING:
    from ..llm import Llm

log = logging.getLogger(__name__)


def propose(tokens: Sequence[int], max_match: int, length: int) -> list[int]:
    """Up to `length` tokens that followed the longest recent n-gram (n <= max_match) ending
    `tokens` earlier in `tokens`; among several continuations the most frequent wins,
    then the latest."""
    n_tokens = len(tokens)
    for n in range(min(max_match, n_tokens - 1), 0, -1):
        suffix = list(tokens[n_tokens - n:])
        continuations: Counter = Counter()
        latest: dict[tuple, int] = {}
        for start in range(n_tokens - n - 1, -1, -1):
            if list(tokens[start:start + n]) == suffix:
                follow = tuple(tokens[start + n:start + n + length])
                if follow:
                    continuations[follow] += 1
                    latest.setdefault(follow, start)
        if continuations:
            best = max(continuations, key=lambda f: (continuations[f] * len(f), latest[f]))
            return list(best)
    return []


class LookaheadGeneration:
    def __init__(self, llm: "Llm"):
        self.llm = llm
        self.proposed = 0
        self.accepted = 0

    def generate(self, new_ids: list[int], max_new_tokens: int) -> Iterator[int]:
        llm, ctx = self.llm, self.llm.context
        cfg = llm.config
        ctx.status = RUNNING
        start = time.perf_counter()
        logits = llm.forward(new_ids)
        ctx.prefill_us += int((time.perf_counter() - start) * 1e6)
        budget = min(max_new_tokens, cfg.max_all_tokens - len(ctx.history_tokens))
        token = int(np.argmax(logits))
        emitted = 0
        while True:
            emitted += 1
            ctx.output_tokens.append(token)
            ctx.current_token = token
            ctx.gen_seq_len += 1
            stop = llm.tokenizer.is_stop(token)
            if stop or emitted >= budget:
                ctx.status = end_status(stop, max_new_tokens, budget)
                yield token
                return
            yield token
            room = min(cfg.draft_predict_length, budget - emitted - 1,
                       cfg.max_all_tokens - len(ctx.history_tokens) - 1)
            draft = propose(ctx.history_tokens + [token], cfg.ngram_match_maxlen, room) if room > 0 else []
            start = time.perf_counter()
            rows = llm.forward([token] + draft, all_logits=True).reshape(len(draft) + 1, -1)
            ctx.decode_us += int((time.perf_counter() - start) * 1e6)
            predictions = rows.argmax(axis=-1)
            accepted = 0
            while accepted < len(draft) and predictions[accepted] == draft[accepted]:
                accepted += 1
            self.proposed += len(draft)
            self.accepted += accepted
            rejected = len(draft) - accepted
            if rejected:  # the next forward cuts the KV cache back to the history
                del ctx.history_tokens[len(ctx.history_tokens) - rejected:]
            for position, guess in enumerate(draft[:accepted]):
                emitted += 1
                ctx.output_tokens.append(guess)
                ctx.current_token = guess
                ctx.gen_seq_len += 1
                if llm.tokenizer.is_stop(guess) or emitted >= budget:
                    # the model has seen tokens after this one: forget them
                    extra = accepted - position - 1
                    if extra:
                        del ctx.history_tokens[len(ctx.history_tokens) - extra:]
                    ctx.status = end_status(llm.tokenizer.is_stop(guess), max_new_tokens, budget)
                    yield guess
                    return
                yield guess
            token = int(predictions[accepted])
