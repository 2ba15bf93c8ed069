"""An op as handed to a backend: MNN's type name, its parameter table, and its weights."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(eq=False)
class Op:
    """A backend sees `type` (MNN's OpType name: "Convolution", "RoPE", "Raster", ...),
    `param` (the op's parameter table from llm.mnn, or a core-made one such as
    `RasterParam`), and `weights`, a reader of the op's external data (None once a
    static module has packed them: `rearrange` drops the raw weights)."""

    type: str
    name: str
    param: Any = None
    index: int = -1
    weights: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"Op({self.type} {self.name!r})"
