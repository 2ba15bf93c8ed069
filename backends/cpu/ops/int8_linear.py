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

MNN's memory-low tokens are not reproduced (measured on the shared 135M q4 model, greedy, 64
tokens; PyPI MNN 3.6.1 memory "low" gives exactly `mnn_cpp_q4`): prompt 0 all 8 tokens equal,
prompt 1 first divergence at token 1 (MNN low itself leaves fp32 there), prompt 2 at token 0;
MNN-low logits are 2-5 (max abs) away from ours on either path, as far as from MNN's fp32 ones.
Quantizing every row symmetrically follows MNN low 4 tokens on prompt 1 but changes prompt 2's
first token; so MNN's input quantization is not yet established exactly (per block? rounding?),
and the path stays opt-in.

Each linear is its own call (no q/k/v or gate/up sharing, no fused step programs as on the fp32
path): with 2 threads a 135M decode step is slower than the fp32 path, 1 thread and larger
models gain (`bench/int8_activation_bench.py`).
"""
from __future__ import annotations

from functools import partial

import numpy as np

from mnnllm_core.backend_api import Execution

from ..kernels.int8_dot import BoundLinear, Int8Weight
from ..kernels.linear import FEW_TOKENS, PARALLEL_BYTES
from .bias_activation import finish


class Int8LinearExecution(Execution):
    def __init__(self, backend, weight: Int8Weight, bias: np.ndarray | None, activation: int):
        super().__init__(backend)
        self.weight, self.bias, self.activation = weight, bias, activation
        self.packed_bytes = weight.nbytes + (bias.nbytes if bias is not None else 0)

    def on_resize(self, inputs, outputs) -> None:
        x = inputs[0].storage
        tokens = x.shape[0]
        self.x = np.ascontiguousarray(x.reshape(tokens, -1))
        self.copy_in = not np.shares_memory(self.x, x)  # x was not contiguous: copied in each run
        self.source = x.reshape(tokens, -1)
        self.out = outputs[0].storage.reshape(tokens, -1)
        direct = self.weight.oc % 16 == 0 and self.out.flags.c_contiguous
        self.result = self.out if direct else np.empty((tokens, self.weight.rows), np.float32)
        threads = self.backend.runtime.thread_num
        threads = threads if self.weight.nbytes * tokens > PARALLEL_BYTES else 1
        self.kernel = BoundLinear(self.weight, self.x, self.result, tokens > FEW_TOKENS, threads).call

    def on_execute(self, inputs, outputs) -> None:
        for step in self.replay_steps(inputs, outputs):
            step()

    def replay_steps(self, inputs, outputs) -> list:
        steps = [partial(np.copyto, self.x, self.source)] if self.copy_in else []
        steps.append(self.kernel)
        if self.result is not self.out:
            steps.append(partial(np.copyto, self.out, self.result[:, :self.weight.oc]))
        if self.bias is not None or self.activation:
            steps.append(partial(finish, self.out, self.bias, self.activation))
        return steps

    def on_clone(self, backend, op):
        return Int8LinearExecution(backend, self.weight, self.bias, self.activation)
