"""A KV cache of one float32 row per token: the per-token history a linear attention keeps (LFM2's
B * x, Qwen3.5's recurrence inputs), steered by the KV meta as keys and values are."""
from __future__ import annotations

import numpy as np

from mnnllm_core.backend_api import KVCache


class TokenRows(KVCache):
    """`rows` [capacity, width]: the first `length` are the cached tokens'."""

    def __init__(self, width: int = 0) -> None:
        super().__init__()
        self.rows: np.ndarray | None = None
        self.width = width

    def grow(self, capacity: int) -> None:
        grown = np.zeros((capacity, self.width), np.float32)
        if self.rows is not None:
            grown[:self.length] = self.rows[:self.length]
        self.rows = grown

    def write(self, k: np.ndarray, v, seq: int) -> None:
        self.rows[self.length:self.length + seq] = k

    def add(self, rows: np.ndarray) -> None:
        self.width = rows.shape[1]
        self.append(rows, None, rows.shape[0])
