"""Fused RoPE on q and k (rotate-half form), with the optional per-head q/k norm (Qwen3);
with memory "low" one numba kernel per input (`kernels/rope.py`)."""
from __future__ import annotations

import numpy as np

from mnnllm_core.core.backend import Execution
from mnnllm_core.core.op_params import NormParams, RoPEParams, rope_params

from .norm import normalize


def rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, rope_dim: int) -> np.ndarray:
    """x [seq, heads, head_dim]; cos/sin [seq, rope_dim] laid out [even half | odd half]."""
    half = rope_dim // 2
    out = x.copy()
    a, b = x[..., :half], x[..., half:rope_dim]
    c, s = cos[:, None, :], sin[:, None, :]
    out[..., :half] = a * c[..., :half] - b * s[..., :half]
    out[..., half:rope_dim] = b * c[..., half:rope_dim] + a * s[..., half:rope_dim]
    return out


class RoPEExecution(Execution):
    def __init__(self, backend, params: RoPEParams):
        super().__init__(backend)
        self.params = params

    def _apply(self, x, heads: int, norm: NormParams | None, cos, sin, out) -> None:
        seq, head_dim = cos.shape[0], self.params.head_dim
        h = x.reshape(seq, heads, head_dim)
        if norm is not None:
            h = normalize(h, norm.gamma, norm.beta, norm.epsilon, norm.rms)
        out.reshape(seq, heads, head_dim)[...] = rotate(h, cos, sin, self.params.rope_dim)

    def on_execute(self, inputs, outputs) -> None:
        p = self.params
        q, k = inputs[0].storage, inputs[1].storage
        if self.backend.low_memory() and q.dtype == np.float32:
            self._execute_kernel(q, k, inputs[2].storage, inputs[3].storage, outputs)
            return
        seq = q.size // (p.num_head * p.head_dim)
        cos = inputs[2].storage.reshape(seq, -1)[:, :p.rope_dim]
        sin = inputs[3].storage.reshape(seq, -1)[:, :p.rope_dim]
        self._apply(q, p.num_head, p.q_norm, cos, sin, outputs[0].storage)
        self._apply(k, p.kv_num_head, p.k_norm, cos, sin, outputs[1].storage)

    def _execute_kernel(self, q, k, cos, sin, outputs) -> None:
        from ..kernels.rope import rope_heads
        p = self.params
        seq = q.size // (p.num_head * p.head_dim)
        cos, sin = cos.reshape(seq, -1), sin.reshape(seq, -1)
        empty = np.zeros(0, np.float32)
        for x, heads, norm, out in ((q, p.num_head, p.q_norm, outputs[0]), (k, p.kv_num_head, p.k_norm, outputs[1])):
            gamma = norm.gamma if norm is not None and norm.gamma is not None else empty
            beta = norm.beta if norm is not None and norm.beta is not None else empty
            rope_heads(x.reshape(-1), heads, p.head_dim, p.rope_dim, cos, sin, gamma, beta,
                       norm.epsilon if norm is not None else 0.0, norm.rms if norm is not None else True,
                       norm is not None, out.storage.reshape(-1))

    def on_clone(self, backend, op):
        return RoPEExecution(backend, self.params)


def create_rope(backend, inputs, outputs, op):
    params = rope_params(op)
    return None if params is None else RoPEExecution(backend, params)


CREATORS = {"RoPE": create_rope}
