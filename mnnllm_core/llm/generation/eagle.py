"""MNN's EagleGeneration: a one-step draft model run `eagle_depth` times, greedy and exact.

`eagle_fc` maps the main model's hidden state at the last kept position into the draft's
space; each `eagle` step takes a token's embedding and a draft hidden state and gives logits
over the draft vocabulary (mapped to target tokens by `eagle_d2t`) and the next draft hidden
state. With `eagle_topk` > 1 the steps keep the `eagle_topk` best paths by summed log
probability (a beam) and the best one is verified; MNN verifies the whole token tree at once
with a tree attention mask, which needs an Attention op that takes one (not done here).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .drafts import EagleDraft, draft_feeds
from .speculative import SpeculativeGeneration

if TYPE_CHECKING:
    from ..llm import Llm


def log_softmax(rows: np.ndarray) -> np.ndarray:
    shifted = rows - rows.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


class EagleGeneration(SpeculativeGeneration):
    def __init__(self, llm: "Llm", draft: EagleDraft):
        super().__init__(llm)
        self.eagle = draft
        self.depth = llm.config.eagle_depth
        self.topk = llm.config.eagle_topk
        self.hidden = None  # [1, hidden]: the main model's hidden state before the pending token

    def start(self, new_ids: list[int]) -> None:
        self.hidden = self.llm.hidden_states[-1:]

    def verified(self, tokens: list[int], accepted: int) -> None:
        self.hidden = self.llm.hidden_states[accepted:accepted + 1]

    def draft(self, token: int, room: int) -> list[int]:
        llm, eagle = self.llm, self.eagle
        width = llm.config.hidden_size
        draft_vocab = eagle.d2t.size
        hidden, = eagle.fc.run({"fc_hidden": self.hidden}, {"hidden_states": width})
        paths, scores = [[]], np.zeros(1)
        tokens = [token]
        for _ in range(min(self.depth, room)):
            logits, hidden = eagle.step.run(draft_feeds(llm.embedding.embedding(tokens), hidden),
                                            {"logits": draft_vocab, "out_hidden_states": width})
            total = (scores[:, None] + log_softmax(logits)).reshape(-1)
            best = np.argsort(-total, kind="stable")[:self.topk]
            parents, picks = best // draft_vocab, best % draft_vocab
            tokens = [int(p + eagle.d2t[p]) for p in picks]
            paths = [paths[parent] + [t] for parent, t in zip(parents, tokens)]
            scores, hidden = total[best], hidden[parents]
        return paths[0]
