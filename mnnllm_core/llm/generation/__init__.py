"""Generation strategies (MNN's GenerationStrategy), chosen by `speculative_type`. A strategy sees
the model through target.py's narrow protocol, not the Llm, and emits its tokens through
strategy.py's loop, the same for all."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ...errors import ConfigError
from .ar import ARGeneration
from .drafts import load_drafts
from .eagle import EagleGeneration
from .lookahead import LookaheadGeneration
from .mtp import MtpGeneration

if TYPE_CHECKING:
    from ..config import LlmConfig
    from ..sampler import Sampler
    from .target import DraftingTarget

__all__ = ["ARGeneration", "EagleGeneration", "LookaheadGeneration", "MtpGeneration", "create_generation", "needs_hidden_states"]

SPECULATIVE = ("lookahead", "mtp", "eagle")
DRAFTED = ("mtp", "eagle")  # strategies whose draft reads the main model's hidden_states


def needs_hidden_states(config: "LlmConfig") -> bool:
    return str(config.speculative_type or "") in DRAFTED


def create_generation(target: "DraftingTarget", sampler: "Sampler | None" = None):
    """"" -> autoregressive; "lookahead" (n-gram guesses), "mtp", "eagle" (draft modules) ->
    speculative decoding, greedy sampler only, where it is exact; with another sampler it falls
    back to autoregressive, logged. `sampler` replaces the model's own sampler (a per-request one)."""
    kind = str(target.config.speculative_type or "")
    if kind == "":
        return ARGeneration(target, sampler)
    if kind not in SPECULATIVE:
        raise ConfigError(f"speculative_type {kind!r} is not supported (supported: '', "
                          f"{', '.join(repr(k) for k in SPECULATIVE)})", file=target.config.origin("speculative_type"),
                          field="speculative_type")
    config = target.config if sampler is None else sampler.config
    if config.sampler_type != "greedy" or (sampler is not None and sampler.config.stage_order):
        logging.getLogger(__name__).warning(
            "speculative_type %s needs a plain greedy sampler (got %s): decoding token by token", kind,
            config.sampler_type)
        return ARGeneration(target, sampler)
    if kind == "lookahead":
        return LookaheadGeneration(target)
    draft = load_drafts(target, kind)
    return MtpGeneration(target, draft) if kind == "mtp" else EagleGeneration(target, draft)
