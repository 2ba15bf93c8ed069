"""MNN's `attention_mode` read once for every backend, and how a device backend stores its KV rows.

MNN reads attention_mode as two parts (CPUAttention): `mode // 8 == 1` asks for flash attention,
`mode % 8` for int8 KV: 1 keys, 2 keys and, with the flash bit, values too (so 10 quantizes both,
2 only the keys). `AttentionMode.of` gives those parts; values outside them (MNN's newer quantized
modes) are not `known` and run as 8. Each backend keeps what it can and reports the rest through
`report_ignored`, once per backend and value, with what runs instead.

Device formats (`KVFormat.name`, `kv_format`): "float", the rows as the activations are (fp32, or
fp16 where the backend stores activations as fp16); "fp16"; "int8": per (token, kv head) symmetric
int8 with one float32 scale (max |x| / 127), a token's row being kv_heads * head_dim int8 then its
kv_heads scales, so keys and values have rows of one size and the cache's copies, moves, growth and
snapshots (the prefix cache) work on raw rows whatever the format. (The cpu backend keeps keys and
values as separate arrays, so it can quantize either alone: backends/cpu/kv_storage.py.)
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

log = logging.getLogger(__name__)

_REPORTED: set[tuple[str, int]] = set()


@dataclass(frozen=True)
class KVFormat:
    name: str  # "float" | "fp16" | "int8"

    # the attention_mode values a backend with all these formats honours whole
    honoured = frozenset({8, 10})

    def row_bytes(self, kv_heads: int, dim: int, float_bytes: int) -> int:
        """Bytes of one token's keys (or values); `float_bytes`: an activation's size."""
        if self.name == "int8":
            return kv_heads * (dim + 4)
        return kv_heads * dim * (2 if self.name == "fp16" else float_bytes)


@dataclass(frozen=True)
class AttentionMode:
    """The parts of one attention_mode value (see the module's docstring)."""

    value: int
    flash: bool
    int8_keys: bool
    int8_values: bool
    known: bool

    @classmethod
    def of(cls, mode: int) -> "AttentionMode":
        quant, flash = mode % 8, mode // 8
        if mode < 0 or flash > 1 or quant > 2:
            return cls(mode, True, False, False, False)
        return cls(mode, flash == 1, quant >= 1, quant == 2 and flash == 1, True)

    def unknown_reason(self) -> list[str]:
        """The ignored part for a value outside MNN's two parts, else nothing."""
        return [] if self.known else [f"{self.value} is not flash (8) plus int8 keys (1) or keys and values (2): "
                                      "runs as 8 (flash, no KV quantization)"]


def report_ignored(backend: str, mode: int, ignored: list[str], honoured: frozenset[int]) -> None:
    """Log, once per backend and value, the parts of attention_mode `mode` the backend ignores."""
    key = (backend, mode)
    if ignored and key not in _REPORTED:
        _REPORTED.add(key)
        log.info("backend %s ignores part of attention_mode=%d: %s (it honours: %s)", backend, mode,
                 "; ".join(ignored), ", ".join(str(m) for m in sorted(honoured)))


def kv_format(backend: str, attention_mode: int, fp16: bool = False,
              honoured: frozenset[int] = KVFormat.honoured) -> KVFormat:
    """The storage for `attention_mode` on a backend whose keys and values share one format: int8
    for both where it `honoured` mode 10, else fp16 when `fp16`, else float; the rest is reported
    as ignored (int8 keys alone run unquantized; without the flash bit the kernels still use an
    online softmax, which gives the same result)."""
    mode = AttentionMode.of(attention_mode)
    ignored = mode.unknown_reason()
    int8 = mode.int8_keys and mode.int8_values
    if mode.int8_keys and not mode.int8_values:
        ignored.append("keys-only int8: keys and values stay unquantized (mode 10 quantizes both)")
    if int8 and 10 not in honoured:
        ignored.append("int8 keys and values: not implemented here, the cache stays unquantized")
        int8 = False
    if not mode.flash:
        ignored.append("attention without flash: the kernels always use an online softmax (same result)")
    report_ignored(backend, attention_mode, ignored, honoured)
    return KVFormat("int8" if int8 else "fp16" if fp16 else "float")


def quantize_int8_rows(x: np.ndarray) -> np.ndarray:
    """float [tokens, kv_heads, dim] -> the int8 format's raw rows, uint8 [tokens, kv_heads * (dim + 4)]
    (the reference the device kernels are tested against)."""
    x = np.asarray(x, np.float32)
    top = np.abs(x).max(axis=2, keepdims=True)
    inverse = np.where(top > 0, np.float32(127.0) / np.where(top > 0, top, 1), 0).astype(np.float32)
    q = np.clip(np.rint(x * inverse), -127, 127).astype(np.int8)
    scales = (top[..., 0] / np.float32(127.0)).astype(np.float32)
    return np.concatenate([q.reshape(len(x), -1).view(np.uint8), scales.view(np.uint8).reshape(len(x), -1)], axis=1)


def dequantize_int8_rows(rows: np.ndarray, kv_heads: int, dim: int) -> np.ndarray:
    """The int8 format's raw rows back to float32 [tokens, kv_heads, dim]."""
    rows = np.ascontiguousarray(rows, np.uint8)
    q = rows[:, :kv_heads * dim].view(np.int8).reshape(len(rows), kv_heads, dim).astype(np.float32)
    scales = rows[:, kv_heads * dim:].copy().view(np.float32).reshape(len(rows), kv_heads, 1)
    return q * scales
