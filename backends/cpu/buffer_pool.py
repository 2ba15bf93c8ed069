"""The cpu backend's step buffers: the big ones placed by lifetime in one arena, the rest pooled.

Before a resize the pipeline says its whole buffer order (`plan`): tensors of PLANNED_FROM bytes
or more get offsets in one arena (`lifetime_plan.py`: a step holds its live peak, not the
buffers a first-come pool leaves idle), an output the op may write over its input
(`BufferEvent.shares`: MUL_SILU over its gate) the input's bytes. The arena is one anonymous
mapping (`host_memory.py`), committed as written and given back when the step's clone is dropped.

Smaller tensors (all of a decode step's) keep the pool: a released flat byte buffer goes to the
next tensor it holds (the smallest such, and not one under 1/MAX_WASTE of it). Two live tensors
never share a buffer: the pipeline releases a tensor only after its last reader is resized.
"""
from __future__ import annotations

import numpy as np

from .host_memory import MAPPED_FROM, mapped_zeros
from .lifetime_plan import Lifetime, place

MAX_WASTE = 4  # a pooled buffer serves tensors of at least 1/MAX_WASTE of its bytes
PLANNED_FROM = MAPPED_FROM  # bytes: smaller tensors are pooled (a decode step plans nothing)


class SizedBufferPool:
    """The interface of the core's BufferPool (plan, acquire, release, clear) over flat uint8 buffers."""

    def __init__(self) -> None:
        self._free: list[np.ndarray] = []
        self._lent: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # id(view) -> (view, its buffer)
        self._placed: dict[int, tuple[object, int]] = {}  # id(tensor) -> (tensor, offset in the arena)
        self._arena: np.ndarray | None = None

    def plan(self, events) -> None:
        """Offsets in one arena for the tensors of PLANNED_FROM bytes or more, by their lifetimes
        in `events` (BufferEvent: acquire or release, in the resize's order); a tensor that shares
        an input's bytes joins that input's lifetime."""
        end = len(events)
        released = {id(e.tensor): time for time, e in enumerate(events)  # a graph input at its last reader
                    if not e.acquire}  # too: each run uploads it again before the first op
        slots: list[Lifetime] = []
        groups: list[list] = []
        slot_of: dict[int, int] = {}
        for time, event in enumerate(events):
            tensor = event.tensor
            if not event.acquire or tensor.nbytes < PLANNED_FROM or id(tensor) in slot_of:
                continue
            slot = slot_of.get(id(event.shares))
            if slot is None:
                slot = len(slots)
                slots.append(Lifetime(time, end, tensor.nbytes))
                groups.append([])
            groups[slot].append(tensor)
            slot_of[id(tensor)] = slot
        for lifetime, group in zip(slots, groups):  # live until its last tensor's last reader ran
            lifetime.stop = max(released.get(id(t), end) for t in group)
        offsets, size = place(slots)
        self._arena = mapped_zeros(size, np.uint8) if slots else None
        self._placed = {id(t): (t, offsets[slot]) for slot, group in enumerate(groups) for t in group}

    def acquire(self, tensor) -> np.ndarray:
        """A view of tensor.shape and dtype: at its planned offset, else over the best-fitting
        released buffer, else a new one."""
        dtype = np.dtype(tensor.dtype)
        need = int(np.prod(tensor.shape, dtype=np.int64)) * dtype.itemsize
        placed = self._placed.get(id(tensor))
        if placed is not None and placed[0] is tensor:
            return self._arena[placed[1]:placed[1] + need].view(dtype).reshape(tensor.shape)
        fits = [i for i, b in enumerate(self._free) if need <= b.nbytes <= need * MAX_WASTE]
        if fits:
            buffer = self._free.pop(min(fits, key=lambda i: self._free[i].nbytes))
        else:
            buffer = mapped_zeros(max(need, dtype.itemsize), np.uint8)  # given back to the system when dropped
        view = buffer[:need].view(dtype).reshape(tensor.shape)
        self._lent[id(view)] = (view, buffer)
        return view

    def release(self, tensor) -> None:
        """tensor's buffer may serve a later tensor of this resize (a second release, or one of a
        planned tensor, is a no-op)."""
        lent = self._lent.pop(id(tensor.storage), None)
        if lent is not None:
            self._free.append(lent[1])

    def clear(self) -> None:
        self._free.clear()
        self._lent.clear()
        self._placed.clear()
        self._arena = None

    def held_bytes(self) -> int:
        """The bytes of this resize's buffers: the arena and the pooled ones, lent or free."""
        pooled = {id(b): b.nbytes for b in self._free} | {id(b): b.nbytes for _, b in self._lent.values()}
        return sum(pooled.values()) + (0 if self._arena is None else self._arena.nbytes)
