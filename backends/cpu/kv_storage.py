"""How the cpu backend keeps a KV cache below fp32: MNN's `attention_mode` and the fp16 hint.

`attention_mode` is read as every backend reads it (`AttentionMode` in core/kv_format.py: int8
keys for 1, 2, 9 and 10, int8 values for 10 only). Our attention streams the cache in blocks
either way, so the flash bit changes nothing but that rule. Float keys and values are MNN's backend precision (fp32 on a
cpu without fp16 arithmetic, as this one); the hint `kv_fp16` (every backend's) stores them as
fp16 instead.

int8 rows are quantized per token and kv head, asymmetric: scale = (max - min) / 255 and
zero = min + 128 * scale, code = round((x - zero) / scale) in [-128, 127], x ~ code * scale + zero.
MNN does the same for keys (after subtracting a per-channel max of the first prefill, which moves
every score of a query by one constant and so leaves the softmax as it is); its values take one
scale per channel from the first prefill, which a long conversation outgrows: per token is kept
here, so a row never changes once written.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from mnnllm_core.backend_api import AttentionMode, KVCache, report_ignored

PANEL = 16  # capacity in whole panels, as the key-transposed cache of the low-memory kernels
QUANT_INFO = 8  # bytes of one row's scale and zero (float32 each) in a snapshot
HONOURED = frozenset({0, 1, 2, 8, 9, 10})  # the attention_mode values the cpu backend keeps whole
GROWTH_STEP = 256  # a cache grows by at least this many tokens ...
GROWTH_SHARE = 8  # ... or by 1/GROWTH_SHARE of what it holds


def grown_capacity(need: int, capacity: int) -> int:
    """The capacity a host cache grows to when `need` tokens do not fit, in whole panels: 1/8 more
    than it had (or GROWTH_STEP tokens), not double. Doubling held a 8,192-token prefill's cache
    at 16,384 rows from its first decoded token on (fp32, the shared model: 720 MiB, not 360);
    growing by an eighth still copies each row a bounded number of times (8 on average)."""
    return -(-max(need, capacity + max(GROWTH_STEP, capacity // GROWTH_SHARE)) // PANEL) * PANEL


@dataclass(frozen=True)
class StoredKinds:
    """The element kind of the stored keys and of the stored values: "f32", "f16" or "i8"."""

    keys: str = "f32"
    values: str = "f32"

    @classmethod
    def of(cls, attention_mode: int, fp16: bool = False) -> "StoredKinds":
        float_kind = "f16" if fp16 else "f32"
        mode = AttentionMode.of(attention_mode)
        report_ignored("cpu", attention_mode, mode.unknown_reason(), HONOURED)
        return cls("i8" if mode.int8_keys else float_kind, "i8" if mode.int8_values else float_kind)

    @property
    def storage(self) -> str:
        """The coarser of the two as `Runtime.kv_storage` names it: "int8", "fp16" or "float"."""
        kinds = {self.keys, self.values}
        return "int8" if "i8" in kinds else "fp16" if "f16" in kinds else "float"

    @property
    def exact(self) -> bool:
        """Whether both are fp32 (the exact path, stored as computed)."""
        return self.keys == self.values == "f32"


class RowStore:
    """One tensor's rows (keys or values) of every kv head: codes [heads, capacity, dim] and, for
    int8, scale and zero [heads, capacity]."""

    DTYPES = {"f32": np.float32, "f16": np.float16, "i8": np.int8}

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.codes: np.ndarray | None = None
        self.scale: np.ndarray | None = None
        self.zero: np.ndarray | None = None

    def nbytes(self, heads: int, capacity: int, dim: int) -> int:
        itemsize = np.dtype(self.DTYPES[self.kind]).itemsize
        return heads * capacity * (dim * itemsize + (QUANT_INFO if self.kind == "i8" else 0))

    def grow(self, heads: int, capacity: int, dim: int, length: int, zeros: Callable) -> None:
        codes = zeros((heads, capacity, dim), self.DTYPES[self.kind])
        scale = zero = None
        if self.kind == "i8":
            scale, zero = zeros((heads, capacity), np.float32), zeros((heads, capacity), np.float32)
        if self.codes is not None:
            codes[:, :length] = self.codes[:, :length]
            if scale is not None:
                scale[:, :length], zero[:, :length] = self.scale[:, :length], self.zero[:, :length]
        self.codes, self.scale, self.zero = codes, scale, zero

    def write(self, x: np.ndarray, at: int) -> None:
        """x [seq, heads, dim] float32 at token `at`."""
        rows = x.transpose(1, 0, 2)
        end = at + x.shape[0]
        if self.kind != "i8":
            self.codes[:, at:end] = rows
            return
        low, high = rows.min(axis=-1), rows.max(axis=-1)
        scale = (high - low) / np.float32(255)
        zero = low + np.float32(128) * scale
        inverse = np.divide(np.float32(1), scale, out=np.zeros_like(scale), where=scale > 0)
        codes = np.rint((rows - zero[..., None]) * inverse[..., None])
        self.codes[:, at:end] = np.clip(codes, -128, 127)
        self.scale[:, at:end], self.zero[:, at:end] = scale, zero

    def read(self, length: int, out: np.ndarray, transposed: bool = False) -> None:
        """The first `length` rows as float32 into out[:, :length] ([heads, capacity, dim]), or
        into out[:, :, :length] ([heads, dim, capacity]) when `transposed`."""
        codes = self.codes[:, :length]
        target = out[:, :, :length] if transposed else out[:, :length]
        if transposed:
            codes = codes.transpose(0, 2, 1)
        if self.kind != "i8":
            target[...] = codes
            return
        axis = 1 if transposed else 2
        np.multiply(codes, np.expand_dims(self.scale[:, :length], axis), out=target)
        target += np.expand_dims(self.zero[:, :length], axis)

    def move(self, src: int, dst: int, count: int) -> None:
        for array in (self.codes, self.scale, self.zero):
            if array is not None:
                array[:, dst:dst + count] = array[:, src:src + count]

    def snapshot(self, length: int) -> np.ndarray:
        """The rows as stored, uint8 [length, heads, bytes of a head's row]: its codes, then (int8)
        its scale and zero."""
        parts = [self.codes[:, :length].transpose(1, 0, 2)]
        if self.kind == "i8":
            parts += [self.scale[:, :length].T[..., None], self.zero[:, :length].T[..., None]]
        heads = self.codes.shape[0]
        return np.concatenate([np.ascontiguousarray(p).view(np.uint8).reshape(length, heads, -1) for p in parts],
                              axis=2)

    def row_dim(self, head_bytes: int) -> int:
        """The head size of snapshot rows of `head_bytes` bytes a head."""
        return (head_bytes - (QUANT_INFO if self.kind == "i8" else 0)) // np.dtype(self.DTYPES[self.kind]).itemsize

    def restore(self, rows: np.ndarray) -> None:
        """Rows as `snapshot` gave them into storage that holds them (after grow)."""
        length, heads, _ = rows.shape
        dtype = np.dtype(self.DTYPES[self.kind])
        dim = self.codes.shape[2]
        width = dim * dtype.itemsize
        self.codes[:, :length] = rows[:, :, :width].copy().view(dtype).transpose(1, 0, 2)
        if self.kind == "i8":
            info = rows[:, :, width:].copy().view(np.float32)  # [length, heads, 2]
            self.scale[:, :length], self.zero[:, :length] = info[..., 0].T, info[..., 1].T


class StoredKVCache(KVCache):
    """A KV cache kept in a StoredKinds. A decode step reads float32 and int8 rows as stored
    (`stored()`, `kernels/decode_attention.py`); a prefill (and fp16 rows) through `dense()`, the
    rows as float32 in a buffer the backend's Attentions share (one layer's worth), laid out as
    HostKVCache's arrays (keys [kv_heads, dim, capacity] when `keys_transposed`)."""

    reservable = True
    saveable = True

    def __init__(self, kv_format: StoredKinds, keys_transposed: bool, scratch: Callable[[str, int], np.ndarray],
                 zeros_for: Callable[[int], Callable]) -> None:
        super().__init__()
        self.format = kv_format
        self.keys_transposed = keys_transposed
        self.keys, self.values = RowStore(kv_format.keys), RowStore(kv_format.values)
        self._scratch, self._zeros_for = scratch, zeros_for
        self._heads = self._dim = 0

    def set_rows(self, heads: int, dim: int) -> None:
        self._heads, self._dim = heads, dim

    def capacity_for(self, need: int) -> int:
        return grown_capacity(need, self.capacity)

    def grow(self, capacity: int) -> None:
        heads, dim = self._heads, self._dim
        zeros = self._zeros_for(self.keys.nbytes(heads, capacity, dim) + self.values.nbytes(heads, capacity, dim))
        for store in (self.keys, self.values):
            store.grow(heads, capacity, dim, self.length, zeros)

    def write(self, k: np.ndarray, v: np.ndarray, seq: int) -> None:
        self.keys.write(k, self.length)
        self.values.write(v, self.length)

    def add(self, k: np.ndarray, v: np.ndarray) -> None:
        """k, v: [seq, kv_heads, dim] float32."""
        self.set_rows(k.shape[1], k.shape[2])
        self.append(k, v, k.shape[0])

    def move(self, src: int, dst: int, count: int) -> None:
        self.keys.move(src, dst, count)
        self.values.move(src, dst, count)

    def dense(self) -> tuple[np.ndarray, np.ndarray]:
        """The cached rows as float32 arrays of the full capacity (the first `length` tokens valid)."""
        heads, capacity, dim = self._heads, self.capacity, self._dim
        size = heads * capacity * dim
        keys = self._scratch("kv_keys", size)[:size].reshape((heads, dim, capacity) if self.keys_transposed
                                                             else (heads, capacity, dim))
        values = self._scratch("kv_values", size)[:size].reshape(heads, capacity, dim)
        self.keys.read(self.length, keys, self.keys_transposed)
        self.values.read(self.length, values)
        return keys, values

    def decodable(self) -> bool:
        """Whether `kernels/decode_attention.py` reads these rows as stored (float32 or int8)."""
        return self.keys.kind != "f16" and self.values.kind != "f16"

    def stored(self) -> tuple[np.ndarray, ...]:
        """Keys' codes, scale, zero, then the values' (scale and zero empty for float32 rows)."""
        empty = np.zeros((0, 0), np.float32)
        return tuple(a if a is not None else empty for store in (self.keys, self.values)
                     for a in (store.codes, store.scale, store.zero))

    def snapshot(self) -> tuple[np.ndarray, np.ndarray]:
        if self.keys.codes is None:
            empty = np.zeros((0, self._heads, 0), np.uint8)
            return empty, empty.copy()
        return self.keys.snapshot(self.length), self.values.snapshot(self.length)

    def restore(self, k: np.ndarray, v: np.ndarray) -> None:
        """Rows as `snapshot` gave them (the same format), or float32 [tokens, kv_heads, dim] to store anew."""
        self.length = 0
        if k.dtype == np.float32:
            self.add(k, v)
            return
        self.set_rows(k.shape[1], self.keys.row_dim(k.shape[2]))
        if self.keys.codes is None or k.shape[0] > self.capacity or self.keys.codes.shape[0] != self._heads:
            self.capacity = self.capacity_for(k.shape[0])
            self.grow(self.capacity)
        self.keys.restore(k)
        self.values.restore(v)
        self.length = k.shape[0]
