"""MNN's MoE op: each token's hidden state through its top_k experts, weighted by the routing
weights and summed. Inputs: hidden [tokens, hidden], routing weights and expert ids [.., tokens,
top_k]. Each expert (gate_up, its program on the two halves, down; see MoEExpert) is dequantized
once to fp32 at creation, its program bound to this backend's UnaryOp / BinaryOp functions; a run
groups the tokens by expert, as MNN's MoEModule does in prefill."""
from __future__ import annotations

from typing import Callable

import numpy as np

from mnnllm_core.backend_api import Execution, ExpertProgram, MoEExpert, Refused, step_name

from .elementwise import BINARY, UNARY


class BoundProgram:
    """An expert's program with each step bound to this backend's UnaryOp / BinaryOp function;
    an operand is a slot (0 gate, 1 up, 2 + i step i's result) or a float32 scalar."""

    def __init__(self, steps: list[tuple[Callable, tuple]]):
        self.steps = steps

    def __call__(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        values = [gate, up]
        for function, operands in self.steps:
            values.append(function(*(values[o] if isinstance(o, int) else o for o in operands)))
        return values[-1]


def bind_program(program: ExpertProgram) -> BoundProgram | str:
    """The program bound to this backend's functions, or why a step has none here."""
    slots = {"gate": 0, "up": 1}
    steps = []
    for index, step in enumerate(program):
        function = (UNARY if len(step.operands) == 1 else BINARY).get(step.operation)
        if function is None:
            return f"no {step.operation} kernel for an expert's program"
        steps.append((function, tuple(np.float32(o) if isinstance(o, float) else slots[o] for o in step.operands)))
        slots[step_name(index)] = 2 + index
    return BoundProgram(steps)


class PackedExpert:
    def __init__(self, expert: MoEExpert, activation: BoundProgram):
        self.gate_up = expert.gate_up.dequantize()
        self.gate_up_bias = expert.gate_up.nonzero_bias
        self.down = expert.down.dequantize()
        self.down_bias = expert.down.nonzero_bias
        self.inter = expert.intermediate
        self.activation = activation

    def __call__(self, x: np.ndarray) -> np.ndarray:
        h = x @ self.gate_up.T
        if self.gate_up_bias is not None:
            h += self.gate_up_bias
        y = self.activation(h[:, :self.inter], h[:, self.inter:]) @ self.down.T
        return y + self.down_bias if self.down_bias is not None else y


class MoEExecution(Execution):
    def __init__(self, backend, experts: list[PackedExpert], top_k: int):
        super().__init__(backend)
        self.experts, self.top_k = experts, top_k

    def on_execute(self, inputs, outputs) -> None:
        x = inputs[0].storage
        x = x.reshape(-1, x.shape[-1])
        weights = inputs[1].storage.reshape(-1, self.top_k)
        chosen = inputs[2].storage.reshape(-1, self.top_k)
        out = np.zeros_like(x)
        for e in np.unique(chosen):
            tokens, slot = np.nonzero(chosen == e)
            out[tokens] += weights[tokens, slot, None] * self.experts[int(e)](x[tokens])
        outputs[0].storage.reshape(out.shape)[...] = out

    def on_clone(self, backend, op):
        return MoEExecution(backend, self.experts, self.top_k)


def create_moe(backend, inputs, outputs, op):
    if op.weights is None:
        return Refused("its experts were packed for another backend")
    experts = []
    for expert in op.weights.experts():
        program = bind_program(expert.program)
        if isinstance(program, str):
            return Refused(program)
        experts.append(PackedExpert(expert, program))
    return MoEExecution(backend, experts, op.param.top_k)


CREATORS = {"MoE": create_moe}
