"""MNN's EagleGeneration: a one-step draft model run `eagle_depth` times, greedy and exact.

`eagle_fc` maps the main model's hidden state at the last kept position into the draft's
space; each `eagle` step takes a token's embedding and a draft hidden state and gives logits
over the draft vocabulary (mapped to target tokens by `eagle_d2t`) and the next draft hidden
state. With `eagle_topk` 1 the steps make one chain of guesses. With `eagle_topk` > 1 they grow
MNN's token tree (token_tree.py: per level the `eagle_topk` best nodes by summed log
probability, each expanded by its `eagle_topk` best tokens; the best `draft_predict_length`
nodes are the draft) and the whole tree is verified in one forward with a tree attention mask;
the accepted path's KV rows stay (KV meta reserve). A model whose cache cannot keep reserved
rows (a linear-attention layer: its state runs in token order, not as a tree) verifies the
tree's best path instead, as a chain. An `eagle` step with its own KV cache (Attention ops)
runs through draft_kv.py: it first takes in the rows the last verify step kept, then each
level's guesses see their ancestors by a tree mask.
"""
from __future__ import annotations

import logging

import numpy as np

from .draft_kv import DraftKV
from .drafts import EagleDraft, draft_feeds
from .speculative import SpeculativeGeneration
from .target import Target
from .token_tree import DraftTree, TreeBuilder

log = logging.getLogger(__name__)


def log_softmax(rows: np.ndarray) -> np.ndarray:
    shifted = rows - rows.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def top(rows: np.ndarray, k: int) -> np.ndarray:
    """Per row the indices of the `k` largest values, largest first (ties: the lower index)."""
    return np.argsort(-rows, axis=-1, kind="stable")[:, :k]


class EagleGeneration(SpeculativeGeneration):
    def __init__(self, target: Target, draft: EagleDraft):
        super().__init__(target)
        self.eagle = draft
        self.depth = target.config.eagle_depth
        self.topk = target.config.eagle_topk
        self.hidden = None  # [1, hidden]: the main model's hidden state before the pending token
        self.tree = self.topk > 1 and target.conversation.reservable
        if self.topk > 1 and not self.tree:
            log.info("eagle_topk %d: the model's KV cache cannot keep a tree's path; verifying the best path only",
                     self.topk)
        widths = {"logits": draft.d2t.size, "out_hidden_states": target.config.hidden_size}
        self.kv = DraftKV(target, draft.step, widths) if draft.step.attends else None

    def start(self, new_ids: list[int]) -> None:
        self.hidden = self.target.hidden_states[-1:]
        if self.kv is not None:
            self.kv.start()

    def verified(self, tokens: list[int], accepted: int, rows: list[int]) -> None:
        self.hidden = self.target.hidden_states[rows[-1]:rows[-1] + 1]
        if self.kv is not None:
            self.kv.keep(self.target.hidden_states[rows], [tokens[row] for row in rows])

    def _step(self, tokens: list[int], hidden: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One draft step for each (token, draft state) row: log probabilities over the draft
        vocabulary and the next draft states."""
        target, eagle = self.target, self.eagle
        logits, hidden = eagle.step.run(draft_feeds(target.embedding.embedding(tokens), hidden),
                                        {"logits": eagle.d2t.size, "out_hidden_states": target.config.hidden_size})
        return log_softmax(logits), hidden

    def _fc(self, hidden: np.ndarray) -> np.ndarray:
        """The main model's hidden states in the draft's space (eagle_fc)."""
        return self.eagle.fc.run({"fc_hidden": hidden}, {"hidden_states": self.target.config.hidden_size})[0]

    def _first(self, token: int) -> tuple[np.ndarray, np.ndarray]:
        """The step at the pending token (for a draft with a KV cache, after the rows kept since)."""
        if self.kv is None:
            return self._step([token], self._fc(self.hidden))
        logits, out = self.kv.catch_up(token, self._fc)
        return log_softmax(logits[-1:]), out[-1:]

    def _next(self, tokens: list[int], hidden: np.ndarray, continues: list[int], level: int):
        """A step for each guess of `level`; row i's guess continues grown row continues[i]."""
        if self.kv is None:
            return self._step(tokens, hidden)
        logits, out = self.kv.grow(tokens, hidden, continues, level)
        return log_softmax(logits), out

    def _targets(self, picks: np.ndarray) -> list[int]:
        return [int(p + self.eagle.d2t[p]) for p in picks]

    def draft(self, token: int, room: int) -> "list[int] | DraftTree":
        log_probs, hidden = self._first(token)
        levels = min(self.depth, room)
        if self.topk == 1:
            guesses = []
            for level in range(levels):
                if level:
                    log_probs, hidden = self._next(guesses[-1:], hidden, [level - 2], level - 1)
                guesses.append(self._targets([int(np.argmax(log_probs[0]))])[0])
            return guesses
        best = top(log_probs, self.topk)[0]
        tree = TreeBuilder(self.topk)
        tree.init(self._targets(best), log_probs[0, best])
        hidden = np.repeat(hidden, len(best), axis=0)
        continues, grown = [-1] * len(best), 0
        for level in range(levels - 1):
            log_probs, hidden = self._next([tree.tokens[n] for n in tree.actives], hidden, continues, level)
            picks = top(log_probs, self.topk)
            rows = tree.grow([self._targets(p) for p in picks], np.take_along_axis(log_probs, picks, axis=-1))
            continues, grown = [grown + row for row in rows], grown + len(hidden)
            hidden = hidden[rows]
        return tree.finalize(self.room_for_nodes()) if self.tree else tree.best_path()
