"""Fused RoPE on q and k (rotate-half form), with the optional per-head q/k norm (Qwen3)."""
from __future__ import annotations

import numpy as np

from mnnllm_core.backend_api import Execution, QKNorm, Refused, RoPEParams

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

    def _apply(self, x, heads: int, norm: QKNorm | None, cos, sin, out) -> None:
        seq, head_dim = cos.shape[0], self.params.head_dim
        h = x.reshape(seq, heads, head_dim)
        if norm is not None:
            h = normalize(h, norm.gamma, norm.beta, norm.epsilon, norm.rms)
        out.reshape(seq, heads, head_dim)[...] = rotate(h, cos, sin, self.params.rope_dim)

    def on_execute(self, inputs, outputs) -> None:
        p = self.params
        q, k = inputs[0].storage, inputs[1].storage
        seq, _ = p.rows(q.size, inputs[2].size)
        cos = inputs[2].storage.reshape(seq, -1)[:, :p.rope_dim]
        sin = inputs[3].storage.reshape(seq, -1)[:, :p.rope_dim]
        self._apply(q, p.num_head, p.q_norm, cos, sin, outputs[0].storage)
        self._apply(k, p.kv_num_head, p.k_norm, cos, sin, outputs[1].storage)

    def on_clone(self, backend, op):
        return RoPEExecution(backend, self.params)


def create_rope(backend, inputs, outputs, op):
    if op.param is None:
        return Refused("the RoPE table has no head layout")
    return RoPEExecution(backend, op.param)


CREATORS = {"RoPE": create_rope}
