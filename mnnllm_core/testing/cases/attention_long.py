"""Attention at depth: decode steps over a cache of 2048 to 4096 keys, prefilled in chunks (a
kernel that splits the keys across work-items and merges the splits must cover every one exactly
once, at every split boundary), a long causal prefill and a chunked one that ends past 3000 keys, grouped and odd
heads. Queries are scaled up (SHARPEN) so each softmax is peaked rather than a flat average a
dropped or doubled key would hardly move. `cases(tol)` also serves the quantized KV formats
(tests/test_kv_formats_gpu.py runs them with a looser tolerance under attention_mode 10)."""
from __future__ import annotations

import numpy as np

from ..references import attention_reference
from .attention import SCALAR, _chunked_prefill, attention_op, feeds, packed, steps_trial
from .case import Case, Step, Trial, randn

SHARPEN = 4.0
DECODE = [(9, 3, 64, 2048, 3), (8, 2, 128, 4093, 2), (6, 1, 12, 2051, 2), (4, 4, 16, 3000, 2)]
PROMPT_CHUNK = 1024  # the decode cases' prompts go in chunks (a kernel with a scores buffer needs no more)
PREFILL = [(4, 2, 64, (2048,)), (6, 2, 16, (1500, 1533))]  # (heads, kv_heads, dim, chunks)


def _long_decode(heads: int, kv_heads: int, dim: int, prompt: int, count: int):
    def build(rng) -> Trial:
        total = prompt + count
        q = randn(rng, total, heads, dim) * np.float32(SHARPEN)
        k, v = randn(rng, total, kv_heads, dim), randn(rng, total, kv_heads, dim)
        steps = [Step(feeds(q[a:b], k[a:b], v[a:b], SCALAR))
                 for a, b in ((a, min(prompt, a + PROMPT_CHUNK)) for a in range(0, prompt, PROMPT_CHUNK))]
        for t in range(prompt, total):
            expected = attention_reference(q[t:t + 1], k[:t + 1], v[:t + 1], causal_offset=t)
            steps.append(Step(feeds(q[t:t + 1], k[t:t + 1], v[t:t + 1], SCALAR), [packed(expected)]))
        return steps_trial(attention_op(heads, kv_heads, dim), steps)
    return build


def cases(tol: float | None = None, tag: str = "") -> list[Case]:
    """The long cases; `tol` and `tag` (a suffix of each name) for a run under another KV format."""
    tags = frozenset({"head_dim%4"})
    found = [Case("Attention", f"long decode heads={h}/{kv} dim={d} past {p} keys{tag}", _long_decode(h, kv, d, p, n),
                  device_tol=tol, tags=tags if d % 4 else frozenset())
             for h, kv, d, p, n in DECODE]
    found += [Case("Attention", f"long causal prefill heads={h}/{kv} dim={d} chunks={list(c)}{tag}",
                   _chunked_prefill(h, kv, d, c, SHARPEN, check_meta=False), device_tol=tol, tags=tags if d % 4 else frozenset())
              for h, kv, d, c in PREFILL]
    return found


