"""Independent float64 references and small builders shared by the backend op tests."""
from __future__ import annotations

import math

import numpy as np

from mnnllm_core.express.quant import QuantizedWeight
from mnnllm_core.schema.MNN.Convolution2D import Convolution2DT
from mnnllm_core.schema.MNN.Convolution2DCommon import Convolution2DCommonT


def conv_param(oc: int, ic: int, relu: bool = False, relu6: bool = False) -> Convolution2DT:
    common = Convolution2DCommonT()
    common.outputCount, common.inputCount, common.relu, common.relu6 = oc, ic, relu, relu6
    param = Convolution2DT()
    param.common = common
    return param


def quantize(weight: np.ndarray, bits: int, block: int) -> tuple[QuantizedWeight, np.ndarray]:
    """A small asymmetric block quantizer in MNN's layout: codes MSB-first (high nibble first
    for 4 bits), value = code - 2^(bits-1), w = value * scale + zero per (row, block).
    Returns the QuantizedWeight and its float64 dequantization, computed here."""
    oc, ic = weight.shape
    blocks = weight.astype(np.float64).reshape(oc, ic // block, block)
    low, high = blocks.min(axis=-1), blocks.max(axis=-1)
    levels, offset = (1 << bits) - 1, 1 << (bits - 1)
    scale = (np.maximum(high - low, 1e-6) / levels).astype(np.float32)
    zero = (low + offset * scale.astype(np.float64)).astype(np.float32)
    codes = np.rint((blocks - zero[..., None]) / scale[..., None]) + offset
    codes = np.clip(codes, 0, levels).astype(np.uint8).reshape(-1)
    packed = (codes[0::2] << 4) | codes[1::2] if bits == 4 else codes
    reference = ((codes.reshape(oc, ic // block, block).astype(np.float64) - offset) * scale[..., None]
                 + zero[..., None]).reshape(oc, ic)
    return QuantizedWeight(bits=bits, block_size=block, oc=oc, ic=ic, packed=packed, zero=zero, scale=scale), reference


def linear_reference(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    rows = x.shape[0]
    y = x.reshape(rows, -1).astype(np.float64) @ weight.astype(np.float64).T
    return y + bias if bias is not None else y


def rope_tables(positions: np.ndarray, rope_dim: int, base: float = 10000.0) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin [1, seq, 1, rope_dim] as the exporter feeds them: cat(freqs, freqs)."""
    inv = 1.0 / base ** (np.arange(0, rope_dim, 2, dtype=np.float64) / rope_dim)
    angles = positions[:, None].astype(np.float64) * inv[None, :]
    emb = np.concatenate([angles, angles], axis=-1)
    shape = (1, len(positions), 1, rope_dim)
    return np.cos(emb).reshape(shape).astype(np.float32), np.sin(emb).reshape(shape).astype(np.float32)


def attention_reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float | None = None,
                        bias: np.ndarray | None = None, causal_offset: int | None = 0) -> np.ndarray:
    """q [seq, heads, dim], k/v [total, kv_heads, dim] -> [seq, heads, dim]. Query i sits at
    position causal_offset + i (None: no causal mask); bias [seq, total] is added."""
    seq, heads, dim = q.shape
    total, kv_heads, _ = k.shape
    group = heads // kv_heads
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    out = np.empty((seq, heads, dim))
    for h in range(heads):
        scores = q[:, h].astype(np.float64) @ k[:, h // group].astype(np.float64).T * scale
        if bias is not None:
            scores = scores + bias
        if causal_offset is not None:
            allowed = np.arange(total)[None, :] <= causal_offset + np.arange(seq)[:, None]
            scores = np.where(allowed, scores, -np.inf)
        p = np.exp(scores - scores.max(axis=-1, keepdims=True))
        out[:, h] = (p / p.sum(axis=-1, keepdims=True)) @ v[:, h // group].astype(np.float64)
    return out
