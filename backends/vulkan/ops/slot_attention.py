"""Slot-aware Attention on vulkan: a step's rows grouped by KV slot (`kv_meta.batch`), each group
run by the one-sequence Attention (attention.py, its shaders unchanged) over that slot's own device
cache, under that slot's KV meta. Without a batch it is that Attention (slot 0).

Per group: a copy of the step's q/k/v rows to the head of scratch buffers of the step's size, the
dispatches of the slot's twin (`SlotTwins`: the one-sequence execution bound to the slot's cache
and the scratch; its own step buffer holds that slot's past and total), a copy of its output rows
back; the recorder's barriers order the groups, which take turns on one scratch. Replay stays on:
`before_run` does every group's bookkeeping and asks for a new recording when the row table (or
a slot's cache buffer) changed, so decode steps over the same slots replay one command buffer.
"""
from __future__ import annotations

import functools

from mnnllm_core.backend_api import SlotCaches, SlotTwins, UnsupportedError, float_attention_creator, slot_meta

from ..device import Program
from .attention import AttentionExecution


class SlotAttentionExecution(SlotTwins, AttentionExecution):
    one_sequence = AttentionExecution

    def __init__(self, backend, params, cache=None, slots: SlotCaches | None = None):
        super().__init__(backend, params, cache)
        self.init_slots(slots)
        self.table: tuple | None = None  # the row table the recorded steps were made for
        self.plan: list[tuple] = []  # per group of this step: (first row, rows, twin)

    def on_resize(self, inputs, outputs) -> None:
        self.table, self.plan = None, []
        if self.backend.kv_meta.batch is None:
            self.layout = None
            super().on_resize(inputs, outputs)
            return
        shape = self.params.layout(inputs[0].shape, inputs[1].shape)
        if shape is None or shape[1] % shape[2]:
            raise UnsupportedError(f"vulkan Attention needs known heads (a multiple of kv heads), got {shape}",
                                   field="heads")
        self.inputs, self.outputs = inputs, outputs
        self.resize_batch(inputs, outputs, shape)

    def before_run(self) -> bool:
        batch = self.backend.kv_meta.batch
        if (batch is None) != (self.layout is None):  # resized for the other kind of step
            self.on_resize(self.inputs, self.outputs)
        if batch is None:
            return super().before_run()
        batch.check(self.layout[0])
        moved, plan = False, []
        for group in batch.groups:
            twin = self.twin(group.slot, group.count)[0]
            with slot_meta(self.backend, group.meta):
                moved = twin.before_run() or moved
            plan.append((group.start, group.count, twin))
        table = tuple((g.slot, g.start, g.count) for g in batch.groups)
        moved = moved or table != self.table
        self.table, self.plan = table, plan
        return moved

    def replay_steps(self, inputs, outputs) -> list:
        if self.layout is None:
            return super().replay_steps(inputs, outputs)
        steps: list = []
        for start, count, twin in self.plan:
            steps.append(functools.partial(self._copy_rows, inputs, outputs, start, count, True))
            steps += twin.dispatches
            steps.append(functools.partial(self._copy_rows, inputs, outputs, start, count, False))
        return steps

    def _copy_rows(self, inputs, outputs, start: int, count: int, into: bool) -> None:
        """Record (on the current recorder) the group's q, k, v rows to the scratch's head, or the
        scratch's output rows back to the group's."""
        seq, copy = self.layout[0], self.backend.recorder.copy
        for t, tensor in enumerate((*inputs[:3], outputs[0])):
            row = tensor.size // seq * tensor.dtype.itemsize
            if into and t < 3:
                copy(self.scratch[t], tensor.storage, count * row, 0, start * row)
            elif not into and t == 3:
                copy(tensor.storage, self.scratch[t], count * row, start * row, 0)

    def on_execute(self, inputs, outputs) -> None:
        self.before_run()
        recorder = self.backend.recorder
        for step in self.replay_steps(inputs, outputs):
            if isinstance(step, Program):
                recorder.dispatch(step)
            else:
                step()

    def on_clone(self, backend, op):
        return SlotAttentionExecution(backend, self.params, self.cache, self.slots)


CREATORS = {"Attention": float_attention_creator(SlotAttentionExecution)}
