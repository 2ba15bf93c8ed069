"""Rotary position embeddings as transformers computes their inverse frequencies (default, linear, llama3,
yarn, proportional).

The graph turns `position_ids * inv_freq` into the cos/sin tables at run time, so a rope type is
supported when it changes inv_freq and at most scales cos/sin by a constant (YaRN's attention factor:
the graph multiplies the table by it); types that switch with the sequence length (longrope, dynamic)
are refused by the config reader.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

ROPE_TYPES = ("default", "linear", "llama3", "proportional")  # and "yarn" where an architecture asks for it (gpt-oss)


@dataclass(frozen=True)
class RopeSpec:
    """One rotary table: theta and the scaling that transformers applies to its frequencies."""

    theta: float
    kind: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    partial_rotary_factor: float = 1.0  # Phi, Qwen3.5: only the leading int(head_dim * factor) dims of a head rotate
    beta_fast: float = 32.0        # yarn: the rotations bounding the blend of scaled and unscaled frequencies
    beta_slow: float = 1.0
    truncate: bool = True          # yarn: round that blend's bounds outwards to whole dims
    attention_factor: float = 1.0  # yarn: cos and sin are multiplied by it

    def rotary_dim(self, head_dim: int) -> int:
        """How many leading dims of each head rotate (even; MNN's RoPEParam.ropeCutHeadDim); proportional
        rope rotates the whole head (its tail frequencies are 0)."""
        if self.kind == "proportional":
            return head_dim
        return int(head_dim * self.partial_rotary_factor) // 2 * 2

    def inv_freq(self, head_dim: int) -> np.ndarray:
        """fp32 [rotary_dim / 2], computed in fp32 like transformers' rope init functions."""
        if self.kind == "proportional":
            return _proportional(self, head_dim)
        dim = self.rotary_dim(head_dim)
        exponent = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
        inv = (np.float32(1.0) / np.power(np.float32(self.theta), exponent)).astype(np.float32)
        if self.kind == "linear":
            return (inv / np.float32(self.factor)).astype(np.float32)
        if self.kind == "llama3":
            return _llama3(inv, self)
        if self.kind == "yarn":
            return _yarn(np.power(np.float32(self.theta), exponent).astype(np.float32), dim, self)
        return inv


def _llama3(inv: np.ndarray, spec: RopeSpec) -> np.ndarray:
    """Llama 3.1's rule: long wavelengths divided by `factor`, short ones kept, a smooth blend between."""
    old = float(spec.original_max_position_embeddings)
    low_wavelen = old / spec.low_freq_factor
    high_wavelen = old / spec.high_freq_factor
    wavelen = np.float32(2 * math.pi) / inv
    scaled = np.where(wavelen > low_wavelen, inv / np.float32(spec.factor), inv).astype(np.float32)
    smooth = ((old / wavelen - spec.low_freq_factor) / (spec.high_freq_factor - spec.low_freq_factor)).astype(np.float32)
    blended = (1 - smooth) * scaled / np.float32(spec.factor) + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, blended, scaled).astype(np.float32)


def _proportional(spec: RopeSpec, head_dim: int) -> np.ndarray:
    """Gemma 4's rule: the first partial * head_dim / 2 frequencies spaced over the whole head
    (theta^(-2j / head_dim)), the rest 0 (those dims pass unrotated), all divided by `factor`."""
    angles = int(spec.partial_rotary_factor * head_dim // 2)
    exponent = np.arange(0, 2 * angles, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    inv = np.zeros(head_dim // 2, np.float32)
    inv[:angles] = np.float32(1.0) / np.power(np.float32(spec.theta), exponent)
    return (inv / np.float32(spec.factor)).astype(np.float32)


def _yarn(pos_freqs: np.ndarray, dim: int, spec: RopeSpec) -> np.ndarray:
    """YaRN: frequencies below the ramp divided by `factor`, above it kept, blended linearly across the
    dims whose wavelengths make between beta_slow and beta_fast turns in the original context."""
    def correction_dim(turns: float) -> float:
        wavelengths = spec.original_max_position_embeddings / (turns * 2 * math.pi)
        return dim * math.log(wavelengths) / (2 * math.log(spec.theta))

    low, high = correction_dim(spec.beta_fast), correction_dim(spec.beta_slow)
    if spec.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - np.float32(low)) / np.float32(high - low), 0, 1)
    keep = (np.float32(1) - ramp).astype(np.float32)
    extrapolation = (np.float32(1) / pos_freqs).astype(np.float32)
    interpolation = (np.float32(1) / (np.float32(spec.factor) * pos_freqs)).astype(np.float32)
    return (interpolation * (np.float32(1) - keep) + extrapolation * keep).astype(np.float32)


def yarn_attention_factor(factor: float, mscale: float | None, mscale_all_dim: float | None) -> float:
    """transformers' default YaRN attention factor (0.1 ln(factor) + 1, or the mscale ratio)."""
    def get(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if mscale and mscale_all_dim:
        return get(factor, mscale) / get(factor, mscale_all_dim)
    return get(factor)
