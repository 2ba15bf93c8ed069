"""Fused Attention with its KV cache in device tensors, split so a CUDA graph can hold the step.

q [seq, heads*dim, 1, 1] (packed) or [1, seq, heads, dim], k/v likewise with kv heads: token-major
[seq, heads, dim] in memory; the cache is head-major ([kv_heads, capacity, dim], zeros beyond
what was written), so scores and context are one contiguous batched matmul per kv head (a
broadcast matmul over the query groups is 30x slower on a loaded cpu). A run is two halves:

  before_run()  the host bookkeeping (the KV meta: drop removed tokens, make room, count the new
                ones) and one small write of (past, total) into the device tensor `step`;
                True when the cache moved to larger tensors (a captured step must be captured
                again)
  compute()     device work only (its `replay_steps`), reading past/total from `step`: the new
                keys and values written at rows past.., scores over the whole capacity with the
                keys at or beyond total (and, causally, beyond each query's position) masked
                out, softmax, the weighted values

on_execute is the two in a row, so the per-op loop and a replay (TorchReplay) compute exactly the
same. Sinks (a fifth input, one logit per head: gpt-oss) are a last score column of every row,
dropped after the softmax. A full float or int mask (not the scalar "causal" one) is placed by host indexes: then the
step cannot be captured (`capturable` is False) and a replay runs it eagerly.
"""
from __future__ import annotations

import numpy as np
import torch

from mnnllm_core.backend_api import (AttentionParams, Execution, KVCache, UnsupportedError, attention_mask,
                                     float_attention_creator)


class TorchKVCache(KVCache):
    """Keys and values as two device tensors [kv_heads, capacity, dim], zero-filled (a masked
    score's zero weight times an unwritten row must stay zero)."""

    min_capacity = 256

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = device
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.row_shape: tuple[int, int] = (0, 0)  # (kv_heads, dim), set at resize

    def grow(self, capacity: int) -> None:
        heads, dim = self.row_shape
        grown_k = torch.zeros((heads, capacity, dim), dtype=torch.float32, device=self.device)
        grown_v = torch.zeros_like(grown_k)
        if self.k is not None:
            grown_k[:, :self.length] = self.k[:, :self.length]
            grown_v[:, :self.length] = self.v[:, :self.length]
        self.k, self.v = grown_k, grown_v

    reservable = True

    def move(self, src: int, dst: int, count: int) -> None:
        """Through a copy of the source rows (the ranges may overlap)."""
        for t in (self.k, self.v):
            t[:, dst:dst + count] = t[:, src:src + count].clone()

    def write(self, k: torch.Tensor, v: torch.Tensor, seq: int) -> None:
        """k, v: [seq, kv_heads, dim]."""
        self.k[:, self.length:self.length + seq] = k.transpose(0, 1)
        self.v[:, self.length:self.length + seq] = v.transpose(0, 1)

    saveable = True

    def snapshot(self) -> tuple[np.ndarray, np.ndarray]:
        if self.k is None:
            empty = np.zeros((0, *self.row_shape), np.float32)
            return empty, empty.copy()
        return tuple(np.ascontiguousarray(t[:, :self.length].transpose(0, 1).cpu().numpy()) for t in (self.k, self.v))

    def restore(self, k: np.ndarray, v: np.ndarray) -> None:
        self.length, self.row_shape = 0, tuple(k.shape[1:])
        self.k = self.v = None
        self.capacity = 0
        self.append(torch.from_numpy(np.ascontiguousarray(k, np.float32)).to(self.device),
                    torch.from_numpy(np.ascontiguousarray(v, np.float32)).to(self.device), k.shape[0])


class AttentionExecution(Execution):
    def __init__(self, backend, params: AttentionParams, cache: TorchKVCache | None = None):
        super().__init__(backend)
        self.params = params
        self.cache = cache if cache is not None else TorchKVCache(backend.device)
        self.step = torch.zeros(2, dtype=torch.int64, device=backend.device)  # past, total
        self.host_step = torch.zeros(2, dtype=torch.int64, pin_memory=backend.device.type == "cuda")
        self.capturable = True
        self.bound = None  # the cache's key tensor at the last run
        self.shape = (0, 0, 0, 0)
        self.kv_seq = 0
        self.mask = None
        self.views = None
        self.sinks = None  # [kv_heads, group, 1, 1] when the op has sinks

    def on_resize(self, inputs, outputs) -> None:
        shape = self.params.layout(inputs[0].shape, inputs[1].shape)
        if shape is None:
            raise UnsupportedError("packed attention inputs need the head configuration", field="heads")
        seq, heads, kv_heads, dim = self.shape = shape
        self.kv_seq = inputs[1].size // (kv_heads * dim)
        mask = inputs[3] if len(inputs) > 3 else None
        self.mask = (attention_mask(mask, seq), mask)
        self.capturable = self.mask[0].kind == "causal"
        self.cache.row_shape = (kv_heads, dim)
        group = heads // kv_heads
        self.views = (inputs[0].storage.view(seq, kv_heads, group, dim).permute(1, 2, 0, 3),
                      inputs[1].storage.view(self.kv_seq, kv_heads, dim).transpose(0, 1),
                      inputs[2].storage.view(self.kv_seq, kv_heads, dim).transpose(0, 1),
                      outputs[0].storage.view(seq, kv_heads, group, dim))
        self.new_rows = torch.arange(self.kv_seq, device=self.backend.device)
        self.sinks = None
        if len(inputs) > 4:
            if inputs[4].size != heads:
                raise UnsupportedError(f"Attention: {inputs[4].size} sinks for {heads} heads", field="sinks")
            self.sinks = inputs[4].storage.view(kv_heads, group, 1, 1)
        self.query_rows = torch.arange(seq, device=self.backend.device)[:, None]

    def before_run(self) -> bool:
        """The step's host bookkeeping (see the module's docstring); True when the cache is in
        other tensors than at this execution's last run (grown here, or by a clone: the prefill
        and decode clones share the cache)."""
        if self.params.kv_cache:
            past = self.cache.begin_step(self.backend.kv_meta)
            self.cache.extend(self.kv_seq)
            moved, self.bound = self.cache.k is not self.bound, self.cache.k
            step = (past, self.cache.length)
        else:
            moved, step = False, (0, self.kv_seq)
        self.host_step[0], self.host_step[1] = step
        self.step.copy_(self.host_step, non_blocking=True)
        return moved

    def replay_steps(self, inputs, outputs) -> list:
        """Its device work only: `compute`."""
        return [self.compute]

    def compute(self) -> None:
        queries, k, v, out = self.views  # q [kv_heads, group, seq, dim], k/v [kv_heads, kv_seq, dim]
        seq, heads, kv_heads, dim = self.shape
        if self.params.kv_cache:
            rows = self.new_rows + self.step[0]
            self.cache.k.index_copy_(1, rows, k)
            self.cache.v.index_copy_(1, rows, v)
            keys, values = self.cache.k, self.cache.v
        else:
            keys, values = k, v
        columns = torch.arange(keys.shape[1], device=keys.device)[None, :]
        blocked = columns >= self.step[1]
        kind, mask = self.mask
        if kind.kind == "causal":
            blocked = blocked | (columns > self.step[0] + self.query_rows)
        grouped = queries.reshape(kv_heads, -1, dim)  # [kv_heads, group * seq, dim]
        scores = torch.bmm(grouped, keys.transpose(1, 2)).view(kv_heads, -1, seq, keys.shape[1])
        scores = scores * self.params.scale_for(dim)
        if kind.kind != "causal":
            scores = scores + self._full_mask(mask, kind.kind, seq, keys.shape[1])
        scores = scores.masked_fill(blocked, float("-inf"))
        if self.sinks is None:
            probs = scores.softmax(-1)
        else:
            probs = torch.cat([scores, self.sinks.expand(-1, -1, seq, 1)], -1).softmax(-1)[..., :-1]
        context = torch.bmm(probs.view(kv_heads, -1, keys.shape[1]), values)
        out.copy_(context.view(kv_heads, -1, seq, dim).permute(2, 0, 1, 3))

    def _full_mask(self, mask, kind: str, seq: int, columns: int) -> torch.Tensor:
        """The mask's last `seq` rows added at the columns that end at total (host indexes)."""
        total = int(self.host_step[1])
        rows = mask.storage.view(mask.shape[-2], mask.shape[-1])[-seq:]
        if kind == "int":
            rows = torch.zeros(rows.shape, device=rows.device).masked_fill(rows == 0, float("-inf"))
        placed = torch.zeros((seq, columns), device=rows.device)
        width = min(rows.shape[-1], total)
        placed[:, total - width:total] = rows[:, rows.shape[-1] - width:]
        return placed

    def on_execute(self, inputs, outputs) -> None:
        self.before_run()
        self.compute()

    def on_clone(self, backend, op):
        return AttentionExecution(backend, self.params, self.cache)


CREATORS = {"Attention": float_attention_creator(AttentionExecution, sinks=True)}
