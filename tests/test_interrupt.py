"""Ctrl-C: a reply stopped anywhere leaves the history and the KV cache in agreement (the engine),
`mnnllm chat` returns to its prompt with the conversation kept, `mnnllm run` exits 130 (the CLI)."""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from mnnllm_core.core.kv_meta import KVMeta
from mnnllm_core.llm.context import STOPPED
from mnnllm_backends.cpu.ops.attention import AttentionExecution
from paths import CONFIG, load_shared_greedy

QUESTION = "What is the capital of France?"
LAYERS = 30  # Attention ops of the shared SmolLM2 model


@pytest.fixture(scope="module")
def llm():
    return load_shared_greedy()


def interrupt_on_call(monkeypatch, owner: type, names: tuple[str, ...], call: int) -> None:
    """Make owner's methods `names` raise KeyboardInterrupt right after the `call`-th call of any
    of them has done its work."""
    calls = [0]

    def wrapping(original):
        def wrapped(self, *args, **kwargs):
            result = original(self, *args, **kwargs)
            calls[0] += 1
            if calls[0] == call:
                raise KeyboardInterrupt
            return result
        return wrapped

    for name in names:
        monkeypatch.setattr(owner, name, wrapping(getattr(owner, name)))


# The third decode step (prefill, then steps 1, 2, 3) is hit: inside layer 10, after 10 layers
# appended the new token to their caches (or, in a replayed cpu step, counted it in before_run,
# ahead of the recorded calls: the first run of a resize goes op by op, later ones replay), or
# just after the step's commit of the KV cache.
POINTS = {"inside a layer": (AttentionExecution, ("on_execute", "before_run"), 3 * LAYERS + 10),
          "after the kv commit": (KVMeta, ("sync",), 4)}


@pytest.mark.parametrize("point", POINTS)
def test_a_reply_interrupted_anywhere_leaves_history_and_kv_cache_in_agreement(llm, monkeypatch, point):
    llm.reset()
    ids = llm.tokenizer_encode(llm.apply_chat_template(QUESTION))
    with monkeypatch.context() as patch:
        interrupt_on_call(patch, *POINTS[point])
        pieces = []
        with pytest.raises(KeyboardInterrupt):
            for piece in llm.response(QUESTION, stream=True):
                pieces.append(piece)
    assert llm.context.status == STOPPED
    tokens = llm.context.output_tokens
    assert len(tokens) == 3 and llm.context.history_tokens == ids + tokens[:2]
    after_interrupt = llm.forward(tokens[2:])
    # the same steps, never interrupted: prefill, decode 1 and 2, then the third token
    llm.reset()
    assert llm.generate(ids, 3) == tokens
    np.testing.assert_array_equal(after_interrupt, llm.forward(tokens[2:]))


def test_a_stream_closed_by_its_reader_is_stopped_and_the_next_turn_reuses_the_cache(llm):
    llm.reset()
    stream = llm.response(QUESTION, stream=True)
    first = next(stream)
    stream.close()
    assert llm.context.status == STOPPED and first == "The"
    history = list(llm.context.history_tokens)
    messages = [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": first},
                {"role": "user", "content": QUESTION}]
    full = llm.tokenizer_encode(llm.apply_chat_template(messages))
    new = llm._start(full)
    assert full[:len(full) - len(new)] == history[:len(full) - len(new)] and len(new) < len(full) - 30
    reused = llm.forward(new)
    llm.reset()
    np.testing.assert_allclose(reused, llm.forward(full), rtol=1e-4, atol=1e-3)


# ----------------------------------------------------------------------------------------------
# the CLI, as a user presses Ctrl-C (SIGINT) in a terminal
# ----------------------------------------------------------------------------------------------

STORY = "Write a long story about a brave knight and a dragon."


class Process:
    """A running `mnnllm` whose stdout is read as it comes."""

    def __init__(self, *args: str):
        self.proc = subprocess.Popen([sys.executable, "-m", "mnnllm_core.cli", *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.out = b""

    def read_until(self, done, timeout: float = 300) -> bytes:
        end = time.monotonic() + timeout
        while not done(self.out):
            assert time.monotonic() < end, f"timed out; stdout so far: {self.out[-500:]!r}"
            ready, _, _ = select.select([self.proc.stdout], [], [], 1.0)
            if ready:
                chunk = os.read(self.proc.stdout.fileno(), 4096)
                assert chunk, f"stdout closed; so far: {self.out[-500:]!r}, stderr: {self.proc.stderr.read()!r}"
                self.out += chunk
        return self.out

    def send(self, text: str) -> None:
        self.proc.stdin.write(text.encode())
        self.proc.stdin.flush()

    def finish(self) -> tuple[int, str]:
        _, err = self.proc.communicate(timeout=120)
        return self.proc.returncode, err.decode()


def prompts_shown(count: int):
    return lambda out: out.count(b"> ") >= count


def test_ctrl_c_in_chat_stops_the_reply_keeps_the_conversation_and_a_second_one_quits():
    chat = Process("chat", str(CONFIG), "--set", "sampler_type=greedy", "--max-new-tokens", "300")
    chat.read_until(prompts_shown(1))
    chat.send(STORY + "\n")
    chat.read_until(lambda out: len(out.split(b"> ", 1)[1]) > 40)  # the reply is streaming
    chat.proc.send_signal(signal.SIGINT)
    chat.read_until(prompts_shown(2))  # back at the prompt, the reply stopped
    chat.send("What is the name of the knight in your story?\n")
    chat.read_until(prompts_shown(3))
    chat.send("/reset\n" + QUESTION + "\n")
    out = chat.read_until(prompts_shown(5))
    chat.proc.send_signal(signal.SIGINT)  # at the prompt: quits
    code, err = chat.finish()
    assert code == 0 and "Traceback" not in err and err.count("[reply stopped]") == 1
    answers = out.decode().split("> ")
    assert len(answers[1]) < 600 and answers[2].strip()  # stopped early; the next turn answered
    assert answers[4].strip() == "The capital of France is Paris."


def test_ctrl_c_during_run_exits_130_without_a_traceback():
    run = Process("run", str(CONFIG), "--set", "sampler_type=greedy", "--max-new-tokens", "300", "-p", STORY)
    run.read_until(lambda out: len(out) > 40)
    run.proc.send_signal(signal.SIGINT)
    code, err = run.finish()
    assert code == 130 and "Traceback" not in err and "KeyboardInterrupt" not in err
