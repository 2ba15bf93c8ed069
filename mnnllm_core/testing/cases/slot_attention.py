"""Attention over KV slots (continuous batching): steps whose rows belong to several sequences,
each row attending only to its own slot's cache. Ragged slot lengths, a slot starting at 0 beside
slots far into their history, prefill chunks and decode rows in one step, a slot joining later,
slot 0 (the layer's own, single-sequence cache) inside a batch, and a slot growing past its first
capacity; each against float64 attention over that slot's rows alone."""
from __future__ import annotations

import numpy as np

from ..references import attention_reference
from .attention import SCALAR, attention_op, feeds, packed
from .case import Case, Step, Trial, randn


def _batched(heads: int, kv_heads: int, dim: int, schedule: list[tuple[tuple[int, int], ...]],
             single: tuple[int, ...] = ()):
    """`single`: one-sequence steps (slot 0) first; then each step of `schedule`, its rows as
    (slot, rows) groups in order. Every slot's tokens are its own random stream."""
    def build(rng) -> Trial:
        totals: dict[int, int] = {0: sum(single)}
        for step in schedule:
            for slot, rows in step:
                totals[slot] = totals.get(slot, 0) + rows
        streams = {slot: (randn(rng, n, heads, dim), randn(rng, n, kv_heads, dim), randn(rng, n, kv_heads, dim))
                   for slot, n in totals.items()}
        done = dict.fromkeys(totals, 0)
        steps = []
        for rows in single:
            q, k, v = streams[0]
            start, end = done[0], done[0] + rows
            expected = attention_reference(q[start:end], k[:end], v[:end], causal_offset=start)
            steps.append(Step(feeds(q[start:end], k[start:end], v[start:end], SCALAR), [packed(expected)]))
            done[0] = end
        for step in schedule:
            parts: list[list[np.ndarray]] = [[], [], [], []]
            for slot, rows in step:
                q, k, v = streams[slot]
                start, end = done[slot], done[slot] + rows
                parts[0].append(q[start:end])
                parts[1].append(k[start:end])
                parts[2].append(v[start:end])
                parts[3].append(attention_reference(q[start:end], k[:end], v[:end], causal_offset=start))
                done[slot] = end
            q, k, v, expected = (np.concatenate(p) for p in parts)
            steps.append(Step(feeds(q, k, v, SCALAR), [packed(expected.astype(np.float64))], slots=step))
        return Trial(attention_op(heads, kv_heads, dim), list(steps[0].feeds), steps)
    return build


RAGGED = [((1, 5), (2, 1), (3, 12)),  # three prompts of ragged lengths, all from 0
          ((1, 1), (2, 1), (3, 1)),  # a decode row each
          ((1, 1), (4, 6), (2, 1), (3, 3)),  # decode rows mixed with a new slot's prompt and a chunk
          ((4, 1), (3, 1), (1, 1), (2, 1))]  # decode rows, slots out of order
GROWING = [((1, 70), (2, 3)), ((2, 1), (1, 1)), ((1, 1), (2, 60)), ((1, 1), (2, 1))]
WITH_SLOT_0 = [((0, 1), (2, 4)), ((2, 1), (0, 1))]


def cases() -> list[Case]:
    found = [Case("Attention", f"KV slots ragged prefill and decode heads={h}/{kv} dim={d}",
                  _batched(h, kv, d, RAGGED), tags=frozenset({"slots"}) | (frozenset() if d % 4 == 0
                                                                          else frozenset({"head_dim%4"})))
             for h, kv, d in ((9, 3, 64), (4, 2, 16), (3, 1, 5))]
    found.append(Case("Attention", "KV slots past their first capacity heads=4/2 dim=16",
                      _batched(4, 2, 16, GROWING), tags=frozenset({"slots"})))
    found.append(Case("Attention", "KV slots with slot 0 (one-sequence cache) in a batch heads=9/3 dim=64",
                      _batched(9, 3, 64, WITH_SLOT_0, single=(7, 1)), tags=frozenset({"slots"})))
    return found
