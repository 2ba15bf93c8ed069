"""An op's parameter table decoded once into plain values, the same for every backend.

Backends differ in where they put the numbers (numpy arrays, device buffers), not in what
the numbers are: reading MNN's tables (defaults, optional fields, RoPE's cut dim) lives
here so that no backend re-derives it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .op import Op


@dataclass(frozen=True, eq=False)
class NormParams:
    """A LayerNorm/RMSNorm: gamma and beta (None when absent), over the last `axis_count`
    dims in `group` groups, or over the channel axis of an NC4HW4 tensor."""

    gamma: np.ndarray | None
    beta: np.ndarray | None
    epsilon: float
    rms: bool
    axis_count: int = 1
    group: int = 1
    channel_axis: bool = False


def _floats(values) -> np.ndarray | None:
    return np.asarray(values, np.float32) if values is not None and len(values) else None


def layernorm_params(op: Op) -> NormParams:
    """A LayerNorm op; its gamma/beta come from the weight reader when it has one."""
    p = op.param
    gamma, beta = op.weights.layernorm() if op.weights is not None else (_floats(p.gamma), _floats(p.beta))
    axis = list(p.axis) if p.axis is not None else [-1]
    return NormParams(gamma, beta, float(p.epsilon or 0.0), bool(p.useRmsnorm), max(1, len(axis)),
                      int(p.group or 1), op.extra.get("format") == "NC4HW4")


def norm_table(table) -> NormParams | None:
    """A RoPEParam q_norm/k_norm table (per-head norm, Qwen3); None when absent. A beta of
    another length than gamma is ignored, as MNN does."""
    gamma = _floats(getattr(table, "gamma", None)) if table is not None else None
    if gamma is None:
        return None
    beta = _floats(table.beta)
    return NormParams(gamma, beta if beta is not None and len(beta) == len(gamma) else None,
                      float(table.epsilon or 0.0), bool(table.useRmsnorm))


@dataclass(frozen=True, eq=False)
class RoPEParams:
    num_head: int
    kv_num_head: int
    head_dim: int
    rope_dim: int  # leading dims of each head that rotate (even); the rest pass through
    q_norm: NormParams | None
    k_norm: NormParams | None


def rope_params(op: Op) -> RoPEParams | None:
    """None when the table lacks the head layout (no backend can run it then)."""
    p = op.param
    if p is None or not p.numHead or not p.kvNumHead or not p.headDim:
        return None
    head_dim, cut = int(p.headDim), int(p.ropeCutHeadDim or 0)
    rope_dim = (cut if 0 < cut <= head_dim else head_dim) // 2 * 2
    return RoPEParams(int(p.numHead), int(p.kvNumHead), head_dim, rope_dim,
                      norm_table(getattr(p, "qNorm", None)), norm_table(getattr(p, "kNorm", None)))
