"""Rotary position embeddings as transformers computes their inverse frequencies (default, linear, llama3).

The graph turns `position_ids * inv_freq` into the cos/sin tables at run time, so a rope type is
supported exactly when it only changes inv_freq; types that also scale cos/sin or switch with the
sequence length (yarn, longrope, dynamic) are refused by the config reader.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

ROPE_TYPES = ("default", "linear", "llama3", "proportional")


@dataclass(frozen=True)
class RopeSpec:
    """One rotary table: theta and the scaling that transformers applies to its frequencies."""

    theta: float
    kind: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    partial: float = 1.0           # partial_rotary_factor: only the first dims of each head rotate

    def rotary_dim(self, head_dim: int) -> int:
        """How many leading dims of a head rotate (MNN's RoPEParam.ropeCutHeadDim); proportional rope
        rotates the whole head (its tail frequencies are 0)."""
        return head_dim if self.kind == "proportional" else int(head_dim * self.partial)

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
    angles = int(spec.partial * head_dim // 2)
    exponent = np.arange(0, 2 * angles, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    inv = np.zeros(head_dim // 2, np.float32)
    inv[:angles] = np.float32(1.0) / np.power(np.float32(spec.theta), exponent)
    return (inv / np.float32(spec.factor)).astype(np.float32)
