"""A draft with its own KV cache (a real export's decoder layer: Eagle's step, an MTP module),
steered as MNN's eagle.cpp and mtp.cpp do.

The draft's cache holds one row per main-model position t that the history keeps: the main
model's hidden state at t with the embedding of the token at t + 1, at position t. The main
model's rows are `keep`t as verify steps keep them; drafting first `catch_up`s with those
(dropping the rows the last drafting grew; the last row's token is the pending one), then, for
Eagle, `grow`s: each level's rows (one per active guess) see the kept rows, their ancestors
among the grown rows and themselves (a tree mask), at position next + level. Those grown rows
go again at the next catch-up (KV meta remove), so the cache keeps only the history.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..attention_mask import step_mask, tree_mask
from .drafts import DraftModule
from .target import Target


class DraftKV:
    """`widths`: the draft's outputs and their row widths; `logits_index` as the draft graph
    takes it (0 all rows, -1 the last: an MTP module guesses from the last row only)."""

    def __init__(self, target: Target, module: DraftModule, widths: dict[str, int], logits_index: int = 0):
        self.target, self.module, self.widths = target, module, widths
        self.logits_index = np.array([logits_index], np.int32)
        self.meta = module.kv_meta
        self.next = 0  # the main-model position of the next row taken in
        self.drop = 0  # rows the next step removes first (the last drafting's growth, or all at a start)
        self.grown: list[int] = []  # per grown row, the grown row it continues (-1: the last kept row)
        self.kept_hidden: list[np.ndarray] = []  # the main model's rows not yet taken in
        self.kept_tokens: list[int] = []  # the tokens at their positions

    def start(self) -> None:
        """After a prefill: the cache is emptied at the next step and starts at the history's last
        position (the prefill gives the hidden state of its last token only)."""
        history = self.target.conversation.history
        self.next, self.drop, self.grown = len(history) - 1, self.meta.previous, []
        self.kept_hidden, self.kept_tokens = [self.target.hidden_states[-1:]], [history[-1]]

    def keep(self, hidden: np.ndarray, tokens: list[int]) -> None:
        """A verify step kept these main-model rows (consecutive positions after the last kept)."""
        self.kept_hidden.append(hidden)
        self.kept_tokens += tokens

    def catch_up(self, token: int, prepare: Callable[[np.ndarray], np.ndarray] | None = None) -> list[np.ndarray]:
        """Take in the kept rows, the last one's next token being `token` (the pending one);
        `prepare` maps the main model's hidden states to the draft's input (Eagle's fc)."""
        hidden = np.concatenate(self.kept_hidden)
        tokens = self.kept_tokens[1:] + [token]
        self.kept_hidden, self.kept_tokens = [], []
        return self.take_in(tokens, prepare(hidden) if prepare else hidden)

    def take_in(self, tokens: list[int], hidden: np.ndarray) -> list[np.ndarray]:
        """Rows for (hidden[i], token i) at positions next.. (causal); the draft's outputs."""
        cfg, rows = self.target.config, len(tokens)
        past = self.meta.previous - self.drop
        mask = step_mask(cfg.attention_mask, cfg.attention_type, cfg.sliding_window, past, rows)
        out = self._run(tokens, hidden, mask, np.arange(self.next, self.next + rows), self.drop)
        self.next += rows
        self.drop, self.grown = 0, []
        return out

    def grow(self, tokens: list[int], hidden: np.ndarray, continues: list[int], level: int) -> list[np.ndarray]:
        """Grown rows for (hidden[i], token i) at position next + level; row i continues grown
        row continues[i] (-1: the last kept row). The draft's outputs."""
        cfg = self.target.config
        first = len(self.grown)
        self.grown += continues
        past = self.meta.previous - first
        mask = tree_mask(cfg.attention_mask, cfg.attention_type, cfg.sliding_window, past, self.grown)
        out = self._run(tokens, hidden, mask[..., first:, :], np.full(len(tokens), self.next + level), 0)
        self.drop += len(tokens)
        return out

    def _run(self, tokens: list[int], hidden: np.ndarray, mask: np.ndarray, positions: np.ndarray,
             remove: int) -> list[np.ndarray]:
        rows = hidden.shape[0]
        meta = self.meta
        meta.remove, meta.add, meta.reserve = remove, rows, ()
        embeds = self.target.embedding.embedding(tokens)
        feeds = {"input_embed": embeds.reshape(rows, 1, -1).astype(np.float32, copy=False),
                 "hidden_states": hidden.astype(np.float32, copy=False), "attention_mask": np.ascontiguousarray(mask),
                 "position_ids": positions.astype(np.int32).reshape(1, rows), "logits_index": self.logits_index}
        out = self.module.run(feeds, self.widths)
        meta.sync()
        return out
