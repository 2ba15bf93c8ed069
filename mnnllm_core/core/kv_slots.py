"""KV slots: one forward carrying rows of several independent sequences (continuous batching).

A batched step's rows are grouped by sequence: each `SlotRows` names a slot, the rows of the
step that belong to it (contiguous, in order) and that slot's own `KVMeta` (its cached length,
what it removes and adds this step). The LLM sets the step's `BatchMeta` on the runtime's KV
meta (`KVMeta.batch`); a slot-aware Attention then runs each group as a single-sequence step
over the slot's own KV cache, so every row attends only to its own sequence's history (its
position comes with the `position_ids` of its row; the scalar "causal" mask is per group).
Without a batch (the default) an Attention is exactly MNN's single-sequence one: slot 0.

Each slot keeps a KV cache object of the backend's own class (`SlotCaches`), so per-slot storage
is whatever the backend stores (fp32, quantized, a device buffer). An Execution that honours the
batch says so with `slot_aware = True`; `slot_refusal` is why a module cannot run batches
(its stateful ops are not all slot-aware), and a caller then runs sequences one at a time.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ..errors import KVStateError, UnsupportedError
from .backend import Refused
from .kv_cache import KVCache
from .kv_meta import KVMeta
from .op_params import attention_mask
from .tensor import Tensor

if TYPE_CHECKING:
    from .backend import Backend, Execution


@dataclass
class SlotRows:
    """Rows start..start+count of a batched step belong to `slot`, whose KV meta is `meta`."""

    slot: int
    start: int
    count: int
    meta: KVMeta


@dataclass
class BatchMeta:
    """The step's row table: groups in row order, covering every row once."""

    groups: tuple[SlotRows, ...]

    @property
    def rows(self) -> int:
        return sum(group.count for group in self.groups)

    def check(self, rows: int) -> None:
        """The groups tile the step's `rows` rows in order, each slot once: a KVStateError otherwise."""
        at, seen = 0, set()
        for group in self.groups:
            if group.start != at or group.count < 1 or group.slot in seen or group.slot < 0:
                raise KVStateError(f"KV slot rows {[(g.slot, g.start, g.count) for g in self.groups]} do not tile "
                                   f"the step's {rows} rows in order, one group per slot", field="batch")
            seen.add(group.slot)
            at += group.count
        if at != rows:
            raise KVStateError(f"KV slot rows cover {at} rows, the step has {rows}", field="batch")


class SlotCaches:
    """The KV cache of each slot of one Attention layer: slot 0 is the layer's own (the
    single-sequence state), others are made on first use by `fresh()` (a cache of the backend's
    class). Shared by the clones of an Execution, as the single cache is."""

    def __init__(self, own: KVCache, fresh: Callable[[], KVCache]):
        self.by_slot: dict[int, KVCache] = {0: own}
        self.fresh = fresh

    def get(self, slot: int) -> KVCache:
        cache = self.by_slot.get(slot)
        if cache is None:
            cache = self.by_slot[slot] = self.fresh()
        return cache


def group_rows(tensor: Tensor, seq: int, count: int, storage: object) -> Tensor:
    """`count` of the `seq` rows of a step's [seq, ...] (or [1, seq, ...]) tensor, as a tensor of its
    own on `storage`: what a device Attention hands its one-sequence kernels for one slot's group
    (the rows copied there, or a view where the device allows one)."""
    shape = list(tensor.shape)
    axis = next(i for i, n in enumerate(shape) if n == seq and all(m == 1 for m in shape[:i]))
    shape[axis] = count
    return replace(tensor, shape=tuple(shape), storage=storage, host=None)


class slot_meta:  # noqa: N801 - used as a function: `with slot_meta(backend, meta):`
    """Within the block `backend.kv_meta` is `meta` (one slot's), so a single-sequence
    Attention keeps that slot's books; the backend's own meta is back afterwards. A class, not a
    generator: a replayed batched step enters it per layer and slot (a generator's machinery
    cost several times more)."""

    __slots__ = ("backend", "meta", "had", "before")

    def __init__(self, backend: "Backend", meta: KVMeta):
        self.backend, self.meta = backend, meta

    def __enter__(self) -> None:
        own = self.backend.__dict__
        self.had, self.before = "own_kv_meta" in own, own.get("own_kv_meta")
        own["own_kv_meta"] = self.meta

    def __exit__(self, *exc) -> None:
        own = self.backend.__dict__
        if self.had:
            own["own_kv_meta"] = self.before
        else:
            del own["own_kv_meta"]


class SlotTwins:
    """What a device Attention adds to run a batch of slots with its one-sequence kernels,
    written once: a mixin over that Execution (`backend`, `params`, `cache`), which names its
    one-sequence class `one_sequence`. `init_slots` keeps the slots' caches; `resize_batch`
    checks a batched resize (a KV cache, the scalar mask) and allocates scratch buffers of the
    step's q, k, v and output rows; `twin(slot, rows)` is the slot's one-sequence Execution over
    its cache, resized for `rows` rows at the head of the scratch (one per (slot, rows), kept
    until the next resize, so nothing an enqueued command uses is freed inside a step). The
    backend copies each group's rows in, runs the twin under `slot_meta`, copies its rows out."""

    slot_aware = True
    one_sequence: type

    def init_slots(self, slots: SlotCaches | None) -> None:
        self.slots = slots if slots is not None else SlotCaches(self.cache, self._fresh_cache)
        self.twins: dict[tuple[int, int], tuple] = {}  # (slot, rows) -> (twin, its inputs, its outputs)
        self.scratch: list | None = None  # q, k, v, output storage of the step's rows
        self.layout: tuple | None = None  # (seq, heads, kv_heads, dim) of a batched resize; None: one sequence
        self.step_tensors: tuple = ()  # the step's inputs and outputs at the batched resize

    def _fresh_cache(self) -> KVCache:
        return self.one_sequence(self.backend, self.params).cache

    def resize_batch(self, inputs: Sequence[Tensor], outputs: Sequence[Tensor], shape: tuple) -> None:
        if not self.params.kv_cache:
            raise UnsupportedError("a batch of KV slots needs an Attention with a KV cache", field="batch")
        if attention_mask(inputs[3] if len(inputs) > 3 else None, shape[0]).kind != "causal":
            raise UnsupportedError("a batch of KV slots takes the scalar (causal) attention mask; each row's own "
                                   "mask would need a plane per slot", field="attention_mask")
        self.layout, self.step_tensors, self.twins = shape, (list(inputs), list(outputs)), {}
        self.scratch = [self.backend.alloc(t) for t in (*inputs[:3], outputs[0])]

    def twin(self, slot: int, count: int) -> tuple:
        """(the twin, its inputs, its outputs) of `count` rows of `slot`."""
        cache = self.slots.get(slot)
        found = self.twins.get((slot, count))
        if found is None or found[0].cache is not cache:
            (inputs, outputs), seq = self.step_tensors, self.layout[0]
            sub_inputs = [group_rows(t, seq, count, buffer) for t, buffer in zip(inputs[:3], self.scratch)]
            sub_inputs += inputs[3:]
            sub_outputs = [group_rows(outputs[0], seq, count, self.scratch[3])]
            twin = self.one_sequence(self.backend, self.params, cache)
            twin.on_resize(sub_inputs, sub_outputs)
            found = self.twins[(slot, count)] = (twin, sub_inputs, sub_outputs)
        return found


def slot_aware_creator(create: Callable[..., Any], execution: Callable[..., "Execution"]) -> Callable[..., Any]:
    """An Attention creator: `create`'s one-sequence Execution (or its Refused, or None), made
    slot-aware as `execution(backend, op.param, cache)` over the cache the one-sequence one made."""
    def creator(backend, inputs, outputs, op):
        made = create(backend, inputs, outputs, op)
        return made if made is None or isinstance(made, Refused) else execution(backend, op.param, made.cache)
    return creator


def stateful_executions(executions: Sequence[object], stateful_ops: Sequence[object] = ()) -> list[object]:
    """The executions keeping per-token state: those holding a KVCache, and `stateful_ops` (the
    executions of the ops that keep state by their type, whatever they keep it in): the ones a
    batch must split."""
    found = {id(e): e for e in stateful_ops}
    found.update((id(e), e) for e in executions if any(isinstance(value, KVCache) for value in vars(e).values()))
    return list(found.values())


def slot_refusal(executions: Sequence[object], stateful_ops: Sequence[object] = ()) -> str | None:
    """Why these executions (one module's) cannot run a batch of slots, or None; it names each
    stateful op's class and backend that is not slot-aware (`Execution.slot_aware`)."""
    stateful = stateful_executions(executions, stateful_ops)
    if not stateful:
        return "the model keeps no KV cache"
    unaware = sorted({f"{type(e).__name__} on {e.backend.name}" for e in stateful
                      if not getattr(e, "slot_aware", False)})
    if unaware:
        return f"{', '.join(unaware)} each keep one sequence's state only (not slot-aware)"
    return None
