"""The experts of MNN's MoE op: subgraphs of the Net named "/expert/{layer_id}_{e}".

MNN runs each expert subgraph as a module of its own (MoEModule). Exporters write every expert
as one Linear gate_up [2 * inter, hidden], its output sliced in halves on the last axis (gate,
then up), an elementwise expression of the halves, one Linear down [hidden, inter]. We follow
the subgraph's data flow from its input to its output, check that shape, and read the
expression into an `ExpertProgram` (see core/expert_program.py); the backend gets the two
Linears' weights (read from the weight file on demand) and the program, so the MoE op is packed
and run by a backend like any weighted op. An expert of another shape, or an expression with
an operation outside the expert operations, is an UnsupportedError.
"""
from __future__ import annotations

from ...errors import FormatError, UnsupportedError
from ...schema.reader import op_type_name
from ..expert_program import EXPERT_BINARY, EXPERT_UNARY, HALVES, ExpertProgram, ExpertStep, step_name
from ..op_params import BINARY_NAMES, UNARY_NAMES, MoEParams
from .const_blob import blob_to_array
from .file import ExternalWeightFile
from .formats import MoEExpert
from .op_weights import OpWeights

LAYOUT_OPS = {"Reshape", "ConvertTensor"}  # a Linear's input and output pass through these unchanged in value


def _text(value) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else (value or "")


class ExpertWeights:
    """The `WeightReader` of one MoE op: `experts()` reads each expert's two Linears."""

    def __init__(self, linears: list[tuple[OpWeights, OpWeights]], programs: list[ExpertProgram]):
        self.linears = linears
        self.programs = programs

    def experts(self) -> list[MoEExpert]:
        return [MoEExpert(gate_up.convolution(), down.convolution(), program)
                for (gate_up, down), program in zip(self.linears, self.programs)]

    def release(self) -> None:
        for pair in self.linears:
            for reader in pair:
                reader.release()


class _ExpertGraph:
    """One expert subgraph, read: its two Linears and its program."""

    def __init__(self, graph, weight_file: ExternalWeightFile | None, path: str):
        self.name = _text(graph.name)
        self.path = path
        self.weight_file = weight_file
        self.nodes = list(graph.nodes or [])
        self.producer = {int(t): op for op in self.nodes for t in (op.outputIndexes or [])}
        self.inputs = [int(t) for t in (graph.inputs if graph.inputs is not None else [])]
        self.outputs = [int(t) for t in (graph.outputs if graph.outputs is not None else [])]
        self.steps: list[ExpertStep] = []
        self.operands: dict[int, str | float] = {}

    def unsupported(self, what: str) -> UnsupportedError:
        return UnsupportedError(f"MoE expert {self.name!r}: {what}", file=self.path, field="subgraphs")

    def _type(self, op) -> str:
        return op_type_name(op.type)

    def _through_layout(self, tensor: int) -> int:
        """The tensor `tensor` is a Reshape / ConvertTensor chain of."""
        op = self.producer.get(tensor)
        while op is not None and self._type(op) in LAYOUT_OPS:
            tensor = int(op.inputIndexes[0])
            op = self.producer.get(tensor)
        return tensor

    def read(self) -> tuple[tuple[OpWeights, OpWeights], ExpertProgram]:
        if len(self.inputs) != 1 or len(self.outputs) != 1:
            raise self.unsupported(f"{len(self.inputs)} inputs and {len(self.outputs)} outputs, not one each")
        down = self.producer.get(self._through_layout(self.outputs[0]))
        if down is None or self._type(down) != "Convolution":
            raise self.unsupported("its output does not come from a Linear (down)")
        halves_of = self._through_layout(int(down.inputIndexes[0]))
        convolutions = [op for op in self.nodes if self._type(op) == "Convolution"]
        if len(convolutions) != 2:
            raise self.unsupported(f"{len(convolutions)} Linears, not gate_up and down")
        gate_up = next(op for op in convolutions if op is not down)
        gate_up_out = int(gate_up.outputIndexes[0])
        if self._through_layout(int(gate_up.inputIndexes[0])) != self.inputs[0]:
            raise self.unsupported("gate_up does not read the expert's input")
        hidden, inter = int(gate_up.main.common.inputCount), int(down.main.common.inputCount)
        if int(gate_up.main.common.outputCount) != 2 * inter or int(down.main.common.outputCount) != hidden:
            raise FormatError(f"MoE expert {self.name!r}: gate_up is [{gate_up.main.common.outputCount}, {hidden}], "
                              f"down [{down.main.common.outputCount}, {inter}]", file=self.path, field="subgraphs")
        self._find_halves(gate_up_out, inter)
        if isinstance(self._operand(halves_of), float):
            raise self.unsupported("down reads a constant")
        if not self.steps:
            raise self.unsupported("down reads one half of gate_up as it is, without an activation")
        linears = tuple(OpWeights(_text(op.name), op.main, self.weight_file, self.path) for op in (gate_up, down))
        return linears, tuple(self.steps)

    def _const_int(self, tensor: int) -> int | None:
        """The one int32 value of a Const tensor, or None when the tensor is computed."""
        op = self.producer.get(tensor)
        if op is None or self._type(op) != "Const" or op.main.int32s is None or len(op.main.int32s) != 1:
            return None
        return int(op.main.int32s[0])

    def _find_halves(self, gate_up_out: int, inter: int) -> None:
        """Name the two StridedSlices of gate_up's output "gate" (begin 0) and "up" (from where the gate
        ends). A constant split must be `inter` and a constant end of up 2 * inter; MNN's exporter
        computes both from gate_up's shape (the split is the same tensor in both slices)."""
        slices = [op for op in self.nodes if self._type(op) == "StridedSlice"
                  and self._through_layout(int(op.inputIndexes[0])) == gate_up_out]
        if len(slices) != 2 or any(len(op.inputIndexes) < 4 for op in slices):
            raise self.unsupported(f"{len(slices)} slices of gate_up, not its two halves")
        for op in slices:
            masks = (getattr(op.main, m, 0) for m in ("beginMask", "endMask", "ellipsisMask", "newAxisMask",
                                                       "shrinkAxisMask"))
            if int(getattr(op.main, "fromType", 0)) != 1 or any(masks):  # 1: ONNX Slice (data, starts, ends, axes)
                raise self.unsupported(f"slice {_text(op.name)!r} of gate_up is not a Slice (starts, ends, axes)")
            if self._const_int(int(op.inputIndexes[3])) != -1 or (
                    len(op.inputIndexes) > 4 and self._const_int(int(op.inputIndexes[4])) != 1):
                raise self.unsupported(f"slice {_text(op.name)!r} of gate_up is not on its last axis with step 1")
        starts = [self._const_int(int(op.inputIndexes[1])) for op in slices]
        if starts.count(0) != 1:
            raise self.unsupported("no slice of gate_up is its first half (begin 0)")
        gate, up = slices if starts[0] == 0 else slices[::-1]
        split = int(gate.inputIndexes[2])
        if int(up.inputIndexes[1]) != split and self._const_int(int(up.inputIndexes[1])) != inter:
            raise self.unsupported("up does not start where gate ends")
        bounds = {"gate end": (self._const_int(split), inter),
                  "up begin": (self._const_int(int(up.inputIndexes[1])), inter),
                  "up end": (self._const_int(int(up.inputIndexes[2])), 2 * inter)}
        for what, (value, expected) in bounds.items():
            if value is not None and value != expected:
                raise self.unsupported(f"the {what} of gate_up's halves is {value}, not {expected}")
        for op, half in zip((gate, up), HALVES):
            self.operands[int(op.outputIndexes[0])] = half

    def _operand(self, tensor: int) -> str | float:
        """The operand that computes `tensor`: a half, a scalar constant, or a step (appended,
        after the steps of its own operands)."""
        if tensor in self.operands:
            return self.operands[tensor]
        op = self.producer.get(tensor)
        if op is None:
            raise self.unsupported(f"the expression reads tensor {tensor}, which no op of the expert computes")
        op_type = self._type(op)
        if op_type == "Const":
            value = blob_to_array(op.main, _text(op.name), self.weight_file, self.path)
            if value.size != 1 or value.dtype.kind != "f":
                raise self.unsupported(f"Const {_text(op.name)!r} in the expression is not one float")
            operand: str | float = float(value.reshape(-1)[0])
        elif op_type in ("UnaryOp", "BinaryOp"):
            operand = self._step(op, op_type)
        else:
            raise self.unsupported(f"{op_type} op {_text(op.name)!r} in the expression between gate_up and down "
                                   f"(an expert computes UnaryOp {sorted(EXPERT_UNARY)} and BinaryOp "
                                   f"{sorted(EXPERT_BINARY)} of gate, up and scalar constants)")
        self.operands[tensor] = operand
        return operand

    def _step(self, op, op_type: str) -> str:
        if op_type == "UnaryOp":
            operation, known, arity = UNARY_NAMES.get(int(op.main.opType)), EXPERT_UNARY, 1
        else:
            operation, known, arity = BINARY_NAMES.get(int(op.main.opType)), EXPERT_BINARY, 2
            if int(getattr(op.main, "activationType", 0) or 0):
                raise self.unsupported(f"BinaryOp {_text(op.name)!r} has a fused activation")
        if operation not in known:
            raise self.unsupported(f"{op_type} {operation or op.main.opType} ({_text(op.name)!r}) is not one of "
                                   f"the operations an expert computes: {sorted(known)}")
        if len(op.inputIndexes) != arity:
            raise self.unsupported(f"{op_type} {_text(op.name)!r} has {len(op.inputIndexes)} inputs")
        operands = tuple(self._operand(int(t)) for t in op.inputIndexes)
        if all(isinstance(o, float) for o in operands):
            raise self.unsupported(f"{op_type} {_text(op.name)!r} computes a constant")
        self.steps.append(ExpertStep(operation, operands))
        return step_name(len(self.steps) - 1)


def expert_weights(net, params: MoEParams, op_name: str, weight_file: ExternalWeightFile | None,
                   path: str) -> ExpertWeights:
    """The reader of the experts of one MoE op; a missing expert subgraph is a FormatError."""
    graphs = {_text(g.name): g for g in (net.subgraphs or [])}
    linears, programs = [], []
    for e in range(params.num_experts):
        key = f"/expert/{params.layer_id}_{e}"
        if key not in graphs:
            raise FormatError(f"MoE op {op_name!r} needs subgraph {key!r}, which the net lacks", file=path,
                              field="subgraphs")
        pair, program = _ExpertGraph(graphs[key], weight_file, path).read()
        linears.append(pair)
        programs.append(program)
    return ExpertWeights(linears, programs)
