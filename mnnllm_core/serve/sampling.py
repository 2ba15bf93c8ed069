"""A request's sampling fields -> MNN sampler keys (mnnllm_core/llm/sampler.py) for that
request alone: the model's config fills in what the request leaves out.

- No sampling field set: the model's own sampler (with the request's seed and logit_bias).
- temperature 0: greedy (argmax), after the penalty step when a penalty is asked for.
- Otherwise MNN's "mixed" sampler: the model's stages plus those the request names, in MNN's
  default order (penalty, topK, tfs, typical, topP, min_p), then a temperature draw.
  top_k 0 turns the topK stage off.
"""
from __future__ import annotations

from typing import Any

from ..llm.sampler import DEFAULT_MIXED_SAMPLERS, SamplerConfig
from .schemas import SamplingRequest

_STAGE_ORDER = ("penalty",) + tuple(n for n in DEFAULT_MIXED_SAMPLERS if n != "temperature")
_REQUEST_STAGES = (("top_k", "topK"), ("top_p", "topP"), ("min_p", "min_p"))
_SHAPE_FIELDS = ("temperature", "top_p", "top_k", "min_p")
_VALUE_FIELDS = ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                 "repetition_penalty", "seed")


def sampler_overrides(request: SamplingRequest, base: SamplerConfig) -> dict[str, Any] | None:
    """The sampler keys to merge over the model's config for this request; None: none needed."""
    keys: dict[str, Any] = {name: getattr(request, name) for name in _VALUE_FIELDS
                            if getattr(request, name) is not None}
    if request.top_k:
        keys["top_k"] = request.top_k
    if request.logit_bias:
        keys["logit_bias"] = {int(token): bias for token, bias in request.logit_bias.items()}
    shaped = any(getattr(request, name) is not None for name in _SHAPE_FIELDS)
    penalised = _penalised(request)
    if request.temperature == 0 or (not shaped and base.select_type == "greedy" and penalised):
        keys.pop("temperature", None)  # MNN's temperature must be > 0; greedy never reads it
        keys.update(sampler_type="penalty" if penalised else "greedy", penalty_sampler="greedy")
    elif shaped or penalised:
        keys.update(sampler_type="mixed", mixed_samplers=_stages(request, base, penalised))
    return keys or None


def _penalised(request: SamplingRequest) -> bool:
    return bool(request.presence_penalty or request.frequency_penalty
                or (request.repetition_penalty is not None and request.repetition_penalty > 1))


def _stages(request: SamplingRequest, base: SamplerConfig, penalised: bool) -> list[str]:
    names = set(base.mixed_samplers if base.sampler_type == "mixed" else (base.sampler_type,))
    names = {"min_p" if n == "minP" else n for n in names}
    names |= {stage for field, stage in _REQUEST_STAGES if getattr(request, field) is not None}
    if penalised:
        names.add("penalty")
    if request.top_k == 0:
        names.discard("topK")
    return [n for n in _STAGE_ORDER if n in names] + ["temperature"]
