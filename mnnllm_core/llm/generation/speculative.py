"""The loop every greedy speculative strategy shares (MNN's draftVerify and what follows it).

Decode is memory-bound: one forward over a few tokens costs about what one token costs. So
each step a strategy guesses the tokens after the pending one (`draft`), the pending token and
the guesses run through the model at once (all logits; the ModulePool keeps a clone per verify
length), the guesses the model agrees with are kept, and the rest leave the conversation (its
`rewind`: the next forward cuts the KV cache back to the history, KV meta `remove`). A strategy
may guess a tree instead (`DraftTree`: Eagle with eagle_topk > 1): its nodes run in one forward
under a tree mask, the path the model agrees with stays, its rows kept by the conversation's
`keep_rows` (KV meta `reserve`: they are not contiguous).
With the greedy sampler the output is exactly what token-by-token decoding gives.
Whether a step drafts at all is a `DraftBudget`'s call (draft_budget.py): plain steps while
drafting does not pay; the strategy keeps it across replies.
"""
from __future__ import annotations

import time
from typing import Iterator

import numpy as np

from .draft_budget import DraftBudget
from .reply import Reply
from .strategy import Strategy
from .target import Target
from .token_tree import DraftTree


class SpeculativeGeneration(Strategy):
    """Subclasses say how to guess (`draft`) and what to remember of a verified step (`verified`);
    `free_guesses`: a guess costs nothing to make (only verifying it does)."""

    free_guesses = False

    def __init__(self, target: Target):
        super().__init__(target)
        self.proposed = 0  # guessed tokens verified so far
        self.accepted = 0  # of them, the ones the model agreed with
        self.verify_steps = 0
        self.empty_steps = 0  # of them, the ones that kept no guess (their work was lost)
        self.constraint = None  # a ConstraintState (constraint.py): tokens are the best *allowed* ones
        self.budget = DraftBudget(target.config.draft_adaptive, free_guesses=self.free_guesses)

    def pick(self, row: np.ndarray) -> int:
        """The greedy token of a row of logits: the best one, or the best the constraint allows."""
        if self.constraint is None:
            return int(np.argmax(row))
        row = np.array(row, dtype=np.float32).reshape(-1)
        self.constraint.mask(row)
        return int(np.argmax(row))

    def take(self, token: int) -> None:
        """`token` is the reply's next one: the constraint follows it."""
        if self.constraint is not None:
            self.constraint.consume(token)

    def _accept_chain(self, rows: np.ndarray, draft: list[int]) -> tuple[int, int]:
        """How many guesses of a chain stay, and the token after them. Under a constraint each row is
        judged by the mask after the guesses before it (which the constraint then follows)."""
        if self.constraint is None:
            predictions = rows.argmax(axis=-1)
            accepted = 0
            while accepted < len(draft) and predictions[accepted] == draft[accepted]:
                accepted += 1
            return accepted, int(predictions[accepted])
        accepted = 0
        while accepted < len(draft):
            chosen = self.pick(rows[accepted])
            if chosen != draft[accepted]:
                return accepted, chosen
            self.take(chosen)
            accepted += 1
        return accepted, self.pick(rows[accepted])

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
        cfg = self.target.config
        return min(cfg.draft_predict_length, cfg.max_all_tokens - len(self.target.conversation) - 1)

    def verified(self, tokens: list[int], accepted: int, rows: list[int]) -> None:
        """`tokens` (pending + guesses) ran; the pending one and `accepted` guesses stay in the
        history: the forward's output `rows` (0, then the accepted path's)."""

    def decode(self, new_ids: list[int], logits: np.ndarray, reply: Reply) -> Iterator[list[int]]:
        """Chunks: the pending token (not yet run), then the guesses its verify step accepted
        (they ran and are in the history)."""
        target, ctx = self.target, self.target.context
        cfg, conversation = target.config, target.conversation
        budget = self.budget
        self.start(new_ids)
        budget.start_reply()
        token = self.pick(logits)
        self.take(token)
        while True:
            yield [token]
            start = time.perf_counter()
            most = min(cfg.draft_predict_length, reply.left - 1, cfg.max_all_tokens - len(conversation) - 1)
            room = budget.room(most)
            draft = self.draft(token, room) if room > 0 else []
            guess = self.draft(token, 1) if budget.guesses_while_paused(most) else None
            if isinstance(draft, DraftTree):
                tokens = [token] + draft.tokens
                rows = target.forward(tokens, all_logits=True, parents=draft.forward_parents())
                predictions = rows.reshape(len(tokens), -1).argmax(axis=-1)
                kept = draft.accepted_rows(predictions)
                conversation.keep_rows(tokens, kept)
                following = int(predictions[kept[-1]])
            else:
                tokens = [token] + draft
                rows = target.forward(tokens, all_logits=bool(draft)).reshape(len(tokens), -1)
                accepted, following = self._accept_chain(rows, draft)
                kept = list(range(accepted + 1))
                conversation.rewind(len(conversation) - (len(draft) - accepted))
            accepted = len(kept) - 1
            if len(tokens) > 1:
                self.proposed += len(tokens) - 1
                self.accepted += accepted
                self.verify_steps += 1
                self.empty_steps += accepted == 0
            self.verified(tokens, accepted, kept)
            seconds = time.perf_counter() - start
            budget.record(seconds, len(kept), len(tokens), guessed=guess == [following])
            ctx.decode_us += int(seconds * 1e6)
            yield [tokens[row] for row in kept[1:]]
            token = following
            self.take(token)

    def ended_within(self, unsent: int) -> None:
        """The model has seen the accepted guesses after the last one emitted: they leave the history."""
        conversation = self.target.conversation
        conversation.rewind(len(conversation) - unsent)
