"""An op as handed to a backend: MNN's type name, its decoded parameters, and its weights."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(eq=False)
class Op:
    """A backend reads `type` (MNN's OpType name: "Convolution", "RoPE", "Raster", ...),
    `param` (the op's parameters as a typed dataclass of `mnnllm_core.core.op_params`,
    decoded once when the schedule is built; None for ops that have none) and `weights`,
    a `WeightReader` of the op's weights (None once a static module has packed them:
    `rearrange` drops the raw weights).

    `table` (MNN's flatbuffer parameter table) and `extra` (what the loader read beside it:
    the op's tensor format, the attention heads of the RoPE feeding it) are the core's: shape
    inference and geometry read them, and `op_params.decode` turns them into `param`."""

    type: str
    name: str
    table: Any = None
    index: int = -1
    weights: Any = None
    extra: dict[str, Any] = field(default_factory=dict)
    param: Any = None

    def __repr__(self) -> str:
        return f"Op({self.type} {self.name!r})"
