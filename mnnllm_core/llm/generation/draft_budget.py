"""Whether a speculative step should draft at all (`draft_adaptive`, our key, not MNN's).

A verify step of k tokens costs more than a one-token step (1.1-4.6x on cpu), so a draft that
guesses badly makes speculative decoding slower than plain decoding. MNN always drafts; this
policy compares the speed (tokens per second, medians of the last few steps) of verify steps
with that of plain (one-token) steps of the same reply, and while drafting does not pay runs
plain steps, probing drafting again after a pause that doubles on each failed probe (up to
`max_pause` steps) and falls back to one step when a probe pays. The first steps draft (as
MNN does); the first plain steps are taken to measure once a probe is full. It only chooses
how many guesses a step verifies, so the output stays exactly greedy decoding's.
"""
from __future__ import annotations

from collections import deque
from statistics import median


class DraftBudget:
    """Asked each step for its room (`room`), told what each step cost and yielded (`record`)."""

    def __init__(self, adaptive: bool = True, window: int = 3, max_pause: int = 64):
        self.adaptive = adaptive
        self.window = window
        self.max_pause = max_pause
        self.verify: deque[float] = deque(maxlen=window)  # tokens per second of the latest verify steps
        self.plain: deque[float] = deque(maxlen=window)  # and of the latest plain ones
        self.probing = window  # verify steps before the next judgement (0: judge every verify step)
        self.pause = 0  # plain steps left before drafting again
        self.backoff = 1  # the pause after the next failed probe
        self.probes_failed = 0

    def room(self, most: int) -> int:
        """How many guesses this step verifies, of the `most` the context and the reply allow."""
        if not self.adaptive or self.pause == 0:
            return most
        return 0

    def record(self, seconds: float, tokens: int, drafted: bool) -> None:
        """A step took `seconds` and emitted `tokens` (the pending one and the accepted guesses);
        `drafted`: it verified guesses (else it ran one token)."""
        if not self.adaptive:
            return
        speed = tokens / max(seconds, 1e-9)
        if not drafted:
            self.plain.append(speed)
            self.pause = max(self.pause - 1, 0)
            return
        self.verify.append(speed)
        self.probing = max(self.probing - 1, 0)
        if self.probing:
            return
        if len(self.plain) < self.window:  # nothing to compare with yet: measure plain steps
            self.pause = self.window - len(self.plain)
        elif median(self.verify) >= median(self.plain):
            self.backoff = 1
        else:
            self.probes_failed += 1
            self.pause = self.backoff
            self.backoff = min(2 * self.backoff, self.max_pause)
            self.verify.clear()
            self.probing = self.window
