"""Fused Attention as the export has it (packed q/k/v [seq, heads*dim, 1, 1]), driven through
several steps by the KV meta: causal prefill, decode against the cache (past its first
capacity), tokens removed from the cache, runs of them kept (KV meta reserve, overlapping
moves too), full float and int masks, a token tree's mask over the cache (and its path kept
after), a sliding-window mask over the cache (prefill and decode), attnScale, no cache (keys
outnumbering queries), unpacked heads, packed q/k with an unpacked v (Gemma 4's v_norm output)
at its attn_scale 1.0, sinks (gpt-oss: a fifth input, one logit per head in every row's softmax;
causal and sliding-window, prefill and decode, odd and grouped heads) and a mask with too few
rows (a typed error)."""
from __future__ import annotations

import numpy as np

from ...core.op import Op
from ...core.op_params import AttentionParams
from ...errors import UnsupportedError
from ..harness import Const
from ..references import attention_reference
from .case import Case, Step, Trial, randn

TOKENS = (1, 3, 7, 37)
PREFILL = [(9, 3, 64), (4, 4, 8), (6, 1, 5), (6, 1, 12), (3, 1, 5), (4, 2, 6)]  # (heads, kv_heads, head_dim)
SCALAR = np.zeros((1, 1, 1, 1), np.float32)


def attention_op(heads: int, kv_heads: int, dim: int, kv_cache: bool = True, scale: float = 0.0,
                 packed: bool = True) -> Op:
    params = AttentionParams(kv_cache, scale, (heads, kv_heads, dim) if packed else None, output_c4=True)
    return Op("Attention", "attn", param=params)


def packed(x: np.ndarray) -> np.ndarray:
    return x.reshape(x.shape[0], -1, 1, 1)


def feeds(q, k, v, mask) -> list[np.ndarray]:
    return [packed(q), packed(k), packed(v), mask]


def steps_trial(op: Op, steps: list[Step], **trial) -> Trial:
    return Trial(op, list(steps[0].feeds), steps, **trial)


def _tags(dim: int) -> frozenset[str]:
    return frozenset() if dim % 4 == 0 else frozenset({"head_dim%4"})


def _prefill(tokens: int, heads: int, kv_heads: int, dim: int):
    def build(rng) -> Trial:
        q, k, v = randn(rng, tokens, heads, dim), randn(rng, tokens, kv_heads, dim), randn(rng, tokens, kv_heads, dim)
        expected = attention_reference(q, k, v).reshape(tokens, heads * dim, 1, 1)
        return steps_trial(attention_op(heads, kv_heads, dim), [Step(feeds(q, k, v, SCALAR), [expected])])
    return build


def _chunked_prefill(heads: int, kv_heads: int, dim: int, chunks: tuple[int, ...], sharpen: float = 1.0,
                     check_meta: bool = True):
    """A prompt in chunks of causal prefill, each attending to the cache the earlier ones left
    (long enough for a backend's blocks of queries to end mid-chunk); queries scaled by `sharpen`
    (attention_long.py), the KV meta's count checked after the steps with `check_meta`."""
    def build(rng) -> Trial:
        total = sum(chunks)
        q = randn(rng, total, heads, dim) * np.float32(sharpen)
        k, v = randn(rng, total, kv_heads, dim), randn(rng, total, kv_heads, dim)
        steps, start = [], 0
        for size in chunks:
            end = start + size
            expected = attention_reference(q[start:end], k[:end], v[:end], causal_offset=start)
            steps.append(Step(feeds(q[start:end], k[start:end], v[start:end], SCALAR), [packed(expected)]))
            start = end
        return steps_trial(attention_op(heads, kv_heads, dim), steps, resizes=len(set(chunks)),
                           checks=[_meta_previous(total)] if check_meta else ())
    return build


def _meta_previous(expected: int):
    def check(outputs, module, runtime):
        got = runtime.kv_meta.previous
        return None if got == expected else f"the KV meta holds {got} tokens, not {expected}"
    return check


def _decode(heads: int, kv_heads: int, dim: int, prompt: int, count: int):
    def build(rng) -> Trial:
        total = prompt + count
        q, k, v = randn(rng, total, heads, dim), randn(rng, total, kv_heads, dim), randn(rng, total, kv_heads, dim)
        steps = [Step(feeds(q[:prompt], k[:prompt], v[:prompt], SCALAR))]
        for t in range(prompt, total):
            expected = attention_reference(q[t:t + 1], k[:t + 1], v[:t + 1], causal_offset=t)
            steps.append(Step(feeds(q[t:t + 1], k[t:t + 1], v[t:t + 1], SCALAR), [packed(expected)]))
        return steps_trial(attention_op(heads, kv_heads, dim), steps, resizes=2,  # prefill, then one decode shape
                           checks=[_meta_previous(total)])
    return build


def _long_cache(heads: int, kv_heads: int, dim: int, cached: int, queries: int):
    """`queries` tokens of causal prefill after `cached` ones (long context: a backend's tiles
    over keys, its online softmax across them), checked on the last step only."""
    def build(rng) -> Trial:
        total = cached + queries
        q, k, v = randn(rng, total, heads, dim), randn(rng, total, kv_heads, dim), randn(rng, total, kv_heads, dim)
        expected = attention_reference(q[cached:], k, v, causal_offset=cached)
        steps = [Step(feeds(q[:cached], k[:cached], v[:cached], SCALAR)),
                 Step(feeds(q[cached:], k[cached:], v[cached:], SCALAR), [packed(expected)])]
        return steps_trial(attention_op(heads, kv_heads, dim), steps, resizes=2, checks=[_meta_previous(total)])
    return build


def _remove(rng) -> Trial:
    heads, kv_heads, dim = 4, 2, 8
    q, k, v = randn(rng, 9, heads, dim), randn(rng, 9, kv_heads, dim), randn(rng, 9, kv_heads, dim)
    # drop the last 3 cached tokens, then add 2 new ones (positions 4 and 5)
    keys, values = np.concatenate([k[:4], k[7:9]]), np.concatenate([v[:4], v[7:9]])
    expected = attention_reference(q[7:9], keys, values, causal_offset=4)
    steps = [Step(feeds(q[:7], k[:7], v[:7], SCALAR)), Step(feeds(q[7:9], k[7:9], v[7:9], SCALAR), [packed(expected)],
                                                           remove=3)]
    return steps_trial(attention_op(heads, kv_heads, dim), steps, checks=[_meta_previous(6)])


def _reserve(remove: int, reserve: tuple[tuple[int, int], ...]):
    """Cache 7 tokens; the next step removes the last `remove` but keeps the `reserve` runs of
    them (moved down after the prefix), then adds 2 tokens."""
    def build(rng) -> Trial:
        heads, kv_heads, dim = 4, 2, 8
        q, k, v = randn(rng, 9, heads, dim), randn(rng, 9, kv_heads, dim), randn(rng, 9, kv_heads, dim)
        start = 7 - remove
        rows = list(range(start)) + [start + b + i for b, size in reserve for i in range(size)] + [7, 8]
        kept = len(rows) - 2
        expected = attention_reference(q[7:9], k[rows], v[rows], causal_offset=kept)
        steps = [Step(feeds(q[:7], k[:7], v[:7], SCALAR)),
                 Step(feeds(q[7:9], k[7:9], v[7:9], SCALAR), [packed(expected)], remove=remove, reserve=reserve)]
        return steps_trial(attention_op(heads, kv_heads, dim), steps, checks=[_meta_previous(kept + 2)])
    return build


TREE = [-1, 0, 0, 1, 1, 2, 3]  # a token tree: each node's parent (-1: the root, after the cache)


def tree_bias(parents: list[int], past: int) -> np.ndarray:
    """[nodes, past + nodes] float64: 0 where a node sees a key (every cached one, itself and
    its ancestors), -inf elsewhere."""
    bias = np.full((len(parents), past + len(parents)), -np.inf)
    bias[:, :past] = 0.0
    for node in range(len(parents)):
        at = node
        while at >= 0:
            bias[node, past + at] = 0.0
            at = parents[at]
    return bias


def _tree_mask(prompt: int, path: list[int] | None = None, dim: int = 16):
    """Cache `prompt` tokens, then a token tree (TREE) in one step under a [1, 1, nodes, nodes]
    mask (MNN's layout: the cache columns implied, on the left); with `path`, a last step after
    keeping only the prompt and the path's rows (reserve) attends to exactly them."""
    def build(rng) -> Trial:
        heads, kv_heads, nodes = 4, 2, len(TREE)
        total = prompt + nodes + 1
        q, k, v = randn(rng, total, heads, dim), randn(rng, total, kv_heads, dim), randn(rng, total, kv_heads, dim)
        bias = tree_bias(TREE, prompt)
        mask = np.where(np.isinf(bias[:, prompt:]), np.finfo(np.float32).min, 0.0).astype(np.float32)
        end = prompt + nodes
        expected = attention_reference(q[prompt:end], k[:end], v[:end], bias=bias, causal_offset=None)
        steps = [Step(feeds(q[:prompt], k[:prompt], v[:prompt], SCALAR)),
                 Step(feeds(q[prompt:end], k[prompt:end], v[prompt:end], mask.reshape(1, 1, nodes, nodes)),
                      [packed(expected)])]
        if path is None:
            return steps_trial(attention_op(heads, kv_heads, dim), steps, checks=[_meta_previous(end)])
        rows = list(range(prompt)) + [prompt + node for node in path] + [end]
        runs = tuple((node, 1) for node in path)
        last = attention_reference(q[end:], k[rows], v[rows], causal_offset=len(rows) - 1)
        steps.append(Step(feeds(q[end:], k[end:], v[end:], SCALAR), [packed(last)], remove=nodes, reserve=runs))
        return steps_trial(attention_op(heads, kv_heads, dim), steps, checks=[_meta_previous(len(rows))])
    return build


def _float_mask(tokens: int, heads: int = 4, kv_heads: int = 2, dim: int = 8, floor: bool = True):
    def build(rng) -> Trial:
        q, k, v = randn(rng, tokens, heads, dim), randn(rng, tokens, kv_heads, dim), randn(rng, tokens, kv_heads, dim)
        bias = (rng.standard_normal((tokens, tokens)) * 2).astype(np.float32)
        if floor:
            bias[0, 1:] = np.float32(np.finfo(np.float32).min)
        expected = attention_reference(q, k, v, bias=bias.astype(np.float64), causal_offset=None)
        step = Step(feeds(q, k, v, bias.reshape(1, 1, tokens, tokens)), [packed(expected)])
        return steps_trial(attention_op(heads, kv_heads, dim), [step])
    return build


def _int_mask(heads: int, kv_heads: int, tokens: int, dim: int = 8):
    def build(rng) -> Trial:
        q, k, v = randn(rng, tokens, heads, dim), randn(rng, tokens, kv_heads, dim), randn(rng, tokens, kv_heads, dim)
        allowed = (rng.random((tokens, tokens)) < 0.6).astype(np.int32)
        np.fill_diagonal(allowed, 1)
        expected = attention_reference(q, k, v, bias=np.where(allowed == 0, -np.inf, 0.0), causal_offset=None)
        step = Step(feeds(q, k, v, allowed.reshape(1, 1, tokens, tokens)), [packed(expected)])
        return steps_trial(attention_op(heads, kv_heads, dim), [step])
    return build


def _scale(rng) -> Trial:
    heads, kv_heads, dim, tokens = 4, 2, 16, 7
    q, k, v = randn(rng, tokens, heads, dim), randn(rng, tokens, kv_heads, dim), randn(rng, tokens, kv_heads, dim)
    expected = attention_reference(q, k, v, scale=0.5)
    step = Step(feeds(q, k, v, SCALAR), [packed(expected)])
    return steps_trial(attention_op(heads, kv_heads, dim, scale=0.5), [step])


def _unpacked_values(heads: int, kv_heads: int, dim: int, prompt: int, count: int):
    """Gemma 4: q and k come packed from RoPE, v [1, seq, kv_heads, dim] from its weightless norm;
    scores scaled by 1.0 (the config's attn_scale), a prefill then decode steps."""
    def build(rng) -> Trial:
        total = prompt + count
        q, k, v = randn(rng, total, heads, dim), randn(rng, total, kv_heads, dim), randn(rng, total, kv_heads, dim)

        def step_feeds(start: int, end: int) -> list[np.ndarray]:
            return [packed(q[start:end]), packed(k[start:end]), v[None, start:end].copy(), SCALAR]
        first = attention_reference(q[:prompt], k[:prompt], v[:prompt], scale=1.0)
        steps = [Step(step_feeds(0, prompt), [packed(first)])]
        for t in range(prompt, total):
            expected = attention_reference(q[t:t + 1], k[:t + 1], v[:t + 1], scale=1.0, causal_offset=t)
            steps.append(Step(step_feeds(t, t + 1), [packed(expected)]))
        return steps_trial(attention_op(heads, kv_heads, dim, scale=1.0), steps, resizes=2)
    return build


def _no_cache(heads: int, kv_heads: int, dim: int, runs: tuple[int, ...]):
    def build(rng) -> Trial:
        steps = []
        for tokens in runs:  # no cache: each run sees only its own keys
            q, k, v = (randn(rng, tokens, h, dim) for h in (heads, kv_heads, kv_heads))
            steps.append(Step(feeds(q, k, v, SCALAR), [packed(attention_reference(q, k, v))]))
        return steps_trial(attention_op(heads, kv_heads, dim, kv_cache=False), steps)
    return build


def _keys_outnumber_queries(rng) -> Trial:
    heads, kv_heads, dim, queries, keys = 4, 2, 8, 2, 5
    q, k, v = randn(rng, queries, heads, dim), randn(rng, keys, kv_heads, dim), randn(rng, keys, kv_heads, dim)
    mask = (rng.standard_normal((queries, keys)) * 2).astype(np.float32)
    expected = attention_reference(q, k, v, bias=mask.astype(np.float64), causal_offset=None)
    step = Step(feeds(q, k, v, mask.reshape(1, 1, queries, keys)), [packed(expected)])
    return steps_trial(attention_op(heads, kv_heads, dim, kv_cache=False), [step])


def _unpacked(rng) -> Trial:
    heads, kv_heads, dim, tokens = 4, 2, 8, 7
    q, k, v = (randn(rng, 1, tokens, h, dim) for h in (heads, kv_heads, kv_heads))
    expected = attention_reference(q[0], k[0], v[0]).reshape(1, tokens, heads * dim)
    op = Op("Attention", "attn", param=AttentionParams())
    return steps_trial(op, [Step([q, k, v, SCALAR], [expected])])


def window_bias(past: int, seq: int, window: int) -> np.ndarray:
    """[seq, past + seq] float64: 0 where query i (position past + i) sees key j, causally and
    fewer than `window` positions back; -inf elsewhere."""
    bias = np.full((seq, past + seq), -np.inf)
    for i in range(seq):
        position = past + i
        bias[i, max(0, position - window + 1):position + 1] = 0.0
    return bias


def _sliding_window(heads: int, kv_heads: int, dim: int, prompt: int, count: int, window: int):
    """A windowed float mask over the whole KV length (MNN's "mix" plane): prefill, then decode
    against the cache, each step's mask one row [1, 1, 1, kv] (blocked = float32's lowest)."""
    def build(rng) -> Trial:
        total = prompt + count
        q, k, v = randn(rng, total, heads, dim), randn(rng, total, kv_heads, dim), randn(rng, total, kv_heads, dim)
        steps = []
        for start, end in [(0, prompt)] + [(t, t + 1) for t in range(prompt, total)]:
            bias = window_bias(start, end - start, window)
            mask = np.where(np.isinf(bias), np.finfo(np.float32).min, 0.0).astype(np.float32)
            expected = attention_reference(q[start:end], k[:end], v[:end], bias=bias, causal_offset=None)
            steps.append(Step(feeds(q[start:end], k[start:end], v[start:end], mask.reshape(1, 1, end - start, end)),
                              [packed(expected)]))
        return steps_trial(attention_op(heads, kv_heads, dim), steps, checks=[_meta_previous(total)])
    return build


def _sinks(heads: int, kv_heads: int, dim: int, prompt: int, count: int, window: int | None):
    """Sinks as a constant fifth input: a prefill of `prompt` tokens, then `count` decode steps,
    under the causal scalar mask or (with `window`) a windowed float mask over the cache."""
    def build(rng) -> Trial:
        total = prompt + count
        q, k, v = randn(rng, total, heads, dim), randn(rng, total, kv_heads, dim), randn(rng, total, kv_heads, dim)
        sinks = randn(rng, heads) * 2
        steps = []
        for start, end in [(0, prompt)] + [(t, t + 1) for t in range(prompt, total)]:
            if window is None:
                mask, bias, offset = SCALAR, None, start
            else:
                bias, offset = window_bias(start, end - start, window), None
                mask = np.where(np.isinf(bias), np.finfo(np.float32).min, 0.0).astype(np.float32)
                mask = mask.reshape(1, 1, end - start, end)
            expected = attention_reference(q[start:end], k[:end], v[:end], bias=bias, causal_offset=offset,
                                           sinks=sinks)
            steps.append(Step(feeds(q[start:end], k[start:end], v[start:end], mask), [packed(expected)]))
        return Trial(attention_op(heads, kv_heads, dim), [*steps[0].feeds, Const(sinks)], steps,
                     checks=[_meta_previous(total)])
    return build


def _sinks_per_kv_head(rng) -> Trial:
    heads, kv_heads, dim, tokens = 4, 2, 8, 3
    q, k, v = randn(rng, tokens, heads, dim), randn(rng, tokens, kv_heads, dim), randn(rng, tokens, kv_heads, dim)
    trial = Trial(attention_op(heads, kv_heads, dim), [*feeds(q, k, v, SCALAR), Const(randn(rng, kv_heads))],
                  [Step(feeds(q, k, v, SCALAR))])
    trial.error = (UnsupportedError, "sinks")
    return trial


def _short_mask(rng) -> Trial:
    heads, kv_heads, dim, tokens = 4, 2, 8, 7
    q, k, v = randn(rng, tokens, heads, dim), randn(rng, tokens, kv_heads, dim), randn(rng, tokens, kv_heads, dim)
    trial = steps_trial(attention_op(heads, kv_heads, dim), [Step(feeds(q, k, v, np.zeros((1, 1, 1, tokens),
                                                                                           np.float32)))])
    trial.error = (UnsupportedError, "attention_mask")
    return trial


def cases() -> list[Case]:
    found = [Case("Attention", f"causal prefill heads={h}/{kv} dim={d} tokens={t}", _prefill(t, h, kv, d),
                  tags=_tags(d)) for h, kv, d in PREFILL for t in TOKENS]
    found += [Case("Attention", f"decode 4 steps on a 7-token cache heads={h}/{kv}", _decode(h, kv, 16, 7, 4))
              for h, kv in ((9, 3), (2, 2))]
    found.append(Case("Attention", "decode past 256 cached tokens", _decode(9, 3, 64, 250, 10)))
    found.append(Case("Attention", "decode past 4096 cached tokens", _decode(9, 3, 64, 4096, 2)))
    found.append(Case("Attention", "prefill of 37 tokens after 4059 cached heads=4/2 dim=64",
                      _long_cache(4, 2, 64, 4059, 37)))
    found += [Case("Attention", f"causal prefill in chunks {c} heads={h}/{kv} dim={d}", _chunked_prefill(h, kv, d, c),
                   tags=_tags(d)) for h, kv, d, c in ((4, 2, 16, (70, 150)), (9, 3, 64, (130, 67)))]
    found.append(Case("Attention", "meta remove truncates the cache before appending", _remove))
    found += [Case("Attention", f"meta reserve keeps runs {list(r)} of the {n} removed tokens", _reserve(n, r))
              for n, r in ((5, ((1, 1), (3, 2))), (5, ((1, 3),)), (4, ((0, 4),)))]
    found.append(Case("Attention", "token tree mask over the cache", _tree_mask(6)))
    found.append(Case("Attention", "token tree mask, then its path kept by reserve", _tree_mask(6, [0, 1, 3])))
    found.append(Case("Attention", "token tree mask, then its path kept by reserve dim=64",
                      _tree_mask(5, [0, 2, 5], dim=64)))
    found += [Case("Attention", f"full float mask tokens={t}", _float_mask(t)) for t in (3, 7)]
    found.append(Case("Attention", "full float mask without a floor tokens=7", _float_mask(7, floor=False)))
    found += [Case("Attention", f"int mask blocks where 0 heads={h}/{kv} tokens={t}", _int_mask(h, kv, t),
                   dtype="int32") for h, kv, t in ((2, 1, 5), (4, 2, 7))]
    found += [Case("Attention", f"sliding window {w} over the cache heads={h}/{kv} prompt={p} decode={n}",
                   _sliding_window(h, kv, 16, p, n, w)) for h, kv, p, n, w in ((4, 2, 9, 4, 4), (3, 1, 5, 3, 16))]
    # head dims 64 and 128: the sizes of real models (backends may have kernels just for them)
    found.append(Case("Attention", "decode 4 steps on a 7-token cache heads=4/2 dim=128", _decode(4, 2, 128, 7, 4)))
    found.append(Case("Attention", "full float mask tokens=7 dim=64", _float_mask(7, dim=64)))
    found.append(Case("Attention", "int mask blocks where 0 heads=4/2 tokens=7 dim=128", _int_mask(4, 2, 7, 128),
                      dtype="int32"))
    found.append(Case("Attention", "sliding window 4 over the cache heads=4/2 prompt=9 decode=4 dim=64",
                      _sliding_window(4, 2, 64, 9, 4, 4)))
    found.append(Case("Attention", "no cache heads=4/2 dim=64 runs=(5, 3, 1)", _no_cache(4, 2, 64, (5, 3, 1))))
    found.append(Case("Attention", "attnScale 0.5", _scale))
    found += [Case("Attention", f"packed q/k, v [1, seq, {kv}, {d}], scale 1.0 heads={h} prompt={p} decode={n}",
                   _unpacked_values(h, kv, d, p, n), tags=_tags(d))
              for h, kv, d, p, n in ((4, 2, 16, 9, 3), (3, 1, 5, 4, 2))]
    found += [Case("Attention", f"no cache heads={h}/{kv} dim={d} runs={runs}", _no_cache(h, kv, d, runs))
              for h, kv, d, runs in ((4, 2, 8, (5, 3)), (4, 2, 16, (5, 3, 1)))]
    found.append(Case("Attention", "no cache, keys outnumber queries", _keys_outnumber_queries))
    found.append(Case("Attention", "unpacked [1, seq, heads, dim] inputs", _unpacked))
    found += [Case("Attention", f"sinks, {'causal' if w is None else f'sliding window {w}'} heads={h}/{kv} dim={d} "
                                f"prompt={p} decode={n}", _sinks(h, kv, d, p, n, w), tags=_tags(d) | {"sinks"})
              for h, kv, d, p, n, w in ((9, 3, 64, 7, 3, None), (3, 1, 16, 37, 2, None), (5, 5, 12, 6, 2, None),
                                        (6, 2, 16, 9, 4, 4), (3, 1, 8, 5, 3, 16), (7, 7, 5, 4, 2, 3))]
    found.append(Case("Attention", "sinks, one per kv head instead of per head, are an UnsupportedError",
                      _sinks_per_kv_head, tags=frozenset({"sinks"})))
    found.append(Case("Attention", "a mask with fewer rows than queries is an UnsupportedError", _short_mask))
    return found
