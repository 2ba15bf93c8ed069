"""Norm tables as device kernels take them, shared by the backends whose kernels are alike.

A kernel gets gamma and beta as fp32 buffers (a one-float placeholder when absent) and a flag
word saying which are present. A backend passes its own `constant(array) -> buffer`
(an OpenCL buffer, a Vulkan storage buffer); everything else is decided here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import FormatError
from .op_params import LayerNormParams, NormLayout, QKNorm

Constant = Callable[[np.ndarray], Any]

# flag bits of the layer norm kernels
NORM_RMS, NORM_GAMMA, NORM_BETA, NORM_RESIDUAL = 1, 2, 4, 8
# flag bits of the per-head q/k norm inside the RoPE kernels
HEAD_NORM_ON, HEAD_NORM_RMS, HEAD_NORM_BETA = 1, 2, 4


@dataclass(frozen=True, eq=False)
class NormTables:
    """gamma and beta on the device; `gamma_count`/`beta_count` are 0 for an absent one."""

    gamma: Any
    beta: Any
    gamma_count: int
    beta_count: int


def _table(constant: Constant, values: np.ndarray | None) -> tuple[Any, int]:
    if values is None:
        return constant(np.zeros(1, np.float32)), 0
    values = np.asarray(values, np.float32).reshape(-1)
    return constant(values), int(values.size)


def norm_tables(constant: Constant, gamma: np.ndarray | None, beta: np.ndarray | None) -> NormTables:
    (g, gn), (b, bn) = _table(constant, gamma), _table(constant, beta)
    return NormTables(g, b, gn, bn)


@dataclass(frozen=True)
class NormLaunch:
    """One resize of a LayerNorm kernel: its rows, flags, and which tensors it reads and writes
    (`second` is the residual input, or the input again; `target` receives the norm)."""

    layout: NormLayout
    flags: int
    second: Any
    target: Any


def check_norm_lengths(layout: NormLayout, gamma_count: int, beta_count: int) -> None:
    """A gamma or beta (count 0: absent) of another length than a row is a FormatError: a kernel
    would read past it, numpy would broadcast garbage."""
    for name, count in (("gamma", gamma_count), ("beta", beta_count)):
        if count and count != layout.length:
            raise FormatError(f"LayerNorm {name} has {count} values for rows of {layout.length}", field=name)


def layernorm_launch(param: LayerNormParams, tables: NormTables, inputs: Sequence, outputs: Sequence) -> NormLaunch:
    """The launch for these tensors (see check_norm_lengths)."""
    layout = param.layout(inputs[0].shape)
    check_norm_lengths(layout, tables.gamma_count, tables.beta_count)
    residual = len(inputs) == 2
    flags = (NORM_RMS if param.rms else 0) | (NORM_GAMMA if tables.gamma_count else 0) | \
            (NORM_BETA if tables.beta_count else 0) | (NORM_RESIDUAL if residual else 0)
    return NormLaunch(layout, flags, inputs[1] if residual else inputs[0], outputs[1] if residual else outputs[0])


@dataclass(frozen=True, eq=False)
class HeadNormTables:
    """A RoPE q_norm/k_norm on the device: gamma, beta, eps and the kernel's flags (0: none)."""

    gamma: Any
    beta: Any
    epsilon: float
    flags: int


def head_norm_tables(constant: Constant, norm: QKNorm | None) -> HeadNormTables:
    tables = norm_tables(constant, None if norm is None else norm.gamma, None if norm is None else norm.beta)
    if norm is None:
        return HeadNormTables(tables.gamma, tables.beta, 0.0, 0)
    flags = HEAD_NORM_ON | (HEAD_NORM_RMS if norm.rms else 0) | (HEAD_NORM_BETA if norm.beta is not None else 0)
    return HeadNormTables(tables.gamma, tables.beta, norm.epsilon, flags)
