"""Convolution 1x1 on packed int4 weights with int8 activations: the opt-in "dynamic quant"
path of memory "low" (backend hint `cpu_int8_activations`, see `runtime.CPUHints`).

MNN's CPU backend runs every quantized linear this way under memory "low" (precision does not
enter: `ConvolutionFloatFactory` picks `DenseConvInt8TiledExecutor` with dynamic quant for
Memory_Low alone); ours stays on the exact fp32 kernels unless the hint asks, since int8
inputs change the results (MNN's own memory-low tokens drift from its fp32 ones). The input is
quantized per token row with MNN's one-row rule (asymmetric) whatever the number of rows: MNN
takes a symmetric ("batch") rule from 2 rows on, so its rows' bits depend on the rows beside
them; ours do not, so a decode step, a speculative verify step, a prefill and a continuous
batch's step (decode rows beside prompt chunks, llm/batch_engine.py) give each row the bits it
gives alone (the symmetric rule past FEW_TOKENS rows, as MNN, made a batched stream's tokens
differ from the stream alone on 3 of 5 prompts: issue #33).

What MNN 3.6.1 (PyPI, x86-64: its AVX2 kernels) does, measured op by op on one int4 linear by
`bench/mnn_int8_linear_probe.py` (MNN's Module API, memory code 2: pymnn ignores the string
"low" there) against this path:
- one row: asymmetric with a float zero point zp = -min * 255 / range - 128 (not rounded),
  x * 255 / range + zp clamped then rounded half away from zero. Ours does exactly this, so
  the input codes are MNN's: a 576 -> 64/1024 linear is 1-2e-5 (max abs) from MNN low, against
  5e-2 with a rounded zero point (and 4e-2 between MNN low and MNN fp32).
- several rows: symmetric per row (absmax / 127) from 2 rows on, hint or not; so MNN gives a
  row other bits alone than among others (0 of 64 outputs equal). Ours keeps the one-row
  quantization for every row (a row's bits do not depend on the rows beside it): its codes are
  not MNN's there (the kernels' symmetric rule, `int8_dot.quantize_rows`, gives MNN's codes,
  3e-5 apart, but no op takes it).
- the float epilogue, not reproduced bit for bit: the input is uint8 u = q + 128, the codes
  0..15, D = sum c * u per block; on a one-block linear with exactly representable inputs
  (scale 1/64, zp -128) MNN gives fl(fl(D * scale) * ds) + fl(ds * sum u * (zero - 8 * scale))
  (no FMA) for 98-99.6% of its outputs, the rest 1 ulp of those terms away (as if the weight
  bias zero - 8 * scale were 1 ulp off for a few rows: not explained). A fractional zero
  point adds a per-block term I = fl(-(zp + 128) * ds * (sum of the block's weights)), after
  those two: with inputs chosen so that ds, zp and I's factors are exact (scale 1/128, zp
  -126.5), fl(fl(P + X) + I) is 96-98% of MNN's outputs. On random inputs the same order, with
  every variant tried of how ds, the block sum of u and I are rounded, is 2-5% bit-equal
  (1.6e-6 mean from MNN where the exact sum is 1.2e-5 away): how MNN rounds ds * (...) there
  is the part not found.
Ours sums (c - 8) q exactly in int32 per block and takes fma(scale, (float(E) - zp * (csum - 8 *
block)) * ds, fma(zero, xsum, acc)): within a few ulps of MNN's terms, not their bits.
The model amplifies what is left: on the shared 135M q4 model one token's logits move by up to
1.0 for a relative noise of 1e-7 on its embedding row (4.7 for 1e-6), since a quantized input
code flips at an ulp. So with the linear 2e-5 from MNN, MNN-low logits are still 2-4 (max abs)
from ours (1-token forward 3.3; MNN low to MNN fp32: 2-6) and the greedy tokens are not MNN's
`mnn_cpp_q4` beyond prompt 0 (prompt 1 first differs at token 1, prompt 2 at token 0): only a
bit-exact epilogue (and bit-exact other ops) could give them. The path stays opt-in.

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
from ..kernels.linear import FEW_TOKENS, MEMBERS, parallel_pays
from ..replay import SharedGemvStep
from .bias_activation import finish


class SharedInt8Input:
    """The int8 linears reading one input tensor, and the buffers of their shared call (the
    quantized rows, each member's results) for up to FEW_TOKENS rows."""

    def __init__(self, weights: list[Int8Weight], threads: int = 1):
        self.weights, self.threads = weights, threads
        first = weights[0]
        # a copy of the quantized rows per thread: each rank of a thread team quantizes its own
        # (`int8_dot.own_rows`), so no rank waits on another before its rows
        self.scratch = np.empty(max(1, threads) * scratch_bytes(FEW_TOKENS, first.ic, first.n_blocks), np.uint8)
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
        return SharedInt8Input(list(self.weights), self.threads)

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
        threads = self.threads if parallel_pays(shared.nbytes, tokens) else 1
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
        threads = threads if parallel_pays(self.weight.nbytes, tokens) else 1
        self.kernel = BoundLinear(self.weight, self.x, self.result, False, threads).call  # asymmetric: see above

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
        shared, member = SharedInt8Input([weight], backend.runtime.thread_num), 0
        backend.shared_inputs[("int8", key)] = shared
    return Int8LinearExecution(backend, shared, member, bias, activation)
