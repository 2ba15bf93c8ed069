"""MNN's LlmContext: what the last generation did, and how long each phase took."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

RUNNING, FINISHED, MAX_TOKENS, STOPPED = 0, 1, 2, 3
CONTEXT_FULL = 5  # not one of MNN's: the reply reached max_all_tokens before max_new_tokens (4 is MNN's error)


def end_status(stopped: bool, max_new_tokens: int, budget: int) -> int:
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
    status: int = RUNNING
    history_tokens: list[int] = field(default_factory=list)
    output_tokens: list[int] = field(default_factory=list)
    current_token: int = -1

    def to_dict(self) -> dict:
        return asdict(self)
