"""Fused RoPE on q and k (rotate-half form), with the optional per-head q/k norm (Qwen3)."""
from __future__ import annotations

import numpy as np

from mnnllm_core.backend_api import HeadNormTables, Refused, RoPEParams, rope_norm_tables

from ..device import ProgramExecution


class RoPEExecution(ProgramExecution):
    def __init__(self, backend, params: RoPEParams, q_norm: HeadNormTables, k_norm: HeadNormTables):
        super().__init__(backend)
        self.params, self.q_norm, self.k_norm = params, q_norm, k_norm

    def on_resize(self, inputs, outputs) -> None:
        p, q, k = self.params, self.q_norm, self.k_norm
        seq, cs_stride = p.rows(inputs[0].size, inputs[2].size)
        self.program = self.backend.program("rope.cl", "rope").bind(
            (seq, p.num_head + p.kv_num_head), None,
            *(t.storage for t in inputs[:4]), outputs[0].storage, outputs[1].storage,
            q.gamma, q.beta, k.gamma, k.beta,
            *(np.int32(v) for v in (p.num_head, p.kv_num_head, p.head_dim, p.rope_dim, cs_stride)),
            np.float32(q.epsilon), np.float32(k.epsilon), np.int32(q.flags), np.int32(k.flags))

    def on_clone(self, backend, op):
        return RoPEExecution(backend, self.params, self.q_norm, self.k_norm)


def create_rope(backend, inputs, outputs, op):
    p = op.param
    if p is None:
        return Refused("the RoPE table has no head layout")
    return RoPEExecution(backend, p, *rope_norm_tables(backend.allocator.constant, p))


CREATORS = {"RoPE": create_rope}
