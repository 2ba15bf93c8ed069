"""An Eagle step with its own KV cache (a real export's decoder layer), steered as MNN's eagle.cpp does.

The draft's cache holds one row per main-model position t that the history keeps: the main
model's hidden state at t with the embedding of the token at t + 1, at position t. Drafting
first `catch_up`s with the rows the last verify step kept (dropping the rows the last drafting
grew), then `grow`s: each level's rows (one per active guess) see the kept rows, their
ancestors among the grown rows and themselves (a tree mask), at position next + level. Those
grown rows go again at the next catch-up (KV meta remove), so the cache keeps only the history.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..attention_mask import step_mask, tree_mask
from .drafts import DraftModule

if TYPE_CHECKING:
    from ..llm import Llm


class DraftKV:
    def __init__(self, llm: "Llm", step: DraftModule, draft_vocab: int):
        self.llm, self.step, self.vocab = llm, step, draft_vocab
        self.meta = step.kv_meta
        self.next = 0  # the main-model position of the next row kept
        self.drop = 0  # rows the next step removes first (the last drafting's growth, or all at a start)
        self.grown: list[int] = []  # per grown row, the grown row it continues (-1: the last kept row)

    def start(self, position: int) -> None:
        """A new conversation or prompt: the cache is emptied at the next step; its rows start at `position`."""
        self.next, self.drop, self.grown = position, self.meta.previous, []

    def _run(self, embeds: np.ndarray, hidden: np.ndarray, mask: np.ndarray, positions: np.ndarray,
             remove: int) -> tuple[np.ndarray, np.ndarray]:
        rows = hidden.shape[0]
        meta = self.meta
        meta.remove, meta.add, meta.reserve = remove, rows, ()
        feeds = {"input_embed": embeds.reshape(rows, 1, -1).astype(np.float32, copy=False),
                 "hidden_states": hidden.astype(np.float32, copy=False), "attention_mask": np.ascontiguousarray(mask),
                 "position_ids": positions.astype(np.int32).reshape(1, rows), "logits_index": np.zeros(1, np.int32)}
        logits, out = self.step.run(feeds, {"logits": self.vocab, "out_hidden_states": self.llm.config.hidden_size})
        meta.sync()
        return logits, out

    def catch_up(self, tokens: list[int], hidden: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Keep rows for (hidden[i], token i), the hidden states of consecutive positions from
        `next` on; the last row's logits and draft state."""
        cfg, rows = self.llm.config, len(tokens)
        past = self.meta.previous - self.drop
        mask = step_mask(cfg.attention_mask, cfg.attention_type, cfg.sliding_window, past, rows)
        logits, out = self._run(self.llm.embedding.embedding(tokens), hidden, mask,
                                np.arange(self.next, self.next + rows), self.drop)
        self.next += rows
        self.drop, self.grown = 0, []
        return logits[-1:], out[-1:]

    def grow(self, tokens: list[int], hidden: np.ndarray, continues: list[int], level: int) -> tuple[np.ndarray,
                                                                                                   np.ndarray]:
        """Grown rows for (hidden[i], token i) at position next + level; row i continues grown
        row continues[i] (-1: the last kept row). Their logits and draft states."""
        cfg = self.llm.config
        first = len(self.grown)
        self.grown += continues
        past = self.meta.previous - first
        mask = tree_mask(cfg.attention_mask, cfg.attention_type, cfg.sliding_window, past, self.grown)
        logits, out = self._run(self.llm.embedding.embedding(tokens), hidden, mask[..., first:, :],
                                np.full(len(tokens), self.next + level), 0)
        self.drop += len(tokens)
        return logits, out
