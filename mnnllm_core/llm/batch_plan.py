"""What one batched step runs: which rows of which sequences, in which order, and which rows'
logits come back (continuous batching, batch_engine.py).

The token budget: a step runs at most `token_budget` rows. Every decoding sequence gets its row
first (running streams never wait for a prompt); prompts in prefill share what is left, in the
order they were admitted, a long one in chunks over several steps. Rows are ordered so the
logits needed sit at the end: chunks that do not finish their prompt first, then chunks that
do (only their last row's logits are read), then the decode rows; the graph's `logits_index`
(the first row whose logits it computes) is the first needed row, so the lm_head runs over few
rows more than needed (the inner rows of prompt-finishing chunks after the first).

Padding (`pad_decode`): on a static-shape backend every new row count is a resize and a recording
of its own, so a step of decode rows only runs at one of a few sizes (BATCH_SIZES), the smallest
that holds its rows, in slot order; the rows after them are padding, which run (one group of their own, in a
KV slot no sequence uses) and whose outputs are dropped. Each size is resized once.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence


@dataclass
class Part:
    """`tokens` of sequence `owner` run at rows start..start+len(tokens); `logits`: its last row's
    logits are read (it finishes its prompt, or it is a decode row)."""

    owner: object
    tokens: list[int]
    logits: bool
    start: int = 0

    @property
    def last_row(self) -> int:
        return self.start + len(self.tokens) - 1


BATCH_SIZES = (1, 2, 4, 8)  # the row counts of a padded decode step (static-shape backends)
PAD_TOKEN = 0  # what a padding row feeds (its outputs are dropped; every vocabulary has id 0)


@dataclass
class StepPlan:
    """`parts` in row order, then `padding` rows of no part (a padded decode step: they run and
    nobody reads their logits); `sized`: a decode step at one of the padded sizes."""

    parts: list[Part]
    padding: int = 0
    sized: bool = False

    @property
    def rows(self) -> int:
        return sum(len(p.tokens) for p in self.parts) + self.padding

    @property
    def logits_from(self) -> int:
        """The first row whose logits are read (every part after it reads its last row); the last
        row when none is read (the graph computes at least one)."""
        return min((p.last_row for p in self.parts if p.logits), default=self.rows - 1)

    @property
    def tokens(self) -> list[int]:
        """The step's token ids in row order (PAD_TOKEN on padding rows)."""
        return [t for p in self.parts for t in p.tokens] + [PAD_TOKEN] * self.padding


def plan_step(decoding: Sequence[tuple[object, int]], prefilling: Sequence[tuple[object, Sequence[int]]],
              token_budget: int) -> StepPlan | None:
    """`decoding`: (sequence, its next token); `prefilling`: (sequence, its prompt tokens not yet
    run), in admission order. None when there is nothing to run."""
    room = token_budget - len(decoding)
    chunks, finishing = [], []
    for owner, pending in prefilling:
        if room <= 0:
            break
        take = min(room, len(pending))
        room -= take
        done = take == len(pending)
        (finishing if done else chunks).append(Part(owner, list(pending[:take]), done))
    parts = chunks + finishing + [Part(owner, [token], True) for owner, token in decoding]
    if not parts:
        return None
    at = 0
    for part in parts:
        part.start = at
        at += len(part.tokens)
    return StepPlan(parts)


def padded_size(rows: int, sizes: Sequence[int]) -> int | None:
    """The smallest of `sizes` (ascending) holding `rows` rows; None when none does."""
    return next((size for size in sizes if size >= rows), None)


def pad_decode(plan: StepPlan, sizes: Sequence[int], order: Callable[[object], int]) -> StepPlan | None:
    """`plan` as a decode step of the smallest of `sizes` holding its rows, its rows sorted by
    `order(owner)` (the slot: the same slots running give the same row table, which a backend
    that records the table records once), padding after them. None when the plan is not decode
    rows only (one row each, its logits read), has a single row (one stream runs unpadded), or no
    size holds it (it then runs at its own row count)."""
    if len(plan.parts) < 2 or any(not p.logits or len(p.tokens) != 1 for p in plan.parts):
        return None
    size = padded_size(len(plan.parts), sizes)
    if size is None:
        return None
    ranked = sorted(plan.parts, key=lambda part: order(part.owner))
    parts = [Part(part.owner, part.tokens, True, row) for row, part in enumerate(ranked)]
    return StepPlan(parts, size - len(parts), sized=True)
