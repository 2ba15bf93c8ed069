"""A tensor as the pipeline sees it: shape, dtype, and the storage its backend gave it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(eq=False)
class Tensor:
    """One value of the graph.

    `host` holds the value when it is known on the host at resize time (constants,
    Shape/Rank results and everything folded from them). `storage` is whatever the
    owning backend allocated for it (a numpy array on the cpu backend, a buffer on a GPU);
    `backend` is that Backend (backend.py, which builds on this file, not the other way).
    """

    index: int
    name: str
    shape: tuple[int, ...] = ()
    dtype: np.dtype = field(default_factory=lambda: np.dtype(np.float32))
    host: np.ndarray | None = None
    backend: Any = None
    storage: Any = None

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def is_constant(self) -> bool:
        return self.host is not None

    def __repr__(self) -> str:
        where = self.backend.name if self.backend is not None else "host" if self.host is not None else "-"
        return f"Tensor({self.index} {self.name!r} {self.shape} {self.dtype} on {where})"
