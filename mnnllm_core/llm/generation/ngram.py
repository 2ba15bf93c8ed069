"""MNN's lookahead n-gram cache: which token followed each n-gram (n = 1..ngram_match_maxlen).

Built from the history when a generation starts (the prompt, and the earlier turns) and from
`lookup_file`; with `ngram_update` the accepted tokens join it as decoding goes on. A draft is
grown token by token: for each key length from the longest down, the key is the last n tokens
of history + draft so far, and

* `draft_selection_rule: "freqxlen"` scores every follower of a matching key by
  count * n and keeps the best over all key lengths (a longer key wins a tie);
* `"fcfs"` takes the first follower ever seen after the longest matching key.

`draft_match_strictness` "medium"/"high" refuse a first draft token whose share of its key's
followers is below MNN's per-length percentages (60/50/50/40... and 90/80/70/60/50...);
"low" takes any match. After punctuation the first token is always judged "high".
"""
from __future__ import annotations

from collections import defaultdict
from typing import Iterable, Sequence

MAX_KEY = 8  # MNN_NGRAM_KEY_MAX
_MIN_SHARE = {"medium": (60, 50, 50, 40, 40, 40, 40, 40), "high": (90, 80, 70, 60, 50, 50, 50, 50)}
CONFUSING = frozenset({",", ".", ":", ";", "\u3001", "\uff0c", "\u3002", "\uff1a", "\uff1b"})


class NgramCache:
    def __init__(self, max_key: int, rule: str = "freqxlen"):
        self.max_key = max_key
        self.rule = rule
        # key -> {follower: count}; dicts keep insertion order, so the first follower is fcfs's
        self.followers: dict[tuple[int, ...], dict[int, int]] = defaultdict(dict)
        self.latest: dict[tuple[tuple[int, ...], int], int] = {}  # (key, follower) -> when last seen
        self._seen = 0

    def update(self, tokens: Sequence[int], new_count: int | None = None) -> None:
        """Count the n-grams ending at the last `new_count` tokens of `tokens` (all when None)."""
        total = len(tokens)
        first = 0 if new_count is None else max(total - new_count, 0)
        for n in range(1, self.max_key + 1):
            for i in range(max(first, n), total):
                key, token = tuple(tokens[i - n:i]), int(tokens[i])
                counts = self.followers[key]
                counts[token] = counts.get(token, 0) + 1
                self._seen += 1
                self.latest[(key, token)] = self._seen

    def draft(self, tokens: Sequence[int], length: int, strictness: str = "low") -> list[int]:
        """Up to `length` guessed tokens after `tokens` (only the last `max_key` of them matter)."""
        out: list[int] = []
        context = list(tokens[-self.max_key:])
        while len(out) < length:
            found = self._next(context, strictness if not out else "low")
            if found is None:
                break
            out.append(found[0])
            context.append(found[0])
        return out

    def guess(self, tokens: Sequence[int], strictness: str = "low") -> tuple[int, int] | None:
        """The first token `draft` guesses after `tokens`, and the length of the key it follows
        (how much of the text repeats; None: no guess)."""
        return self._next(list(tokens[-self.max_key:]), strictness)

    def _next(self, context: list[int], strictness: str) -> tuple[int, int] | None:
        """The guess after `context` and the length of its key."""
        best, best_score, best_key = None, 0, 0
        for n in range(min(self.max_key, len(context)), 0, -1):
            key = tuple(context[len(context) - n:])
            counts = self.followers.get(key)
            if not counts:
                continue
            if self.rule == "fcfs":
                return next(iter(counts)), n
            token = max(counts, key=lambda t: (counts[t] * n, self.latest[(key, t)]))
            if counts[token] * n <= best_score:
                continue
            best_score = counts[token] * n
            sure = strictness == "low" or 100.0 * counts[token] / sum(counts.values()) >= _MIN_SHARE[strictness][n - 1]
            best = token if sure else None  # as MNN: an unsure best still sets the score to beat
            best_key = n
        return None if best is None else (best, best_key)


def build_cache(history: Iterable[int], max_key: int, rule: str, extra: Sequence[int] = ()) -> NgramCache:
    cache = NgramCache(max_key, rule)
    cache.update(list(history))
    if extra:
        cache.update(list(extra))
    return cache
