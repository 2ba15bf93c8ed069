"""Stop sequences on streamed text: a stop may span pieces, so a tail that could begin one is
held back until the next piece shows whether it does."""
from __future__ import annotations

from typing import Sequence


class StopMatcher:
    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self._held = ""

    def feed(self, piece: str) -> tuple[str, bool]:
        """The text that is safe to show now, and whether a stop sequence was reached (the
        text is then everything before the earliest one)."""
        text = self._held + piece
        found = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if found:
            self._held = ""
            return text[:min(found)], True
        keep = self._partial_tail(text)
        self._held = text[len(text) - keep:]
        return text[:len(text) - keep], False

    def flush(self) -> str:
        """What was held back, once the text has ended without a stop."""
        held, self._held = self._held, ""
        return held

    def _partial_tail(self, text: str) -> int:
        """Length of the longest end of `text` that is the start of some stop sequence."""
        longest = max((len(s) - 1 for s in self.stops), default=0)
        for k in range(min(longest, len(text)), 0, -1):
            if any(s.startswith(text[-k:]) for s in self.stops):
                return k
        return 0
