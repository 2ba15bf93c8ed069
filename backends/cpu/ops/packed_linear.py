"""Convolution 1x1 on packed int4/int8 weights, the cpu backend's `memory: "low"` path.

Weights are packed once at creation (`kernels/layout.py`) and never expanded to fp32 whole:
one token runs the GEMV kernel on the packed bytes, 2..FEW_TOKENS tokens (a speculative verify
step) the few-token GEMV that reads each packed byte once for all of them, more tokens multiply
dequantized panels (`kernels/linear.py`). Linears that read the same input tensor (q/k/v,
gate/up) share one GEMV: the first of them to run computes every member's rows in one kernel
call and the others copy their result.
"""
from __future__ import annotations

import numpy as np

from mnnllm_core.backend_api import Execution

from ..kernels.layout import LAYOUT_VERSION, PackedWeight, pack
from ..kernels.linear import FEW_TOKENS, MEMBERS, Gemv, matmul
from .bias_activation import finish


class SharedInput:
    """The packed linears reading one input tensor, and their GEMV results."""

    def __init__(self, weights: list[PackedWeight]):
        self.weights = weights
        self.gemv = Gemv(weights)
        self.computed: tuple[int, int, int] | None = None  # (run, id of the input, tokens) of `latest`
        self.latest: list[np.ndarray] = []

    def join(self, weight: PackedWeight) -> int | None:
        """Add a member; its index, or None when it cannot share this GEMV."""
        if len(self.weights) == MEMBERS or not weight.same_format(self.weights[0]):
            return None
        self.weights.append(weight)
        self.gemv = Gemv(self.weights)
        return len(self.weights) - 1

    def twin(self) -> "SharedInput":
        """The same weights with result buffers of their own (for a cloned session)."""
        return SharedInput(self.weights)

    def results(self, x: np.ndarray, source: int, run: int, threads: int) -> list[np.ndarray]:
        """Every member's rows for x ([tokens, ic] with 1..FEW_TOKENS tokens, a view of the input
        storage `source` identifies), computed once per run: [padded rows] for one token, else
        [tokens, padded rows]."""
        tokens = x.shape[0]
        key = (run, source, tokens)
        if self.computed != key:
            self.latest = self.gemv(x[0], threads) if tokens == 1 else self.gemv.few(x, threads)
            self.computed = key
        return self.latest


class PackedLinearExecution(Execution):
    row_wise = True  # past FEW_TOKENS rows every row is the GEMM's, blocked from the first row

    def __init__(self, backend, shared: SharedInput, member: int, bias: np.ndarray | None, activation: int):
        super().__init__(backend)
        self.shared, self.member = shared, member
        self.weight = shared.weights[member]
        self.bias = bias
        self.activation = activation
        self.packed_bytes = self.weight.nbytes + (bias.nbytes if bias is not None else 0)

    def on_resize(self, inputs, outputs) -> None:
        x = inputs[0].storage  # storages stay put until the next resize
        self.tokens = x.shape[0]
        self.x = x.reshape(self.tokens, -1)
        self.out = outputs[0].storage.reshape(self.tokens, -1)
        self.threads = self.backend.runtime.thread_num
        self.source = id(x)
        if 1 < self.tokens <= FEW_TOKENS:  # a speculative or short step: its kernels load on first need
            self.backend.runtime.load_kernels("few_tokens")

    def on_execute(self, inputs, outputs) -> None:
        tokens, x, out, rows = self.tokens, self.x, self.out, self.weight.oc
        if tokens <= FEW_TOKENS:
            result = self.shared.results(x, self.source, self.backend.run_count, self.threads)[self.member]
            out[:] = result[..., :rows]
        else:
            matmul(self.weight, x, out, self.threads)
        finish(out, self.bias, self.activation)

    def replay_steps(self, inputs, outputs) -> list:
        """Up to FEW_TOKENS tokens: this member's part of the shared GEMV (CPUReplay binds it);
        else on_execute."""
        if self.tokens > FEW_TOKENS or not self.x.flags.c_contiguous:
            return super().replay_steps(inputs, outputs)
        from ..replay import SharedGemvStep
        x = self.x[0] if self.tokens == 1 else self.x
        return [SharedGemvStep(self.shared, self.member, x, self.out.reshape(-1), self.bias, self.activation,
                               self.threads)]

    def on_clone(self, backend, op):
        twins = backend.shared_twins
        twin = twins.get(id(self.shared))
        if twin is None:
            twin = twins[id(self.shared)] = self.shared.twin()
        return PackedLinearExecution(backend, twin, self.member, self.bias, self.activation)


def create_packed_linear(backend, inputs, name: str, weight, bias, activation: int) -> Execution:
    """Pack `weight` (a QuantizedWeight of op `name`; with use_mmap, map the pack an earlier load
    kept) and join the linears already reading the same input; with the hint
    `cpu_int8_activations` (on a cpu with AVX512-VNNI, 4-bit codes) the int8-activation linear."""
    cache, spread = backend.runtime.weight_cache, backend.runtime.host_threads.run  # packed on thread_num threads
    if cache is None:
        packed = pack(weight, spread)
    else:
        packed = PackedWeight.from_arrays(cache.arrays(name, LAYOUT_VERSION, lambda: pack(weight, spread).arrays()))
    key = inputs[0].index
    if backend.runtime.hints.cpu_int8_activations:
        from ..kernels import int8_dot
        if int8_dot.supported() and int8_dot.can_repack(packed):
            from .int8_linear import create_int8_linear
            return create_int8_linear(backend, key, int8_dot.repack(packed), bias, activation)
    shared = backend.shared_inputs.get(key)
    member = shared.join(packed) if shared is not None else None
    if member is None:
        shared, member = SharedInput([packed]), 0
        backend.shared_inputs[key] = shared
    return PackedLinearExecution(backend, shared, member, bias, activation)
