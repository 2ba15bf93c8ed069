"""Fused Attention with its own KV cache, driven by the KV meta the LLM sets each step.

q [seq, heads*dim, 1, 1] (packed, as MNN's transformer-fused export emits) or [1, seq, heads, dim];
k and v likewise with kv heads. Grouped-query heads share kv heads. A scalar mask means
"causal"; a full float mask is added to the scores; an int mask blocks where it is 0.
An optional fifth input, the sinks (one learned logit per head, gpt-oss), joins each row's
softmax denominator and is then dropped, as in MNN's CPUAttention.
With memory "low" and the causal mask, numba kernels attend (`kernels/attention.py`), over a
cache that holds keys transposed. Below fp32 (`attention_mode`, the `kv_fp16` hint) the
cache is a StoredKVCache (`kv_storage.py`): a decode step reads its rows as stored (the replay
runs it as one kernel call, `append_attend_stored`), a prefill as float32 one layer at a time.
A prefill (the numpy path) attends in blocks of queries, spread over the runtime's threads
with BLAS on one thread in each (`host_threads.py`: many small BLAS calls each waiting for
BLAS's threads took minutes on a loaded machine); a block that sees more than
TILED_FROM keys goes over them in tiles of KEY_TILE with an online softmax (a running max and
sum per query row, the context rescaled as the max grows), so its scores never span every key.
The tiles' sums round differently from one softmax over the row, so shorter prompts, MNN's
exact greedy tokens among them, keep the one-pass softmax.
"""
from __future__ import annotations

from functools import partial

import numpy as np

from mnnllm_core.backend_api import AttentionParams, Execution, KVCache, Refused, UnsupportedError, attention_mask

from ..kv_storage import StoredKVCache, grown_capacity

FEW_TOKENS = 8  # up to this many new tokens attend on the calling thread (memory "low")
PANEL = 16  # the cache grows in whole panels of the low-memory GEMM
SCORES_BUDGET = 1 << 24  # attention scores (float32) held at once: a prefill attends in blocks of queries
# causal blocks of queries on the numpy path: each block's scores stay in cache and skip the keys
# past its last query (half the work of a prefill, whose scores are a triangle)
CAUSAL_QUERIES = 128
TILED_FROM = 2048  # a block of queries seeing more keys than this attends in key tiles (numpy path)
KEY_TILE = 2048  # keys per tile of that online softmax (tiles of 512 took 2x one pass's time at 4,096 keys)
NO_SINKS = np.zeros(0, np.float32)  # the kernels' sinks argument without a fifth input


def query_blocks(seq: int, heads: int, total: int) -> range:
    """Starts of the blocks of query tokens whose scores fit SCORES_BUDGET (at least 16 tokens
    a block): memory grows linearly with the prompt, not with its square."""
    return range(0, seq, max(16, SCORES_BUDGET // max(1, heads * total)))


class HostKVCache(KVCache):
    """Keys and values in host memory, [kv_heads, capacity, dim] each (keys [kv_heads, dim,
    capacity] when `keys_transposed`); capacity in whole panels, grown by an eighth (`grown_capacity`)."""

    def __init__(self, keys_transposed: bool = False, zeros_for=None) -> None:
        super().__init__()
        self.k: np.ndarray | None = None
        self.v: np.ndarray | None = None
        self.keys_transposed = keys_transposed
        # a layer's bytes -> its allocator: np.zeros, or a file-backed mapping (the runtime's KVMemory)
        self.zeros_for = zeros_for or in_memory
        self._heads = self._dim = 0

    def capacity_for(self, need: int) -> int:
        return grown_capacity(need, self.capacity)

    def grow(self, capacity: int) -> None:
        heads, dim = self._heads, self._dim
        zeros = self.zeros_for(2 * 4 * heads * capacity * dim)
        grown_v = zeros((heads, capacity, dim), np.float32)
        grown_k = zeros((heads, dim, capacity) if self.keys_transposed else grown_v.shape, np.float32)
        if self.v is not None:
            grown_v[:, :self.length] = self.v[:, :self.length]
            if self.keys_transposed:
                grown_k[:, :, :self.length] = self.k[:, :, :self.length]
            else:
                grown_k[:, :self.length] = self.k[:, :self.length]
        self.k, self.v = grown_k, grown_v

    def write(self, k: np.ndarray, v: np.ndarray, seq: int) -> None:
        """k, v: [seq, kv_heads, dim]."""
        end = self.length + seq
        if self.keys_transposed:
            self.k[:, :, self.length:end] = k.transpose(1, 2, 0)
        else:
            self.k[:, self.length:end] = k.transpose(1, 0, 2)
        self.v[:, self.length:end] = v.transpose(1, 0, 2)

    reservable = True

    def move(self, src: int, dst: int, count: int) -> None:
        """numpy copies overlapping slices as if through a temporary."""
        if self.keys_transposed:
            self.k[:, :, dst:dst + count] = self.k[:, :, src:src + count]
        else:
            self.k[:, dst:dst + count] = self.k[:, src:src + count]
        self.v[:, dst:dst + count] = self.v[:, src:src + count]

    def add(self, k: np.ndarray, v: np.ndarray) -> None:
        self.set_rows(k.shape[1], k.shape[2])
        self.append(k, v, k.shape[0])

    def set_rows(self, heads: int, dim: int) -> None:
        """The kv heads and head size of a token's row (what `grow` allocates for)."""
        self._heads, self._dim = heads, dim

    saveable = True

    def snapshot(self) -> tuple[np.ndarray, np.ndarray]:
        n = self.length
        if self.v is None:
            empty = np.zeros((0, self._heads, self._dim), np.float32)
            return empty, empty.copy()
        keys = self.k[:, :, :n].transpose(2, 0, 1) if self.keys_transposed else self.k[:, :n].transpose(1, 0, 2)
        return np.ascontiguousarray(keys), np.ascontiguousarray(self.v[:, :n].transpose(1, 0, 2))

    def restore(self, k: np.ndarray, v: np.ndarray) -> None:
        self.length = 0
        self.add(k, v)

    def dense(self) -> tuple[np.ndarray, np.ndarray]:
        """The keys and values as float32 arrays of the full capacity (StoredKVCache's reading)."""
        return self.k, self.v


def softmax_last(x: np.ndarray, sinks: np.ndarray | None = None) -> np.ndarray:
    """Softmax over the last axis; `sinks` (broadcast against x's rows, one logit a row) count in
    each row's denominator without a column of their own."""
    top = x.max(axis=-1, keepdims=True)
    if sinks is not None:
        top = np.maximum(top, sinks)
    x = x - top
    np.exp(x, out=x)
    total = x.sum(axis=-1, keepdims=True)
    if sinks is not None:
        total += np.exp(sinks - top)
    x /= total
    return x


class AttentionExecution(Execution):
    def __init__(self, backend, params: AttentionParams, cache: HostKVCache | None = None):
        super().__init__(backend)
        self.params = params
        self.cache = cache if cache is not None else new_cache(backend, params.kv_cache and backend.low_memory())
        self.kernel_call = None  # (kernel, q, out, scale) bound at resize for the key-transposed cache
        self.replay_kernel = False  # whether a replay runs this step as `append_attend` (set at resize)
        self.replay_stored = False  # ... as `append_attend_stored` (one token over a StoredKVCache)
        self.past = np.zeros(1, np.int64)  # the step's past, written by before_run for the replayed kernel
        self.bound = None  # the cache's keys the replay's step is bound to

    def _layout(self, inputs) -> tuple[int, int, int, int]:
        layout = self.params.layout(inputs[0].shape, inputs[1].shape)
        if layout is None:
            raise UnsupportedError("packed attention inputs need the head configuration", field="heads")
        return layout

    @staticmethod
    def _sinks(inputs, num_head: int) -> np.ndarray | None:
        """The fifth input as float32 [heads], or None without one."""
        if len(inputs) < 5:
            return None
        if inputs[4].size != num_head:
            raise UnsupportedError(f"Attention: {inputs[4].size} sinks for {num_head} heads", field="sinks")
        return np.ascontiguousarray(inputs[4].storage.reshape(num_head), dtype=np.float32)

    def on_resize(self, inputs, outputs) -> None:
        self.kernel_call = None
        self.replay_kernel = self.replay_stored = False
        seq, num_head, kv_heads, dim = self._layout(inputs)
        q = inputs[0].storage.reshape(seq, num_head, dim)
        mask = inputs[3] if len(inputs) > 3 else None
        causal = attention_mask(mask, seq).kind == "causal"
        runtime = self.backend.runtime
        if self.cache.keys_transposed and dim % PANEL == 0 and q.flags.c_contiguous:
            from ..kernels.attention import attend, attend_parallel
            kernel = attend
            if seq > FEW_TOKENS and runtime.thread_num > 1:  # a prompt's tasks over the threads
                kernel = partial(attend_parallel, threads=runtime.thread_num)
            self.kernel_call = (kernel, q, outputs[0].storage.reshape(seq, num_head, dim),
                                np.float32(self.params.scale_for(dim)))
            self.replay_kernel = (kernel is attend and self.params.kv_cache and isinstance(self.cache, HostKVCache)
                                  and causal)
            self.cache.set_rows(kv_heads, dim)
        cache = self.cache
        if (seq == 1 and causal and self.params.kv_cache and isinstance(cache, StoredKVCache) and cache.decodable()
                and q.flags.c_contiguous and runtime.low_memory_kernels()):
            self.replay_stored = True  # `_decode_stored`'s step: the replay runs it as `append_attend_stored`
            cache.set_rows(kv_heads, dim)

    # -- replay: the KV bookkeeping before the step, the append and the kernel as one bound call --
    def before_run(self) -> bool:
        if not (self.replay_kernel or self.replay_stored):
            return False  # the replay runs on_execute, which keeps the books itself
        self.past[0] = self.cache.begin_step(self.backend.kv_meta)
        moved = self.cache.extend(self.kernel_call[1].shape[0] if self.replay_kernel else 1)
        return moved or self.bound is not self._bound_array()  # grown here or by a clone sharing the cache

    def _bound_array(self) -> np.ndarray | None:
        """The cache array whose replacement (the cache grew) makes the recorded step stale."""
        return self.cache.keys.codes if self.replay_stored else self.cache.k

    def replay_steps(self, inputs, outputs) -> list:
        if not (self.replay_kernel or self.replay_stored):
            return super().replay_steps(inputs, outputs)
        seq, num_head, kv_heads, dim = self._layout(inputs)
        q = inputs[0].storage.reshape(seq, num_head, dim)
        out = outputs[0].storage.reshape(seq, num_head, dim)
        k, v = (t.storage.reshape(seq, kv_heads, dim) for t in inputs[1:3])
        scale = np.float32(self.params.scale_for(dim))
        sinks = self._sinks(inputs, num_head)
        sinks = NO_SINKS if sinks is None else sinks
        threads = self.backend.runtime.thread_num
        self.bound = self._bound_array()
        if self.replay_stored:
            from ..kernels.decode_attention import append_attend_stored
            return [partial(append_attend_stored, q, k, v, *self.cache.stored(), self.past, scale, sinks, out,
                            threads)]
        from ..kernels.attention import append_attend, append_decode, append_decode_deep
        if seq == 1:  # split over keys at depth, as on_execute's `decode_attend_deep`
            kernel = append_decode_deep if self._splits_keys(self.cache.k, threads) else append_decode
            return [partial(kernel, q, k, v, self.cache.k, self.cache.v, self.past, scale, sinks, out, threads)]
        return [partial(append_attend, q, k, v, self.cache.k, self.cache.v, self.past, scale, sinks, out)]

    def _splits_keys(self, keys_t: np.ndarray, threads: int) -> bool:
        """Whether a one-token step over this cache (keys_t [kv_heads, dim, capacity]) takes the
        kernels that split the keys at depth, loading them (compiled on a machine's first need)."""
        from ..kernels.attention import splits_keys
        if not splits_keys(keys_t.shape[2], threads):
            return False
        self.backend.runtime.load_kernels("deep_decode")
        return True

    def on_execute(self, inputs, outputs) -> None:
        seq, num_head, kv_heads, dim = self._layout(inputs)
        q = inputs[0].storage.reshape(seq, num_head, dim)
        k = inputs[1].storage.reshape(-1, kv_heads, dim)
        v = inputs[2].storage.reshape(-1, kv_heads, dim)
        group = num_head // kv_heads
        mask = inputs[3] if len(inputs) > 3 else None
        kind = attention_mask(mask, seq)
        sinks = self._sinks(inputs, num_head)
        if self.params.kv_cache:
            past = self.cache.begin_step(self.backend.kv_meta)
            self.cache.add(k, v)
            length = self.cache.length
            if seq == 1 and kind.kind == "causal" and self._decode_stored(q, outputs, sinks):
                return
            stored_k, stored_v = self.cache.dense()
            if self.cache.keys_transposed:
                if self.kernel_call is not None and kind.kind == "causal":
                    kernel, queries, out, scale = self.kernel_call
                    sinks = NO_SINKS if sinks is None else sinks
                    if seq == 1:  # split over keys at depth (the replay's `append_decode_deep`)
                        from ..kernels.attention import decode_attend, decode_attend_deep
                        threads = self.backend.runtime.thread_num
                        one_token = decode_attend_deep if self._splits_keys(stored_k, threads) else decode_attend
                        one_token(queries, stored_k, stored_v, past, scale, sinks, out, threads)
                    else:
                        kernel(queries, stored_k, stored_v, past, scale, sinks, out)
                    return
                keys = stored_k[:, :, :length].transpose(0, 2, 1)
            else:
                keys = stored_k[:, :length]
            values = stored_v[:, :length]
        else:
            past = 0
            keys, values = k.transpose(1, 0, 2), v.transpose(1, 0, 2)
        total = keys.shape[1]
        queries = q.reshape(seq, kv_heads, group, dim).transpose(1, 2, 0, 3)  # [kvh, group, seq, dim]
        keys_t = keys.transpose(0, 2, 1)[:, None]
        scale = np.float32(self.params.scale_for(dim))
        out = outputs[0].storage.reshape(seq, kv_heads, group, dim)
        sink_rows = None if sinks is None else sinks.reshape(kv_heads, group, 1, 1)
        causal = kind.kind == "causal"
        step = query_blocks(seq, num_head, total).step
        if causal:
            step = min(step, CAUSAL_QUERIES)

        def attend_block(t0: int) -> None:
            t1 = min(seq, t0 + step)
            visible = min(total, past + t1) if causal else total  # keys the block's last query sees
            if visible > TILED_FROM:
                masking = partial(self._mask, mask=mask, kind=kind.kind, past=past, seq=seq, total=total, t0=t0, t1=t1)
                context = attend_key_tiles(queries[:, :, t0:t1], keys_t, values, visible, scale, sink_rows, masking)
                out[t0:t1] = context.transpose(2, 0, 1, 3)
                return
            scores = np.matmul(queries[:, :, t0:t1], keys_t[..., :visible])
            scores *= scale
            self._mask(scores, mask, kind.kind, past, seq, visible, t0, t1)
            probs = softmax_last(scores, sink_rows)
            out[t0:t1] = np.matmul(probs, values[:, None, :visible]).transpose(2, 0, 1, 3)  # from [kvh, group, t, dim]

        # the blocks across the runtime's threads, the last (causal: the costliest) first
        self.backend.runtime.host_threads.run(attend_block, reversed(range(0, seq, step)))

    def _decode_stored(self, q: np.ndarray, outputs, sinks: np.ndarray | None) -> bool:
        """One token over a StoredKVCache of float32/int8 rows, read as stored and split over keys
        across the threads (`kernels/decode_attention.py`); False where that does not apply."""
        cache = self.cache
        if not (isinstance(cache, StoredKVCache) and cache.decodable() and self.backend.runtime.low_memory_kernels()):
            return False
        from ..kernels.decode_attention import attend_stored, splits_for
        threads = self.backend.runtime.thread_num
        out = outputs[0].storage.reshape(q.shape[1], q.shape[2])
        attend_stored(np.ascontiguousarray(q[0], dtype=np.float32), *cache.stored(), cache.length,
                      np.float32(self.params.scale_for(q.shape[2])), NO_SINKS if sinks is None else sinks, out,
                      splits_for(cache.length, threads))
        return True

    @staticmethod
    def _mask(scores: np.ndarray, mask, kind: str, past: int, seq: int, total: int, t0: int, t1: int,
              k0: int = 0, k1: int | None = None) -> None:
        """Mask the scores of query tokens t0..t1 of the step's seq against keys k0..k1 (default:
        all `total`; a mask's columns are the last of the `total` keys)."""
        k1 = total if k1 is None else k1
        if kind == "causal":
            if seq > 1 and k1 - 1 > past + t0:  # else the block's first query sees every key
                allowed = np.arange(k0, k1)[None, :] <= (past + np.arange(t0, t1))[:, None]
                scores[..., ~allowed] = -np.inf
            return
        m = mask.storage.reshape(mask.shape[-2], mask.shape[-1])[-seq:][t0:t1]
        if kind == "int":
            m = np.where(m == 0, -np.inf, 0.0).astype(np.float32)
        start = total - m.shape[-1]  # the key of the mask's first column
        if k0 == 0 and k1 == total and start >= 0:
            scores[..., start:] += m
        elif max(k0, start) < k1:
            first = max(k0, start)
            scores[..., first - k0:] += m[:, first - start:k1 - start]

    def on_clone(self, backend, op):
        return AttentionExecution(backend, self.params, self.cache)


def attend_key_tiles(queries: np.ndarray, keys_t: np.ndarray, values: np.ndarray, visible: int, scale: np.float32,
                     sink_rows: np.ndarray | None, masking) -> np.ndarray:
    """softmax(queries @ keys * scale, masked) @ values over the first `visible` keys, KEY_TILE
    keys at a time with a running max and sum per row (a sink starts a row as a key of its own
    logit and no value). queries [kvh, group, t, dim], keys_t [kvh, 1, dim, keys], values [kvh,
    keys, dim]; `masking(scores, k0=, k1=)` masks a tile's scores in place. Returns [kvh, group,
    t, dim]."""
    rows = queries.shape[:-1] + (1,)
    if sink_rows is None:
        top, norm = np.full(rows, -np.inf, np.float32), np.zeros(rows, np.float32)
    else:
        top, norm = np.broadcast_to(sink_rows, rows).astype(np.float32), np.ones(rows, np.float32)
    context = np.zeros(queries.shape, np.float32)
    for k0 in range(0, visible, KEY_TILE):
        k1 = min(visible, k0 + KEY_TILE)
        scores = np.matmul(queries, keys_t[..., k0:k1])
        scores *= scale
        masking(scores, k0=k0, k1=k1)
        grown = np.maximum(top, scores.max(axis=-1, keepdims=True))
        shift = np.where(grown == -np.inf, np.float32(0.0), grown)  # a row masked so far: nothing to rescale
        fade = np.exp(top - shift)
        scores -= shift
        np.exp(scores, out=scores)
        norm = norm * fade + scores.sum(axis=-1, keepdims=True)
        context *= fade
        context += np.matmul(scores, values[:, None, k0:k1])
        top = grown
    context /= norm
    return context


def new_cache(backend, keys_transposed: bool) -> KVCache:
    """The cache an Attention keeps: fp32 arrays (HostKVCache), or the runtime's KV format below fp32."""
    kv_format, memory = getattr(backend.runtime, "kv_format", None), getattr(backend.runtime, "kv_memory", None)
    zeros_for = memory.zeros_for if memory is not None else in_memory
    if kv_format is None or kv_format.exact:
        return HostKVCache(keys_transposed, zeros_for)
    return StoredKVCache(kv_format, keys_transposed, backend.scratch, zeros_for)


def in_memory(layer_bytes: int):
    """The allocator of a cache without a KVMemory: np.zeros, whatever its size."""
    return np.zeros


def create_attention(backend, inputs, outputs, op):
    if inputs[0].shape and op.param.layout(inputs[0].shape, inputs[1].shape) is None:
        return Refused("the inputs do not say the head layout")
    return AttentionExecution(backend, op.param)


CREATORS = {"Attention": create_attention}
