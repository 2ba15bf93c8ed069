"""The bookkeeping of one reply, the same for every strategy: each emitted token joins the
context's output and is counted and checked for a stop; the last one says how the reply ended."""
from __future__ import annotations

from typing import Callable

from ..context import LlmContext, end_status


class Reply:
    """`budget`: how many tokens the reply may emit (max_new_tokens, or less where the context
    ends first)."""

    def __init__(self, context: LlmContext, is_stop: Callable[[int], bool], max_new_tokens: int, budget: int):
        self.context = context
        self.is_stop = is_stop
        self.max_new_tokens = max_new_tokens
        self.budget = budget
        self.emitted = 0

    @property
    def left(self) -> int:
        return self.budget - self.emitted

    def emit(self, token: int) -> bool:
        """Record `token`; whether it ends the reply (a stop token, or the budget spent). The status
        is set before the consumer sees the token: it may stop reading at the stop token."""
        ctx = self.context
        self.emitted += 1
        ctx.output_tokens.append(token)
        ctx.current_token = token
        ctx.gen_seq_len += 1
        stop = self.is_stop(token)
        last = stop or self.emitted >= self.budget
        if last:
            ctx.status = end_status(stop, self.max_new_tokens, self.budget)
        return last

    def ran_out(self) -> None:
        """The strategy had nothing to emit (the context left no room for a token)."""
        self.context.status = end_status(False, self.max_new_tokens, self.budget)
