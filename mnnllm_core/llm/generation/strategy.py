"""MNN's GenerationStrategy: what every strategy shares. The prompt's new tokens run (prefill),
then the strategy's `decode` gives the reply's tokens in chunks (autoregressive: one per step;
speculative: the pending token, then the guesses a verify step accepted); each token is emitted
here, once for all strategies, and handed to the consumer."""
from __future__ import annotations

import time
from typing import Iterator

import numpy as np

from ..context import RUNNING
from .reply import Reply
from .target import Target


class Strategy:
    def __init__(self, target: Target):
        self.target = target

    def decode(self, new_ids: list[int], logits: np.ndarray, reply: Reply) -> Iterator[list[int]]:
        """After the prefill of `new_ids` (its last token's `logits`), the reply's tokens in chunks.
        Read only while the reply goes on: a chunk is asked for after the last one was emitted
        and did not end the reply."""
        raise NotImplementedError

    def ended_within(self, unsent: int) -> None:
        """The reply ended with `unsent` tokens of the last chunk not emitted."""

    def generate(self, new_ids: list[int], max_new_tokens: int) -> Iterator[int]:
        """Yield each emitted token (the stop token included, as MNN reports it)."""
        target, ctx = self.target, self.target.context
        ctx.status = RUNNING
        start = time.perf_counter()
        logits = target.forward(new_ids)
        ctx.prefill_us += int((time.perf_counter() - start) * 1e6)
        budget = min(max_new_tokens, target.config.max_all_tokens - len(target.conversation))
        reply = Reply(ctx, target.tokenizer.is_stop, max_new_tokens, budget)
        chunks = self.decode(new_ids, logits, reply)
        try:
            for chunk in chunks:
                for at, token in enumerate(chunk):
                    last = reply.emit(token)
                    if last:
                        self.ended_within(len(chunk) - at - 1)
                    yield token
                    if last:
                        return
        finally:
            chunks.close()
        reply.ran_out()
