"""The draft budget (draft_budget.py): on synthetic costs, weak drafts give mostly plain steps with
probes at doubling pauses, good drafts keep drafting; end to end, the tokens stay greedy decoding's
(MNN's reference) with the policy on and off, whatever steps it chooses."""
import json

import pytest

import mnnllm_core
from mnnllm_core.llm.generation import speculative
from mnnllm_core.llm.generation.draft_budget import DraftBudget
from paths import CONFIG, REFERENCE

PROMPTS = json.loads(REFERENCE.read_text())["prompts"]
N = 32


def run(budget, steps, verify_cost, accepted, most=3):
    """`steps` steps: a plain one costs 1 s, a verify one of `most` guesses `verify_cost` s (of
    fewer, proportionally less) and keeps up to `accepted` of them. The rooms chosen."""
    rooms = []
    for _ in range(steps):
        room = budget.room(most)
        rooms.append(room)
        if room:
            budget.record(1 + (verify_cost - 1) * room / most, 1 + min(accepted, room), drafted=True)
        else:
            budget.record(1.0, 1, drafted=False)
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
    assert rooms[:2] == [3, 0]  # draft first (as MNN), then measure a plain step
    assert plain_runs(rooms)[:6] == [1 + 2, 4, 8, 16, 16, 16]
    assert set(rooms[2:]) == {0, 1}  # probes verify one guess
    assert sum(1 for room in rooms if room) < 0.1 * len(rooms)
    assert budget.probes_failed == sum(1 for room in rooms if room) - 1


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


def test_off_always_drafts():
    assert all(room == 3 for room in run(DraftBudget(adaptive=False), 50, verify_cost=5.0, accepted=0))


def test_the_room_the_reply_allows_is_kept():
    budget = DraftBudget()
    assert budget.room(0) == 0 and budget.room(2) == 2


class SlowVerify(DraftBudget):
    """Every verify step 'costs' 5 plain ones: drafting never pays."""

    def record(self, seconds, tokens, drafted):
        super().record(5.0 if drafted else 1.0, tokens, drafted)


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


def test_plain_steps_between_verify_steps_keep_the_tokens_and_the_cache(lookahead, monkeypatch):
    monkeypatch.setattr(speculative, "DraftBudget", SlowVerify)
    lookahead.set_config({"draft_adaptive": True})
    steps = []
    strategy = lookahead.generation
    verified = strategy.verified

    def spy(tokens, accepted, rows):
        steps.append(len(tokens))
        verified(tokens, accepted, rows)
    strategy.verified = spy
    try:
        prompt = PROMPTS[1]
        lookahead.reset()
        assert lookahead.generate(prompt["prompt_ids"], N) == prompt["mnn_cpp_q4_memory_normal"]["gen_ids"][:N]
    finally:
        del strategy.verified
    meta = lookahead.kv_meta
    assert meta.previous - meta.remove == len(lookahead.context.history_tokens)
    assert strategy.budget.probes_failed and steps.count(1) > len(steps) // 2
