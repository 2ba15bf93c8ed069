"""Generation strategies (MNN's GenerationStrategy), chosen by `speculative_type`."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ...errors import ConfigError
from .ar import ARGeneration
from .lookahead import LookaheadGeneration

if TYPE_CHECKING:
    from ..llm import Llm

__all__ = ["ARGeneration", "LookaheadGeneration", "create_generation"]


def create_generation(llm: "Llm"):
    """"" -> autoregressive; "lookahead" -> n-gram speculative decoding (greedy sampler only,
    where it is exact; with another sampler it falls back to autoregressive, logged)."""
    kind = str(llm.config.speculative_type or "")
    if kind == "":
        return ARGeneration(llm)
    if kind == "lookahead":
        if llm.config.sampler_type != "greedy":
            logging.getLogger(__name__).warning(
                "speculative_type lookahead needs sampler_type greedy (got %s): decoding token by token",
                llm.config.sampler_type)
            return ARGeneration(llm)
        return LookaheadGeneration(llm)
    raise ConfigError(f"speculative_type {kind!r} is not supported (supported: '', 'lookahead'); mtp and eagle "
                      f"need their draft modules", file=llm.config.origin("speculative_type"),
                      field="speculative_type")
