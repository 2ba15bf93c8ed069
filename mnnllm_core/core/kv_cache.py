"""The KV cache of one Attention layer: the bookkeeping every backend shares, written once.

Each step the LLM sets `KVMeta` (`backend.kv_meta`): `previous` tokens are cached, `remove`
of them go (a rejected guess, a new prompt that shares only a prefix), `add` come; `reserve`
runs of the removed tail stay, moved down to follow the prefix (a verified token tree's
accepted path). An Attention first calls `begin_step(meta)`, which drops the removed tokens
and moves the reserved ones, and returns how many remain (the step's past), then
`append(k, v, seq)`. Moving rows is the one thing a backend adds for reserve (`move`); a cache
that cannot (`reservable` False) raises an UnsupportedError rather than keep wrong rows.
Storage grows by doubling (at least `min_capacity` tokens), so a step never copies the whole
cache. A backend subclasses this and says how to grow its storage and where to write the new
rows (and, to take part in the prefix cache on disk, how to `snapshot` and `restore` it); the
clones of an Execution (prefill and decode) share one cache.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..errors import ContextLengthError, KVStateError, UnsupportedError
from .kv_meta import KVMeta


class KVCache:
    min_capacity = 64

    def __init__(self) -> None:
        self.length = 0
        self.capacity = 0
        self.moved_at: tuple[int, int] | None = None  # the (KV meta, step) whose reserve moved rows here

    reservable = False  # whether `move` works (KV meta reserve needs it)

    def begin_step(self, meta: KVMeta) -> int:
        """Drop the tokens this step removes, keeping its reserved runs; the number of cached
        tokens the step attends to."""
        start = meta.previous - meta.remove
        if not meta.reserve:
            self.truncate(start)
            return self.length
        if not self.reservable:
            raise UnsupportedError(f"{type(self).__name__} cannot keep reserved KV rows (a verified token tree's "
                                   "path): it cannot move rows", field="reserve")
        if self.moved_at == (id(meta), meta.steps):  # this step ran before, interrupted: the rows moved then
            self.truncate(meta.kept)
            return self.length
        meta.check_reserve()
        end = start + meta.reserve[-1][0] + meta.reserve[-1][1]
        if start < 0 or end > self.length:
            raise KVStateError(f"KV meta reserve {list(meta.reserve)} after {start} kept tokens reaches row {end}, "
                               f"but the cache holds {self.length}", field="reserve")
        at = start
        for begin, size in meta.reserve:
            if start + begin != at:
                self.move(start + begin, at, size)
            at += size
        self.length = at
        self.moved_at = (id(meta), meta.steps)
        return self.length

    def move(self, src: int, dst: int, count: int) -> None:
        """Copy token rows src.. to dst.. (dst < src; the ranges may overlap)."""
        raise NotImplementedError

    def truncate(self, length: int) -> None:
        self.length = max(0, min(self.length, length))

    def append(self, k: Any, v: Any, seq: int) -> None:
        """Add `seq` tokens' keys and values (in the backend's own storage)."""
        self.reserve(seq)
        self.write(k, v, seq)
        self.length += seq

    def reserve(self, seq: int) -> bool:
        """Make room for `seq` more tokens; True when that moved the storage (a device kernel
        bound to the old buffers, a recorded step, must bind the new ones)."""
        need = self.length + seq
        if need <= self.capacity:
            return False
        capacity = self.capacity_for(need)
        self.grow(capacity)
        self.capacity = capacity
        return True

    def extend(self, seq: int) -> bool:
        """Count `seq` tokens a device kernel writes itself (at row `length` before the call);
        True when their room moved the storage (see reserve)."""
        moved = self.reserve(seq)
        self.length += seq
        return moved

    def capacity_for(self, need: int) -> int:
        """The capacity to grow to when `need` tokens do not fit."""
        return max(need, 2 * self.capacity, self.min_capacity)

    def grow(self, capacity: int) -> None:
        """New storage for `capacity` tokens holding the first `self.length` of the old."""
        raise NotImplementedError

    def write(self, k: Any, v: Any, seq: int) -> None:
        """Store `seq` tokens of k and v at token `self.length`."""
        raise NotImplementedError

    saveable = False  # whether `snapshot` and `restore` work (the prefix cache on disk needs both)

    def snapshot(self) -> tuple[np.ndarray, np.ndarray]:
        """The cached keys and values as host arrays [length, ...] (float32 [length, kv_heads, dim]
        on the host; a device's raw rows), for the prefix cache on disk."""
        raise NotImplementedError

    def restore(self, k: np.ndarray, v: np.ndarray) -> None:
        """Hold exactly these keys and values (as `snapshot` gave them)."""
        raise NotImplementedError


class DeviceKVCache(KVCache):
    """Keys and values as two device buffers of token-major rows ([capacity, kv_heads, dim], the
    layout of the k/v inputs), so a step appends with one device-side copy each and growing is
    one copy of the used part; nothing goes back to the host. The backend gives `alloc(nbytes)`,
    `copy(dst, src, nbytes, dst_offset=0, src_offset=0)` and, when buffers have a size limit,
    `fits(nbytes)` (then a cache that would not fit doubled grows only to what it needs)."""

    min_capacity = 256

    def __init__(self, alloc: Callable[[int], Any], copy: Callable[..., None],
                 fits: Callable[[int], bool] | None = None, read: Callable[[Any, int], np.ndarray] | None = None,
                 write: Callable[[Any, np.ndarray], None] | None = None) -> None:
        super().__init__()
        self._alloc, self._copy, self._fits = alloc, copy, fits
        self._read, self._write = read, write  # read(buffer, nbytes) -> uint8 array; write(buffer, uint8 array)
        self.saveable = read is not None and write is not None
        self.row_bytes = 0  # bytes of one token's keys: set at resize, the same for every clone
        self.k = self.v = None

    def capacity_for(self, need: int) -> int:
        capacity = super().capacity_for(need)
        if self._fits is None or self._fits(capacity * self.row_bytes):
            return capacity
        if not self._fits(need * self.row_bytes):
            raise ContextLengthError(f"{need} tokens do not fit the KV cache: its buffers hold at most "
                                     f"{self.max_tokens(need)} tokens of {self.row_bytes} bytes on this device",
                                     field="max_all_tokens")
        return need

    def max_tokens(self, below: int) -> int:
        """The most tokens (fewer than `below`) one buffer holds: `fits` is monotone, so bisect."""
        low, high = 0, below
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if self._fits(middle * self.row_bytes) else (low, middle)
        return low

    reservable = True

    def move(self, src: int, dst: int, count: int) -> None:
        """In chunks of at most src - dst rows, first to last: no copy reads rows it writes (OpenCL
        refuses overlapping copies within a buffer, Vulkan leaves them undefined), and each chunk
        reads rows the chunks before it have already copied away."""
        rows, step = self.row_bytes, src - dst
        for done in range(0, count, step):
            n = min(step, count - done)
            for buffer in (self.k, self.v):
                self._copy(buffer, buffer, n * rows, dst_offset=(dst + done) * rows, src_offset=(src + done) * rows)

    def grow(self, capacity: int) -> None:
        rows = self.row_bytes
        grown_k, grown_v = self._alloc(capacity * rows), self._alloc(capacity * rows)
        if self.k is not None:
            self._copy(grown_k, self.k, self.length * rows)
            self._copy(grown_v, self.v, self.length * rows)
        self.k, self.v = grown_k, grown_v

    def write(self, k: Any, v: Any, seq: int) -> None:
        at = self.length * self.row_bytes
        self._copy(self.k, k, seq * self.row_bytes, dst_offset=at)
        self._copy(self.v, v, seq * self.row_bytes, dst_offset=at)

    def snapshot(self) -> tuple[np.ndarray, np.ndarray]:
        """The raw rows, uint8 [length, row_bytes] each (needs `read`)."""
        nbytes = self.length * self.row_bytes
        if not nbytes:
            empty = np.zeros((0, self.row_bytes), np.uint8)
            return empty, empty.copy()
        return tuple(self._read(b, nbytes).reshape(self.length, self.row_bytes) for b in (self.k, self.v))

    def restore(self, k: np.ndarray, v: np.ndarray) -> None:
        """Rows as `snapshot` gave them (needs `write`): storage for at least them, filled from the host."""
        self.length, self.row_bytes = 0, k.shape[1]
        if self.k is None or k.shape[0] > self.capacity:
            self.capacity = self.capacity_for(k.shape[0])
            self.grow(self.capacity)
        self._write(self.k, np.ascontiguousarray(k).reshape(-1))
        self._write(self.v, np.ascontiguousarray(v).reshape(-1))
        self.length = k.shape[0]
