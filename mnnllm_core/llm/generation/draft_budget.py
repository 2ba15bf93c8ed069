"""Whether a speculative step should draft at all (`draft_adaptive`, our key, not MNN's).

A verify step of k tokens costs more than a one-token step (1.1-4.6x on cpu), so a draft that
guesses badly makes speculative decoding slower than plain decoding. MNN always drafts; this
policy compares the speed (tokens per second, medians of the last few steps) of verify steps
with that of plain (one-token) steps of the same reply. The first step drafts (as MNN does),
the next runs plain to measure; while drafting does not pay, steps run plain, and drafting is
probed again after a pause that doubles on each failed probe (up to `max_pause` steps). A probe
verifies one guess (a two-token forward costs little more than one token) and, if it pays,
drafting resumes in full; the pause falls back to `first_pause` once a window of full verify
steps pays. It only chooses how many guesses a step verifies: the output stays exactly greedy
decoding's.
"""
from __future__ import annotations

from collections import deque
from statistics import median


class DraftBudget:
    """Asked each step for its room (`room`), told what each step cost and yielded (`record`)."""

    def __init__(self, adaptive: bool = True, window: int = 3, first_pause: int = 2, max_pause: int = 64):
        self.adaptive = adaptive
        self.first_pause, self.max_pause = first_pause, max_pause
        self.verify: deque[float] = deque(maxlen=window)  # tokens per second of the latest verify steps
        self.plain: deque[float] = deque(maxlen=window)  # and of the latest plain ones
        self.pause = 0  # plain steps left before drafting again
        self.backoff = first_pause  # the pause after the next failed judgement
        self.probing = False  # the next verify step is a probe after a pause
        self.measuring = False  # the pause measures plain steps, judged at its end
        self.probes_failed = 0

    def room(self, most: int) -> int:
        """How many guesses this step verifies, of the `most` the context and the reply allow."""
        if not self.adaptive:
            return most
        if self.pause:
            return 0
        return min(most, 1) if self.probing else most

    def record(self, seconds: float, tokens: int, drafted: bool) -> None:
        """A step took `seconds` and emitted `tokens` (the pending one and the accepted guesses);
        `drafted`: it verified guesses (else it ran one token)."""
        if not self.adaptive:
            return
        speed = tokens / max(seconds, 1e-9)
        if not drafted:
            self.plain.append(speed)
            if self.pause:
                self.pause -= 1
                if not self.pause and self.measuring:
                    self.measuring = False
                    self._judge()
            return
        self.verify.append(speed)
        if not self.plain:  # nothing to compare with yet: measure a plain step
            self.pause, self.measuring = 1, True
            return
        self._judge()

    def _judge(self) -> None:
        probe, self.probing = self.probing, False
        if median(self.verify) >= median(self.plain):
            if not probe and len(self.verify) == self.verify.maxlen:
                self.backoff = self.first_pause  # drafting pays over a whole window
            return
        self.probes_failed += probe
        self.pause, self.probing = self.backoff, True
        self.backoff = min(2 * self.backoff, self.max_pause)
        self.verify.clear()  # the probe is judged on its own
