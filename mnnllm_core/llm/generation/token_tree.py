"""MNN's TokenTree: the draft tree Eagle grows with `eagle_topk` > 1, verified in one forward.

Growing: the first draft step's `topk` best tokens are the first level; each further step
expands every active node (the last level's `topk`) by its `topk` best tokens, all of which
join the tree, and the `topk` best by cumulative log probability become the next actives.
Finally the best `max_nodes` nodes (by cumulative log probability: a child never beats its
parent, so they form a tree) in creation order are the draft, each with its parent.

Verifying (greedy, exact): the pending token and every node run in one forward under a tree
mask; from the pending token follow the child whose token is the model's choice there, as far
as the tree goes. Those rows stay in the KV cache (KV meta reserve), the rest leave it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class DraftTree:
    """Guesses after the pending token as a tree: parents[i] is the index of node i's parent
    among the nodes, -1 for a child of the pending token; parents come before children."""

    tokens: list[int]
    parents: list[int]

    def forward_parents(self) -> list[int]:
        """The parents over the verify forward's rows: the pending token (row 0), then the nodes."""
        return [-1] + [p + 1 for p in self.parents]

    def accepted_rows(self, predictions: np.ndarray) -> list[int]:
        """The forward's rows that stay: row 0, then each step the child whose token is the
        model's greedy choice at the row before."""
        children: dict[int, dict[int, int]] = {}
        for node, (token, parent) in enumerate(zip(self.tokens, self.parents)):
            children.setdefault(parent + 1, {}).setdefault(token, node + 1)
        rows = [0]
        while True:
            follow = children.get(rows[-1], {}).get(int(predictions[rows[-1]]))
            if follow is None:
                return rows
            rows.append(follow)


@dataclass
class TreeBuilder:
    topk: int
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)  # cumulative log probability
    actives: list[int] = field(default_factory=list)  # the last level's best nodes, best first

    def _add(self, token: int, parent: int, score: float) -> int:
        self.tokens.append(int(token))
        self.parents.append(parent)
        self.scores.append(float(score))
        return len(self.tokens) - 1

    def init(self, tokens: list[int], log_probs: np.ndarray) -> None:
        """The first level: `tokens` (best first) with their log probabilities."""
        self.actives = [self._add(t, -1, s) for t, s in zip(tokens, log_probs)]

    def grow(self, tokens: list[list[int]], log_probs: np.ndarray) -> list[int]:
        """Each active's best children (row r: active r's); returns, per new active, the row of
        its parent (so the caller picks the draft states that go on)."""
        candidates = []
        for row, parent in enumerate(self.actives):
            for token, log_prob in zip(tokens[row], log_probs[row]):
                candidates.append((self._add(token, parent, self.scores[parent] + log_prob), row))
        candidates.sort(key=lambda c: -self.scores[c[0]])  # stable: ties keep creation order
        best = candidates[:self.topk]
        self.actives = [node for node, _ in best]
        return [row for _, row in best]

    def finalize(self, max_nodes: int) -> DraftTree:
        order = sorted(range(len(self.tokens)), key=lambda n: -self.scores[n])[:max_nodes]
        chosen: dict[int, int] = {}
        for node in sorted(order):
            parent = self.parents[node]
            if parent < 0 or parent in chosen:  # an orphan (a tie with its parent cut away) goes
                chosen[node] = len(chosen)
        nodes = list(chosen)
        return DraftTree([self.tokens[n] for n in nodes],
                         [chosen[self.parents[n]] if self.parents[n] >= 0 else -1 for n in nodes])

    def best_path(self) -> list[int]:
        """The tokens from the first level down to the best active node (a beam's best guess)."""
        path, node = [], self.actives[0]
        while node >= 0:
            path.append(self.tokens[node])
            node = self.parents[node]
        return path[::-1]
