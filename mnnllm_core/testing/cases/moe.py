"""MNN's MoE op: tokens routed to their top_k experts (gate_up -> silu(gate) * up -> down),
weighted and summed; odd sizes, an expert no token picks, one token (decode)."""
from __future__ import annotations

import numpy as np

from ...core.op import Op
from ...core.op_params import MoEParams
from ...core.weights import ConvolutionWeights, FloatWeight, MoEExpert
from ..harness import Weights
from ..references import silu
from .case import Case, Trial, randn, single


def moe_reference(x, weights, chosen, experts: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """float64: out[t] = sum_j weights[t, j] * down @ (silu(gate) * up)(x[t]), expert chosen[t, j]."""
    out = np.zeros(x.shape, np.float64)
    for t in range(x.shape[0]):
        for j in range(chosen.shape[1]):
            gate_up, down = experts[int(chosen[t, j])]
            h = gate_up.astype(np.float64) @ x[t].astype(np.float64)
            inter = down.shape[1]
            out[t] += weights[t, j] * (down.astype(np.float64) @ (silu(h[:inter]) * h[inter:]))
    return out


def _moe(tokens: int, hidden: int, inter: int, num_experts: int, top_k: int, unused: bool = False):
    def build(rng) -> Trial:
        x = randn(rng, tokens, hidden)
        pairs = [(randn(rng, 2 * inter, hidden) * 0.3, randn(rng, hidden, inter) * 0.3) for _ in range(num_experts)]
        pool = num_experts - 1 if unused else num_experts  # the last expert: never picked
        chosen = np.stack([rng.choice(pool, top_k, replace=False) for _ in range(tokens)]).astype(np.int32)
        weights = rng.random((tokens, top_k)).astype(np.float32)
        weights /= weights.sum(axis=1, keepdims=True)
        experts = [MoEExpert(ConvolutionWeights(FloatWeight(2 * inter, hidden, g), None),
                             ConvolutionWeights(FloatWeight(hidden, inter, d), None)) for g, d in pairs]
        op = Op("MoE", "moe", param=MoEParams(num_experts, top_k), weights=Weights(moe=experts))
        return single(op, [x, weights.reshape(1, tokens, top_k), chosen.reshape(1, tokens, top_k)],
                      [moe_reference(x, weights, chosen, pairs)])
    return build


def cases() -> list[Case]:
    return [Case("MoE", f"tokens={t} hidden={h} inter={i} experts={e} top_k={k}{' one unused' if u else ''}",
                 _moe(t, h, i, e, k, u), device_tol=2e-5)
            for t, h, i, e, k, u in ((7, 12, 5, 4, 2, False), (1, 33, 7, 5, 3, False), (9, 16, 8, 3, 1, True),
                                     (13, 20, 6, 6, 2, True))]
