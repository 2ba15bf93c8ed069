"""Independent float64 references of every op the suite checks, and a small block quantizer
in MNN's layout. Nothing here uses a backend: the numbers come from numpy in float64."""
from __future__ import annotations

import math

import numpy as np

from ..core.weights.formats import QuantizedWeight


def quantize(weight: np.ndarray, bits: int, block: int,
             symmetric: bool = False) -> tuple[QuantizedWeight, np.ndarray]:
    """A small block quantizer in MNN's layout: codes MSB-first (high nibble first for 4 bits, a
    bit stream for 2 and 3), value = code - 2^(bits-1), w = value * scale + zero per (row, block),
    zero 0 when symmetric. Returns the QuantizedWeight and its float64 dequantization, computed here."""
    oc, ic = weight.shape
    blocks = weight.astype(np.float64).reshape(oc, ic // block, block)
    low, high = blocks.min(axis=-1), blocks.max(axis=-1)
    levels, offset = (1 << bits) - 1, 1 << (bits - 1)
    if symmetric:
        scale = (np.maximum(np.abs(blocks).max(axis=-1), 1e-6) / (offset - 1)).astype(np.float32)
        zero = np.zeros_like(scale)
    else:
        scale = (np.maximum(high - low, 1e-6) / levels).astype(np.float32)
        zero = (low + offset * scale.astype(np.float64)).astype(np.float32)
    codes = np.rint((blocks - zero[..., None]) / scale[..., None]) + offset
    codes = np.clip(codes, 0, levels).astype(np.uint8).reshape(-1)
    if bits == 4:
        packed = (codes[0::2] << 4) | codes[1::2]
    elif bits == 8:
        packed = codes
    else:
        packed = np.packbits(np.unpackbits(codes[:, None], axis=1)[:, 8 - bits:].reshape(-1))
    reference = ((codes.reshape(oc, ic // block, block).astype(np.float64) - offset) * scale[..., None]
                 + zero[..., None]).reshape(oc, ic)
    return QuantizedWeight(bits=bits, block_size=block, oc=oc, ic=ic, packed=packed, zero=zero, scale=scale), reference


def linear_reference(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    rows = x.shape[0]
    y = x.reshape(rows, -1).astype(np.float64) @ weight.astype(np.float64).T
    return y + bias if bias is not None else y


def norm_reference(x: np.ndarray, gamma, beta, eps: float, rms: bool) -> np.ndarray:
    """LayerNorm (RMSNorm when rms) over the last axis."""
    x = x.astype(np.float64)
    if rms:
        y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    else:
        centered = x - x.mean(axis=-1, keepdims=True)
        y = centered / np.sqrt(np.mean(centered * centered, axis=-1, keepdims=True) + eps)
    if gamma is not None:
        y = y * gamma
    return y + beta if beta is not None else y


def rope_tables(positions: np.ndarray, rope_dim: int, base: float = 10000.0) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin [1, seq, 1, rope_dim] as the exporter feeds them: cat(freqs, freqs)."""
    inv = 1.0 / base ** (np.arange(0, rope_dim, 2, dtype=np.float64) / rope_dim)
    angles = positions[:, None].astype(np.float64) * inv[None, :]
    emb = np.concatenate([angles, angles], axis=-1)
    shape = (1, len(positions), 1, rope_dim)
    return np.cos(emb).reshape(shape).astype(np.float32), np.sin(emb).reshape(shape).astype(np.float32)


def rope_reference(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, rope_dim: int) -> np.ndarray:
    """HF's rotate_half on the first rope_dim dims; the rest pass through. x [seq, heads, dim]."""
    x = x.astype(np.float64)
    c = cos.reshape(cos.shape[1], 1, -1)[..., :rope_dim].astype(np.float64)
    s = sin.reshape(sin.shape[1], 1, -1)[..., :rope_dim].astype(np.float64)
    rot, rest = x[..., :rope_dim], x[..., rope_dim:]
    half = rope_dim // 2
    rotated_half = np.concatenate([-rot[..., half:], rot[..., :half]], axis=-1)
    return np.concatenate([rot * c + rotated_half * s, rest], axis=-1)


def attention_reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float | None = None,
                        bias: np.ndarray | None = None, causal_offset: int | None = 0,
                        sinks: np.ndarray | None = None) -> np.ndarray:
    """q [seq, heads, dim], k/v [total, kv_heads, dim] -> [seq, heads, dim]. Query i sits at
    position causal_offset + i (None: no causal mask); bias [seq, total] is added; sinks [heads]
    (one logit per head) join every row's softmax as an extra column that is then dropped."""
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
        if sinks is not None:
            scores = np.concatenate([scores, np.full((seq, 1), float(sinks[h]))], axis=-1)
        p = np.exp(scores - scores.max(axis=-1, keepdims=True))
        p = p / p.sum(axis=-1, keepdims=True)
        out[:, h] = p[:, :total] @ v[:, h // group].astype(np.float64)
    return out


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf)(x)


def c_round(x: np.ndarray) -> np.ndarray:
    """roundf: halves away from zero (MNN's UnaryRound)."""
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


FLOAT_BINARY = {
    "ADD": np.add, "SUB": np.subtract, "MUL": np.multiply, "REALDIV": np.divide, "DIV": np.divide,
    "MAXIMUM": np.maximum, "MINIMUM": np.minimum, "MAX_TEMP": np.maximum, "MIN_TEMP": np.minimum,
    "SquaredDifference": lambda a, b: (a - b) ** 2, "ATAN2": np.arctan2, "POW": np.power,
    "FLOORDIV": lambda a, b: np.floor(a / b), "FLOORMOD": lambda a, b: a - np.floor(a / b) * b,
    "MOD": np.fmod,  # MNN: fmodf for floats, the sign follows the dividend
    "MUL_SILU": lambda a, b: a * silu(b),  # the exporter feeds (up, gate)
}
COMPARISON = {"GREATER": np.greater, "GREATER_EQUAL": np.greater_equal, "LESS": np.less,
              "LESS_EQUAL": np.less_equal, "EQUAL": np.equal, "NOTEQUAL": np.not_equal}
INT_BINARY = {
    "ADD": np.add, "SUB": np.subtract, "MUL": np.multiply, "FLOORDIV": np.floor_divide,
    "MAXIMUM": np.maximum, "MINIMUM": np.minimum, "SquaredDifference": lambda a, b: (a - b) ** 2,
    "BITWISE_AND": np.bitwise_and, "BITWISE_OR": np.bitwise_or, "BITWISE_XOR": np.bitwise_xor,
    "LOGICALOR": lambda a, b: ((a != 0) | (b != 0)).astype(np.int32),
    "LOGICALXOR": lambda a, b: ((a != 0) ^ (b != 0)).astype(np.int32),
}
UNARY = {  # operation: (reference, input domain)
    "ABS": (np.abs, "any"), "NEG": (np.negative, "any"), "FLOOR": (np.floor, "any"), "CEIL": (np.ceil, "any"),
    "SQUARE": (np.square, "any"), "SQRT": (np.sqrt, "positive"), "RSQRT": (lambda x: 1 / np.sqrt(x), "positive"),
    "EXP": (np.exp, "any"), "LOG": (np.log, "positive"), "SIN": (np.sin, "any"), "COS": (np.cos, "any"),
    "TAN": (np.tan, "unit"), "ASIN": (np.arcsin, "unit"), "ACOS": (np.arccos, "unit"), "ATAN": (np.arctan, "any"),
    "RECIPROCAL": (lambda x: 1 / x, "positive"), "LOG1P": (np.log1p, "positive"),
    "BNLL": (lambda x: np.log1p(np.exp(x)), "any"), "ACOSH": (np.arccosh, "above_one"), "SINH": (np.sinh, "any"),
    "ASINH": (np.arcsinh, "any"), "ATANH": (np.arctanh, "unit"), "SIGN": (np.sign, "any"),
    "ROUND": (c_round, "any"), "COSH": (np.cosh, "any"), "EXPM1": (np.expm1, "any"),
    "SIGMOID": (lambda x: 1 / (1 + np.exp(-x)), "any"), "TANH": (np.tanh, "any"),
    "HARDSWISH": (lambda x: x * np.clip(x + 3, 0, 6) / 6, "any"), "SILU": (silu, "any"),
    "GELU": (lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))), "any"),
    "GELU_STANDARD": (lambda x: 0.5 * x * (1 + erf(x / math.sqrt(2))), "any"), "ERF": (erf, "any"),
}
REDUCTIONS = {
    "SUM": np.sum, "MEAN": np.mean, "MAXIMUM": np.max, "MINIMUM": np.min, "PROD": np.prod,
    "ASUM": lambda x, axis, keepdims: np.sum(np.abs(x), axis=axis, keepdims=keepdims),
    "SUMSQ": lambda x, axis, keepdims: np.sum(x * x, axis=axis, keepdims=keepdims),
}
