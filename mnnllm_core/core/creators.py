"""Op-creator prologues every backend would otherwise write again: the weights of a linear layer
(or why it is not one), an Attention run by float kernels (or why not), a norm's weights and a
RoPE's head-norm tables on the device. A backend's creator keeps only what is its own."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .backend import Execution, Refused
from .norm_tables import Constant, HeadNormTables, head_norm_tables
from .op_params import AttentionParams, RoPEParams
from .weights.formats import ConvolutionWeights, linear_weights

LinearMaker = Callable[[Any, list, list, Any, ConvolutionWeights], "Execution | Refused"]


def linear_creator(make: LinearMaker) -> Callable[[Any, list, list, Any], "Execution | Refused"]:
    """The op creator of a Convolution run as a linear layer: `make(backend, inputs, outputs,
    op, weights)` with the op's weights, or the Refused of `linear_weights` (not 1x1, or
    weights packed for another backend)."""

    def create(backend, inputs, outputs, op):
        weights = linear_weights(op)
        return weights if isinstance(weights, Refused) else make(backend, inputs, outputs, op, weights)

    create.__doc__ = make.__doc__
    return create


def float_attention_creator(execution: Callable[[Any, AttentionParams], Execution], sinks: bool = False) -> Callable:
    """The op creator of an Attention the backend runs with float kernels: `execution(backend,
    op.param)`, or Refused with `AttentionParams.float_kernel_refusal`'s reason (`sinks`: the
    kernel adds Attention's sinks to its softmax; without it such an op is refused)."""

    def create(backend, inputs, outputs, op):
        refusal = op.param.float_kernel_refusal(inputs, outputs, sinks=sinks)
        return Refused(refusal) if refusal else execution(backend, op.param)

    return create


def layernorm_weights(op) -> tuple[np.ndarray | None, np.ndarray | None]:
    """A LayerNorm op's gamma and beta; (None, None) once another backend packed them."""
    return op.weights.layernorm() if op.weights is not None else (None, None)


def rope_norm_tables(constant: Constant, params: RoPEParams) -> tuple[HeadNormTables, HeadNormTables]:
    """The q and k head norms of a fused RoPE as `constant` device tables."""
    return head_norm_tables(constant, params.q_norm), head_norm_tables(constant, params.k_norm)
