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
The rules are MNN's; the float arithmetic around them is not, and since quantizing is a step
function an ulp apart flips input codes, which 30 layers amplify. What MNN does, as read in its
current sources (`DenseConvInt8TiledExecutor`, the x86 kernels; 3.6.1's may differ in detail; the
PyPI x86-64 wheel has no AVX512 code, so its AVX2 kernels run even on a VNNI cpu), against ours:
- one row: x*qscale + zero (float add, zero = roundf(-min*255/range) - 128) clamped to
  [-128, 127], then +-0.5 and truncation (`_AVX_MNNFloat2Int8`: half away from zero, after the
  add); ours rounds x*qscale half to even, then adds the integer zero. A range under 1e-7 (1e-6
  in the vector path) gives scale 0, ours only an exact 0.
- the sums: the input is stored as uint8 (q + 128) and the int4 codes as 0..15; per block
  f = float(D) * (weight scale * input scale, one rounded product) + srcKernelSum * (zero - 8 *
  scale, rounded) + the running sum, mul and add rounded apart; the +128 and input zero-point
  terms are subtracted in float through `weightKernelSum` (per row, float sum over blocks of
  code sum * scale + block * zero), folded into the bias once per call. Ours sums (c - 8)(q - zp)
  exactly in int32 and takes fma(scale, float(D) * ds, fma(zero, xsum, acc)).
- several rows: symmetric per row (absmax / 127, absmax under 1e-7: scale 1), as ours past
  FEW_TOKENS; MNN does so from 2 rows on, in tiles of 4 rows (AVX2).
Reproducing MNN low therefore needs its float epilogue op for op (and its rounding), not only
its rules; the path stays opt-in.

Linears reading one input (q/k/v, gate/up) share one call for 1..FEW_TOKENS rows in a replay
(`SharedInt8Input`, `SharedInt8Step`): the input is quantized once and the members' row groups are
split over the threads, and the call is an instruction of the step's compiled program
(`kernels/program.py`), as the fp32 GEMV is. Each member's rows are the bits its own call gives
(the rows of every member go through the same instructions). Run op by op (the first run of a
shape, a prefill) each linear is its own call.
"""
from __future__ import annotations

from functools import partial

import numpy as np

from mnnllm_core.backend_api import Execution

from ..kernels.int8_dot import BoundLinear, Int8Weight, bind, scratch_bytes
from ..kernels.linear import FEW_TOKENS, MEMBERS, PARALLEL_BYTES
from ..replay import SharedGemvStep
from .bias_activation import finish


class SharedInt8Input:
    """The int8 linears reading one input tensor, and the buffers of their shared call (the
    quantized rows, each member's results) for up to FEW_TOKENS rows."""

    def __init__(self, weights: list[Int8Weight]):
        self.weights = weights
        first = weights[0]
        self.scratch = np.empty(scratch_bytes(FEW_TOKENS, first.ic, first.n_blocks), np.uint8)
        self.results = [np.zeros(FEW_TOKENS * w.rows, np.float32) for w in weights]
        self.nbytes = sum(w.nbytes for w in weights)

    def join(self, weight: Int8Weight) -> int | None:
        """Add a member; its index, or None when it cannot share the call."""
        first = self.weights[0]
        if len(self.weights) == MEMBERS or (weight.ic, weight.block, weight.alpha.dtype) != (
                first.ic, first.block, first.alpha.dtype):
            return None
        self.weights.append(weight)
        self.results.append(np.zeros(FEW_TOKENS * weight.rows, np.float32))
        self.nbytes += weight.nbytes
        return len(self.weights) - 1

    def twin(self) -> "SharedInt8Input":
        """The same weights with buffers of their own (for a cloned session)."""
        return SharedInt8Input(list(self.weights))

    def targets(self, tokens: int) -> tuple[np.ndarray, ...]:
        """Each member's result buffer for `tokens` rows ([tokens][padded rows], flat)."""
        return tuple(r[:tokens * w.rows] for r, w in zip(self.results, self.weights))


class SharedInt8Step(SharedGemvStep):
    """`SharedGemvStep` for a SharedInt8Input: x is [tokens, ic] whatever the rows."""

    @property
    def tokens(self) -> int:
        return self.x.shape[0]

    def targets(self) -> tuple[np.ndarray, ...]:
        return self.shared.targets(self.tokens)

    def gemv_call(self):
        shared, tokens = self.shared, self.tokens
        targets = list(self.targets())
        if self.fits:
            targets[self.member] = self.out
        threads = self.threads if shared.nbytes * tokens > PARALLEL_BYTES else 1
        return bind(self.x, False, shared.scratch, shared.weights, targets, threads)


class Int8LinearExecution(Execution):
    def __init__(self, backend, shared: SharedInt8Input, member: int, bias: np.ndarray | None, activation: int):
        super().__init__(backend)
        self.shared, self.member = shared, member
        self.weight, self.bias, self.activation = shared.weights[member], bias, activation
        self.packed_bytes = self.weight.nbytes + (bias.nbytes if bias is not None else 0)

    def on_resize(self, inputs, outputs) -> None:
        x = inputs[0].storage
        tokens = x.shape[0]
        self.x = np.ascontiguousarray(x.reshape(tokens, -1))
        self.copy_in = not np.shares_memory(self.x, x)  # x was not contiguous: copied in each run
        self.source = x.reshape(tokens, -1)
        self.out = outputs[0].storage.reshape(tokens, -1)
        direct = self.weight.oc % 16 == 0 and self.out.flags.c_contiguous
        self.result = self.out if direct else np.empty((tokens, self.weight.rows), np.float32)
        self.threads = threads = self.backend.runtime.thread_num
        threads = threads if self.weight.nbytes * tokens > PARALLEL_BYTES else 1
        self.kernel = BoundLinear(self.weight, self.x, self.result, tokens > FEW_TOKENS, threads).call

    def on_execute(self, inputs, outputs) -> None:
        for step in self._own_steps():
            step()

    def replay_steps(self, inputs, outputs) -> list:
        """Up to FEW_TOKENS rows: this member's part of the shared call (CPUReplay binds it); else
        the quantize-and-multiply call, then its copy and bias/activation."""
        if self.x.shape[0] <= FEW_TOKENS and not self.copy_in and self.out.flags.c_contiguous:
            return [SharedInt8Step(self.shared, self.member, self.x, self.out.reshape(-1), self.bias,
                                   self.activation, self.threads)]
        return self._own_steps()

    def _own_steps(self) -> list:
        """This linear alone: x quantized and multiplied, then its copy and bias/activation."""
        steps = [partial(np.copyto, self.x, self.source)] if self.copy_in else []
        steps.append(self.kernel)
        if self.result is not self.out:
            steps.append(partial(np.copyto, self.out, self.result[:, :self.weight.oc]))
        if self.bias is not None or self.activation:
            steps.append(partial(finish, self.out, self.bias, self.activation))
        return steps

    def on_clone(self, backend, op):
        twins = backend.shared_twins
        twin = twins.get(id(self.shared))
        if twin is None:
            twin = twins[id(self.shared)] = self.shared.twin()
        return Int8LinearExecution(backend, twin, self.member, self.bias, self.activation)


def create_int8_linear(backend, key: int, weight: Int8Weight, bias: np.ndarray | None,
                       activation: int) -> Int8LinearExecution:
    """An int8 linear joining those already reading input tensor `key`."""
    shared = backend.shared_inputs.get(("int8", key))
    member = shared.join(weight) if shared is not None else None
    if member is None:
        shared, member = SharedInt8Input([weight]), 0
        backend.shared_inputs[("int8", key)] = shared
    return Int8LinearExecution(backend, shared, member, bias, activation)
