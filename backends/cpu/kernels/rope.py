"""Fused RoPE (rotate-half) on q and k, with the optional per-head norm, one pass per head."""
from __future__ import annotations

from . import jit
from .norm import normalize_rows


@jit()
def _rope_heads(x, heads, head_dim, rope_dim, cos, sin, gamma, beta, eps, rms, norm, out):
    """x, out flat float32 [tokens * heads * head_dim]; cos/sin [tokens, >= rope_dim] with the
    [even half | odd half] layout of the reference `ops/rope.rotate`; norm: normalize each head
    first (gamma/beta of head_dim values, empty when absent)."""
    half = rope_dim // 2
    tokens = x.shape[0] // (heads * head_dim)
    for t in range(tokens):
        c = cos[t]
        s = sin[t]
        for h in range(heads):
            start = (t * heads + h) * head_dim
            head = out[start:start + head_dim]
            if norm:
                normalize_rows(x[start:start + head_dim], head_dim, gamma, beta, eps, rms, head)
            else:  # a loop, not a slice assignment: that compiles numba's shape-error formatting (seconds)
                for i in range(head_dim):
                    head[i] = x[start + i]
            for i in range(half):
                a = head[i]
                b = head[half + i]
                head[i] = a * c[i] - b * s[i]
                head[half + i] = b * c[half + i] + a * s[half + i]


@jit()
def rope_qk(q, k, heads, kv_heads, head_dim, rope_dim, cos, sin, q_norm, q_gamma, q_beta, q_eps, q_rms, k_norm,
            k_gamma, k_beta, k_eps, k_rms, q_out, k_out):
    """q and k in one call (each with its own optional norm)."""
    _rope_heads(q, heads, head_dim, rope_dim, cos, sin, q_gamma, q_beta, q_eps, q_rms, q_norm, q_out)
    _rope_heads(k, kv_heads, head_dim, rope_dim, cos, sin, k_gamma, k_beta, k_eps, k_rms, k_norm, k_out)
