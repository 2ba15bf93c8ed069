"""MNN's LinearAttention, attn_type short_conv (LFM2): y = C * causal_conv(B * x) over the tokens,
and attn_type gated_delta_rule (Qwen3.5's gated delta-net), each driven through several steps by
the KV meta: a prefill, decode steps that continue the convolution's (and the recurrence's)
state, a prompt shorter than the kernel, tokens removed from the history."""
from __future__ import annotations

import numpy as np

from ...core.op import Op
from ...core.op_params import LinearAttentionParams
from ...errors import UnsupportedError
from ..harness import Const
from .case import Case, Step, Trial, randn


def short_conv_reference(qkv: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """qkv [tokens, 3H] of the whole history, weight [H, K] -> y [tokens, H] (float64)."""
    b, c, x = np.split(qkv.astype(np.float64), 3, axis=1)
    bx = b * x
    taps = weight.shape[1]
    padded = np.concatenate([np.zeros((taps - 1, bx.shape[1])), bx])
    conv = sum(padded[k:k + bx.shape[0]] * weight[:, k].astype(np.float64) for k in range(taps))
    return c * conv


def short_conv_op(channels: int) -> Op:
    return Op("LinearAttention", "short_conv", param=LinearAttentionParams("short_conv", 1, 1, channels, channels))


def _steps(channels: int, taps: int, runs: tuple[int, ...], remove_before_last: int = 0):
    """Runs of new tokens in order; before the last run, `remove_before_last` tokens leave the history."""
    def build(rng) -> Trial:
        weight = randn(rng, channels, 1, taps)
        history = np.zeros((0, 3 * channels), np.float32)
        steps = []
        for n, tokens in enumerate(runs):
            remove = remove_before_last if n == len(runs) - 1 else 0
            if remove:
                history = history[:len(history) - remove]
            qkv = randn(rng, tokens, 3 * channels)
            history = np.concatenate([history, qkv])
            expected = short_conv_reference(history, weight.reshape(channels, taps))[-tokens:]
            fill = np.zeros((1, tokens, 1), np.float32)
            steps.append(Step([qkv.reshape(tokens, 3 * channels, 1, 1), fill, fill],
                              [expected.reshape(tokens, channels, 1, 1)], remove=remove))
        return Trial(short_conv_op(channels), [*steps[0].feeds, Const(weight)], steps)
    return build


def gated_delta_rule_reference(qkv: np.ndarray, gate: np.ndarray, beta: np.ndarray, weight: np.ndarray,
                               params: LinearAttentionParams) -> np.ndarray:
    """The whole history's qkv [tokens, D], gate and beta [tokens, Hv], conv weight [D, K] ->
    out [tokens, Hv, dv] (float64), one head and one token at a time."""
    p = params
    tokens, channels = qkv.shape
    x = qkv.astype(np.float64)
    w = weight.astype(np.float64)
    conv = np.stack([np.convolve(x[:, d], w[d, ::-1])[:tokens] for d in range(channels)], axis=1)
    act = conv / (1.0 + np.exp(-conv))
    key_dim = p.num_k_heads * p.head_k_dim
    group = p.num_v_heads // p.num_k_heads
    out = np.zeros((tokens, p.num_v_heads, p.head_v_dim))
    for h in range(p.num_v_heads):
        source = (h // group) * p.head_k_dim
        state = np.zeros((p.head_k_dim, p.head_v_dim))
        for t in range(tokens):
            q = act[t, source:source + p.head_k_dim]
            k = act[t, key_dim + source:key_dim + source + p.head_k_dim]
            v = act[t, 2 * key_dim + h * p.head_v_dim:2 * key_dim + (h + 1) * p.head_v_dim]
            if p.use_qk_l2norm:
                q, k = q / np.sqrt(q @ q + 1e-6), k / np.sqrt(k @ k + 1e-6)
            q = q / np.sqrt(p.head_k_dim)
            state = state * np.exp(float(gate[t, h]))
            state = state + np.outer(k, float(beta[t, h]) * (v - state.T @ k))
            out[t, h] = state.T @ q
    return out


def gated_delta_rule_op(params: LinearAttentionParams) -> Op:
    return Op("LinearAttention", "gated_delta_rule", param=params)


def _delta_rule_steps(params: LinearAttentionParams, taps: int, runs: tuple[int, ...], remove_before_last: int = 0,
                      mnn_layout: bool = False):
    """Runs of new tokens in order; before the last run, `remove_before_last` tokens leave the
    history. `mnn_layout`: qkv [1, D, tokens] and gate/beta [1, tokens, Hv] (the unfused export)
    instead of a Linear's [tokens, D, 1, 1] and [tokens, Hv, 1, 1]."""
    p = params
    channels = 2 * p.num_k_heads * p.head_k_dim + p.num_v_heads * p.head_v_dim

    def build(rng) -> Trial:
        weight = randn(rng, channels, 1, taps) * np.float32(0.5)
        history = [np.zeros((0, n), np.float32) for n in (channels, p.num_v_heads, p.num_v_heads)]
        steps = []
        for n, tokens in enumerate(runs):
            remove = remove_before_last if n == len(runs) - 1 else 0
            if remove:
                history = [h[:len(h) - remove] for h in history]
            qkv = randn(rng, tokens, channels)
            gate = -np.abs(randn(rng, tokens, p.num_v_heads)) * np.float32(0.7)
            beta = (1.0 / (1.0 + np.exp(-randn(rng, tokens, p.num_v_heads)))).astype(np.float32)
            history = [np.concatenate([h, new]) for h, new in zip(history, (qkv, gate, beta))]
            expected = gated_delta_rule_reference(*history, weight.reshape(channels, taps), p)[-tokens:]
            if mnn_layout:
                feeds = [qkv.T[None].copy(), gate[None], beta[None]]
                want = expected.reshape(1, tokens, p.num_v_heads, p.head_v_dim)
            else:
                feeds = [qkv.reshape(tokens, channels, 1, 1), gate.reshape(tokens, -1, 1, 1),
                         beta.reshape(tokens, -1, 1, 1)]
                want = expected.reshape(tokens, -1, 1, 1)
            steps.append(Step(feeds, [want], remove=remove))
        return Trial(gated_delta_rule_op(p), [*steps[0].feeds, Const(weight)], steps)
    return build


def _refused(params: LinearAttentionParams, channels: int, gate_heads: int, why: str):
    def build(rng) -> Trial:
        qkv, gate = randn(rng, 3, channels, 1, 1), randn(rng, 3, gate_heads, 1, 1)
        trial = Trial(gated_delta_rule_op(params), [qkv, gate, gate.copy(), Const(randn(rng, channels, 1, 4))],
                      [Step(None, None)])
        trial.error = (UnsupportedError, why)
        return trial
    return build


def _delta_rule_cases() -> list[Case]:
    qwen = LinearAttentionParams("gated_delta_rule", 2, 4, 16, 16, True)
    odd = LinearAttentionParams("gated_delta_rule", 1, 3, 5, 3, True)
    wide = LinearAttentionParams("gated_delta_rule", 2, 6, 8, 5, True)
    plain = LinearAttentionParams("gated_delta_rule", 3, 3, 4, 6, False)
    shapes = [(qwen, 4, (1,), 0, False), (qwen, 4, (7,), 0, False), (qwen, 4, (7, 1, 1), 0, False),
              (odd, 4, (1, 1, 1), 0, False), (odd, 3, (6, 2, 1), 0, False), (wide, 4, (9, 1, 3), 4, False),
              (plain, 2, (5, 1), 0, False), (wide, 4, (7,), 0, True),
              (odd, 4, (70, 2, 3), 7, False)]  # past the cpu history's checkpoint at 64 tokens, and back
    found = [Case("LinearAttention",
                  f"gated_delta_rule k_heads={p.num_k_heads} v_heads={p.num_v_heads} dk={p.head_k_dim} "
                  f"dv={p.head_v_dim} l2norm={p.use_qk_l2norm} kernel={k} runs={runs} remove={r}"
                  + (" layout=[1,D,tokens]" if mnn else ""), _delta_rule_steps(p, k, runs, r, mnn))
             for p, k, runs, r, mnn in shapes]
    bad = [(LinearAttentionParams("gated_delta_rule", 3, 4, 4, 4, True), 40, 4, "not a multiple"),
           (LinearAttentionParams("gated_delta_rule", 2, 2, 0, 4, True), 8, 2, "must be positive"),
           (LinearAttentionParams("gated_delta_rule", 2, 2, 4, 4, True), 20, 2, "channels"),
           (LinearAttentionParams("gated_delta_rule", 2, 2, 4, 4, True), 24, 3, "v heads"),
           (LinearAttentionParams("chunked_delta", 2, 2, 4, 4, True), 24, 2, "attn_type")]
    found += [Case("LinearAttention", f"{p.attn_type} refused ({why}): k_heads={p.num_k_heads} "
                   f"v_heads={p.num_v_heads} dk={p.head_k_dim} dv={p.head_v_dim} qkv={c} gate_heads={g}",
                   _refused(p, c, g, why)) for p, c, g, why in bad]
    return found


def cases() -> list[Case]:
    return [Case("LinearAttention", f"short_conv channels={h} kernel={k} runs={runs} remove={r}",
                 _steps(h, k, runs, r))
            for h, k, runs, r in ((7, 3, (5, 1, 1, 1), 0), (16, 4, (9, 1, 1), 0), (5, 3, (1, 1, 1), 0),
                                  (6, 3, (8, 1, 3), 4))] + _delta_rule_cases()
