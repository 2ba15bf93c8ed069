"""pymnn's `MNN.llm` (3.6.1) as a contract: the methods of its Llm that mnnllm's Llm lacked, and the
list of its public names that differ here, each with the reason. tests/test_pymnn_compat.py reads
pymnn's names from the installed MNN (`pymnn_names`) and checks each against ours or this list;
`python -m mnnllm_core.llm.pymnn_compat` prints the README's table."""
from __future__ import annotations

import json
import logging
import subprocess
import sys

from ..errors import ArgumentError, UnsupportedError
from . import arguments
from .context import RUNNING

log = logging.getLogger(__name__)

# pymnn name (module.Class.member) -> how ours differs and why. Every other public name of
# MNN.llm and its C extension _mnncengine.llm exists here with the same signature and meaning.
DIFFERENT: dict[str, str] = {
    "IntEnum": "not API: pymnn's module imports enum.IntEnum at top level; ours has LlmStatus, an IntEnum",
    "Llm.response": "stream=True returns an iterator of text pieces (print them as they come) where pymnn "
                    "prints to stdout and returns the whole string; stream=False returns the string as pymnn",
    "Llm.forward": "returns the logits as a numpy array ([vocab]) where pymnn returns an MNN Var",
    "Llm.txt_embedding": "on an embedding model (create(..., embedding_model=True)) returns a numpy array "
                         "[1, dim] where pymnn returns an MNN Var; on a plain Llm it is absent (pymnn returns None)",
    "Llm.apply_lora": "not provided: pymnn 3.6.1's wrapper calls a method its C extension lacks (AttributeError); "
                      "ours: create_lora(path) returns a loaded Llm over this one's weights",
    "Llm.select_module": "not provided (AttributeError in pymnn 3.6.1, see apply_lora): keep the Llm that "
                         "create_lora returned and call it",
    "Llm.release_module": "not provided (AttributeError in pymnn 3.6.1, see apply_lora): drop the Llm that "
                          "create_lora returned",
    "Llm.generate_init": "resets the context's counters and keeps end_with as pymnn does; a stream is refused "
                         "(UnsupportedError): replies stream through response(stream=True) instead",
    "Llm.get_log": "always returns \"\" (pymnn's default build, without LLM_LOG_TO_STRING); logs go to "
                   "Python's logging, logger \"mnnllm_core\"",
    "Llm.set_config": "refuses an unknown key with the closest known one suggested (ConfigError), as the CLI's "
                      "--set does; pymnn accepts any key. Takes an optional `source` naming the keys' origin",
    "Context.refresh": "a no-op: our context is the live object, not a copy",
    "Context.audio_us": "always 0: no audio encoder runs here",
    "Context.audio_input_s": "always 0.0: no audio input here",
    "Context.pixels_mp": "always 0.0: image sizes are not measured",
    "Context.generate_str": "stays \"\": replies stream to the caller, not into the context",
    "Context.status": "an LlmStatus with pymnn's members plus mnnllm's own: CONTEXT_FULL (6), the reply reached "
                      "max_all_tokens before max_new_tokens; CONSTRAINT_UNFINISHED (7), a constrained reply "
                      "ended before its text was complete",
    "LLM": "the C extension's class; ours is Llm (pymnn's Python name for it)",
    "LLM.get_context": "the C extension's internals behind pymnn's Context: use llm.context (its fields, "
                       "or context.to_dict())",
    "LLM.set_context": "the C extension's internals behind pymnn's Context: use llm.context.update(...)",
    "LLM.erase_history": "erases rows [begin, end) as MNN's eraseHistory (end 0: to the end); the erase happens "
                         "at once, not at the next response",
    "Reranker": "not provided: reranker models (qwen3, gte) are not supported",
    "create_reranker": "not provided: reranker models (qwen3, gte) are not supported",
}


class PymnnMethods:
    """The methods of pymnn's Llm that an Llm gets from here (it provides context, conversation,
    config and tokenizer)."""

    def stoped(self) -> bool:
        """pymnn's (spelling kept): whether the last token generated is a stop token."""
        arguments.require_loaded(self, "stoped")
        return self.tokenizer.is_stop(self.context.current_token)

    def get_log(self) -> str:
        """pymnn's: the log buffer of a build with LLM_LOG_TO_STRING; empty, as pymnn's default build.
        Logs go to Python's logging."""
        return ""

    def dump_config(self) -> str:
        """pymnn's: the merged config as JSON text."""
        return json.dumps(self.config.to_dict(), ensure_ascii=False)

    def get_current_history(self) -> int:
        """pymnn's: how many tokens the conversation (and so the KV cache) holds."""
        arguments.require_loaded(self, "get_current_history")
        return len(self.conversation)

    def erase_history(self, begin: int, end: int = 0) -> None:
        """pymnn's: forget tokens [begin, end) of the conversation (end 0: to its end). The rows after
        `end` stay where they are in the KV cache, as MNN's eraseHistory keeps them."""
        begin, end = _index(begin, "begin"), _index(end, "end")
        arguments.require_loaded(self, "erase_history")
        with self.exclusive("erase_history"):
            held = len(self.conversation)
            end = end or held
            if end > held or begin >= end:
                raise ArgumentError(f"erase_history({begin}, {end}) is not a range within the {held} tokens held",
                                    field="begin")
            if end == held:
                self.conversation.rewind(begin)
                return
            if not self.conversation.reservable:
                raise UnsupportedError("erasing the middle of the history needs a KV cache that keeps rows apart; "
                                       "this backend's does not", field="end")
            tail = list(self.conversation.history[begin:])
            self.conversation.keep_rows(tail, range(end - begin, held - begin))

    def generate_init(self, stream: None = None, end_with: str | None = None) -> None:
        """pymnn's: start a generation's counters afresh (the conversation stays); `end_with` is kept in
        the context. Writing the reply to a stream is refused (None or False: no stream): response(stream=True)
        yields it."""
        if stream is not None and stream is not False:
            raise UnsupportedError("generate_init writes to no stream here: iterate response(prompt, stream=True)",
                                   field="stream")
        if end_with is not None:
            self.context.end_with = arguments.text(end_with, "end_with")
        ctx = self.context
        ctx.gen_seq_len = ctx.prefill_us = ctx.decode_us = ctx.sample_us = 0
        ctx.current_token, ctx.status, ctx.generate_str, ctx.output_tokens = -1, RUNNING, "", []


def _index(value, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ArgumentError(f"{field} must be an int >= 0, got {value!r:.40}", field=field)
    return value


# Run in a fresh interpreter (MNN allows one runtime per process): every public name of MNN.llm and of
# its C extension, as {name: [[parameter, repr(default) or None], ...] where a signature is readable,
# an LlmStatus member's value, or None}.
_INTROSPECT = r"""
import enum, inspect, json, os
import MNN.llm as m
import _mnncengine.llm as F
names = {}
def sig(obj):
    try:
        return [[p.name, repr(p.default) if p.default is not p.empty else None]
                for p in inspect.signature(obj).parameters.values() if p.name != "self"]
    except (TypeError, ValueError):
        return None
for name in dir(m):
    obj = getattr(m, name)
    if name.startswith("_"):
        continue
    names[name] = sig(obj) if callable(obj) and not isinstance(obj, type) else None
    if isinstance(obj, enum.EnumMeta) and obj is not enum.IntEnum:
        names.update({f"{name}.{member.name}": member.value for member in obj})
    elif isinstance(obj, type) and obj is not enum.IntEnum:
        names.update({f"{name}.{attr}": sig(member) if callable(member) else None
                      for attr, member in vars(obj).items() if not attr.startswith("_")})
for name in dir(F):
    obj = getattr(F, name)
    if name.startswith("_"):
        continue
    names.setdefault(name, None)
    if isinstance(obj, type):
        names.update({f"{name}.{attr}": None for attr in dir(obj) if not attr.startswith("_")})
print("@@NAMES@@" + json.dumps(names), flush=True)
os._exit(0)  # before MNN's C stdio buffer (device info) is flushed after our line at exit
"""


def pymnn_names(timeout: float = 120) -> dict:
    """The public names of the installed pymnn's MNN.llm (see _INTROSPECT); RuntimeError without MNN."""
    done = subprocess.run([sys.executable, "-c", _INTROSPECT], capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0 or "@@NAMES@@" not in done.stdout:
        raise RuntimeError(f"cannot read pymnn's names (is PyPI MNN installed?): {done.stderr[-500:]}")
    return json.loads(done.stdout.split("@@NAMES@@", 1)[1])


def documented(name: str) -> bool:
    """In DIFFERENT: itself, its class (a class not provided covers its members), or, for a member of
    the C extension's LLM, the same member of pymnn's Python Llm."""
    owner, _, member = name.partition(".")
    return name in DIFFERENT or bool(member and owner in DIFFERENT) or (owner == "LLM" and f"Llm.{member}" in DIFFERENT)


def markdown_table(same: list[str]) -> str:
    """The README's table: every pymnn name, `same` or how it differs."""
    rows = [(name, "same") for name in same] + list(DIFFERENT.items())
    lines = ["| pymnn `MNN.llm` | mnnllm |", "|---|---|"]
    lines += [f"| `{name}` | {text} |" for name, text in sorted(rows)]
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown_table([name for name in pymnn_names() if not documented(name)]))

