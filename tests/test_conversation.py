"""The conversation's state (history + KV meta) and the strategies' narrow view of the model:
the bookkeeping every strategy shares, run over a stand-in model (no Llm, no graph)."""
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mnnllm_core.core.kv_meta import KVMeta
from mnnllm_core.llm.context import CONTEXT_FULL, FINISHED, MAX_TOKENS, LlmContext
from mnnllm_core.llm.conversation import Conversation
from mnnllm_core.llm.generation import ARGeneration
from mnnllm_core.llm.generation.speculative import SpeculativeGeneration
from mnnllm_core.llm.generation.target import Target

ROOT = Path(__file__).resolve().parents[1]

VOCAB, STOP = 8, 7


def attached(history=()) -> Conversation:
    conversation = Conversation(LlmContext())
    conversation.attach(KVMeta(), [])
    if history:
        conversation.start_step(len(history))
        conversation.commit(list(history))
    return conversation


# -- the conversation ---------------------------------------------------------------------------

def test_a_step_cuts_the_cache_to_the_history_then_commits_its_tokens() -> None:
    conversation = attached([1, 2, 3])
    assert list(conversation.history) == [1, 2, 3] and conversation.cached == 3
    conversation.rewind(1)
    conversation.start_step(2)
    meta = conversation.meta
    assert (meta.remove, meta.add) == (2, 2)
    conversation.commit([4, 5])
    assert list(conversation.history) == [1, 4, 5] and conversation.cached == len(conversation) == 3
    assert conversation.context.all_seq_len == 3


def test_keep_rows_keeps_a_trees_accepted_path_as_reserve_runs() -> None:
    conversation = attached([1, 2, 3, 4])
    conversation.start_step(5)
    conversation.commit([10, 11, 12, 13, 14])  # pending token + four tree nodes
    conversation.keep_rows([10, 11, 12, 13, 14], [0, 2, 4])
    assert list(conversation.history) == [1, 2, 3, 4, 10, 12, 14]
    meta = conversation.meta
    assert (meta.remove, meta.reserve, meta.kept) == (5, ((0, 1), (2, 1), (4, 1)), 7)
    conversation.rewind(6)  # the reply ended before the last accepted row
    assert meta.reserve == ((0, 1), (2, 1)) and meta.kept == 6 == len(conversation)


def test_restore_and_forget() -> None:
    conversation = attached([1, 2])
    conversation.restore([5, 6, 7])
    meta = conversation.meta
    assert list(conversation.history) == [5, 6, 7] and (meta.previous, meta.remove, meta.add) == (3, 0, 0)
    conversation.context.output_tokens = [9]
    conversation.forget()
    assert list(conversation.history) == [] and meta.remove == 3 and conversation.context.output_tokens == []


def test_a_conversation_before_load_rewinds_and_forgets_its_history_alone() -> None:
    conversation = Conversation(LlmContext(history_tokens=[1, 2, 3]))
    conversation.rewind(1)
    assert list(conversation.history) == [1]
    conversation.forget()
    assert len(conversation) == 0


# -- strategies over a stand-in target -------------------------------------------------------

class Tokenizer:
    @staticmethod
    def is_stop(token: int) -> bool:
        return token == STOP


@dataclass
class Config:
    max_all_tokens: int = 64
    draft_predict_length: int = 3
    draft_adaptive: bool = False  # draft every step (MNN's way): the test counts what each verify step keeps


class Greedy:
    @staticmethod
    def sample(logits: np.ndarray, history) -> int:
        return int(np.argmax(logits))


@dataclass
class Counting:
    """A model whose next token is the last one plus one (a stop at STOP): greedy decoding
    counts up; a forward goes through the conversation like Llm's."""

    config: Config = field(default_factory=Config)
    context: LlmContext = field(default_factory=LlmContext)
    tokenizer: Tokenizer = field(default_factory=Tokenizer)
    sampler: Greedy = field(default_factory=Greedy)
    embedding: None = None
    hidden_states: None = None
    forwards: list = field(default_factory=list)

    def __post_init__(self):
        self.conversation = Conversation(self.context)
        self.conversation.attach(KVMeta(), [])

    def forward(self, input_ids, all_logits=None, parents=None) -> np.ndarray:
        self.forwards.append(list(input_ids))
        self.conversation.start_step(len(input_ids))
        self.conversation.commit(list(input_ids))
        rows = np.eye(VOCAB)[[min(t + 1, STOP) for t in input_ids]]
        return rows if all_logits else rows[-1]


class Guessing(SpeculativeGeneration):
    """Guesses `right` correct tokens, then wrong ones."""

    def __init__(self, target: Target, right: int):
        super().__init__(target)
        self.right = right

    def draft(self, token: int, room: int) -> list[int]:
        return [min(token + 1 + i, STOP) if i < self.right else 0 for i in range(room)]


def test_ar_emits_each_token_once_and_ends_at_the_stop_token() -> None:
    target = Counting()
    out = list(ARGeneration(target).generate([1, 2], 10))
    ctx = target.context
    assert out == [3, 4, 5, 6, 7] and ctx.output_tokens == out and ctx.gen_seq_len == 5
    assert ctx.status == FINISHED and ctx.current_token == STOP
    assert list(target.conversation.history) == [1, 2, 3, 4, 5, 6]  # the stop token never ran


def test_ar_at_max_new_tokens_and_with_no_room_left() -> None:
    target = Counting()
    assert list(ARGeneration(target).generate([1], 2)) == [2, 3] and target.context.status == MAX_TOKENS
    full = Counting(config=Config(max_all_tokens=2))
    assert list(ARGeneration(full).generate([1, 2], 5)) == [] and full.context.status == CONTEXT_FULL


def test_speculative_gives_the_greedy_tokens_and_forgets_guesses_past_the_end() -> None:
    for right in (0, 1, 3):
        for budget in (1, 2, 3, 4, 10):
            target, greedy = Counting(), Counting()
            out = list(Guessing(target, right).generate([0], budget))
            assert out == list(ARGeneration(greedy).generate([0], budget)), (right, budget)
            assert target.context.output_tokens == out and target.context.status == greedy.context.status
            history = list(target.conversation.history)  # up to the last token emitted that ran
            assert history == ([0] + out)[:len(history)] and len(history) >= len(greedy.conversation)
            assert target.conversation.meta.kept == len(history), (right, budget)


# -- the import graph ----------------------------------------------------------------------------

def test_the_llm_and_its_generation_strategies_import_in_no_circle() -> None:
    """(Imports under TYPE_CHECKING and inside functions count: a strategy imports no Llm at all.)"""
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "import_cycles.py"), str(ROOT / "mnnllm_core")],
                         capture_output=True, text=True, check=True)
    lines = run.stdout.splitlines()
    assert lines[-1].endswith(" import circles")
    assert not [line for line in lines if "mnnllm_core.llm" in line], run.stdout
