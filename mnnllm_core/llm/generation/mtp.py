"""MNN's MtpGeneration: multi-token-prediction heads guess the next tokens, greedy and exact.

The draft (`mtp.mnn`) sees the main model's hidden state at the last kept position and the
embedding of the token the model chose there (the pending token) and guesses, head by head,
the tokens after it; the main model verifies them in one forward (speculative.py). An MTP
module with its own KV cache (Attention ops) first takes in the rows the last verify step kept
(draft_kv.py) and guesses from the last of them (logits_index -1).
"""
from __future__ import annotations

from .draft_kv import DraftKV
from .drafts import MtpDraft, draft_feeds
from .speculative import SpeculativeGeneration
from .target import Target


class MtpGeneration(SpeculativeGeneration):
    def __init__(self, target: Target, draft: MtpDraft):
        super().__init__(target)
        self.mtp = draft
        self.hidden = None  # [1, hidden]: the main model's hidden state before the pending token
        module = draft.module
        widths = {"logits": target.embedding.vocab}
        self.kv = DraftKV(target, module, widths, logits_index=-1) if module.attends else None

    def start(self, new_ids: list[int]) -> None:
        self.hidden = self.target.hidden_states[-1:]
        if self.kv is not None:
            self.kv.start()

    def draft(self, token: int, room: int) -> list[int]:
        embedding = self.target.embedding
        if self.kv is not None:
            logits, = self.kv.catch_up(token)
        else:
            logits, = self.mtp.module.run(draft_feeds(embedding.embedding([token]), self.hidden),
                                          {"logits": embedding.vocab})
        return [int(t) for t in logits.argmax(axis=-1)[:room]]

    def verified(self, tokens: list[int], accepted: int, rows: list[int]) -> None:
        self.hidden = self.target.hidden_states[rows[-1]:rows[-1] + 1]
        if self.kv is not None:
            self.kv.keep(self.target.hidden_states[rows], [tokens[row] for row in rows])
