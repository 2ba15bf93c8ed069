"""Fused RoPE on q and k (rotate-half form), with the optional per-head q/k norm (Qwen3);
with memory "low" one numba kernel per input (`kernels/rope.py`)."""
from __future__ import annotations

from functools import partial

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
    """q and k rotated (each head's pairs read before either is written; the numpy path rotates
    a copy), so the rotated q may take q's storage: a long step holds one [rows, q] buffer less."""

    output_may_share = 0

    def __init__(self, backend, params: RoPEParams):
        super().__init__(backend)
        self.params = params
        self.kernel_call = None  # the numba kernel with its arguments, bound at resize on the low-memory path

    def _apply(self, x, heads: int, norm: QKNorm | None, cos, sin, out) -> None:
        seq, head_dim = cos.shape[0], self.params.head_dim
        h = x.reshape(seq, heads, head_dim)
        if norm is not None:
            h = normalize(h, norm.gamma, norm.beta, norm.epsilon, norm.rms)
        out.reshape(seq, heads, head_dim)[...] = rotate(h, cos, sin, self.params.rope_dim)

    def on_resize(self, inputs, outputs) -> None:
        self.kernel_call = None
        if not (self.backend.low_memory() and inputs[0].dtype == np.float32):
            return
        from ..kernels.rope import rope_qk
        p = self.params
        q, k, cos, sin = (t.storage for t in inputs[:4])  # storages stay put until the next resize
        seq, _ = p.rows(q.size, cos.size)
        self.kernel_call = partial(rope_qk, q.reshape(-1), k.reshape(-1), p.num_head, p.kv_num_head, p.head_dim,
                                   p.rope_dim, cos.reshape(seq, -1), sin.reshape(seq, -1), *_norm_args(p.q_norm),
                                   *_norm_args(p.k_norm), outputs[0].storage.reshape(-1),
                                   outputs[1].storage.reshape(-1))

    def on_execute(self, inputs, outputs) -> None:
        if self.kernel_call is not None:
            self.kernel_call()
            return
        p = self.params
        q, k = inputs[0].storage, inputs[1].storage
        seq, _ = p.rows(q.size, inputs[2].size)
        cos = inputs[2].storage.reshape(seq, -1)[:, :p.rope_dim]
        sin = inputs[3].storage.reshape(seq, -1)[:, :p.rope_dim]
        self._apply(q, p.num_head, p.q_norm, cos, sin, outputs[0].storage)
        self._apply(k, p.kv_num_head, p.k_norm, cos, sin, outputs[1].storage)

    def replay_steps(self, inputs, outputs) -> list:
        return super().replay_steps(inputs, outputs) if self.kernel_call is None else [self.kernel_call]

    def on_clone(self, backend, op):
        return RoPEExecution(backend, self.params)


_EMPTY = np.zeros(0, np.float32)


def _norm_args(norm: QKNorm | None) -> tuple:
    """(present, gamma, beta, epsilon, rms) of a per-head norm for the kernel; empty arrays when absent."""
    if norm is None:
        return False, _EMPTY, _EMPTY, 0.0, True
    return (True, _EMPTY if norm.gamma is None else norm.gamma, _EMPTY if norm.beta is None else norm.beta,
            float(norm.epsilon), bool(norm.rms))


def create_rope(backend, inputs, outputs, op):
    if op.param is None:
        return Refused("the RoPE table has no head layout")
    return RoPEExecution(backend, op.param)


CREATORS = {"RoPE": create_rope}
