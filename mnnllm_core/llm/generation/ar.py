"""MNN's ArGeneration: prefill once, then sample and decode one token at a time."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Iterator

import numpy as np

from .reply import Reply
from .strategy import Strategy
from .target import Target

if TYPE_CHECKING:
    from ..sampler import Sampler


class ARGeneration(Strategy):
    def __init__(self, target: Target, sampler: "Sampler | None" = None):
        super().__init__(target)
        self.sampler = sampler  # None: the model's own, looked up per call (set_config may replace it)

    def decode(self, new_ids: list[int], logits: np.ndarray, reply: Reply) -> Iterator[list[int]]:
        target, ctx = self.target, self.target.context
        sampler = target.sampler if self.sampler is None else self.sampler
        history = target.conversation.history
        for _ in range(reply.budget):
            start = time.perf_counter()
            token = sampler.sample(logits, history)
            ctx.sample_us += int((time.perf_counter() - start) * 1e6)
            yield [token]  # resumed only when the reply goes on
            start = time.perf_counter()
            logits = target.forward([token])
            ctx.decode_us += int((time.perf_counter() - start) * 1e6)
