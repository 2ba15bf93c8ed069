"""Generation strategies (MNN's GenerationStrategy), chosen by `speculative_type`."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ...errors import ConfigError
from .ar import ARGeneration
from .lookahead import LookaheadGeneration

if TYPE_CHECKING:
    from ..llm import Llm
    from ..sampler import Sampler

__all__ = ["ARGeneration", "LookaheadGeneration", "create_generation"]


def create_generation(llm: "Llm", sampler: "Sampler | None" = None):
    """"" -> autoregressive; "lookahead" -> n-gram speculative decoding (greedy sampler only,
    where it is exact; with another sampler it falls back to autoregressive, logged).
    `sampler` replaces the model's own sampler (a per-request one)."""
    kind = str(llm.config.speculative_type or "")
    if kind == "":
        return ARGeneration(llm, sampler)
    if kind == "lookahead":
        config = llm.config if sampler is None else sampler.config
        if config.sampler_type != "greedy" or (sampler is not None and sampler.config.stage_order):
            logging.getLogger(__name__).warning(
                "speculative_type lookahead needs a plain greedy sampler (got %s): decoding token by token",
                config.sampler_type)
            return ARGeneration(llm, sampler)
        return LookaheadGeneration(llm)
    raise ConfigError(f"speculative_type {kind!r} is not supported (supported: '', 'lookahead'); mtp and eagle "
                      f"need their draft modules", file=llm.config.origin("speculative_type"),
                      field="speculative_type")
