"""What the BatchEngine (batch_engine.py) sees of the Llm whose sequences it batches: its loaded
parts and four calls, all public, as a generation strategy sees only its `Target`
(generation/target.py). `Llm` implements it; the engine touches nothing else of it."""
from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Mapping, Protocol, Sequence

import numpy as np

if TYPE_CHECKING:
    from ..express.module import NetModule
    from ..express.runtime_manager import RuntimeManager
    from .config import LlmConfig
    from .conversation import Conversation
    from .sampler import Sampler
    from .tokenizer.base import Tokenizer


class BatchHost(Protocol):
    """A loaded model the engine steps: `module` (cloned once per step shape; its executions say
    whether they are slot-aware), `runtime_manager.kv_meta` (where a step's slot table goes) and
    `.static_shapes` (whether decode steps pad to a few sizes),
    `conversation` (slot 0: the model's own sequence), `tokenizer` (check_ids, is_stop), `config`.

    `reply_budget(n)`: n checked (or the config's max_new_tokens when None), a ConfigError else.
    `exclusive(what)`: a context held around a step that changes the KV cache (another thread
    inside a step of the model makes it a ConcurrentUseError).
    `token_inputs(ids)`: the graph inputs the tokens decide, in row order (input_ids' embedding
    rows, and extra inputs such as Gemma 4's ple_embeddings).
    `make_sampler(overrides)`: a sampler of the config with sampler keys overridden."""

    config: "LlmConfig"
    tokenizer: "Tokenizer"
    module: "NetModule | None"
    runtime_manager: "RuntimeManager | None"
    conversation: "Conversation"

    def reply_budget(self, max_new_tokens: int | None) -> int: ...

    def exclusive(self, what: str) -> AbstractContextManager[None]: ...

    def token_inputs(self, ids: Sequence[int]) -> dict[str, np.ndarray]: ...

    def make_sampler(self, overrides: Mapping[str, Any]) -> "Sampler": ...
