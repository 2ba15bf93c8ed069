"""MNN's ArGeneration: prefill once, then sample and decode one token at a time."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Iterator

from ..context import RUNNING, end_status

if TYPE_CHECKING:
    from ..llm import Llm
    from ..sampler import Sampler


class ARGeneration:
    def __init__(self, llm: "Llm", sampler: "Sampler | None" = None):
        self.llm = llm
        self.sampler = sampler  # None: the model's own, looked up per call (set_config may replace it)

    def generate(self, new_ids: list[int], max_new_tokens: int) -> Iterator[int]:
        """Yield each sampled token (the stop token included, as MNN reports it)."""
        llm, ctx = self.llm, self.llm.context
        sampler = llm.sampler if self.sampler is None else self.sampler
        ctx.status = RUNNING
        start = time.perf_counter()
        logits = llm.forward(new_ids)
        ctx.prefill_us += int((time.perf_counter() - start) * 1e6)
        budget = min(max_new_tokens, llm.config.max_all_tokens - len(ctx.history_tokens))
        for step in range(budget):
            start = time.perf_counter()
            token = sampler.sample(logits, ctx.history_tokens)
            ctx.sample_us += int((time.perf_counter() - start) * 1e6)
            ctx.output_tokens.append(token)
            ctx.current_token = token
            ctx.gen_seq_len += 1
            stop = llm.tokenizer.is_stop(token)
            last = stop or step + 1 == budget
            if last:  # set before yielding: a consumer may stop reading at the stop token
                ctx.status = end_status(stop, max_new_tokens, budget)
            yield token
            if last:
                return
            start = time.perf_counter()
            logits = llm.forward([token])
            ctx.decode_us += int((time.perf_counter() - start) * 1e6)
        ctx.status = end_status(False, max_new_tokens, budget)  # the context left no room for a token
