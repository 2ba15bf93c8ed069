"""Fused RoPE on packed q and k: grouped kv heads, odd head dims, a cut head dim (the rest passes
through unchanged), and Qwen3's per-head q/k norms (RMS, and LayerNorm with a beta)."""
from __future__ import annotations

import numpy as np

from ...core.op import Op
from ...core.op_params import QKNorm, RoPEParams
from ..references import norm_reference, rope_reference, rope_tables
from .case import Case, Trial, randn, single

TOKENS = (1, 3, 7, 37)
# (heads, kv_heads, head_dim, cut): SmolLM2's 9/3/64, equal heads, odd dims, cut dims (even and odd)
LAYOUTS = [(9, 3, 64, 0), (2, 2, 8, 0), (4, 1, 6, 0), (5, 5, 10, 0), (4, 2, 16, 8), (3, 1, 14, 7)]


def rope_op(heads: int, kv_heads: int, dim: int, cut: int = 0, q_norm=None, k_norm=None) -> Op:
    rope_dim = (cut if 0 < cut <= dim else dim) // 2 * 2
    return Op("RoPE", "rope", param=RoPEParams(heads, kv_heads, dim, rope_dim, q_norm, k_norm))


def _rotate(tokens: int, heads: int, kv_heads: int, dim: int, cut: int, norms: str | None = None):
    def build(rng) -> Trial:
        rope_dim = (cut or dim) // 2 * 2
        q, k = randn(rng, tokens, heads * dim, 1, 1) * 3, randn(rng, tokens, kv_heads * dim, 1, 1) * 3
        cos, sin = rope_tables(np.arange(5, 5 + tokens), rope_dim)
        q_norm = k_norm = None
        if norms == "rms":
            q_norm, k_norm = QKNorm(randn(rng, dim), None, 1e-6, True), QKNorm(randn(rng, dim), None, 1e-6, True)
        elif norms == "layer":
            q_norm, k_norm = QKNorm(randn(rng, dim), randn(rng, dim), 1e-6, False), QKNorm(randn(rng, dim), None,
                                                                                            1e-6, False)
        q_in, k_in = q.reshape(tokens, heads, dim), k.reshape(tokens, kv_heads, dim)
        if q_norm is not None:
            q_in = norm_reference(q_in, q_norm.gamma, q_norm.beta, q_norm.epsilon, q_norm.rms)
            k_in = norm_reference(k_in, k_norm.gamma, k_norm.beta, k_norm.epsilon, k_norm.rms)
        expected = [rope_reference(q_in, cos, sin, rope_dim).reshape(q.shape),
                    rope_reference(k_in, cos, sin, rope_dim).reshape(k.shape)]
        checks = []
        if rope_dim < dim and norms is None:
            def passed_through(outputs, module, runtime):
                kept = outputs[0].reshape(tokens, heads, dim)[..., rope_dim:]
                same = np.array_equal(kept, q.reshape(tokens, heads, dim)[..., rope_dim:])
                return None if same else "the dims after the cut must pass through unchanged"
            checks.append(passed_through)
        return single(rope_op(heads, kv_heads, dim, cut, q_norm, k_norm), [q, k, cos, sin], expected, outputs=2,
                      checks=checks)
    return build


def cases() -> list[Case]:
    found = [Case("RoPE", f"heads={h}/{kv} dim={d}{f' cut={c}' if c else ''} tokens={t}", _rotate(t, h, kv, d, c))
             for h, kv, d, c in LAYOUTS for t in TOKENS]
    found += [Case("RoPE", f"qwen3 rms q/k norm tokens={t}", _rotate(t, 4, 2, 32, 0, "rms")) for t in TOKENS]
    found += [Case("RoPE", f"layer q/k norm with beta cut=6 tokens={t}", _rotate(t, 3, 3, 10, 6, "layer"))
              for t in TOKENS]
    return found
