"""Run one op (or a few) through the real core path on any backend.

A test describes a tiny graph; the harness turns it into a `ScheduleInfo` and runs it with
`StaticModule` on a `RuntimeManager`, so shape inference, folding of host-known values,
geometry lowering to Raster, placement (with fallback to cpu) and the Execution all run
exactly as they do for a model loaded from disk.

    result = run_op(Op("BinaryOp", "add", param=BinaryParams("ADD")), [a, Const(b)])
    result.outputs[0], result.command_types  # ["BinaryOp"]

Inputs given as arrays are fed at run time; `Const(array)` makes a constant tensor
(known at resize, so it may be folded or used as a shape argument).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Sequence

import numpy as np

from ..core.backend import BackendConfig, ScheduleConfig
from ..core.op import Op
from ..core.schedule import OpNode, ScheduleInfo
from ..core.weights.formats import ConvolutionWeights, FloatWeight, MoEExpert
from ..express.pipeline_module import _shape_inputs
from ..express.runtime_manager import RuntimeManager
from ..express.static_module import Config, StaticModule


@dataclass(frozen=True)
class Const:
    """A constant input: its value is known when the graph is resized."""

    value: np.ndarray


@dataclass(frozen=True)
class Again:
    """The same graph input as an earlier position (an op reading one tensor twice)."""

    index: int


@dataclass
class Weights:
    """Stands in for an op's weight reader (`OpWeights`): what a backend's creator packs."""

    conv: ConvolutionWeights | None = None
    gamma: np.ndarray | None = None
    beta: np.ndarray | None = None
    moe: list[MoEExpert] | None = None

    def convolution(self) -> ConvolutionWeights:
        assert self.conv is not None
        return self.conv

    def layernorm(self) -> tuple[np.ndarray | None, np.ndarray | None]:
        return self.gamma, self.beta

    def experts(self) -> list[MoEExpert]:
        assert self.moe is not None
        return self.moe

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


def new_runtime(backend: str = "cpu", thread_num: int = 2, precision: str = "normal",
                hints: dict[str, Any] | None = None, memory: str = "normal") -> RuntimeManager:
    """A runtime of its own (with its own KV meta) on `backend`."""
    config = ScheduleConfig(backend_type=backend, thread_num=thread_num,
                            backend_config=BackendConfig(precision=precision, memory=memory))
    return RuntimeManager.create(config, hints)


@lru_cache(maxsize=1)
def shared_runtime() -> RuntimeManager:
    """One cpu runtime for stateless ops (Attention tests make their own: it holds the KV meta)."""
    return new_runtime()


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


def one_op_graph(op: Op, inputs: Sequence[np.ndarray | Const | Again], outputs: int = 1) -> tuple[ScheduleInfo, dict]:
    """The schedule of `op` alone and its feeds: arrays are graph inputs in0, in1, ...,
    `Const`s constant tensors, `Again(k)` the k-th input once more."""
    graph = Graph()
    feeds, indexes = {}, []
    for k, value in enumerate(inputs):
        if isinstance(value, Const):
            indexes.append(graph.const(value.value))
        elif isinstance(value, Again):
            indexes.append(indexes[value.index])
        else:
            array = np.asarray(value)
            name = f"in{k}"
            indexes.append(graph.input(name, array.dtype))
            feeds[name] = array
    produced = graph.add(op, indexes, outputs)
    return graph.schedule(produced), feeds


def run_op(op: Op, inputs: Sequence[np.ndarray | Const], outputs: int = 1,
           runtime: RuntimeManager | None = None) -> OpResult:
    """Run `op` on these inputs: arrays are graph inputs (fed), `Const`s constant tensors."""
    info, feeds = one_op_graph(op, inputs, outputs)
    module = make_module(info, runtime)
    return OpResult(module.forward(feeds), module)
