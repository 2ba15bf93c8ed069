"""MNN's lookahead (prompt n-gram) speculative decoding, greedy and exact.

Guesses come from the n-gram cache (ngram.py) of the history at the start of the generation
and of `lookup_file` (a text the user expects the answer to quote); with `ngram_update` the
accepted tokens join the cache. Up to `draft_predict_length` guesses are verified per step.
With `draft_adaptive` a step verifies as many of its guesses as pay for their verify step on
average (`GuessOdds`): by how often first guesses from keys of the same length were right
lately (a one-token key's guess rarely is the model's next token), how often later guesses
were, and what steps of each width cost here (`DraftBudget.cost`); none where a plain step
gives more tokens for the time.
"""
from __future__ import annotations

import logging
import os

from ...errors import ConfigError
from .draft_budget import GuessOdds
from .ngram import CONFUSING, MAX_KEY, NgramCache, build_cache
from .speculative import SpeculativeGeneration
from .target import Target

log = logging.getLogger(__name__)

LOOKUP_LIMIT = 1 << 20  # bytes of lookup_file read (a prior text, not a corpus)


class LookaheadGeneration(SpeculativeGeneration):
    free_guesses = True  # an n-gram lookup: the draft budget may guess while it pauses

    def __init__(self, target: Target):
        super().__init__(target)
        cfg = target.config
        if cfg.ngram_match_maxlen > MAX_KEY:
            raise ConfigError(f"ngram_match_maxlen must be at most {MAX_KEY} (MNN's longest n-gram key), got "
                              f"{cfg.ngram_match_maxlen}", file=cfg.origin("ngram_match_maxlen"),
                              field="ngram_match_maxlen")
        self.strictness = cfg.draft_match_strictness
        self.update = cfg.ngram_update
        self.cache = NgramCache(cfg.ngram_match_maxlen, cfg.draft_selection_rule)
        self._lookup: list[int] | None = None
        self.odds = GuessOdds()  # by the length of the key a first guess follows
        self._open: tuple[int, int, int] | None = None  # (its place in the history, guess, key length): unjudged

    def _lookup_ids(self) -> list[int]:
        """lookup_file's tokens (read once; a missing file means none, as in MNN)."""
        if self._lookup is None:
            path = self.target.config.lookup_file
            self._lookup = []
            if os.path.isfile(path):
                with open(path, "rb") as f:
                    text = f.read(LOOKUP_LIMIT).decode("utf-8", errors="replace")
                self._lookup = self.target.tokenizer.encode(text)
                log.info("lookahead: %d tokens of n-grams from %s", len(self._lookup), path)
        return self._lookup

    def start(self, new_ids: list[int]) -> None:
        cfg = self.target.config
        self.cache = build_cache(self.target.conversation.history, cfg.ngram_match_maxlen, cfg.draft_selection_rule,
                                 self._lookup_ids())
        self._open = None

    def draft(self, token: int, room: int) -> list[int]:
        """Called on every step that may draft (a paused one guesses too: `free_guesses`), so the
        last step's first guess is judged here against the token that came."""
        history = self.target.conversation.history
        self._judge_open(history, token)
        context = [*history[-MAX_KEY:], token]
        strictness = "high" if self.target.tokenizer.decode_id(token) in CONFUSING else self.strictness
        first = self.cache.guess(context, strictness)
        if first is None:
            return []
        self._open = (len(history) + 1, *first)
        # priced at its longest before it is drafted: no step drafts guesses it would not verify
        most = self.odds.worth(first[1], room, self.budget.cost) if self.budget.adaptive else room
        if most == 0:
            return []
        # the rest of the chain after the first guess (`draft` judges only its first by strictness)
        chain = [first[0], *self.cache.draft([*context, first[0]], most - 1)]
        if self.budget.adaptive and len(chain) < most:  # it ran out: priced again over its own length
            return chain[:self.odds.worth(first[1], len(chain), self.budget.cost)]
        return chain

    def _judge_open(self, history, token: int) -> None:
        """The open guess was for place p of the history (+ the pending token): right or not."""
        if self._open is None:
            return
        place, guess, key = self._open
        self._open = None
        if place < len(history):
            self.odds.record(key, history[place] == guess)
        elif place == len(history):
            self.odds.record(key, token == guess)

    def verified(self, tokens: list[int], accepted: int, rows: list[int]) -> None:
        self.odds.verified(len(tokens) - 1, accepted)
        if self.update:
            self.cache.update(self.target.conversation.history, accepted + 1)
