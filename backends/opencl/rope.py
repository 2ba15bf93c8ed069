"""Fused RoPE on q and k (rotate-half form), with the optional per-head q/k norm (Qwen3)."""
from __future__ import annotations

import numpy as np

from mnnllm_core.core.backend import Execution

from .norm import constant_or_placeholder


class HeadNorm:
    """A RoPEParam q_norm/k_norm table on the device: gamma, beta, eps and kernel flags."""

    def __init__(self, backend, table):
        present = table is not None and table.gamma is not None and len(table.gamma) > 0
        gamma = np.asarray(table.gamma, np.float32) if present else None
        beta = None
        if present and table.beta is not None and len(table.beta) == len(gamma):
            beta = np.asarray(table.beta, np.float32)
        self.gamma = constant_or_placeholder(backend, gamma)[0]
        self.beta = constant_or_placeholder(backend, beta)[0]
        self.eps = float(table.epsilon or 0.0) if present else 0.0
        self.flags = (1 | (2 if table.useRmsnorm else 0) | (4 if beta is not None else 0)) if present else 0


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
    p = op.param
    if p is None or not p.numHead or not p.kvNumHead or not p.headDim:
        return None
    head_dim, cut = int(p.headDim), int(p.ropeCutHeadDim or 0)
    rope_dim = (cut if 0 < cut <= head_dim else head_dim) // 2 * 2
    return RoPEExecution(backend, int(p.numHead), int(p.kvNumHead), head_dim, rope_dim,
                         HeadNorm(backend, getattr(p, "qNorm", None)), HeadNorm(backend, getattr(p, "kNorm", None)))


CREATORS = {"RoPE": create_rope}
