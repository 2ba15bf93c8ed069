"""How a device backend stores its KV cache rows, from MNN's `attention_mode` (a runtime hint).

MNN reads attention_mode as two parts: `mode // 8` chooses flash attention (1) or not (0), and
`mode % 8` the KV quantization: 0 none, 1 keys int8, 2 keys and values quantized (here both
int8, one format for both). A backend declares the modes it honours (its RuntimeCreator's
`attention_modes`, passed to `kv_format`); `kv_format` maps a mode to a storage format and logs,
once per backend and value, each part it ignores (what then runs instead).

Formats (`KVFormat.name`): "float", the rows as the activations are (fp32, or fp16 where the
backend stores activations as fp16); "fp16"; "int8": per (token, kv head) symmetric int8 with one
float32 scale (max |x| / 127), a token's row being kv_heads * head_dim int8 then its kv_heads
scales, so keys and values have rows of one size and the cache's copies, moves, growth and
snapshots (the prefix cache) work on raw rows whatever the format.
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


def kv_format(backend: str, attention_mode: int, fp16: bool = False,
              honoured: frozenset[int] = KVFormat.honoured) -> KVFormat:
    """The storage for `attention_mode` (keys and values int8 for quant 2 where the backend
    `honoured` mode 10, else fp16 when `fp16`, else float), the ignored parts logged: keys-only
    int8 (quant 1) runs unquantized, the non-flash modes run the backend's flash (online softmax)
    kernels, unknown values run as 8."""
    quant, flash = attention_mode % 8, attention_mode // 8
    ignored = []
    if attention_mode < 0 or flash > 1 or quant > 2:
        ignored.append(f"{attention_mode} is no MNN attention_mode (runs as 8: flash, no KV quantization)")
        quant, flash = 0, 1
    if quant == 1:
        ignored.append("keys-only int8 (quant 1): keys and values stay unquantized (mode 10 quantizes both)")
        quant = 0
    if quant == 2 and 10 not in honoured:
        ignored.append("int8 keys and values (quant 2): not implemented here, the cache stays unquantized")
        quant = 0
    if flash == 0:
        ignored.append("attention without flash: the kernels always use an online softmax (same result)")
    key = (backend, attention_mode)
    if ignored and key not in _REPORTED:
        _REPORTED.add(key)
        log.info("backend %s ignores part of attention_mode=%d: %s (it honours: %s)", backend, attention_mode,
                 "; ".join(ignored), ", ".join(str(m) for m in sorted(honoured)))
    return KVFormat("int8" if quant == 2 else "fp16" if fp16 else "float")


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
