"""MNN's MoE op: tokens routed to their top_k experts (gate_up -> the expert's program on the
halves -> down), weighted and summed; odd sizes, an expert no token picks, one token (decode);
silu(gate) * up, gelu_tanh(gate) * up spelled out step by step as the Gemma 4 export writes it,
and gpt-oss's clamped swiglu with biases on both Linears."""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ...core.expert_program import SILU_GLU, ExpertProgram, ExpertStep
from ...core.op import Op
from ...core.op_params import MoEParams
from ...core.weights.formats import ConvolutionWeights, FloatWeight, MoEExpert
from ..harness import Weights
from ..references import silu
from .case import Case, Trial, randn, single

Activation = Callable[[np.ndarray, np.ndarray], np.ndarray]  # float64 (gate, up) -> what down reads
GELU_C = math.sqrt(2 / math.pi)
# gpt-oss's constants, with a limit the random halves cross
ALPHA, LIMIT = 1.702, 0.75


def gelu_tanh_program() -> ExpertProgram:
    """0.5 g (1 + tanh(c (g + 0.044715 g^3))) * up, in the exporter's order of ops."""
    return (ExpertStep("SQUARE", ("gate",)), ExpertStep("MUL", ("gate", "step0")),
            ExpertStep("MUL", (0.044715, "step1")), ExpertStep("ADD", ("gate", "step2")),
            ExpertStep("MUL", (float(np.float32(GELU_C)), "step3")), ExpertStep("TANH", ("step4",)),
            ExpertStep("ADD", (1.0, "step5")), ExpertStep("MUL", ("gate", "step6")),
            ExpertStep("MUL", (0.5, "step7")), ExpertStep("MUL", ("up", "step8")))


def clamped_swiglu_program() -> ExpertProgram:
    """g = min(gate, limit), u = clamp(up, -limit, limit); (u + 1) * g * sigmoid(alpha * g)."""
    return (ExpertStep("MINIMUM", ("gate", LIMIT)), ExpertStep("MINIMUM", ("up", LIMIT)),
            ExpertStep("MAXIMUM", ("step1", -LIMIT)), ExpertStep("MUL", ("step0", ALPHA)),
            ExpertStep("SIGMOID", ("step3",)), ExpertStep("MUL", ("step0", "step4")),
            ExpertStep("ADD", ("step2", 1.0)), ExpertStep("MUL", ("step6", "step5")))


def gelu_tanh_glu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    return 0.5 * gate * (1 + np.tanh(GELU_C * (gate + 0.044715 * gate ** 3))) * up


def clamped_swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    g = np.minimum(gate, LIMIT)
    return (np.clip(up, -LIMIT, LIMIT) + 1) * g / (1 + np.exp(-ALPHA * g))


ACTIVATIONS: dict[str, tuple[ExpertProgram, Activation]] = {
    "silu": (SILU_GLU, lambda gate, up: silu(gate) * up),
    "gelu_tanh": (gelu_tanh_program(), gelu_tanh_glu),
    "clamped_swiglu": (clamped_swiglu_program(), clamped_swiglu),
}


def moe_reference(x, weights, chosen, experts: list[tuple[np.ndarray, ...]], activation: Activation) -> np.ndarray:
    """float64: out[t] = sum_j weights[t, j] * (down @ act(gate, up) + down_bias), (gate, up) the halves
    of gate_up @ x[t] + gate_up_bias, expert chosen[t, j]."""
    out = np.zeros(x.shape, np.float64)
    for t in range(x.shape[0]):
        for j in range(chosen.shape[1]):
            gate_up, down, gate_up_bias, down_bias = (a.astype(np.float64) for a in experts[int(chosen[t, j])])
            h = gate_up @ x[t].astype(np.float64) + gate_up_bias
            inter = down.shape[1]
            out[t] += weights[t, j] * (down @ activation(h[:inter], h[inter:]) + down_bias)
    return out


def _moe(tokens: int, hidden: int, inter: int, num_experts: int, top_k: int, unused: bool = False,
         activation: str = "silu", biases: bool = False):
    program, reference = ACTIVATIONS[activation]

    def build(rng) -> Trial:
        x = randn(rng, tokens, hidden)
        tensors = []
        for _ in range(num_experts):
            gate_up, down = randn(rng, 2 * inter, hidden) * 0.3, randn(rng, hidden, inter) * 0.3
            gate_up_bias, down_bias = ((randn(rng, 2 * inter) * 0.3, randn(rng, hidden) * 0.3) if biases
                                       else (np.zeros(2 * inter, np.float32), np.zeros(hidden, np.float32)))
            tensors.append((gate_up, down, gate_up_bias, down_bias))
        pool = num_experts - 1 if unused else num_experts  # the last expert: never picked
        chosen = np.stack([rng.choice(pool, top_k, replace=False) for _ in range(tokens)]).astype(np.int32)
        weights = rng.random((tokens, top_k)).astype(np.float32)
        weights /= weights.sum(axis=1, keepdims=True)
        experts = [MoEExpert(ConvolutionWeights(FloatWeight(2 * inter, hidden, g), gb if biases else None),
                             ConvolutionWeights(FloatWeight(hidden, inter, d), db if biases else None), program)
                   for g, d, gb, db in tensors]
        op = Op("MoE", "moe", param=MoEParams(num_experts, top_k), weights=Weights(moe=experts))
        return single(op, [x, weights.reshape(1, tokens, top_k), chosen.reshape(1, tokens, top_k)],
                      [moe_reference(x, weights, chosen, tensors, reference)])
    return build


def cases() -> list[Case]:
    found = [Case("MoE", f"tokens={t} hidden={h} inter={i} experts={e} top_k={k}{' one unused' if u else ''}",
                  _moe(t, h, i, e, k, u), device_tol=2e-5)
             for t, h, i, e, k, u in ((7, 12, 5, 4, 2, False), (1, 33, 7, 5, 3, False), (9, 16, 8, 3, 1, True),
                                      (13, 20, 6, 6, 2, True))]
    found += [Case("MoE", f"{a} experts{' with biases' if b else ''} tokens={t} hidden={h} inter={i} experts={e} "
                          f"top_k={k}", _moe(t, h, i, e, k, activation=a, biases=b), device_tol=3e-5)
              for a, b, t, h, i, e, k in (("gelu_tanh", False, 7, 12, 5, 4, 2), ("gelu_tanh", False, 1, 33, 7, 5, 3),
                                          ("clamped_swiglu", True, 9, 16, 8, 3, 2),
                                          ("clamped_swiglu", True, 1, 20, 6, 4, 2))]
    return found
