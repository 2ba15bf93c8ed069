"""LayerNorm and RMSNorm: the last axis (with gamma, beta), two axes, groups, the channel axis
of NC4HW4 tensors, MNN's fused residual form, each head of a packed q/k (Llama 4's weightless
q/k norm after RoPE), and a gamma shorter than a row (a typed error)."""
from __future__ import annotations

import numpy as np

from ...core.op import Op
from ...core.op_params import LayerNormParams
from ...core.weights.op_weights import OpWeights
from ...errors import FormatError
from ...schema.MNN.LayerNorm import LayerNormT
from ..harness import Weights
from ..references import norm_reference
from .case import Case, Trial, randn, single

TOKENS = (1, 3, 7, 37)


def table_op(eps: float, rms: bool, gamma=None, beta=None) -> Op:
    """A LayerNorm as the loader makes one: MNN's table (gamma inline) and its weight reader."""
    table = LayerNormT()
    table.axis, table.epsilon, table.useRmsnorm = [-1], eps, rms
    table.gamma = None if gamma is None else gamma.tolist()
    table.beta = None if beta is None else beta.tolist()
    return Op("LayerNorm", "ln", table, weights=OpWeights("ln", table, None, "<test>"), extra={"format": "NCHW"})


def norm_op(params: LayerNormParams, gamma=None, beta=None) -> Op:
    return Op("LayerNorm", "ln", param=params, weights=Weights(gamma=gamma, beta=beta))


def _last_axis(tokens: int, width: int, rms: bool):
    def build(rng) -> Trial:
        x, gamma, beta = randn(rng, tokens, width) * 2 + 0.5, randn(rng, width), randn(rng, width)
        beta = None if rms else beta
        return single(table_op(1e-5, rms, gamma, beta), [x], [norm_reference(x, gamma, beta, 1e-5, rms)])
    return build


def _two_axes(rng) -> Trial:
    x = randn(rng, 3, 4, 5)
    expected = norm_reference(x.reshape(3, 20), None, None, 1e-6, False).reshape(3, 4, 5)
    return single(norm_op(LayerNormParams(1e-6, False, axis_count=2)), [x], [expected])


def _groups(rms: bool):
    def build(rng) -> Trial:
        # MNN (CPULayerNorm): a group spans every dim after the first; gamma/beta cover one group.
        batch, channels, width, group = 2, 6, 4, 3
        x = randn(rng, batch, channels, width) * 3 + 1
        inner = channels * width // group
        gamma, beta = randn(rng, inner), randn(rng, inner)
        expected = norm_reference(x.reshape(batch, group, inner), gamma, beta, 1e-5, rms).reshape(x.shape)
        return single(norm_op(LayerNormParams(1e-5, rms, group=group), gamma, beta), [x], [expected])
    return build


def _residual(tokens: int):
    def build(rng) -> Trial:
        a, b, gamma = randn(rng, tokens, 576, 1, 1), randn(rng, tokens, 576, 1, 1), randn(rng, 576)
        total = a.astype(np.float64) + b
        normed = norm_reference(total.reshape(tokens, 576), gamma, None, 1e-5, True).reshape(tokens, 576, 1, 1)
        op = norm_op(LayerNormParams(1e-5, True, channel_axis=True), gamma)
        return single(op, [a, b], [total, normed], outputs=2)
    return build


def _channel_axis(rng) -> Trial:
    x, gamma, beta = randn(rng, 2, 17, 3, 5), randn(rng, 17), randn(rng, 17)
    moved = np.moveaxis(x, 1, -1)
    expected = np.moveaxis(norm_reference(moved, gamma, beta, 1e-5, False), -1, 1)
    return single(norm_op(LayerNormParams(1e-5, False, channel_axis=True), gamma, beta), [x], [expected])


def _per_head(tokens: int, heads: int, head_dim: int):
    def build(rng) -> Trial:
        # packed [tokens, heads*head_dim, 1, 1]: the norm's last axis is each head's head_dim
        x = randn(rng, tokens, heads * head_dim, 1, 1) * 3 + 0.5
        expected = norm_reference(x.reshape(tokens * heads, head_dim), None, None, 1e-6, True).reshape(x.shape)
        return single(norm_op(LayerNormParams(1e-6, True, head_dim=head_dim)), [x], [expected])
    return build


def _short_gamma(rng) -> Trial:
    trial = single(norm_op(LayerNormParams(1e-5, True), randn(rng, 5)), [randn(rng, 3, 8)], [])
    trial.error = (FormatError, "gamma")
    return trial


def cases() -> list[Case]:
    found = [Case("LayerNorm", f"{'rms' if rms else 'layer'} last axis width={w} tokens={t}", _last_axis(t, w, rms))
             for t in TOKENS for w in (5, 17, 576) for rms in (True, False)]
    found.append(Case("LayerNorm", "two axes", _two_axes))
    found += [Case("LayerNorm", f"{'rms' if rms else 'layer'} groups", _groups(rms)) for rms in (True, False)]
    found += [Case("LayerNorm", f"fused residual tokens={t}", _residual(t)) for t in TOKENS]
    found.append(Case("LayerNorm", "NC4HW4 channel axis", _channel_axis))
    found += [Case("LayerNorm", f"rms per head of packed q/k tokens={t} heads={h} head_dim={d}", _per_head(t, h, d))
              for t, h, d in ((1, 4, 16), (7, 3, 5), (37, 2, 48))]
    found.append(Case("LayerNorm", "gamma shorter than a row is a FormatError", _short_gamma))
    return found
