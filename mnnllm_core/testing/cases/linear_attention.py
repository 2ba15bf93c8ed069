"""MNN's LinearAttention, attn_type short_conv (LFM2): y = C * causal_conv(B * x) over the tokens,
driven through several steps by the KV meta: a prefill, decode steps that continue the
convolution's state, a prompt shorter than the kernel, tokens removed from the history."""
from __future__ import annotations

import numpy as np

from ...core.op import Op
from ...core.op_params import LinearAttentionParams
from ..harness import Const
from . import Case, Step, Trial, randn


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


def cases() -> list[Case]:
    return [Case("LinearAttention", f"short_conv channels={h} kernel={k} runs={runs} remove={r}",
                 _steps(h, k, runs, r))
            for h, k, runs, r in ((7, 3, (5, 1, 1, 1), 0), (16, 4, (9, 1, 1), 0), (5, 3, (1, 1, 1), 0),
                                  (6, 3, (8, 1, 3), 4))]
