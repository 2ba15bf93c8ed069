"""Whether a speculative step should draft at all (`draft_adaptive`, our key, not MNN's).

A verify step of k tokens costs more than a one-token step (1.1-4.6x on cpu), so a draft that
guesses badly makes speculative decoding slower than plain decoding. MNN always drafts; this
policy compares the speed (tokens per second, medians of the last few steps) of verify steps
with that of plain (one-token) steps. The first step drafts (as MNN does); while drafting does
not pay, steps run plain, and drafting is probed again after a pause that doubles on each failed
probe (up to `max_pause` steps: after its first ~500 steps a draft that never pays costs one
failed probe, 2-3 plain steps, per 256). A probe verifies one guess (a two-token forward costs
little more than one token) and, if it pays, drafting resumes in full; the pause falls back to
`first_pause` once a window of full verify steps pays. A verify step judged on its own (the
first, or a probe) that kept no guess fails at once: it emitted one token for more than a plain
step's work, whatever the clock says, so no plain step is needed to measure it against.

The budget lives as long as its strategy, across replies: the Llm makes the strategy at load and
again at every `set_config` (a change of speculative_type, draft_predict_length or the drafts
starts a fresh budget), not at `reset`. What it measures, a verify step's cost against a plain
one's and how often the draft guesses right, belongs to the model, the draft and the machine
more than to one conversation, and a server resetting between requests is the case that needs
it carried: a new reply where drafting did not pay starts plain instead of paying a full verify
step again. What the text changes is bounded: at a reply's start a carried pause is cut to
`carried_pause` steps (a probe comes early), doubled (up to `max_pause`) for each reply in a row
before it where drafting was judged and never paid (a draft that suits no reply costs one failed
probe a reply at first, then fewer: a probe of a draft model costs its forward and a two-token
verify, 2-3 plain steps), and a strategy whose guesses cost nothing to make
(lookahead's n-gram lookup: only verifying them costs) guesses during the pause too, unverified:
a guess the step's token confirms ends the pause (`record(..., guessed=True)`), so repetitive
text is probed as soon as it repeats. A per-request sampler or a guided reply has a strategy of
its own, so a budget of its own. The budget only chooses how many guesses a step verifies: the
output stays exactly greedy decoding's.
"""
from __future__ import annotations

from collections import deque
from statistics import median


class DraftBudget:
    """Asked each step for its room (`room`), told what each step cost and yielded (`record`),
    told when a reply starts (`start_reply`). `free_guesses`: the strategy's guesses cost nothing
    to make, so a paused step may guess unverified (`guesses_while_paused`)."""

    def __init__(self, adaptive: bool = True, window: int = 3, first_pause: int = 2, max_pause: int = 256,
                 carried_pause: int = 8, free_guesses: bool = False):
        self.adaptive = adaptive
        self.first_pause, self.max_pause, self.carried_pause = first_pause, max_pause, carried_pause
        self.free_guesses = free_guesses
        self.verify: deque[float] = deque(maxlen=window)  # tokens per second of the latest verify steps
        self.plain: deque[float] = deque(maxlen=window)  # and of the latest plain ones
        self.pause = 0  # plain steps left before drafting again
        self.backoff = first_pause  # the pause after the next failed judgement
        self.probing = False  # the next verify step is a probe after a pause
        self.measuring = False  # the pause measures plain steps, judged at its end
        self.probes_failed = 0
        self.reply_failed = self.reply_paid = False  # this reply's judgements: one failed, one paid
        self.weak_replies = 0  # replies in a row whose judgements all failed

    def start_reply(self) -> None:
        """A reply starts: what was measured stays, a pause carried over is cut to `carried_pause`,
        doubled for each weak reply in a row before this one."""
        if self.reply_paid:
            self.weak_replies = 0
        elif self.reply_failed:
            self.weak_replies += 1
        self.reply_failed = self.reply_paid = False
        cut = self.carried_pause << max(self.weak_replies - 1, 0)
        self.pause = min(self.pause, cut, self.max_pause)

    def room(self, most: int) -> int:
        """How many guesses this step verifies, of the `most` the context and the reply allow."""
        if not self.adaptive:
            return most
        if self.pause:
            return 0
        return min(most, 1) if self.probing else most

    def guesses_while_paused(self, most: int) -> bool:
        """Whether this step, allowed `most` guesses, runs plain yet guesses (unverified, for `record`'s `guessed`)."""
        return self.free_guesses and self.pause > 0 and most > 0

    def record(self, seconds: float, tokens: int, drafted: bool, guessed: bool = False) -> None:
        """A step took `seconds` and emitted `tokens` (the pending one and the accepted guesses);
        `drafted`: it verified guesses (else it ran one token); `guessed`: it ran plain during a
        pause and its unverified guess was the token it gave."""
        if not self.adaptive:
            return
        speed = tokens / max(seconds, 1e-9)
        if not drafted:
            self.plain.append(speed)
            if self.pause:
                self.pause = 0 if guessed else self.pause - 1
                if not self.pause and self.measuring:
                    self.measuring = False
                    self._judge()
            return
        self.verify.append(speed)
        if tokens == 1 and len(self.verify) == 1:
            self._stop_drafting()
        elif not self.plain:  # nothing to compare with yet: measure a plain step
            self.pause, self.measuring = 1, True
        else:
            self._judge()

    def _judge(self) -> None:
        """Drafting pays while verify steps emit at least as many tokens per second as plain ones."""
        if median(self.verify) < median(self.plain):
            self._stop_drafting()
            return
        self.reply_paid = True
        if not self.probing and len(self.verify) == self.verify.maxlen:
            self.backoff = self.first_pause  # drafting pays over a whole window
        self.probing = False

    def _stop_drafting(self) -> None:
        """Plain steps for a pause, then a probe judged on its own; the next pause is twice as long."""
        self.probes_failed += self.probing
        self.reply_failed = True
        self.pause, self.probing = self.backoff, True
        self.backoff = min(2 * self.backoff, self.max_pause)
        self.verify.clear()


class GuessOdds:
    """How often a first guess from each source turned out to be the model's next token, and
    whether verifying such a guess pays (`draft_adaptive`). Lookahead's source is the length of
    the n-gram key the guess follows: over twelve answers of the shared model, first guesses
    from a one-token key were the next token 7% of the time (20 of 285), from longer keys 69%
    (11 of 16), and a verify step of two tokens costs 1.1-1.9x a plain one, so only the latter
    pay. A guess that costs nothing to make is judged on every step, verified or not (the step's
    token tells), so a source whose guesses stop being verified still has its odds followed, and
    text that starts repeating is drafted again. The counts decay (the last ~`memory` guesses of
    a source weigh); a source starts at even odds, so it is verified until it proves weak."""

    def __init__(self, least: float = 0.4, memory: float = 32):
        self.least = least  # the share of right guesses that pays for verifying one
        self.keep = 1.0 - 1.0 / memory
        self.counts: dict[object, tuple[float, float]] = {}  # source -> (right, seen), decaying

    def record(self, source: object, right: bool) -> None:
        right_count, seen = self.counts.get(source, (1.0, 2.0))
        self.counts[source] = (right_count * self.keep + right, seen * self.keep + 1.0)

    def rate(self, source: object) -> float:
        right_count, seen = self.counts.get(source, (1.0, 2.0))
        return right_count / seen

    def worth(self, source: object) -> bool:
        return self.rate(source) >= self.least
