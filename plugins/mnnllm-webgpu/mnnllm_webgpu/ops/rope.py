"""Fused RoPE on q and k (cut dim): rope_pairs.wgsl, one invocation per rotated pair; with per-head
q/k norm tables rope.wgsl, one invocation per head (the norm's sums first)."""
from __future__ import annotations

from mnnllm_core.backend_api import FLOAT32, HeadNormTables, Refused, RoPEParams, rope_norm_tables

from ..device import Program, StepsExecution, fold, pack_params


class RoPEExecution(StepsExecution):
    def __init__(self, backend, params: RoPEParams, q_norm: HeadNormTables, k_norm: HeadNormTables):
        super().__init__(backend)
        self.params, self.q_norm, self.k_norm = params, q_norm, k_norm

    def on_resize(self, inputs, outputs) -> None:
        p, q, k = self.params, self.q_norm, self.k_norm
        seq, cs_stride = p.rows(inputs[0].size, inputs[2].size)
        heads = seq * (p.num_head + p.kv_num_head)
        buffers = [*(t.storage for t in inputs[:4]), outputs[0].storage, outputs[1].storage]
        if q.flags or k.flags:  # a per-head norm first: one invocation per head
            shader, count = "rope", heads
            groups = (-(-count // 64), 1, 1)
            buffers += [q.gamma, q.beta, k.gamma, k.beta]
            params = pack_params("6iffii", seq, p.num_head, p.kv_num_head, p.head_dim, p.rope_dim, cs_stride,
                                 q.epsilon, k.epsilon, q.flags, k.flags)
        else:  # one per rotated pair or copied element (a 128-token prefill's RoPE ~63 -> ~35 ms of CPU)
            count = heads * (p.head_dim - p.rope_dim // 2)
            groups, row = fold(-(-count // 64), 64)
            shader, params = "rope_pairs", pack_params("7i", seq, p.num_head, p.kv_num_head, p.head_dim, p.rope_dim,
                                                       cs_stride, row)
        self.steps = [Program(self.backend.device, shader, buffers, params, groups if count else (0, 0, 0))]

    def on_clone(self, backend, op):
        return RoPEExecution(backend, self.params, self.q_norm, self.k_norm)


def create_rope(backend, inputs, outputs, op):
    p = op.param
    if p is None or len(inputs) < 4:
        return Refused("the RoPE table has no head layout")
    tensors = (*inputs[:4], *outputs[:2])
    if any(t.dtype != FLOAT32 for t in tensors):
        return Refused("float32 only")
    if not backend.fits(*tensors):
        return Refused("a tensor exceeds max_storage_buffer_binding_size")
    if any(n is not None and len(n.gamma) != p.head_dim for n in (p.q_norm, p.k_norm)):
        return Refused("a q/k norm of another length than head_dim")
    return RoPEExecution(backend, p, *rope_norm_tables(backend.allocator.constant, p))


CREATORS = {"RoPE": create_rope}
