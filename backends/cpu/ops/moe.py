"""MNN's MoE op: each token's hidden state through its top_k experts, weighted by the routing
weights and summed. Inputs: hidden [tokens, hidden], routing weights and expert ids [.., tokens,
top_k]. Each expert (gate_up, down; see MoEExpert) is dequantized once to fp32 at creation;
a run groups the tokens by expert, as MNN's MoEModule does in prefill."""
from __future__ import annotations

import numpy as np

from mnnllm_core.backend_api import Execution, MoEExpert, Refused


class PackedExpert:
    def __init__(self, expert: MoEExpert):
        self.gate_up = expert.gate_up.dequantize()
        self.gate_up_bias = expert.gate_up.nonzero_bias
        self.down = expert.down.dequantize()
        self.down_bias = expert.down.nonzero_bias
        self.inter = expert.intermediate

    def __call__(self, x: np.ndarray) -> np.ndarray:
        h = x @ self.gate_up.T
        if self.gate_up_bias is not None:
            h += self.gate_up_bias
        gate, up = h[:, :self.inter], h[:, self.inter:]
        y = (gate / (1.0 + np.exp(-gate)) * up) @ self.down.T
        return y + self.down_bias if self.down_bias is not None else y


class MoEExecution(Execution):
    def __init__(self, backend, experts: list[PackedExpert], top_k: int):
        super().__init__(backend)
        self.experts, self.top_k = experts, top_k

    def on_execute(self, inputs, outputs) -> None:
        x = inputs[0].storage
        x = x.reshape(-1, x.shape[-1])
        weights = inputs[1].storage.reshape(-1, self.top_k)
        chosen = inputs[2].storage.reshape(-1, self.top_k)
        out = np.zeros_like(x)
        for e in np.unique(chosen):
            tokens, slot = np.nonzero(chosen == e)
            out[tokens] += weights[tokens, slot, None] * self.experts[int(e)](x[tokens])
        outputs[0].storage.reshape(out.shape)[...] = out

    def on_clone(self, backend, op):
        return MoEExecution(backend, self.experts, self.top_k)


def create_moe(backend, inputs, outputs, op):
    if op.weights is None:
        return Refused("its experts were packed for another backend")
    experts = [PackedExpert(e) for e in op.weights.experts()]
    return MoEExecution(backend, experts, op.param.top_k)


CREATORS = {"MoE": create_moe}
