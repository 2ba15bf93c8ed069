"""Slot-aware Attention on opencl: a step's rows grouped by KV slot (`kv_meta.batch`), each group
run by the one-sequence Attention (attention.py, its kernels unchanged) over that slot's own
device cache, under that slot's KV meta. Without a batch it is that Attention (slot 0).

Per group the step's q/k/v rows are copied to the head of scratch buffers of the step's size
(device copies; the queue is in order, so the groups take turns on one scratch), the slot's twin
(`SlotTwins`: the one-sequence execution bound to the slot's cache and the scratch) runs its
kernels (its past and total go through the runtime's step buffer, filled per group), and its
output rows are copied back. The simple design: four more enqueues per group and layer, against
kernels that would each need a row offset. Nothing is freed inside a step: pocl aborts when a
buffer or kernel an enqueued command uses goes before the command ran. A replayed step runs this
op's on_execute (opencl's replay does so for every Attention), so batched steps replay too.
"""
from __future__ import annotations

from mnnllm_core.backend_api import SlotCaches, SlotTwins, UnsupportedError, slot_aware_creator, slot_meta

from .attention import AttentionExecution, create_attention


class SlotAttentionExecution(SlotTwins, AttentionExecution):
    one_sequence = AttentionExecution

    def __init__(self, backend, params, cache=None, slots: SlotCaches | None = None):
        super().__init__(backend, params, cache)
        self.init_slots(slots)

    def on_resize(self, inputs, outputs) -> None:
        if self.backend.kv_meta.batch is None:
            self.layout = None
            super().on_resize(inputs, outputs)
            return
        shape = self.params.layout(inputs[0].shape, inputs[1].shape)
        if shape is None or shape[3] % 4:
            raise UnsupportedError(f"opencl Attention needs known heads and head_dim % 4 == 0, got {shape}",
                                   field="heads")
        self.resize_batch(inputs, outputs, shape)

    def on_execute(self, inputs, outputs) -> None:
        batch = self.backend.kv_meta.batch
        if (batch is None) != (self.layout is None):  # resized for the other kind of step
            self.on_resize(inputs, outputs)
        if batch is None:
            super().on_execute(inputs, outputs)
            return
        seq = self.layout[0]
        batch.check(seq)
        tensors = (*inputs[:3], outputs[0])
        row_bytes = [t.size // seq * self.backend.storage_dtype(t).itemsize for t in tensors]
        copy = self.backend.allocator.copy
        for group in batch.groups:
            twin, sub_inputs, sub_outputs = self.twin(group.slot, group.count)
            for t in range(3):
                copy(self.scratch[t], tensors[t].storage, group.count * row_bytes[t], 0, group.start * row_bytes[t])
            with slot_meta(self.backend, group.meta):
                twin.on_execute(sub_inputs, sub_outputs)
            copy(tensors[3].storage, self.scratch[3], group.count * row_bytes[3], group.start * row_bytes[3], 0)

    def on_clone(self, backend, op):
        return SlotAttentionExecution(backend, self.params, self.cache, self.slots)


CREATORS = {"Attention": slot_aware_creator(create_attention, SlotAttentionExecution)}
