"""Convolution 1x1 on packed int4 weights with int8 activations: the opt-in "dynamic quant"
path of memory "low" (backend hint `cpu_int8_activations`, see `runtime.CPUHints`).

MNN's CPU backend runs every quantized linear this way under memory "low" (precision does not
enter: `ConvolutionFloatFactory` picks `DenseConvInt8TiledExecutor` with dynamic quant for
Memory_Low alone); ours stays on the exact fp32 kernels unless the hint asks, since int8
inputs change the results (MNN's own memory-low tokens drift from its fp32 ones). The input is
quantized per token row as MNN does: asymmetric for one row, symmetric ("batch" quant) for
several rows. Here up to FEW_TOKENS rows (a decode step, a speculative verify step) are all
quantized asymmetrically, so that a row gives the same bits alone or with others; only a
longer prefill takes the symmetric rule.
"""
from __future__ import annotations

import numpy as np

from mnnllm_core.backend_api import Execution

from ..kernels.int8_dot import Int8Weight, QuantizedRows, linear
from ..kernels.linear import FEW_TOKENS, PARALLEL_BYTES
from .bias_activation import finish


class Int8LinearExecution(Execution):
    def __init__(self, backend, weight: Int8Weight, bias: np.ndarray | None, activation: int):
        super().__init__(backend)
        self.weight, self.bias, self.activation = weight, bias, activation
        self.rows = QuantizedRows()
        self.packed_bytes = weight.nbytes + (bias.nbytes if bias is not None else 0)

    def on_resize(self, inputs, outputs) -> None:
        x = inputs[0].storage
        self.tokens = x.shape[0]
        self.x = x.reshape(self.tokens, -1)
        self.out = outputs[0].storage.reshape(self.tokens, -1)
        self.result = np.empty((self.tokens, self.weight.rows), np.float32)
        threads = self.backend.runtime.thread_num
        self.threads = threads if self.weight.nbytes * self.tokens > PARALLEL_BYTES else 1

    def on_execute(self, inputs, outputs) -> None:
        x = np.ascontiguousarray(self.x)
        linear(self.weight, self.rows.quantize(x, self.weight.block, self.tokens > FEW_TOKENS), self.result,
               self.threads)
        self.out[:] = self.result[:, :self.weight.oc]
        finish(self.out, self.bias, self.activation)

    def on_clone(self, backend, op):
        return Int8LinearExecution(backend, self.weight, self.bias, self.activation)
