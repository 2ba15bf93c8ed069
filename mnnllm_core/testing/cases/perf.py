"""Cases at the sizes of SmolLM2-135M (hidden 576, 9 heads of 64, 3 kv heads, MLP 1536, vocab
49152), one prefill of 128 tokens and one decode token each: what `--perf` times."""
from __future__ import annotations

import numpy as np

from ...core.op_params import LayerNormParams
from ...core.weights.formats import ConvolutionWeights
from ..harness import Weights
from ..references import attention_reference, linear_reference, norm_reference, quantize, rope_reference, rope_tables
from .attention import attention_op, feeds, packed, steps_trial
from .case import Case, Step, Trial, randn, single
from .elementwise import binary_op
from .linear import LINEAR_TOL, linear_op
from .norm import norm_op
from .rope import rope_op

HIDDEN, MLP, VOCAB, HEADS, KV_HEADS, HEAD_DIM = 576, 1536, 49152, 9, 3, 64


def _linear(tokens: int, oc: int, ic: int):
    def build(rng) -> Trial:
        weight, dense = quantize(randn(rng, oc, ic), 4, 64)
        x = randn(rng, tokens, ic, 1, 1)
        op = linear_op(oc, ic, Weights(conv=ConvolutionWeights(weight, None)))
        return single(op, [x], [linear_reference(x, dense, None).reshape(tokens, oc, 1, 1)])
    return build


def _norm(tokens: int):
    def build(rng) -> Trial:
        a, b, gamma = randn(rng, tokens, HIDDEN, 1, 1), randn(rng, tokens, HIDDEN, 1, 1), randn(rng, HIDDEN)
        total = a.astype(np.float64) + b
        normed = norm_reference(total.reshape(tokens, HIDDEN), gamma, None, 1e-5, True).reshape(total.shape)
        op = norm_op(LayerNormParams(1e-5, True, channel_axis=True), gamma)
        return single(op, [a, b], [total, normed], outputs=2)
    return build


def _rope(tokens: int):
    def build(rng) -> Trial:
        q, k = randn(rng, tokens, HEADS * HEAD_DIM, 1, 1), randn(rng, tokens, KV_HEADS * HEAD_DIM, 1, 1)
        cos, sin = rope_tables(np.arange(tokens), HEAD_DIM)
        expected = [rope_reference(q.reshape(tokens, HEADS, HEAD_DIM), cos, sin, HEAD_DIM).reshape(q.shape),
                    rope_reference(k.reshape(tokens, KV_HEADS, HEAD_DIM), cos, sin, HEAD_DIM).reshape(k.shape)]
        return single(rope_op(HEADS, KV_HEADS, HEAD_DIM), [q, k, cos, sin], expected, outputs=2)
    return build


def _attention(tokens: int, past: int):
    def build(rng) -> Trial:
        total = past + tokens
        q = randn(rng, total, HEADS, HEAD_DIM)
        k, v = randn(rng, total, KV_HEADS, HEAD_DIM), randn(rng, total, KV_HEADS, HEAD_DIM)
        scalar = np.zeros((1, 1, 1, 1), np.float32)
        expected = attention_reference(q[past:], k, v, causal_offset=past)
        steps = [Step(feeds(q[past:], k[past:], v[past:], scalar), [packed(expected)])]
        if past:
            steps.insert(0, Step(feeds(q[:past], k[:past], v[:past], scalar)))
        return steps_trial(attention_op(HEADS, KV_HEADS, HEAD_DIM), steps)
    return build


def _mul_silu(tokens: int):
    def build(rng) -> Trial:
        a, b = randn(rng, tokens, MLP, 1, 1), randn(rng, tokens, MLP, 1, 1)
        b64 = b.astype(np.float64)
        return single(binary_op("MUL_SILU"), [a, b], [a * b64 / (1 + np.exp(-b64))])
    return build


def cases() -> list[Case]:
    found = []
    for tokens in (128, 1):
        found += [Case("Convolution", f"q4 {oc}x{ic} tokens={tokens}", _linear(tokens, oc, ic), device_tol=LINEAR_TOL,
                       perf=True) for oc, ic in ((HIDDEN, HIDDEN), (MLP, HIDDEN), (HIDDEN, MLP), (VOCAB, HIDDEN))]
        found += [Case("LayerNorm", f"fused residual rms 576 tokens={tokens}", _norm(tokens), perf=True),
                  Case("RoPE", f"9/3 heads of 64 tokens={tokens}", _rope(tokens), perf=True),
                  Case("BinaryOp", f"MUL_SILU 1536 tokens={tokens}", _mul_silu(tokens), operation="MUL_SILU",
                       perf=True)]
    found += [Case("Attention", "prefill 128 tokens", _attention(128, 0), perf=True),
              Case("Attention", "decode 1 token after 511", _attention(1, 511), perf=True)]
    return found
