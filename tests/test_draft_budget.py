"""The draft budget (draft_budget.py): on synthetic costs, weak drafts give mostly plain steps with
probes at doubling pauses, good drafts keep drafting, the state carries across replies with the
pause capped, a free guess confirmed during a pause ends it; a guess source's odds (GuessOdds)
follow its recent guesses; end to end, the tokens stay greedy decoding's (MNN's reference) with
the policy on and off, the budget outlives `reset` and not `set_config`, lookahead judges every
step's first guess (verified or not) and verifies as many guesses as their odds pay for at the
measured cost of each width."""
import json

import pytest

import mnnllm_core
from mnnllm_core.llm.generation import speculative
from mnnllm_core.llm.generation.draft_budget import COST_SLOPE, DraftBudget, GuessOdds
from mnnllm_core.llm.generation.ngram import NgramCache
from paths import CONFIG, REFERENCE
from slow_verify import SlowVerify

PROMPTS = json.loads(REFERENCE.read_text())["prompts"]
N = 32


def run(budget, steps, verify_cost, accepted, most=3, hits=()):
    """`steps` steps: a plain one costs 1 s, a verify one of `most` guesses `verify_cost` s (of
    fewer, proportionally less) and keeps up to `accepted` of them; a paused step at an index in
    `hits` has its free guess confirmed. The rooms chosen."""
    rooms = []
    for step in range(steps):
        room = budget.room(most)
        rooms.append(room)
        if room:
            budget.record(1 + (verify_cost - 1) * room / most, 1 + min(accepted, room), 1 + room)
        else:
            budget.record(1.0, 1, 1, guessed=budget.guesses_while_paused(most) and step in hits)
    return rooms


def plain_runs(rooms):
    """The lengths of the runs of plain steps between verify steps."""
    runs, length = [], 0
    for room in rooms:
        if room and length:
            runs.append(length)
        length = 0 if room else length + 1
    return runs


def test_weak_drafts_run_mostly_plain_with_one_guess_probes_at_doubling_pauses():
    budget = DraftBudget(max_pause=16)
    rooms = run(budget, 200, verify_cost=2.0, accepted=0)
    assert rooms[0] == 3  # draft first (as MNN): it keeps nothing, so it fails without a plain step to compare
    assert plain_runs(rooms)[:6] == [2, 4, 8, 16, 16, 16]
    assert set(rooms[1:]) == {0, 1}  # probes verify one guess
    assert sum(1 for room in rooms if room) < 0.1 * len(rooms)
    assert budget.probes_failed == sum(1 for room in rooms if room) - 1


def test_a_first_step_keeping_guesses_is_judged_against_a_plain_step():
    budget = DraftBudget()
    rooms = run(budget, 12, verify_cost=4.0, accepted=1)  # 2 tokens in 4 s against 1 in 1 s
    assert rooms[:4] == [3, 0, 0, 0] and rooms[4] == 1  # measured, then paused 2 steps, then a probe


def test_good_drafts_keep_drafting():
    budget = DraftBudget()
    rooms = run(budget, 100, verify_cost=1.5, accepted=2)  # 2 tokens/s against 1
    assert rooms[:2] == [3, 0] and all(room == 3 for room in rooms[2:])
    assert budget.probes_failed == 0


def test_a_paying_probe_resumes_drafting_and_resets_the_pause():
    budget = DraftBudget(max_pause=64)
    run(budget, 100, verify_cost=2.0, accepted=0)
    assert budget.backoff > 8
    rooms = run(budget, 80, verify_cost=1.0, accepted=3)
    first = next(i for i, room in enumerate(rooms) if room)
    assert rooms[first] == 1 and all(room == 3 for room in rooms[first + 1:])
    assert budget.backoff == budget.first_pause


def test_a_reply_after_weak_drafts_starts_plain_and_probes_within_the_carried_pause():
    budget = DraftBudget(max_pause=64, carried_pause=8)
    run(budget, 100, verify_cost=2.0, accepted=0)
    failed, backoff = budget.probes_failed, budget.backoff
    budget.start_reply()
    assert budget.pause <= 8 and budget.backoff == backoff  # the speeds and the backoff carry over
    rooms = run(budget, 64, verify_cost=2.0, accepted=0)
    assert set(rooms) == {0, 1} and rooms.index(1) <= 8  # no full verify step: a probe within 8 steps
    assert sum(rooms) == 1 and budget.probes_failed == failed + 1  # then a pause of 64


def test_each_weak_reply_in_a_row_doubles_the_carried_pause_and_a_paying_one_resets_it():
    budget = DraftBudget(max_pause=64, carried_pause=8)
    run(budget, 100, verify_cost=2.0, accepted=0)  # a first reply: drafting never paid
    firsts = []
    for _ in range(5):
        budget.start_reply()
        rooms = run(budget, 40, verify_cost=2.0, accepted=0)
        firsts.append(rooms.index(1) if 1 in rooms else None)
    # probes at 8, 16, 32; then a pause of 64 runs on across replies: 57 steps left, 40 of them in
    # the fourth reply (which judges nothing: the streak holds), the probe at 17 in the fifth
    assert firsts == [8, 16, 32, None, 17] and budget.weak_replies == 4
    budget.start_reply()
    assert budget.weak_replies == 5 and budget.pause <= 64
    rooms = run(budget, 100, verify_cost=1.0, accepted=3)  # this reply suits the draft
    assert rooms.index(1) <= 64 and rooms[-1] == 3
    budget.start_reply()
    assert budget.weak_replies == 0 and budget.pause == 0


def test_a_reply_suiting_the_draft_recovers_at_the_first_probe():
    budget = DraftBudget(max_pause=64, carried_pause=8)
    run(budget, 100, verify_cost=2.0, accepted=0)
    budget.start_reply()
    rooms = run(budget, 40, verify_cost=1.0, accepted=3)
    first = rooms.index(1)
    assert first <= 8 and all(room == 3 for room in rooms[first + 1:])


def test_a_reply_after_good_drafts_drafts_from_its_first_step():
    budget = DraftBudget()
    run(budget, 20, verify_cost=1.5, accepted=2)
    budget.start_reply()
    assert run(budget, 5, verify_cost=1.5, accepted=2) == [3] * 5


def test_a_confirmed_free_guess_ends_the_pause():
    budget = DraftBudget(max_pause=64, free_guesses=True)
    run(budget, 100, verify_cost=2.0, accepted=0)
    assert budget.pause > 1 and budget.guesses_while_paused(3)
    rooms = run(budget, 4, verify_cost=1.0, accepted=3, hits={0})
    assert rooms[:3] == [0, 1, 3]  # the guess made plain was right: probed at once, then drafting in full
    assert not DraftBudget(max_pause=64).guesses_while_paused(3)  # a draft model's guess costs a forward


def test_guess_odds_start_even_fall_with_misses_and_recover_with_hits():
    odds = GuessOdds(memory=8)
    assert odds.rate(1) == 0.5 and odds.rate(GuessOdds.place(2)) == 0.75
    odds.record(1, False)
    assert odds.rate(1) < 0.4 and odds.rate(2) == 0.5  # each source on its own
    for _ in range(40):
        odds.record(1, False)
    assert odds.rate(1) < 0.01
    hits = 0
    while odds.rate(1) < 0.5:
        odds.record(1, True)
        hits += 1
    assert hits <= 8  # the misses long past weigh little: a few hits in a row bring it back


def test_guess_odds_verify_the_guesses_that_pay_for_their_step():
    """A step verifying g guesses gives 1 + p1 + p1 p2 + ... tokens on average: the count with the
    most tokens for its step's cost is verified, none where a plain step gives more."""
    odds = GuessOdds()
    linear = lambda slope: (lambda width: 1 + slope * (width - 1))  # noqa: E731
    # even odds, then 3 in 4: 1.5, 1.875, 2.156 tokens for 1, 2, 3 guesses
    assert odds.worth(1, 3, linear(0.35)) == 1  # 1.5 / 1.35 beats 1.875 / 1.7 and 2.156 / 2.05
    assert odds.worth(1, 3, linear(0.1)) == 3  # a model read from memory: wide steps cost little
    assert odds.worth(1, 3, linear(0.6)) == 0  # 1.5 / 1.6: a plain step gives more
    assert odds.worth(1, 3, lambda width: 1.0) == 3 and odds.worth(1, 2, lambda width: 1.0) == 2
    for _ in range(20):
        odds.record(1, False)
    assert odds.worth(1, 3, linear(0.1)) == 0  # a one-token key's guesses: rarely right
    for _ in range(20):
        odds.record(3, True)
    assert odds.worth(3, 3, linear(0.35)) == 2  # a long key's: right; the third guess not yet worth it
    for _ in range(20):
        odds.verified(3, 3)
    assert odds.worth(3, 3, linear(0.35)) == 3  # and the chains after it right too


def test_guess_odds_judge_each_later_guess_a_verify_step_reached():
    odds = GuessOdds(memory=float("inf"))
    odds.verified(3, 1)  # the second guess was judged (wrong), the third never reached
    odds.verified(3, 3)  # both right
    odds.verified(1, 1)  # no later guess
    assert odds.counts == {GuessOdds.place(2): (4.0, 6.0), GuessOdds.place(3): (4.0, 5.0)}


def test_the_budget_prices_a_width_at_its_fastest_steps_once_three_ran():
    budget = DraftBudget()
    assert budget.cost(1) == 1.0 and budget.cost(4) == pytest.approx(1 + 3 * 0.35)  # nothing measured
    for seconds in (1.2, 1.0, 1.1):
        budget.record(seconds, 1, 1)
    budget.record(9.0, 1, 4)  # the first steps of a width run op by op, then record the replay
    budget.record(5.0, 1, 4)
    assert budget.cost(4) == pytest.approx(1 + 3 * 0.35)
    budget.record(2.2, 1, 4)
    assert budget.cost(4) == pytest.approx(2.2) and budget.cost(3) == pytest.approx(1.7)
    assert DraftBudget(adaptive=False).cost(2) == pytest.approx(1.35)


def test_off_always_drafts():
    assert all(room == 3 for room in run(DraftBudget(adaptive=False), 50, verify_cost=5.0, accepted=0))


def test_the_room_the_reply_allows_is_kept():
    budget = DraftBudget()
    assert budget.room(0) == 0 and budget.room(2) == 2


@pytest.fixture(scope="module")
def lookahead():
    llm = mnnllm_core.create(CONFIG)
    llm.set_config({"sampler_type": "greedy", "thread_num": 2, "speculative_type": "lookahead",
                    "ngram_update": True})
    return llm.load()


@pytest.mark.parametrize("adaptive", [True, False])
def test_lookahead_gives_the_greedy_tokens_with_the_policy_on_and_off(lookahead, adaptive):
    lookahead.set_config({"draft_adaptive": adaptive})
    for prompt in PROMPTS[:2]:
        lookahead.reset()
        assert lookahead.generate(prompt["prompt_ids"], N) == prompt["mnn_cpp_q4_memory_normal"]["gen_ids"][:N]
        assert lookahead.generation.budget.adaptive == adaptive


@pytest.fixture
def slow_verify(lookahead, monkeypatch):
    """The lookahead model with a SlowVerify budget (a strategy made afresh), the real one after."""
    monkeypatch.setattr(speculative, "DraftBudget", SlowVerify)
    lookahead.set_config({"draft_adaptive": True})
    yield lookahead
    monkeypatch.undo()
    lookahead.set_config({"draft_adaptive": True})


def spied(strategy, steps, kept=None):
    """Record in `steps` the length of each step (the pending token and the guesses verified),
    and in `kept` (if given) how many guesses it kept."""
    verified = strategy.verified

    def spy(tokens, accepted, rows):
        steps.append(len(tokens))
        if kept is not None:
            kept.append(accepted)
        verified(tokens, accepted, rows)
    strategy.verified = spy


def test_plain_steps_between_verify_steps_keep_the_tokens_and_the_cache(slow_verify):
    steps = []
    strategy = slow_verify.generation
    spied(strategy, steps)
    try:
        prompt = PROMPTS[1]
        slow_verify.reset()
        assert slow_verify.generate(prompt["prompt_ids"], N) == prompt["mnn_cpp_q4_memory_normal"]["gen_ids"][:N]
    finally:
        del strategy.verified
    meta = slow_verify.kv_meta
    assert meta.previous - meta.remove == len(slow_verify.context.history_tokens)
    assert strategy.budget.probes_failed and steps.count(1) > len(steps) // 2


def test_the_budget_outlives_reset_so_the_next_reply_only_probes(slow_verify):
    strategy = slow_verify.generation
    budget = strategy.budget
    slow_verify.reset()
    slow_verify.generate(PROMPTS[1]["prompt_ids"], N)
    assert budget.probes_failed  # drafting was judged not to pay
    steps = []
    spied(strategy, steps)
    try:
        for prompt in PROMPTS[:2]:
            slow_verify.reset()
            assert slow_verify.generate(prompt["prompt_ids"], N) == prompt["mnn_cpp_q4_memory_normal"]["gen_ids"][:N]
    finally:
        del strategy.verified
    assert slow_verify.generation is strategy and strategy.budget is budget
    assert set(steps) <= {1, 2}  # no reply starts with a full verify step again: one-guess probes only


def test_set_config_starts_a_fresh_budget(lookahead):
    lookahead.set_config({"draft_adaptive": True})
    lookahead.reset()
    lookahead.generate(PROMPTS[0]["prompt_ids"], 8)
    used = lookahead.generation.budget
    lookahead.set_config({"draft_predict_length": 2})
    try:
        fresh = lookahead.generation.budget
        assert fresh is not used and not fresh.plain and not fresh.pause and fresh.backoff == fresh.first_pause
    finally:
        lookahead.set_config({"draft_predict_length": 3})


def spied_guesses(monkeypatch):
    """Every first guess lookahead makes (the history it was made at, the guess, its key length)."""
    made = []
    guess = NgramCache.guess

    def spy(self, tokens, strictness="low"):
        found = guess(self, tokens, strictness)
        if found is not None:
            made.append((found[0], found[1]))
        return found
    monkeypatch.setattr(NgramCache, "guess", spy)
    return made


@pytest.mark.parametrize("verify_cost", [1.0, 1e9])
def test_lookahead_judges_every_first_guess_verified_or_not(lookahead, monkeypatch, verify_cost):
    """Verify steps priced as dear as 1e9 plain ones: no guess is worth verifying, every step runs
    plain and the odds still learn from each; as cheap as a plain one: every guess is verified
    (MNN's way). Either way each first guess but the last is judged against the token that came
    at its place, and the tokens are greedy decoding's."""
    lookahead.set_config({"draft_adaptive": True})
    strategy = lookahead.generation
    strategy.odds = GuessOdds(memory=float("inf"))  # no decay: plain counts
    monkeypatch.setattr(strategy.budget, "cost", lambda width: 1.0 if width == 1 else verify_cost)
    places = []
    draft = strategy.draft

    def spy(token, room):
        out = draft(token, room)
        places.append(strategy._open)
        return out
    strategy.draft = spy
    steps, kept = [], []
    spied(strategy, steps, kept)
    made = spied_guesses(monkeypatch)
    empty = strategy.empty_steps
    try:
        prompt = PROMPTS[1]
        lookahead.reset()
        out = lookahead.generate(prompt["prompt_ids"], N)
    finally:
        del strategy.draft, strategy.verified
    assert strategy.empty_steps - empty == sum(1 for n, k in zip(steps, kept) if n > 1 and k == 0)
    assert out == prompt["mnn_cpp_q4_memory_normal"]["gen_ids"][:N]
    text = list(prompt["prompt_ids"]) + out
    opened = [o for o in places if o is not None]
    assert [(g, k) for _, g, k in opened] == made and len(made) >= N // 4
    want: dict[int, list[int]] = {}
    for place, guess, key in opened[:-1]:  # the last one is never judged
        right, seen = want.get(key, [1, 2])
        want[key] = [right + (text[place] == guess), seen + 1]
    firsts = {k: list(v) for k, v in strategy.odds.counts.items() if not isinstance(k, tuple)}
    assert firsts == want
    if verify_cost > 1:
        assert set(steps) == {1}
    else:
        assert max(steps) > 1


def test_lookahead_verifies_no_guess_from_a_key_whose_odds_are_low(lookahead, monkeypatch):
    """The shared model's one-token-key guesses on this prompt are mostly wrong: once their odds
    fall, no verify step starts from one, and each verify step holds as many guesses as the odds
    and the costs said pay (at least one). The costs are the budget's prices before measuring
    (the host's timing would decide otherwise which steps pay)."""
    lookahead.set_config({"draft_adaptive": True})
    strategy = lookahead.generation
    monkeypatch.setattr(strategy.budget, "cost", lambda width: 1 + COST_SLOPE * (width - 1))
    judged = []
    draft = strategy.draft

    def spy(token, room):
        out = draft(token, room)
        if out:
            judged.append(len(out) == strategy.odds.worth(strategy._open[2], room, strategy.budget.cost) or
                          len(out) < room)  # a chain the n-gram cache ended sooner
        return out
    strategy.draft = spy
    try:
        for prompt in PROMPTS[:2]:
            lookahead.reset()
            assert lookahead.generate(prompt["prompt_ids"], N) == prompt["mnn_cpp_q4_memory_normal"]["gen_ids"][:N]
    finally:
        del strategy.draft
    assert judged and all(judged) and strategy.odds.counts
    assert strategy.odds.worth(1, 3, strategy.budget.cost) == 0
