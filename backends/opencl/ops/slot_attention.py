"""Slot-aware Attention on opencl: a step's rows grouped by KV slot (`kv_meta.batch`), each group
run by the one-sequence Attention (attention.py, its kernels unchanged) over that slot's own
device cache, under that slot's KV meta. Without a batch it is that Attention (slot 0).

Per group the step's q/k/v rows are copied to the head of scratch buffers of the step's size
(device copies; the queue is in order, so the groups take turns on one scratch), a twin
AttentionExecution of the slot bound to the slot's cache and to the scratch runs its kernels (its
past and total go through the runtime's step buffer, filled per group), and its output rows are
copied back. The simple design: four more enqueues per group and layer, against kernels that would
each need a row offset. Nothing is freed inside a step (pocl aborts when a buffer or kernel an
enqueued command uses goes before the command ran): the twins, one per (slot, rows), live until
the next resize. A replayed step runs this op's on_execute (opencl's replay does so for every
Attention), so batched steps replay too.
"""
from __future__ import annotations

from mnnllm_core.backend_api import (BatchMeta, SlotCaches, UnsupportedError, attention_mask, group_rows,
                                     slot_aware_creator, slot_meta)

from .attention import AttentionExecution, create_attention


class SlotAttentionExecution(AttentionExecution):
    slot_aware = True

    def __init__(self, backend, params, cache=None, slots: SlotCaches | None = None):
        super().__init__(backend, params, cache)
        self.slots = slots if slots is not None else SlotCaches(self.cache, self._fresh_cache)
        self.twins: dict[tuple[int, int], tuple] = {}  # (slot, rows) -> (twin, its inputs, its outputs)
        self.scratch: list | None = None  # q, k, v, output buffers of the step's rows
        self.layout = None  # (seq, heads, kv_heads, dim) of a batched resize

    def _fresh_cache(self):
        return AttentionExecution(self.backend, self.params).cache

    def on_resize(self, inputs, outputs) -> None:
        if self.backend.kv_meta.batch is None:
            self.layout = None
            super().on_resize(inputs, outputs)
            return
        shape = self.params.layout(inputs[0].shape, inputs[1].shape)
        if shape is None or shape[3] % 4:
            raise UnsupportedError(f"opencl Attention needs known heads and head_dim % 4 == 0, got {shape}",
                                   field="heads")
        if not self.params.kv_cache:
            raise UnsupportedError("a batch of KV slots needs an Attention with a KV cache", field="batch")
        if attention_mask(inputs[3] if len(inputs) > 3 else None, shape[0]).kind != "causal":
            raise UnsupportedError("a batch of KV slots takes the scalar (causal) attention mask; each row's own "
                                   "mask would need a plane per slot", field="attention_mask")
        self.layout = shape
        self.twins = {}
        self.scratch = [self.backend.alloc(t) for t in (*inputs[:3], outputs[0])]

    def on_execute(self, inputs, outputs) -> None:
        batch = self.backend.kv_meta.batch
        if batch is None:
            if self.layout is not None:  # resized for a batch: bind the one-sequence kernels first
                self.on_resize(inputs, outputs)
            super().on_execute(inputs, outputs)
            return
        if self.layout is None:
            self.on_resize(inputs, outputs)
        self._run_slots(batch, inputs, outputs)

    def _run_slots(self, batch: BatchMeta, inputs, outputs) -> None:
        seq = self.layout[0]
        batch.check(seq)
        tensors = (*inputs[:3], outputs[0])
        row_bytes = [t.size // seq * self.backend.storage_dtype(t).itemsize for t in tensors]
        copy = self.backend.allocator.copy
        for group in batch.groups:
            twin, sub_inputs, sub_outputs = self._twin(group.slot, group.count, seq, inputs, outputs)
            for t in range(3):
                copy(self.scratch[t], tensors[t].storage, group.count * row_bytes[t], 0, group.start * row_bytes[t])
            with slot_meta(self.backend, group.meta):
                twin.on_execute(sub_inputs, sub_outputs)
            copy(tensors[3].storage, self.scratch[3], group.count * row_bytes[3], group.start * row_bytes[3], 0)

    def _twin(self, slot: int, count: int, seq: int, inputs, outputs) -> tuple:
        """The slot's one-sequence execution over its cache, resized for `count` rows of the scratch."""
        cache = self.slots.get(slot)
        found = self.twins.get((slot, count))
        if found is None or found[0].cache is not cache:
            sub_inputs = [group_rows(t, seq, count, buffer) for t, buffer in zip(inputs[:3], self.scratch)]
            sub_inputs += list(inputs[3:])
            sub_outputs = [group_rows(outputs[0], seq, count, self.scratch[3])]
            twin = AttentionExecution(self.backend, self.params, cache)
            twin.on_resize(sub_inputs, sub_outputs)
            found = self.twins[(slot, count)] = (twin, sub_inputs, sub_outputs)
        return found

    def on_clone(self, backend, op):
        return SlotAttentionExecution(backend, self.params, self.cache, self.slots)


CREATORS = {"Attention": slot_aware_creator(create_attention, SlotAttentionExecution)}
