"""What one batched step runs: which rows of which sequences, in which order, and which rows'
logits come back (continuous batching, batch_engine.py).

The token budget: a step runs at most `token_budget` rows. Every decoding sequence gets its row
first (running streams never wait for a prompt); prompts in prefill share what is left, in the
order they were admitted, a long one in chunks over several steps. Rows are ordered so the
logits needed sit at the end: chunks that do not finish their prompt first, then chunks that
do (only their last row's logits are read), then the decode rows; the graph's `logits_index`
(the first row whose logits it computes) is the first needed row, so the lm_head runs over few
rows more than needed (the inner rows of prompt-finishing chunks after the first).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


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


@dataclass
class StepPlan:
    parts: list[Part]

    @property
    def rows(self) -> int:
        return sum(len(p.tokens) for p in self.parts)

    @property
    def logits_from(self) -> int:
        """The first row whose logits are read (every part after it reads its last row); the last
        row when none is read (the graph computes at least one)."""
        return min((p.last_row for p in self.parts if p.logits), default=self.rows - 1)

    @property
    def tokens(self) -> list[int]:
        return [t for p in self.parts for t in p.tokens]


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
