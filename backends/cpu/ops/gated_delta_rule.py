"""MNN's LinearAttention, attn_type "gated_delta_rule" (Qwen3.5 / Qwen3-Next's gated delta-net).

Inputs, per token: the mixed projection qkv [D = 2 * Hk * dk + Hv * dv] (q, k, v channels before
the convolution), the log-decay g [Hv] (the graph computes -exp(A_log) * softplus(a + dt_bias)),
beta [Hv] (sigmoid(b)), and the depthwise causal convolution's weight [D, 1, K]. Per token t:

    x = silu(sum_j w[:, j] * qkv[t - K + 1 + j])          causal conv1d over the tokens, then SiLU
    q, k, v = split(x); q, k = l2norm(q), l2norm(k)       (when use_qk_l2norm; eps 1e-6 in the root)
    q = q / sqrt(dk); each k head serves Hv / Hk v heads (v head h reads k head h // (Hv / Hk))
    S = S * exp(g)                                         per v head: S [dk, dv], from zeros
    S = S + outer(k, beta * (v - S^T k))                   the delta rule
    out = S^T q                                            [Hv, dv]

The state is the convolution's last K - 1 inputs and S. It must follow the KV meta as a KV cache
does (a new prompt starts from zeros, decode continues, a history cut back to a prefix -- a new
prompt sharing the system prompt, a rejected draft -- continues from that prefix), but S after a
prefix cannot be recovered from S after the whole history, and keeping S per token would cost
dk * dv floats a head per token. So `DeltaRuleHistory` keeps per token only the recurrence's inputs
(the qkv row, g and beta: a row like a KV cache's) plus S every `checkpoint_interval` tokens and S
before the last step of several tokens (a speculative step's verified drafts: rejecting some cuts
back into that step); a cut-back restores the last checkpoint at or before the cut and replays the
rows from there (at most an interval of tokens, with the same per-token arithmetic: S comes out as
it was at the cut). The convolution needs nothing more: its inputs are the rows themselves.
"""
from __future__ import annotations

import numpy as np

from mnnllm_core.backend_api import Execution, LinearAttentionParams

from .token_rows import TokenRows

L2_EPS = 1e-6


class DeltaRuleHistory(TokenRows):
    """Every cached token's row [qkv (D), g (H), beta (H)] in `rows` [capacity, width = D + 2H];
    S after the first `folded` tokens in `state` [H, dk, dv]; in `checkpoints`, S after each
    multiple of `checkpoint_interval` tokens and S at `step_start`, before the last step of
    several tokens."""

    checkpoint_interval = 64

    def __init__(self, width: int) -> None:
        super().__init__(width)
        self.state: np.ndarray | None = None
        self.folded = 0
        self.checkpoints: dict[int, np.ndarray] = {}
        self.step_start: int | None = None

    def rewind(self, past: int, state_shape: tuple[int, int, int]) -> int:
        """Make `state` S after some token count <= `past` (the last checkpoint when the history
        was cut back below what S has folded); that count, from which the rows must be replayed."""
        if self.state is None or self.state.shape != state_shape:
            self.clear()
            self.state = np.zeros(state_shape, np.float32)
        if self.folded <= past:
            return self.folded
        self.checkpoints = {at: s for at, s in self.checkpoints.items() if at <= past}
        if self.step_start is not None and self.step_start > past:
            self.step_start = None
        self.folded = max(self.checkpoints, default=0)
        self.state = self.checkpoints[self.folded].copy() if self.folded else np.zeros(state_shape, np.float32)
        return self.folded

    def reach(self, at: int, step_start: bool = False) -> None:
        """S now holds the first `at` tokens: keep a copy when `at` is a checkpoint, or (with
        `step_start`) the start of a step's new tokens (until the next such step)."""
        self.folded = at
        if step_start:
            if self.step_start is not None and self.step_start % self.checkpoint_interval:
                self.checkpoints.pop(self.step_start, None)
            self.step_start = at
            self.checkpoints[at] = self.state.copy()
        elif at % self.checkpoint_interval == 0:
            self.checkpoints[at] = self.state.copy()

    saveable = True  # the rows suffice: a restored history replays them from zeros

    def snapshot(self) -> tuple[np.ndarray, np.ndarray]:
        """The rows, as two halves of equal width (the prefix cache's keys and values; a zero
        column pads an odd width)."""
        half = (self.width + 1) // 2
        padded = np.zeros((self.length, 2 * half), np.float32)
        if self.length:
            padded[:, :self.width] = self.rows[:self.length]
        return padded[:, :half].copy(), padded[:, half:].copy()

    def restore(self, k: np.ndarray, v: np.ndarray) -> None:
        self.length = 0
        self.clear()
        self.add(np.concatenate([k, v], axis=1)[:, :self.width])

    def clear(self) -> None:
        """Forget S and its checkpoints (the next step replays every row from zeros)."""
        self.state, self.folded, self.checkpoints, self.step_start = None, 0, {}, None


def causal_conv_silu(inputs: np.ndarray, weight: np.ndarray, tokens: int) -> np.ndarray:
    """inputs [K - 1 + tokens, D] (the K - 1 before the first output's token first), weight [D, K]
    -> silu(conv) [tokens, D]."""
    taps = weight.shape[1]
    conv = np.zeros((tokens, weight.shape[0]), np.float32)
    for j in range(taps):
        conv += inputs[j:j + tokens] * weight[:, j]
    return conv / (1.0 + np.exp(-conv))


def l2_normalize(x: np.ndarray) -> np.ndarray:
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + L2_EPS)


def token_major(qkv: np.ndarray) -> np.ndarray:
    """qkv as [tokens, D]: MNN's [1, D, tokens] transposed, or a Linear's [tokens, D, 1, 1]."""
    return qkv[0].T if qkv.ndim == 3 else qkv.reshape(qkv.shape[0], -1)


def scan(q: np.ndarray, k: np.ndarray, v: np.ndarray, decay: np.ndarray, beta: np.ndarray, state: np.ndarray,
         out: np.ndarray, out_from: int) -> None:
    """The recurrence over a run of tokens: q, k [n, H, dk], v [n, H, dv], decay (exp(g)) and beta
    [n, H]; `state` [H, dk, dv] updated in place; out [n - out_from, H, dv]: S^T q of the tokens
    from `out_from` on. (memory "low": the numba kernel `kernels.delta_rule.delta_rule_scan`.)"""
    for t in range(k.shape[0]):
        state *= decay[t][:, None, None]
        predicted = np.matmul(k[t][:, None, :], state)[:, 0]  # S^T k, [H, dv]
        delta = beta[t][:, None] * (v[t] - predicted)
        state += k[t][:, :, None] * delta[:, None, :]
        if t >= out_from:
            out[t - out_from] = np.matmul(q[t][:, None, :], state)[:, 0]


class GatedDeltaRuleExecution(Execution):
    def __init__(self, backend, params: LinearAttentionParams, history: DeltaRuleHistory | None = None):
        super().__init__(backend)
        self.params = params
        width = 2 * params.num_k_heads * params.head_k_dim + (params.head_v_dim + 2) * params.num_v_heads
        self.history = history if history is not None else DeltaRuleHistory(width)
        self.scan = scan
        if backend.low_memory():
            backend.runtime.load_kernels("delta_rule")
            from ..kernels.delta_rule import delta_rule_scan
            self.scan = delta_rule_scan

    def on_execute(self, inputs, outputs) -> None:
        p = self.params
        heads, key_dim = p.num_v_heads, p.num_k_heads * p.head_k_dim
        qkv = token_major(inputs[0].storage)
        tokens, channels = qkv.shape
        gate = inputs[1].storage.reshape(tokens, heads)
        beta = inputs[2].storage.reshape(tokens, heads)
        weight = inputs[3].storage.reshape(channels, -1)  # [D, K]
        taps = weight.shape[1]

        history = self.history
        past = history.begin_step(self.backend.kv_meta)
        start = history.rewind(past, (heads, p.head_k_dim, p.head_v_dim))
        history.add(np.concatenate([qkv, gate, beta], axis=1))
        end = past + tokens
        rows = history.rows[:end]

        first = start - (taps - 1)  # the convolution's inputs reach K - 1 tokens back (zeros before 0)
        conv_in = np.zeros((taps - 1 + end - start, channels), np.float32)
        conv_in[max(0, -first):] = rows[max(0, first):end, :channels]
        x = causal_conv_silu(conv_in, weight, end - start)

        n = end - start
        q = x[:, :key_dim].reshape(n, p.num_k_heads, p.head_k_dim)
        k = x[:, key_dim:2 * key_dim].reshape(n, p.num_k_heads, p.head_k_dim)
        v = np.ascontiguousarray(x[:, 2 * key_dim:]).reshape(n, heads, p.head_v_dim)
        if p.use_qk_l2norm:
            q, k = l2_normalize(q), l2_normalize(k)
        q = q * np.float32(1.0 / np.sqrt(p.head_k_dim))
        group = heads // p.num_k_heads
        q, k = np.repeat(q, group, axis=1), np.repeat(k, group, axis=1)
        decay = np.exp(rows[start:end, channels:channels + heads])
        betas = np.ascontiguousarray(rows[start:end, channels + heads:])
        out = outputs[0].storage.reshape(tokens, heads, p.head_v_dim)

        # the run in pieces between the points where S is kept: checkpoints, and this step's start
        interval = history.checkpoint_interval
        stops = set(range(start - start % interval + interval, end, interval)) | {end}
        if tokens > 1:
            stops.add(past)
        new = past - start  # the run's first new token: outputs from there on
        at = 0
        for stop in sorted(point - start for point in stops):
            if stop > at:
                emit = max(at, new)
                self.scan(q[at:stop], k[at:stop], v[at:stop], decay[at:stop], betas[at:stop], history.state,
                          out[emit - new:max(emit, stop) - new], emit - at)
            history.reach(start + stop, step_start=tokens > 1 and stop == new)
            at = stop

    def on_clone(self, backend, op):
        return GatedDeltaRuleExecution(backend, self.params, self.history)
