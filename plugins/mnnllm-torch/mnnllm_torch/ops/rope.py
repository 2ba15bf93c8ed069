"""Fused RoPE on q and k, rotate-half form: of each head's leading `rope_dim` values the first
half a and second half b become (a*cos - b*sin, b*cos + a*sin), with cos/sin rows laid out
[first half | second half]; the rest of the head passes through. Views are bound at resize, so
a run is a few in-place torch calls (capturable in a CUDA graph). Per-head q/k norms (Qwen3)
stay on cpu."""
from __future__ import annotations

import torch

from mnnllm_core.backend_api import FLOAT32, Execution, Refused, RoPEParams


class RoPEExecution(Execution):
    def __init__(self, backend, params: RoPEParams):
        super().__init__(backend)
        self.params = params
        self.pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.cos = self.sin = None
        self.half = 0

    def on_resize(self, inputs, outputs) -> None:
        p = self.params
        seq, stride = p.rows(inputs[0].size, inputs[2].size)
        self.half = p.rope_dim // 2
        self.cos = inputs[2].storage.view(seq, stride)[:, None, :p.rope_dim]
        self.sin = inputs[3].storage.view(seq, stride)[:, None, :p.rope_dim]
        self.pairs = [(src.storage.view(seq, heads, p.head_dim), dst.storage.view(seq, heads, p.head_dim))
                      for src, dst, heads in ((inputs[0], outputs[0], p.num_head),
                                              (inputs[1], outputs[1], p.kv_num_head))]

    def on_execute(self, inputs, outputs) -> None:
        half, rope_dim, cos, sin = self.half, self.params.rope_dim, self.cos, self.sin
        for x, out in self.pairs:
            rotated = torch.cat((-x[..., half:rope_dim], x[..., :half]), dim=-1)
            out[..., :rope_dim].copy_(x[..., :rope_dim] * cos + rotated * sin)
            if rope_dim < x.shape[-1]:
                out[..., rope_dim:].copy_(x[..., rope_dim:])

    def on_clone(self, backend, op):
        return RoPEExecution(backend, self.params)


def create_rope(backend, inputs, outputs, op):
    p = op.param
    if p is None:
        return Refused("the RoPE table has no head layout")
    if p.q_norm is not None or p.k_norm is not None:
        return Refused("per-head q/k norms stay on cpu")
    if any(t.dtype != FLOAT32 for t in (*inputs[:4], *outputs[:2])):
        return Refused("float32 only")
    return RoPEExecution(backend, p)


CREATORS = {"RoPE": create_rope}
