"""Convolution 1x1 as a linear layer. With `memory: "normal"`/`"high"` the weights are dequantized
once to fp32 [oc, ic] at creation (the exact reference), then one BLAS GEMM/GEMV per run; with
`memory: "low"` quantized weights stay packed (`packed_linear.py`)."""
from __future__ import annotations

from functools import partial

import numpy as np

from mnnllm_core.backend_api import Execution, QuantizedWeight, linear_creator

from .bias_activation import finish

FEW_ROWS = 64
FP32_VERSION = "fp32-oc-ic-1"  # the dequantized [oc, ic] weight, as the weight cache keeps it


class LinearExecution(Execution):
    def __init__(self, backend, weight: np.ndarray, bias: np.ndarray | None, activation: int):
        super().__init__(backend)
        self.weight = weight  # [oc, ic] float32, shared by clones
        self.bias = bias
        self.activation = activation
        self.packed_bytes = weight.nbytes + (bias.nbytes if bias is not None else 0)

    def on_execute(self, inputs, outputs) -> None:
        x = inputs[0].storage
        rows = x.shape[0]
        out = outputs[0].storage.reshape(rows, -1)
        if 1 < rows <= FEW_ROWS:
            # OpenBLAS packs the weight when it is the right-hand side of a GEMM with few rows;
            # as the left-hand side it streams it once (2-3x faster for 2..64 rows)
            out[...] = np.dot(self.weight, x.reshape(rows, -1).T).T
        else:
            np.dot(x.reshape(rows, -1), self.weight.T, out=out)
        finish(out, self.bias, self.activation)

    def replay_steps(self, inputs, outputs) -> list:
        """One row: the GEMV bound to its buffers, as on_execute calls it; else on_execute."""
        x = inputs[0].storage
        if x.shape[0] != 1:
            return super().replay_steps(inputs, outputs)
        out = outputs[0].storage.reshape(1, -1)
        steps = [partial(np.dot, x.reshape(1, -1), self.weight.T, out=out)]
        if self.bias is not None or self.activation:
            steps.append(partial(finish, out, self.bias, self.activation))
        return steps

    def on_clone(self, backend, op):
        return LinearExecution(backend, self.weight, self.bias, self.activation)


@linear_creator
def create_linear(backend, inputs, outputs, op, weights):
    key, cache = f"{op.index}:{op.name}", backend.runtime.weight_cache
    quantized = isinstance(weights.quantized, QuantizedWeight)
    if quantized and backend.low_memory():
        from .packed_linear import create_packed_linear
        return create_packed_linear(backend, inputs, key, weights.quantized, weights.nonzero_bias, op.param.activation)
    if cache is None or not quantized:
        weight = weights.dequantize()
    else:
        weight = cache.arrays(key, FP32_VERSION, lambda: {"weight": weights.dequantize()})["weight"]
    return LinearExecution(backend, weight, weights.nonzero_bias, op.param.activation)


CREATORS = {"Convolution": create_linear}
