"""MNN's ScheduleInfo: the op list, the tensors and which of them are inputs, outputs and constants.
Building one decodes every op's parameters (`op_params.decode`), once for all its sessions."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .op import Op
from .op_params import decode


@dataclass
class OpNode:
    op: Op
    inputs: list[int]
    outputs: list[int]


@dataclass
class ScheduleInfo:
    """What a Session needs to build its Pipeline; shared (read-only) by clones."""

    nodes: list[OpNode]
    tensor_names: list[str]
    constants: dict[int, np.ndarray] = field(default_factory=dict)
    input_indexes: dict[str, int] = field(default_factory=dict)
    input_dtypes: dict[str, np.dtype] = field(default_factory=dict)
    output_indexes: dict[str, int] = field(default_factory=dict)
    path: str = "<memory>"
    shape_inputs: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        for node in self.nodes:
            node.op.param = decode(node.op)
