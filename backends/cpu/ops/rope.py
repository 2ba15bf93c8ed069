"""Fused RoPE on q and k (rotate-half form), with the optional per-head q/k norm (Qwen3)."""
from __future__ import annotations

import numpy as np

from mnnllm_core.core.backend import Execution

from .norm import normalize


def _inline_norm(table):
    """(gamma, beta, eps, rms) of a RoPEParam q_norm/k_norm LayerNorm table, or None."""
    if table is None or table.gamma is None or len(table.gamma) == 0:
        return None
    gamma = np.asarray(table.gamma, dtype=np.float32)
    beta = np.asarray(table.beta, dtype=np.float32) if table.beta is not None and len(table.beta) == len(gamma) else None
    return gamma, beta, float(table.epsilon or 0.0), bool(table.useRmsnorm)


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
    def __init__(self, backend, num_head: int, kv_num_head: int, head_dim: int, cut: int, q_norm, k_norm):
        super().__init__(backend)
        self.num_head, self.kv_num_head, self.head_dim = num_head, kv_num_head, head_dim
        rope_dim = cut if 0 < cut <= head_dim else head_dim
        self.rope_dim = (rope_dim // 2) * 2
        self.q_norm, self.k_norm = q_norm, k_norm

    def _apply(self, x, heads, norm, cos, sin, out):
        seq = cos.shape[0]
        h = x.reshape(seq, heads, self.head_dim)
        if norm is not None:
            h = normalize(h, norm[0], norm[1], norm[2], norm[3])
        out.reshape(seq, heads, self.head_dim)[...] = rotate(h, cos, sin, self.rope_dim)

    def on_execute(self, inputs, outputs) -> None:
        q, k = inputs[0].storage, inputs[1].storage
        seq = q.size // (self.num_head * self.head_dim)
        cos = inputs[2].storage.reshape(seq, -1)[:, :self.rope_dim]
        sin = inputs[3].storage.reshape(seq, -1)[:, :self.rope_dim]
        self._apply(q, self.num_head, self.q_norm, cos, sin, outputs[0].storage)
        self._apply(k, self.kv_num_head, self.k_norm, cos, sin, outputs[1].storage)

    def on_clone(self, backend, op):
        twin = RoPEExecution(backend, self.num_head, self.kv_num_head, self.head_dim, self.rope_dim,
                             self.q_norm, self.k_norm)
        return twin


def create_rope(backend, inputs, outputs, op):
    p = op.param
    if p is None or not p.numHead or not p.kvNumHead or not p.headDim:
        return None
    return RoPEExecution(backend, int(p.numHead), int(p.kvNumHead), int(p.headDim),
                         int(p.ropeCutHeadDim or 0), _inline_norm(getattr(p, "qNorm", None)),
                         _inline_norm(getattr(p, "kNorm", None)))


CREATORS = {"RoPE": create_rope}
