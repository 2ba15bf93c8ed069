"""MNN's LinearAttention: attn_type "short_conv" (LFM2's gated short convolution) here,
"gated_delta_rule" (Qwen3.5) in `gated_delta_rule`.

Input [tokens, 3 * H, ...]: per token the channels B, C and x; conv weight [H, 1, K]. Each
channel h: y = C * sum_k w[h, k] * (B * x)[t - K + 1 + k], a causal depthwise convolution over
the tokens. Its state is the last K - 1 values of B * x; we keep every token's B * x as a KV
cache keeps keys (one row of H per token), so the KV meta steers it exactly: a new prompt
starts from zeros, decode continues, a history cut back to a prefix convolves that prefix's
rows. (MNN keeps only the last K - 1 rows, resetting them for a new prompt.)
"""
from __future__ import annotations

import numpy as np

from mnnllm_core.backend_api import Execution, Refused

from .gated_delta_rule import GatedDeltaRuleExecution
from .token_rows import TokenRows


class ConvHistory(TokenRows):
    """B * x of every cached token, [capacity, H]."""


class ShortConvExecution(Execution):
    def __init__(self, backend, history: ConvHistory | None = None):
        super().__init__(backend)
        self.history = history if history is not None else ConvHistory()

    def on_execute(self, inputs, outputs) -> None:
        qkv = inputs[0].storage
        tokens = qkv.shape[0]
        b, c, x = np.split(qkv.reshape(tokens, -1), 3, axis=1)
        weight = inputs[3].storage.reshape(b.shape[1], -1)  # [H, K]
        taps = weight.shape[1]
        past = self.history.begin_step(self.backend.kv_meta)
        start = max(0, past - (taps - 1))
        padded = np.zeros((taps - 1 + tokens, b.shape[1]), np.float32)
        if past:
            padded[taps - 1 - (past - start):taps - 1] = self.history.rows[start:past]
        padded[taps - 1:] = b * x
        self.history.add(padded[taps - 1:])
        conv = np.zeros((tokens, b.shape[1]), np.float32)
        for k in range(taps):
            conv += padded[k:k + tokens] * weight[:, k]
        outputs[0].storage.reshape(tokens, -1)[...] = c * conv

    def on_clone(self, backend, op):
        return ShortConvExecution(backend, self.history)


def create_linear_attention(backend, inputs, outputs, op):
    param = op.param
    if param.attn_type == "short_conv":
        return ShortConvExecution(backend)
    if param.attn_type == "gated_delta_rule":
        problem = param.gated_delta_rule_problem()
        return Refused(problem) if problem else GatedDeltaRuleExecution(backend, param)
    return Refused(f"attn_type {param.attn_type!r} (only short_conv and gated_delta_rule)")


CREATORS = {"LinearAttention": create_linear_attention}
