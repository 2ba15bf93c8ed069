"""MNN's lookahead (prompt n-gram) speculative decoding, greedy and exact.

Guesses come from the n-gram cache (ngram.py) of the history at the start of the generation
and of `lookup_file` (a text the user expects the answer to quote); with `ngram_update` the
accepted tokens join the cache. Up to `draft_predict_length` guesses are verified per step.
"""
from __future__ import annotations

import logging
import os

from ...errors import ConfigError
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

    def draft(self, token: int, room: int) -> list[int]:
        strictness = "high" if self.target.tokenizer.decode_id(token) in CONFUSING else self.strictness
        return self.cache.draft([*self.target.conversation.history, token], room, strictness)

    def verified(self, tokens: list[int], accepted: int, rows: list[int]) -> None:
        if self.update:
            self.cache.update(self.target.conversation.history, accepted + 1)
