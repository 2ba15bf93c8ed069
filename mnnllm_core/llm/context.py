"""MNN's LlmContext: what the last generation did, and how long each phase took."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from enum import IntEnum
from typing import Any


class LlmStatus(IntEnum):
    """pymnn's `MNN.llm.LlmStatus` (same names and values), plus mnnllm's own: CONTEXT_FULL, the reply
    reached max_all_tokens before max_new_tokens; CONSTRAINT_UNFINISHED, a constrained reply ended
    (max_new_tokens, the context's end, or llguidance giving up on the grammar) before its text was
    a complete match, so it is a prefix of a valid output, not a valid one. An IntEnum, so code
    comparing with ints still works."""
    NOT_LOADED = -1
    RUNNING = 0
    NORMAL_FINISHED = 1
    MAX_TOKENS_FINISHED = 2
    USER_CANCEL = 3
    INTERNAL_ERROR = 4
    TIMEOUT = 5
    CONTEXT_FULL = 6
    CONSTRAINT_UNFINISHED = 7

    def __str__(self) -> str:
        return f"LlmStatus.{self.name}"

    __repr__ = __str__


RUNNING, FINISHED, MAX_TOKENS, STOPPED = (LlmStatus.RUNNING, LlmStatus.NORMAL_FINISHED,
                                          LlmStatus.MAX_TOKENS_FINISHED, LlmStatus.USER_CANCEL)
CONTEXT_FULL, CONSTRAINT_UNFINISHED = LlmStatus.CONTEXT_FULL, LlmStatus.CONSTRAINT_UNFINISHED


def end_status(stopped: bool, max_new_tokens: int, budget: int) -> LlmStatus:
    """How a reply that ends here ended: at a stop token, at max_new_tokens, or at the
    context's end (`budget`, what the context left, fell short of max_new_tokens)."""
    if stopped:
        return FINISHED
    return MAX_TOKENS if budget >= max_new_tokens else CONTEXT_FULL


@dataclass
class LlmContext:
    prompt_len: int = 0
    gen_seq_len: int = 0
    all_seq_len: int = 0
    load_us: int = 0
    prefill_us: int = 0
    decode_us: int = 0
    sample_us: int = 0
    vision_us: int = 0  # encoding the images of the last prompt (Omni)
    audio_us: int = 0  # pymnn's; no audio encoder runs here, so 0
    pixels_mp: float = 0.0  # pymnn's: megapixels of the last prompt's images (0: not measured)
    audio_input_s: float = 0.0  # pymnn's: seconds of audio in the last prompt (no audio input here)
    status: LlmStatus = RUNNING
    history_tokens: list[int] = field(default_factory=list)
    output_tokens: list[int] = field(default_factory=list)
    current_token: int = -1
    end_with: str = ""  # pymnn's generate_init(end_with=...): kept, not written (nothing streams to a file)
    generate_str: str = ""  # pymnn's: text streamed by the last response (empty: replies stream to the caller)

    def to_dict(self) -> dict:
        return asdict(self)

    def refresh(self) -> None:
        """pymnn's Context.refresh: ours is the live object, so there is nothing to fetch."""

    def update(self, data_dict: dict[str, Any] | None = None, **kwargs: Any) -> None:
        """pymnn's Context.update: set fields from a dict and/or keywords; an unknown field is an error."""
        from ..errors import ArgumentError
        names = {f.name for f in fields(self)}
        for key, value in {**(data_dict or {}), **kwargs}.items():
            if key not in names:
                raise ArgumentError(f"the context has no field {key!r}", field=key)
            setattr(self, key, LlmStatus(value) if key == "status" else value)
