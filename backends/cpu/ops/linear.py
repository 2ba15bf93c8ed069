"""Convolution 1x1 as a linear layer. With `memory: "normal"`/`"high"` the weights are dequantized
once to fp32 [oc, ic] at creation (the exact reference), then one BLAS GEMM/GEMV per run; with
`memory: "low"` quantized weights stay packed (`packed_linear.py`)."""
from __future__ import annotations

import numpy as np

from mnnllm_core.core.backend import Execution
from mnnllm_core.express.quant import QuantizedWeight


FEW_ROWS = 64


def finish(out: np.ndarray, bias: np.ndarray | None, relu: bool, relu6: bool) -> None:
    """The convolution's bias and activation, in place."""
    if bias is not None:
        out += bias
    if relu6:
        np.clip(out, 0, 6, out=out)
    elif relu:
        np.maximum(out, 0, out=out)


class LinearExecution(Execution):
    def __init__(self, backend, weight: np.ndarray, bias: np.ndarray | None, relu: bool, relu6: bool):
        super().__init__(backend)
        self.weight = weight  # [oc, ic] float32, shared by clones
        self.bias = bias
        self.relu, self.relu6 = relu, relu6
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
        finish(out, self.bias, self.relu, self.relu6)

    def on_clone(self, backend, op):
        return LinearExecution(backend, self.weight, self.bias, self.relu, self.relu6)


def create_linear(backend, inputs, outputs, op):
    common = op.param.common
    if int(common.kernelX or 1) != 1 or int(common.kernelY or 1) != 1 or int(common.group or 1) != 1:
        return None
    weights = op.weights.convolution()
    bias = None if weights.bias is None or not np.any(weights.bias) else weights.bias.astype(np.float32)
    if isinstance(weights.quantized, QuantizedWeight) and backend.low_memory():
        from .packed_linear import create_packed_linear
        return create_packed_linear(backend, inputs, weights.quantized, bias, bool(common.relu), bool(common.relu6))
    dense = weights.dense if weights.dense is not None else weights.quantized.dequantize()
    dense = np.ascontiguousarray(dense, dtype=np.float32)
    return LinearExecution(backend, dense, bias, bool(common.relu), bool(common.relu6))


CREATORS = {"Convolution": create_linear}
