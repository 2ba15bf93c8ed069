"""The loop every greedy speculative strategy shares (MNN's draftVerify and what follows it).

Decode is memory-bound: one forward over a few tokens costs about what one token costs. So
each step a strategy guesses the tokens after the pending one (`draft`), the pending token and
the guesses run through the model at once (all logits; the ModulePool keeps a clone per verify
length), the guesses the model agrees with are kept, and the rest leave the history: the next
forward cuts the KV cache back to it (KV meta `remove`). With the greedy sampler the output is
exactly what token-by-token decoding gives.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Iterator

import numpy as np

from ..context import RUNNING, end_status

if TYPE_CHECKING:
    from ..llm import Llm


class SpeculativeGeneration:
    """Subclasses say how to guess (`draft`) and what to remember of a verified step (`verified`)."""

    def __init__(self, llm: "Llm"):
        self.llm = llm
        self.proposed = 0  # guessed tokens verified so far
        self.accepted = 0  # of them, the ones the model agreed with
        self.verify_steps = 0

    @property
    def acceptance(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    def start(self, new_ids: list[int]) -> None:
        """The prompt (or the new part of it) has run; the history holds it."""

    def draft(self, token: int, room: int) -> list[int]:
        """Up to `room` guesses of the tokens after `token` (the pending one, not yet run)."""
        raise NotImplementedError

    def verified(self, tokens: list[int], accepted: int) -> None:
        """`tokens` (pending + guesses) ran; the first 1 + `accepted` of them stay in the history."""

    def generate(self, new_ids: list[int], max_new_tokens: int) -> Iterator[int]:
        llm, ctx = self.llm, self.llm.context
        cfg = llm.config
        ctx.status = RUNNING
        start = time.perf_counter()
        logits = llm.forward(new_ids)
        ctx.prefill_us += int((time.perf_counter() - start) * 1e6)
        self.start(new_ids)
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
            start = time.perf_counter()
            room = min(cfg.draft_predict_length, budget - emitted - 1,
                       cfg.max_all_tokens - len(ctx.history_tokens) - 1)
            draft = self.draft(token, room) if room > 0 else []
            tokens = [token] + draft
            rows = llm.forward(tokens, all_logits=bool(draft)).reshape(len(tokens), -1)
            predictions = rows.argmax(axis=-1)
            accepted = 0
            while accepted < len(draft) and predictions[accepted] == draft[accepted]:
                accepted += 1
            if draft:
                self.proposed += len(draft)
                self.accepted += accepted
                self.verify_steps += 1
            self._forget_last(len(draft) - accepted)
            self.verified(tokens, accepted)
            ctx.decode_us += int((time.perf_counter() - start) * 1e6)
            for position, guess in enumerate(draft[:accepted]):
                emitted += 1
                ctx.output_tokens.append(guess)
                ctx.current_token = guess
                ctx.gen_seq_len += 1
                if llm.tokenizer.is_stop(guess) or emitted >= budget:
                    self._forget_last(accepted - position - 1)  # the model has seen tokens after this one
                    ctx.status = end_status(llm.tokenizer.is_stop(guess), max_new_tokens, budget)
                    yield guess
                    return
                yield guess
            token = int(predictions[accepted])

    def _forget_last(self, count: int) -> None:
        """Drop the last `count` tokens from the history and mark their KV rows for removal
        (MNN's `meta->remove`; the next forward cuts the cache back to the history anyway)."""
        ctx, meta = self.llm.context, self.llm.kv_meta
        if count:
            del ctx.history_tokens[len(ctx.history_tokens) - count:]
            ctx.all_seq_len = len(ctx.history_tokens)
        meta.remove = meta.previous - len(ctx.history_tokens)
