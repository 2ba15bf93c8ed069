"""The loop every greedy speculative strategy shares (MNN's draftVerify and what follows it).

Decode is memory-bound: one forward over a few tokens costs about what one token costs. So
each step a strategy guesses the tokens after the pending one (`draft`), the pending token and
the guesses run through the model at once (all logits; the ModulePool keeps a clone per verify
length), the guesses the model agrees with are kept, and the rest leave the history: the next
forward cuts the KV cache back to it (KV meta `remove`). A strategy may guess a tree instead
(`DraftTree`: Eagle with eagle_topk > 1): its nodes run in one forward under a tree mask, the
path the model agrees with stays, its rows kept by KV meta `reserve` (they are not contiguous).
With the greedy sampler the output is exactly what token-by-token decoding gives.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Iterator

import numpy as np

from ..context import RUNNING, end_status
from .token_tree import DraftTree

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

    def draft(self, token: int, room: int) -> "list[int] | DraftTree":
        """Up to `room` guesses of the tokens after `token` (the pending one, not yet run), or a
        tree of them no deeper than `room` (and of at most `room_for_nodes()` nodes)."""
        raise NotImplementedError

    def room_for_nodes(self) -> int:
        """How many guesses one verify step may hold (draft_predict_length, and the context left)."""
        cfg = self.llm.config
        return min(cfg.draft_predict_length, cfg.max_all_tokens - len(self.llm.context.history_tokens) - 1)

    def verified(self, tokens: list[int], accepted: int, rows: list[int]) -> None:
        """`tokens` (pending + guesses) ran; the pending one and `accepted` guesses stay in the
        history: the forward's output `rows` (0, then the accepted path's)."""

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
            if isinstance(draft, DraftTree):
                tokens = [token] + draft.tokens
                rows = llm.forward(tokens, all_logits=True, parents=draft.forward_parents())
                predictions = rows.reshape(len(tokens), -1).argmax(axis=-1)
                kept = draft.accepted_rows(predictions)
                keep_rows(llm, tokens, kept)
            else:
                tokens = [token] + draft
                rows = llm.forward(tokens, all_logits=bool(draft)).reshape(len(tokens), -1)
                predictions = rows.argmax(axis=-1)
                accepted = 0
                while accepted < len(draft) and predictions[accepted] == draft[accepted]:
                    accepted += 1
                kept = list(range(accepted + 1))
                self._forget_last(len(draft) - accepted)
            accepted = len(kept) - 1
            guesses = [tokens[row] for row in kept[1:]]
            if len(tokens) > 1:
                self.proposed += len(tokens) - 1
                self.accepted += accepted
                self.verify_steps += 1
            self.verified(tokens, accepted, kept)
            ctx.decode_us += int((time.perf_counter() - start) * 1e6)
            for position, guess in enumerate(guesses):
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
            token = int(predictions[kept[-1]])

    def _forget_last(self, count: int) -> None:
        """Drop the last `count` tokens from the history and mark their KV rows for removal
        (MNN's `meta->remove`; the next forward cuts the cache back to the history anyway)."""
        ctx, meta = self.llm.context, self.llm.kv_meta
        if count:
            del ctx.history_tokens[len(ctx.history_tokens) - count:]
            ctx.all_seq_len = len(ctx.history_tokens)
        meta.cut_to(len(ctx.history_tokens))


def keep_rows(llm: "Llm", tokens: list[int], rows: list[int]) -> None:
    """After the forward of `tokens` (a tree): only its `rows` (the accepted path) stay in the
    history, and their KV rows after the prefix (KV meta remove + reserve, MNN's way)."""
    ctx = llm.context
    prefix = len(ctx.history_tokens) - len(tokens)
    ctx.history_tokens[prefix:] = [tokens[row] for row in rows]
    ctx.all_seq_len = len(ctx.history_tokens)
    llm.kv_meta.keep_rows(prefix, [prefix + row for row in rows])
