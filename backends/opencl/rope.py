"""Fused RoPE on q and k (rotate-half form), with the optional per-head q/k norm (Qwen3)."""
from __future__ import annotations

import numpy as np

from mnnllm_core.core.backend import Execution
from mnnllm_core.core.op_params import NormParams, rope_params

from .norm import constant_or_placeholder


class HeadNorm:
    """A RoPEParam q_norm/k_norm table on the device: gamma, beta, eps and kernel flags."""

    def __init__(self, backend, norm: NormParams | None):
        self.gamma = constant_or_placeholder(backend, None if norm is None else norm.gamma)[0]
        self.beta = constant_or_placeholder(backend, None if norm is None else norm.beta)[0]
        self.eps = norm.epsilon if norm is not None else 0.0
        self.flags = (1 | (2 if norm.rms else 0) | (4 if norm.beta is not None else 0)) if norm is not None else 0


class RoPEExecution(Execution):
    def __init__(self, backend, num_head: int, kv_num_head: int, head_dim: int, rope_dim: int,
                 q_norm: HeadNorm, k_norm: HeadNorm):
        super().__init__(backend)
        self.num_head, self.kv_num_head, self.head_dim, self.rope_dim = num_head, kv_num_head, head_dim, rope_dim
        self.q_norm, self.k_norm = q_norm, k_norm
        self.kernel = None

    def on_resize(self, inputs, outputs) -> None:
        seq = inputs[0].size // (self.num_head * self.head_dim)
        cs_stride = inputs[2].size // seq
        q, k = self.q_norm, self.k_norm
        self.kernel = self.backend.program("rope.cl", "rope").bind(
            (seq, self.num_head + self.kv_num_head), None,
            *(t.storage for t in inputs[:4]), outputs[0].storage, outputs[1].storage,
            q.gamma, q.beta, k.gamma, k.beta,
            *(np.int32(v) for v in (self.num_head, self.kv_num_head, self.head_dim, self.rope_dim, cs_stride)),
            np.float32(q.eps), np.float32(k.eps), np.int32(q.flags), np.int32(k.flags))

    def on_execute(self, inputs, outputs) -> None:
        self.kernel(self.backend.queue)

    def on_clone(self, backend, op):
        return RoPEExecution(backend, self.num_head, self.kv_num_head, self.head_dim, self.rope_dim,
                             self.q_norm, self.k_norm)


def create_rope(backend, inputs, outputs, op):
    p = rope_params(op)
    if p is None:
        return None
    return RoPEExecution(backend, p.num_head, p.kv_num_head, p.head_dim, p.rope_dim,
                         HeadNorm(backend, p.q_norm), HeadNorm(backend, p.k_norm))


CREATORS = {"RoPE": create_rope}
