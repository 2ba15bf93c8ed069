"""Buffer reuse written once for every backend (tinygrad's Allocator / LRUAllocator split).

A backend says only how to make storage for a tensor (`Backend.alloc`) and which tensors may
share storage (`Backend.buffer_key`: shape and dtype for host arrays, the byte size for device
buffers); the pool keeps what the pipeline releases during a resize and hands it to a later
tensor of the same key. A buffer released twice (a tensor read twice by its last command) is
pooled once, so two live tensors never share storage.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Hashable


@dataclass(frozen=True)
class BufferEvent:
    """One step of a resize's buffer order (`Pipeline._buffer_order`): `tensor` acquired (or
    released, `acquire` False); `shares`: an input of the acquiring command whose storage the
    tensor may take, that command being the input's last reader (an op that reads each element
    before writing it: `Execution.output_may_share`). A graph input is released after its last
    reader too: the pipeline keeps its storage, but every run uploads each input before its
    first op, so a pool that plans may give its bytes to a later tensor."""

    acquire: bool
    tensor: Any
    shares: Any = None


class BufferPool:
    def __init__(self, alloc: Callable[[Any], Any], key: Callable[[Any], Hashable],
                 free: Callable[[Any], None] | None = None):
        self._alloc, self._key, self._free_buffer = alloc, key, free
        self._free: dict[Hashable, list] = defaultdict(list)
        self._pooled: set[int] = set()

    def plan(self, events: list[BufferEvent]) -> None:
        """The resize's whole buffer order, before its first acquire: this pool hands buffers out
        as they are released and does not look ahead (a pool that places them by lifetime does)."""

    def acquire(self, tensor) -> Any:
        """Storage for `tensor`: a released buffer of its key, else a new one."""
        free = self._free.get(self._key(tensor))
        if free:
            buffer = free.pop()
            self._pooled.discard(id(buffer))
            return buffer
        return self._alloc(tensor)

    def release(self, tensor) -> None:
        """`tensor`'s storage may serve a later tensor of this resize."""
        buffer = tensor.storage
        if buffer is not None and id(buffer) not in self._pooled:
            self._pooled.add(id(buffer))
            self._free[self._key(tensor)].append(buffer)

    def clear(self) -> None:
        """Forget the pooled buffers (`free` each, when the backend frees explicitly)."""
        if self._free_buffer is not None:
            for buffers in self._free.values():
                for buffer in buffers:
                    self._free_buffer(buffer)
        self._free.clear()
        self._pooled.clear()
