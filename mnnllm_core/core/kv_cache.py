"""The KV cache of one Attention layer: the bookkeeping every backend shares, written once.

Each step the LLM sets `KVMeta` (`backend.kv_meta`): `previous` tokens are cached, `remove`
of them go (a rejected guess, a new prompt that shares only a prefix), `add` come. An
Attention first calls `begin_step(meta)`, which drops the removed tokens and returns how many
remain (the step's past), then `append(k, v, seq)`. Storage grows by doubling (at least
`min_capacity` tokens), so a step never copies the whole cache. A backend subclasses this and
says how to grow its storage and where to write the new rows (and, to take part in the prefix
cache on disk, how to `snapshot` and `restore` it); the clones of an Execution (prefill and
decode) share one cache.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..errors import ContextLengthError
from .kv_meta import KVMeta


class KVCache:
    min_capacity = 64

    def __init__(self) -> None:
        self.length = 0
        self.capacity = 0

    def begin_step(self, meta: KVMeta) -> int:
        """Drop the tokens this step removes; the number of cached tokens the step attends to."""
        self.truncate(meta.previous - meta.remove)
        return self.length

    def truncate(self, length: int) -> None:
        self.length = max(0, min(self.length, length))

    def append(self, k: Any, v: Any, seq: int) -> None:
        """Add `seq` tokens' keys and values (in the backend's own storage)."""
        need = self.length + seq
        if need > self.capacity:
            capacity = self.capacity_for(need)
            self.grow(capacity)
            self.capacity = capacity
        self.write(k, v, seq)
        self.length = need

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
    `copy(dst, src, nbytes, dst_offset=0)` and, when buffers have a size limit, `fits(nbytes)`
    (then a cache that would not fit doubled grows only to what it needs)."""

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
