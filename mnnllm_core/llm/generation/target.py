"""What a generation strategy sees of the model it decodes (the target, in speculative decoding's
words): forward, sampling, the stop check and the conversation, not the whole Llm."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, Sequence

import numpy as np

if TYPE_CHECKING:
    from ...express.module import NetModule
    from ...express.runtime_manager import RuntimeManager
    from ..config import LlmConfig
    from ..context import LlmContext
    from ..conversation import Conversation
    from ..disk_embedding import DiskEmbedding
    from ..sampler import Sampler
    from ..tokenizer.base import Tokenizer


class Target(Protocol):
    """The model a strategy decodes: `forward` runs tokens (the conversation records them), the
    sampler and the tokenizer (encode, decode, is_stop) choose and judge tokens, `context` takes
    the reply's figures; mtp/eagle drafts read `hidden_states` and `embedding`."""

    config: "LlmConfig"
    context: "LlmContext"
    conversation: "Conversation"
    tokenizer: "Tokenizer"
    sampler: "Sampler | None"
    embedding: "DiskEmbedding | None"
    hidden_states: np.ndarray | None

    def forward(self, input_ids: Sequence[int], all_logits: bool | None = None,
                parents: Sequence[int] | None = None) -> np.ndarray: ...


class DraftingTarget(Target, Protocol):
    """A target the draft modules load beside: its runtimes, its graph (for its outputs) and the
    drafts it keeps once loaded."""

    runtime_manager: "RuntimeManager | None"
    module: "NetModule | None"
    drafts: Any
