"""What an MoE expert computes between its two Linears, as a small declared program.

MNN's MoEModule runs each expert subgraph as written: gate_up Linear, its output split in halves
(gate, then up), an elementwise expression of the two, the down Linear. Exporters differ only
in the expression: silu(gate) * up (MNN's own), gelu_tanh(gate) * up spelled out in UnaryOp /
BinaryOp / Const ops (Gemma 4), gpt-oss's clamped swiglu (MINIMUM, MAXIMUM, SIGMOID, MUL, ADD
with scalar constants). The loader reads that expression into an `ExpertProgram`, and a backend
evaluates it with its own elementwise kernels, so no activation is fixed in a backend.

A program is a tuple of `ExpertStep`s in evaluation order. Each step applies one of MNN's
UnaryOp or BinaryOp operations (by name) to its operands: "gate", "up", "step{i}" (the result of
an earlier step i) or a float scalar (a float32 constant of the subgraph). The last step's
result is what the down Linear reads.
"""
from __future__ import annotations

from dataclasses import dataclass

Operand = str | float

# The operations an expert program may use: float elementwise ops every backend that runs MoE
# has (the cpu backend's UnaryOp / BinaryOp), no broadcasting beyond a scalar constant.
EXPERT_UNARY = frozenset({"ABS", "NEG", "SQUARE", "SQRT", "RSQRT", "EXP", "RECIPROCAL", "SIGMOID", "TANH",
                          "SILU", "GELU", "GELU_STANDARD", "ERF", "HARDSWISH"})
EXPERT_BINARY = frozenset({"ADD", "SUB", "MUL", "REALDIV", "MAXIMUM", "MINIMUM", "POW", "MUL_SILU"})
HALVES = ("gate", "up")


@dataclass(frozen=True)
class ExpertStep:
    """One operation: MNN's UnaryOp or BinaryOp `operation` name on one or two operands."""

    operation: str
    operands: tuple[Operand, ...]


ExpertProgram = tuple[ExpertStep, ...]


def step_name(index: int) -> str:
    """The operand name of step `index`'s result."""
    return f"step{index}"


# silu(gate) * up: the expert MNN's exporter writes for Qwen3-MoE, Qwen3.5-MoE, LFM2-MoE, ...
SILU_GLU: ExpertProgram = (ExpertStep("SILU", ("gate",)), ExpertStep("MUL", ("up", step_name(0))))

