"""Slot-aware Attention on the cpu: a step's rows grouped by KV slot (`kv_meta.batch`), each group
run by the single-sequence Attention (attention.py, either memory path) over that slot's own cache
and under that slot's KV meta. Without a batch it is that Attention, unchanged (slot 0).

Each slot has a twin AttentionExecution bound to the slot's cache; a group's rows are views of
the step's q/k/v and output rows (no copies), resized per step (binding only). A replayed
batched step records each group's twin as that twin records a one-sequence step (`append_decode`,
`append_attend_stored`, `append_attend`: one kernel call over the slot's cache), when every
twin has such a kernel (memory "low"); `before_run` keeps each slot's books under its own meta, and
a new row table (other slots in the rows) or a grown cache records again. The groups' one-token
kernels are marked `joins` (independent of the group before: other rows, another cache), so a
thread team runs them without barriers between (`kernels/team.py`). Otherwise (the fp32 weights'
path, a long prefill chunk) the replay records this op's on_execute, which runs the groups op by op.
"""
from __future__ import annotations

from functools import partial

from mnnllm_core.backend_api import (BatchMeta, KVStateError, Refused, SlotCaches, Tensor, UnsupportedError,
                                     attention_mask, slot_meta)

from .attention import AttentionExecution, create_attention


def rows_view(tensor: Tensor, seq: int, start: int, count: int) -> Tensor:
    """Rows start..start+count of a [seq, ...] (or [1, seq, ...]) tensor as a tensor on a view."""
    shape = list(tensor.shape)
    axis = next(i for i, n in enumerate(shape) if n == seq and all(m == 1 for m in shape[:i]))
    shape[axis] = count
    storage = tensor.storage.reshape(seq, -1)[start:start + count].reshape(shape)
    return Tensor(tensor.index, tensor.name, tuple(shape), tensor.dtype, None, tensor.backend, storage)


class SlotAttentionExecution(AttentionExecution):
    slot_aware = True

    def __init__(self, backend, params, cache=None, slots: SlotCaches | None = None):
        super().__init__(backend, params, cache)
        self.slots = slots if slots is not None else SlotCaches(self.cache, self._fresh_cache)
        self.twins: dict[int, AttentionExecution] = {}  # slot -> a one-sequence execution over its cache
        self.batched = False  # resized for a batch of slots
        self.bound_groups: tuple | None = None  # (row table and buffers, per group (twin, inputs, outputs))
        self.bound: tuple | None = None  # (the batch, per group (twin, inputs, outputs, meta)) last bound
        self.step_io: tuple | None = None  # the batched resize's (inputs, outputs)
        self.recorded: tuple | None = None  # the bound_groups the replay's steps are bound to

    def _fresh_cache(self):
        """An empty cache of the kind the one-sequence Attention makes (whatever it stores)."""
        return AttentionExecution(self.backend, self.params).cache

    def _twin(self, slot: int) -> AttentionExecution:
        cache = self.slots.get(slot)
        twin = self.twins.get(slot)
        if twin is None or twin.cache is not cache:
            twin = self.twins[slot] = AttentionExecution(self.backend, self.params, cache)
        return twin

    def on_resize(self, inputs, outputs) -> None:
        self.batched = self.backend.kv_meta.batch is not None
        self.bound = None
        if not self.batched:
            super().on_resize(inputs, outputs)
            return
        self.kernel_call = None
        self.replay_kernel = self.replay_stored = False
        self._layout(inputs)
        self.step_io, self.recorded = (inputs, outputs), None

    def before_run(self) -> bool:
        batch = self.backend.kv_meta.batch
        if batch is None:
            return super().before_run()
        if self.replay_kernel or self.replay_stored:
            raise KVStateError("a step recorded for one sequence ran a batch of KV slots: resize it for the "
                               "batch first", field="batch")
        groups = self._replayed_groups(batch)
        if groups is None:
            return False  # the replay runs on_execute, which keeps the books
        moved = self.recorded is not self.bound_groups  # bound anew (another row table): record again
        for twin, _, _, meta in groups:
            with slot_meta(self.backend, meta):
                moved = twin.before_run() or moved
        return moved

    def _replayed_groups(self, batch: BatchMeta) -> list[tuple] | None:
        """The groups bound for this batch (`_bind`) when every twin replays a kernel call, else None."""
        inputs, outputs = self.step_io
        groups = self._bind(batch, self._layout(inputs)[0], inputs, outputs)
        return groups if all(twin.replay_kernel or twin.replay_stored for twin, *_ in groups) else None

    def replay_steps(self, inputs, outputs) -> list:
        batch = self.backend.kv_meta.batch
        if not self.batched or batch is None:
            return super().replay_steps(inputs, outputs)
        groups = self._replayed_groups(batch)
        self.recorded = self.bound_groups
        if groups is None:
            return [partial(self.on_execute, inputs, outputs)]
        steps = []
        for twin, sub_inputs, sub_outputs, _ in groups:
            for step in twin.replay_steps(sub_inputs, sub_outputs):
                step.joins = bool(steps)  # the group before it wrote other rows and another cache
                steps.append(step)
        return steps

    def on_execute(self, inputs, outputs) -> None:
        batch = self.backend.kv_meta.batch
        if batch is None:
            super().on_execute(inputs, outputs)
        else:
            self._run_slots(batch, inputs, outputs)

    def _run_slots(self, batch: BatchMeta, inputs, outputs) -> None:
        seq = self._layout(inputs)[0]
        if not self.params.kv_cache:
            raise UnsupportedError("a batch of KV slots needs an Attention with a KV cache", field="batch")
        mask = inputs[3] if len(inputs) > 3 else None
        if attention_mask(mask, seq).kind != "causal":
            raise UnsupportedError("a batch of KV slots takes the scalar (causal) attention mask; each row's "
                                   "own mask would need a plane per slot", field="attention_mask")
        for twin, sub_inputs, sub_outputs, meta in self._bind(batch, seq, inputs, outputs):
            with slot_meta(self.backend, meta):
                twin.on_execute(sub_inputs, sub_outputs)

    def _bind(self, batch: BatchMeta, seq: int, inputs, outputs) -> list[tuple]:
        """Per group: the slot's twin resized for views of the group's rows, and the slot's meta;
        kept while the row table and the step's buffers stay (a replayed decode step binds once).
        The same batch object as the last call (every layer of a step; the engine keeps it while
        the table stays) on the same buffers skips the comparison."""
        if self.bound is not None and self.bound[0] is batch and self.bound[2] is inputs[0].storage:
            return self.bound[1]
        batch.check(seq)
        key = (tuple((g.slot, g.start, g.count, id(self.slots.get(g.slot))) for g in batch.groups),
               tuple(id(t.storage) for t in (*inputs, outputs[0])))
        if self.bound_groups is None or self.bound_groups[0] != key:
            bound = []
            for group in batch.groups:
                sub_inputs = [rows_view(t, seq, group.start, group.count) for t in inputs[:3]] + list(inputs[3:])
                sub_outputs = [rows_view(outputs[0], seq, group.start, group.count)]
                twin = self._twin(group.slot)
                twin.on_resize(sub_inputs, sub_outputs)
                bound.append((twin, sub_inputs, sub_outputs))
            self.bound_groups = (key, bound)
        groups = [(*b, group.meta) for b, group in zip(self.bound_groups[1], batch.groups)]
        self.bound = (batch, groups, inputs[0].storage)
        return groups

    def on_clone(self, backend, op):
        return SlotAttentionExecution(backend, self.params, self.cache, self.slots)


def create_slot_attention(backend, inputs, outputs, op):
    """The one-sequence creator's Execution (or its Refused), made slot-aware over its cache."""
    made = create_attention(backend, inputs, outputs, op)
    return made if isinstance(made, Refused) else SlotAttentionExecution(backend, op.param, made.cache)


CREATORS = {"Attention": create_slot_attention}
