"""The one line `run` and `chat` print on stderr after each reply, as llama.cpp does after a
generation: prompt tokens and prefill speed, generated tokens and decode speed, and why the reply
ended. A reply cut by a limit says which limit, since it would otherwise read as a whole answer."""
from __future__ import annotations

from .llm.context import CONSTRAINT_UNFINISHED, CONTEXT_FULL, FINISHED, MAX_TOKENS, STOPPED, LlmContext


def _speed(tokens: int, micros: int) -> str:
    return f"{tokens / (micros / 1e6):.1f} tok/s" if micros > 0 and tokens > 0 else "- tok/s"


def stop_reason(status: int, max_new_tokens: int, max_all_tokens: int) -> str:
    """Why a reply ended, in words; a cut names the limit and how to raise it."""
    if status == FINISHED:
        return "end of reply"
    if status == MAX_TOKENS:
        return f"cut at max_new_tokens {max_new_tokens} (-n N raises it)"
    if status == CONTEXT_FULL:
        return f"cut at the end of the context, max_all_tokens {max_all_tokens} (/reset or -c N makes room)"
    if status == STOPPED:
        return "stopped by Ctrl-C"
    if status == CONSTRAINT_UNFINISHED:
        return "ended before the constrained output was complete"
    return f"status {int(status)}"


def summary_line(context: LlmContext, max_new_tokens: int, max_all_tokens: int) -> str:
    """`[prompt 37 tok, 812.4 tok/s | generated 8 tok, 41.2 tok/s | cut at max_new_tokens 8 ...]`.
    The decode speed counts the steps after the first token (the prefill produced that one)."""
    decoded = max(context.gen_seq_len - 1, 0)
    return (f"[prompt {context.prompt_len} tok, {_speed(context.prompt_len, context.prefill_us)} | "
            f"generated {context.gen_seq_len} tok, {_speed(decoded, context.decode_us)} | "
            f"{stop_reason(context.status, max_new_tokens, max_all_tokens)}]")
