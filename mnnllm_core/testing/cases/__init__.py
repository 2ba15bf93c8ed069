"""The conformance catalogue: every op type and parameter variant the LLM graphs use (and the
rest of what the cpu backend runs), odd shapes, each dtype, each with a float64 numpy reference;
one module per op family, each with its `cases()`. What a case is and its tolerances: `case.py`.
"""
from __future__ import annotations

from .case import FP16_TOL, FP32_TOL, INT8_KV_TOL, Case, Check, Step, Trial, ints, randn, single

__all__ = ["FP16_TOL", "FP32_TOL", "INT8_KV_TOL", "Case", "Check", "Step", "Trial", "all_cases", "ints",
           "perf_cases", "randn", "single"]


def all_cases() -> list[Case]:
    """The whole catalogue, in a fixed order."""
    from . import (attention, attention_long, elementwise, fill, linear, linear_attention, matmul, moe, movement, norm,
                   reduction, rope, slot_attention, topk)
    found: list[Case] = []
    for module in (linear, norm, rope, attention, attention_long, slot_attention, linear_attention, elementwise,
                   movement, matmul, reduction, topk,
                   fill, moe):
        found += module.cases()
    ids = [c.id for c in found]
    duplicated = {i for i in ids if ids.count(i) > 1}
    assert not duplicated, f"case ids must be unique: {sorted(duplicated)}"
    return found


def perf_cases() -> list[Case]:
    """Cases at the sizes of a real model (SmolLM2-135M), for `--perf`."""
    from . import perf
    return perf.cases()
