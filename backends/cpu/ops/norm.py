"""LayerNorm / RMSNorm, including MNN's fused residual form (two inputs: out0 = a + b,
out1 = norm(out0)) and group norm."""
from __future__ import annotations

import numpy as np

from mnnllm_core.backend_api import Execution, LayerNormParams, check_norm_lengths


def normalize(x: np.ndarray, gamma, beta, eps: float, rms: bool) -> np.ndarray:
    """Normalize over the last axis in fp32."""
    if rms:
        y = x / np.sqrt(np.mean(np.square(x), axis=-1, keepdims=True) + eps)
    else:
        mean = np.mean(x, axis=-1, keepdims=True)
        centered = x - mean
        y = centered / np.sqrt(np.mean(np.square(centered), axis=-1, keepdims=True) + eps)
    if gamma is not None:
        y = y * gamma
    if beta is not None:
        y = y + beta
    return y


class LayerNormExecution(Execution):
    def __init__(self, backend, params: LayerNormParams, gamma, beta):
        super().__init__(backend)
        self.params = params
        self.gamma, self.beta = gamma, beta
        self.packed_bytes = sum(a.nbytes for a in (gamma, beta) if a is not None)

    def on_resize(self, inputs, outputs) -> None:
        check_norm_lengths(self.params.layout(inputs[0].shape), *(0 if a is None else a.size
                                                                  for a in (self.gamma, self.beta)))

    def on_execute(self, inputs, outputs) -> None:
        p = self.params
        x = inputs[0].storage
        if len(inputs) == 2:
            outputs[0].storage[...] = x + inputs[1].storage
            x, target = outputs[0].storage, outputs[1].storage
        else:
            target = outputs[0].storage
        if p.channel_axis and x.ndim == 4:  # C4 tensors normalize over channels
            y = normalize(np.moveaxis(x, 1, -1), self.gamma, self.beta, p.epsilon, p.rms)
            target[...] = np.moveaxis(y, -1, 1)
            return
        layout = p.layout(x.shape)
        y = normalize(x.reshape(-1, layout.length), self.gamma, self.beta, p.epsilon, p.rms)
        target[...] = y.reshape(target.shape)

    def on_clone(self, backend, op):
        return LayerNormExecution(backend, self.params, self.gamma, self.beta)


def create_layernorm(backend, inputs, outputs, op):
    gamma, beta = op.weights.layernorm() if op.weights is not None else (None, None)
    return LayerNormExecution(backend, op.param, gamma, beta)


CREATORS = {"LayerNorm": create_layernorm}
