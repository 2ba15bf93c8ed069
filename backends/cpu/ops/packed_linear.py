"""Convolution 1x1 on packed int4/int8 weights, the cpu backend's `memory: "low"` path.

Weights are packed once at creation (`kernels/layout.py`) and never expanded to fp32 whole:
one token runs the GEMV kernel on the packed bytes, more tokens multiply dequantized tiles
through BLAS. Linears that read the same input tensor (q/k/v, gate/up) share one packed
weight with their rows one after another: for one token the first of them computes every
member's rows in one kernel call and the others copy their slice.
"""
from __future__ import annotations

import numpy as np

from mnnllm_core.core.backend import Execution

from ..kernels.layout import PackedWeight, concatenate, pack
from ..kernels.linear import FEW_TOKENS, gemv, matmul
from ..kernels.simd import GROUP_ROWS


class SharedInput:
    """The packed rows of every linear reading one input tensor, and the one-token result."""

    def __init__(self, weight: PackedWeight):
        self.weight = weight
        self.starts = [0]  # first group of each member
        self.rows = [weight.oc]
        self.result = np.empty(weight.groups * GROUP_ROWS, np.float32)
        self.computed: tuple[int, int] | None = None  # (run, id of the input) the result belongs to

    def accepts(self, weight: PackedWeight) -> bool:
        return self.weight.same_format(weight)

    def join(self, weight: PackedWeight) -> int:
        """Append a member's rows; returns its index."""
        self.starts.append(self.weight.groups)
        self.rows.append(weight.oc)
        self.weight = concatenate([self.weight, weight])
        self.result = np.empty(self.weight.groups * GROUP_ROWS, np.float32)
        return len(self.rows) - 1

    def twin(self) -> "SharedInput":
        """The same weights with a result buffer of its own (for a cloned session)."""
        twin = SharedInput.__new__(SharedInput)
        twin.weight, twin.starts, twin.rows = self.weight, self.starts, self.rows
        twin.result = np.empty_like(self.result)
        twin.computed = None
        return twin

    def member_bytes(self, member: int) -> int:
        groups = -(-self.rows[member] // GROUP_ROWS)
        return self.weight.nbytes * groups // self.weight.groups


class PackedLinearExecution(Execution):
    def __init__(self, backend, shared: SharedInput, member: int, bias: np.ndarray | None, relu: bool,
                 relu6: bool):
        super().__init__(backend)
        self.shared, self.member = shared, member
        self.bias = bias
        self.relu, self.relu6 = relu, relu6
        self.packed_bytes = shared.member_bytes(member) + (bias.nbytes if bias is not None else 0)

    def on_execute(self, inputs, outputs) -> None:
        x = inputs[0].storage
        tokens = x.shape[0]
        out = outputs[0].storage.reshape(tokens, -1)
        shared, threads = self.shared, self.backend.runtime.thread_num
        rows, first = shared.rows[self.member], shared.starts[self.member]
        if tokens == 1:
            key = (self.backend.run_count, id(x))
            if shared.computed != key:  # the first member of this run computes every member's rows
                gemv(shared.weight, x.reshape(-1), shared.result, 0, shared.weight.groups, threads)
                shared.computed = key
            out[0] = shared.result[first * GROUP_ROWS:first * GROUP_ROWS + rows]
        elif tokens <= FEW_TOKENS:
            shared.computed = None
            last = first + -(-rows // GROUP_ROWS)
            for t in range(tokens):
                gemv(shared.weight, x[t].reshape(-1), shared.result, first, last, threads)
                out[t] = shared.result[:rows]
        else:
            matmul(shared.weight, x.reshape(tokens, -1), out, first, threads)
        if self.bias is not None:
            out += self.bias
        if self.relu6:
            np.clip(out, 0, 6, out=out)
        elif self.relu:
            np.maximum(out, 0, out=out)

    def on_clone(self, backend, op):
        twins = backend.shared_twins
        twin = twins.get(id(self.shared))
        if twin is None:
            twin = twins[id(self.shared)] = self.shared.twin()
        return PackedLinearExecution(backend, twin, self.member, self.bias, self.relu, self.relu6)


def create_packed_linear(backend, inputs, weight, bias, relu: bool, relu6: bool) -> PackedLinearExecution:
    """Pack `weight` (a QuantizedWeight) and join the linears already reading the same input."""
    packed = pack(weight)
    key = inputs[0].index
    shared = backend.shared_inputs.get(key)
    if shared is not None and shared.accepts(packed):
        member = shared.join(packed)
    else:
        shared, member = SharedInput(packed), 0
        backend.shared_inputs[key] = shared
    return PackedLinearExecution(backend, shared, member, bias, relu, relu6)
