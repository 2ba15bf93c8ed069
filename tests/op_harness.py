"""Run one op (or a few) through the real core path on the cpu backend.

A test describes a tiny graph; the harness turns it into a `ScheduleInfo` and runs it
with `StaticModule` on a cpu `RuntimeManager`, so shape inference (SizeComputer),
folding of host-known values, geometry lowering to Raster and the Execution all run
exactly as they do for a model loaded from disk.

    result = run_op(Op("BinaryOp", "add", BinaryOpT(), extra={"operation": "ADD"}), [a, Const(b)])
    result.outputs[0], result.command_types  # ["BinaryOp"]

Inputs given as arrays are fed at run time; `Const(array)` makes a constant tensor
(known at resize, so it may be folded or used as a shape argument).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Sequence

import numpy as np

from mnnllm_core.core.backend import ScheduleConfig
from mnnllm_core.core.op import Op
from mnnllm_core.core.schedule import OpNode, ScheduleInfo
from mnnllm_core.express.op_weights import ConvolutionWeights
from mnnllm_core.express.pipeline_module import _shape_inputs
from mnnllm_core.express.quant import FloatWeight
from mnnllm_core.express.runtime_manager import RuntimeManager
from mnnllm_core.express.static_module import Config, StaticModule


@dataclass(frozen=True)
class Const:
    """A constant input: its value is known when the graph is resized."""

    value: np.ndarray


@dataclass
class Weights:
    """Stands in for an op's weight reader (`OpWeights`): what a backend's creator packs."""

    conv: ConvolutionWeights | None = None
    gamma: np.ndarray | None = None
    beta: np.ndarray | None = None

    def convolution(self) -> ConvolutionWeights:
        assert self.conv is not None
        return self.conv

    def layernorm(self) -> tuple[np.ndarray | None, np.ndarray | None]:
        return self.gamma, self.beta

    @classmethod
    def dense(cls, weight: np.ndarray, bias: np.ndarray | None = None) -> "Weights":
        oc, ic = weight.shape
        return cls(conv=ConvolutionWeights(FloatWeight(oc, ic, np.asarray(weight, np.float32)), bias))


class Graph:
    """A tiny graph under construction: tensors by index, ops in execution order."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.nodes: list[OpNode] = []
        self.constants: dict[int, np.ndarray] = {}
        self.inputs: dict[str, int] = {}
        self.dtypes: dict[str, np.dtype] = {}

    def _tensor(self, name: str) -> int:
        self.names.append(name)
        return len(self.names) - 1

    def input(self, name: str, dtype: Any = np.float32) -> int:
        index = self._tensor(name)
        self.inputs[name] = index
        self.dtypes[name] = np.dtype(dtype)
        return index

    def const(self, value: np.ndarray) -> int:
        index = self._tensor(f"const{len(self.names)}")
        self.constants[index] = np.asarray(value)
        return index

    def add(self, op: Op, inputs: Sequence[int], outputs: int = 1) -> list[int]:
        op.index = len(self.nodes)
        produced = [self._tensor(f"{op.name}:{k}") for k in range(outputs)]
        self.nodes.append(OpNode(op, list(inputs), produced))
        return produced

    def schedule(self, outputs: Sequence[int]) -> ScheduleInfo:
        """Outputs are named out0, out1, ... in the order given. Inputs that reach a shape
        argument are marked the way PipelineModule marks them."""
        info = ScheduleInfo(self.nodes, self.names, dict(self.constants), dict(self.inputs), dict(self.dtypes),
                            {f"out{k}": t for k, t in enumerate(outputs)})
        info.shape_inputs = _shape_inputs(info)
        return info


@lru_cache(maxsize=1)
def shared_runtime() -> RuntimeManager:
    """One cpu runtime for stateless ops (Attention tests make their own: it holds the KV meta)."""
    return new_runtime()


def new_runtime(thread_num: int = 2) -> RuntimeManager:
    return RuntimeManager.create(ScheduleConfig(backend_type="cpu", thread_num=thread_num))


def make_module(info: ScheduleInfo, runtime: RuntimeManager | None = None, **config: Any) -> StaticModule:
    return StaticModule(info, runtime or shared_runtime(), Config(rearrange=True, **config))


@dataclass
class OpResult:
    outputs: list[np.ndarray]
    module: StaticModule

    @property
    def command_types(self) -> list[str]:
        """The op types the pipeline encoded (after lowering and folding), in order."""
        return [c.op.type for c in self.module.session.pipeline.commands]

    @property
    def placement(self) -> dict:
        return self.module.session.pipeline.placement.summary()


def run_op(op: Op, inputs: Sequence[np.ndarray | Const], outputs: int = 1,
           runtime: RuntimeManager | None = None) -> OpResult:
    """Run `op` on these inputs: arrays are graph inputs (fed), `Const`s constant tensors."""
    graph = Graph()
    feeds, indexes = {}, []
    for k, value in enumerate(inputs):
        if isinstance(value, Const):
            indexes.append(graph.const(value.value))
        else:
            array = np.asarray(value)
            name = f"in{k}"
            indexes.append(graph.input(name, array.dtype))
            feeds[name] = array
    produced = graph.add(op, indexes, outputs)
    module = make_module(graph.schedule(produced), runtime)
    return OpResult(module.forward(feeds), module)
