"""The experts of MNN's MoE op: subgraphs of the Net named "/expert/{layer_id}_{e}".

MNN runs each expert subgraph as a module of its own (MoEModule). Its exporter writes every
expert the same way: one Linear gate_up [2 * inter, hidden], the first half through SILU
times the second half, one Linear down [hidden, inter]. We check that shape of the subgraph
and hand the backend the two Linears' weights (read from the weight file on demand), so the
MoE op is packed and run by a backend like any weighted op. Any other expert is refused.
"""
from __future__ import annotations

from collections import Counter

from ..core.op_params import UNARY_NAMES, MoEParams
from ..core.weights import MoEExpert
from ..errors import FormatError, UnsupportedError
from ..schema.reader import op_type_name
from .op_weights import OpWeights
from .weight_file import ExternalWeightFile



def _text(value) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else (value or "")


class ExpertWeights:
    """The `WeightReader` of one MoE op: `experts()` reads each expert's two Linears."""

    def __init__(self, linears: list[tuple[OpWeights, OpWeights]]):
        self.linears = linears

    def experts(self) -> list[MoEExpert]:
        return [MoEExpert(gate_up.convolution(), down.convolution()) for gate_up, down in self.linears]

    def release(self) -> None:
        for pair in self.linears:
            for reader in pair:
                reader.release()


def _expert_linears(graph, weight_file: ExternalWeightFile | None, path: str) -> tuple[OpWeights, OpWeights]:
    """The gate_up and down Linears of one expert subgraph, after checking it computes
    down(silu(gate) * up) with the gate the first half of gate_up."""
    name = _text(graph.name)
    nodes = list(graph.nodes or [])
    types = Counter(op_type_name(op.type) for op in nodes)
    silu = [op for op in nodes if op_type_name(op.type) == "UnaryOp"
            and UNARY_NAMES.get(int(op.main.opType)) == "SILU"]
    convolutions = [op for op in nodes if op_type_name(op.type) == "Convolution"]
    if types["Convolution"] != 2 or len(silu) != 1 or types["UnaryOp"] != 1:
        raise UnsupportedError(f"MoE expert {name!r} is not gate_up -> silu(gate) * up -> down "
                               f"(ops {dict(types)})", file=path, field="subgraphs")
    producer = {t: op for op in nodes for t in (op.outputIndexes or [])}
    gate = producer.get(int(silu[0].inputIndexes[0]))
    begin = producer.get(int(gate.inputIndexes[1])) if gate is not None and len(gate.inputIndexes) > 1 else None
    if gate is None or op_type_name(gate.type) != "StridedSlice" or begin is None \
            or op_type_name(begin.type) != "Const" or begin.main.int32s is None or list(begin.main.int32s) != [0]:
        raise UnsupportedError(f"MoE expert {name!r}: SILU does not take the first half of gate_up",
                               file=path, field="subgraphs")
    gate_up, down = convolutions
    hidden, inter = int(gate_up.main.common.inputCount), int(down.main.common.inputCount)
    if int(gate_up.main.common.outputCount) != 2 * inter or int(down.main.common.outputCount) != hidden:
        raise FormatError(f"MoE expert {name!r}: gate_up is [{gate_up.main.common.outputCount}, {hidden}], "
                          f"down [{down.main.common.outputCount}, {inter}]", file=path, field="subgraphs")
    return tuple(OpWeights(_text(op.name), op.main, weight_file, path) for op in (gate_up, down))


def expert_weights(net, params: MoEParams, op_name: str, weight_file: ExternalWeightFile | None,
                   path: str) -> ExpertWeights:
    """The reader of the experts of one MoE op; a missing expert subgraph is a FormatError."""
    graphs = {_text(g.name): g for g in (net.subgraphs or [])}
    linears = []
    for e in range(params.num_experts):
        key = f"/expert/{params.layer_id}_{e}"
        if key not in graphs:
            raise FormatError(f"MoE op {op_name!r} needs subgraph {key!r}, which the net lacks", file=path,
                              field="subgraphs")
        linears.append(_expert_linears(graphs[key], weight_file, path))
    return ExpertWeights(linears)
