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
from typing import Callable


# what a verify step running w tokens is priced at, in plain steps, until PRICED_AFTER of that width ran:
# 1 + COST_SLOPE (w - 1) (the shared model's measured 1.4x, 1.7x, 2.0-2.4x for 2, 3, 4 tokens at
# two threads, where its weights sit in the cache; a model read from memory pays less)
COST_SLOPE = 0.35
# the steps of a width it takes to price it: the first two after a load run op by op and then
# record the replay (the shared model's 3-token step: 29 and 17 ms, then 5-6)
PRICED_AFTER = 3


class DraftBudget:
    """Asked each step for its room (`room`), told what each step cost and yielded (`record`),
    told when a reply starts (`start_reply`). `free_guesses`: the strategy's guesses cost nothing
    to make, so a paused step may guess unverified (`guesses_while_paused`). `cost(width)`: what a
    step running `width` tokens costs against a plain one, as measured."""

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
        self.seconds: dict[int, deque[float]] = {}  # the latest steps' times, by the tokens they ran

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

    def record(self, seconds: float, tokens: int, width: int, guessed: bool = False) -> None:
        """A step took `seconds`, ran `width` tokens (1: a plain step; more: it verified guesses)
        and emitted `tokens` (the pending one and the accepted guesses); `guessed`: it ran plain
        during a pause and its unverified guess was the token it gave."""
        if not self.adaptive:
            return
        self.seconds.setdefault(width, deque(maxlen=8)).append(seconds)
        speed = tokens / max(seconds, 1e-9)
        if width == 1:
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

    def cost(self, width: int) -> float:
        """A step running `width` tokens against a plain one: the fastest of each's latest steps,
        once PRICED_AFTER of that width ran (the first ones record the replay, and the host's
        noise only slows steps down); else priced at COST_SLOPE a token more."""
        wide, plain = self.seconds.get(width), self.seconds.get(1)
        if width > 1 and wide and plain and len(wide) >= PRICED_AFTER:
            return min(wide) / max(min(plain), 1e-9)
        return 1.0 + COST_SLOPE * (width - 1)

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
    """How often guesses from each source turned out to be the model's next tokens, and how many
    of a chain of guesses are worth verifying at what verify steps cost (`draft_adaptive`).

    Lookahead's first guess has the length of the n-gram key it follows as its source: over
    twelve answers of the shared model, first guesses from a one-token key were the next token
    7% of the time (20 of 285), from longer keys 69% (11 of 16). The guesses after it in a chain
    have their place as their source (the second guess was right 5 times of 7 where the first
    was, the third 4 of 5). A guess that costs nothing to make is judged on every step, verified
    or not (the step's token tells), so a source whose guesses stop being verified still has its
    odds followed, and text that starts repeating is drafted again. The counts decay (the last
    ~`memory` guesses of a source weigh); a first guess starts at even odds, a later one at 3
    in 4 (so that a chain is tried at all), each then as its guesses go."""

    def __init__(self, memory: float = 32):
        self.keep = 1.0 - 1.0 / memory
        self.counts: dict[object, tuple[float, float]] = {}  # source -> (right, seen), decaying

    @staticmethod
    def _prior(source: object) -> tuple[float, float]:
        return (3.0, 4.0) if isinstance(source, tuple) else (1.0, 2.0)

    def record(self, source: object, right: bool) -> None:
        right_count, seen = self.counts.get(source, self._prior(source))
        self.counts[source] = (right_count * self.keep + right, seen * self.keep + 1.0)

    def rate(self, source: object) -> float:
        right_count, seen = self.counts.get(source, self._prior(source))
        return right_count / seen

    @staticmethod
    def place(n: int) -> tuple[str, int]:
        """The source of a chain's n-th guess (n >= 2: the first has a source of its own)."""
        return ("place", n)

    def worth(self, first: object, length: int, cost: Callable[[int], float]) -> int:
        """How many of a chain of `length` guesses, the first from source `first`, to verify: the
        count whose step gives the most tokens for its cost (`cost(width)`: a step running `width`
        tokens against a plain one), 0 where none beats a plain step. A step verifying g guesses
        gives 1 + p1 + p1 p2 + ... + p1...pg tokens on average."""
        best, best_rate = 0, 1.0
        expected, reach = 1.0, 1.0
        for n in range(1, length + 1):
            reach *= self.rate(first if n == 1 else self.place(n))
            expected += reach
            rate = expected / cost(n + 1)
            if rate > best_rate:
                best, best_rate = n, rate
        return best

    def verified(self, guesses: int, accepted: int) -> None:
        """A verify step of a chain kept `accepted` of its `guesses`: each later guess reached (its
        guesses before it were right) is judged (the first is judged on every step, elsewhere)."""
        for n in range(2, min(guesses, accepted + 1) + 1):
            self.record(self.place(n), accepted >= n)
