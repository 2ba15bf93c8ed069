"""LayerNorm / RMSNorm, including MNN's fused residual form (two inputs: out0 = a + b,
out1 = norm(out0)) and group norm. With memory "low" a norm over the last axis runs as one
numba kernel (`kernels/norm.py`)."""
from __future__ import annotations

from functools import partial

import numpy as np

from mnnllm_core.backend_api import Execution, LayerNormParams, check_norm_lengths, layernorm_weights


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
    """Each output row is written after the row's values it depends on were read (a + b element
    by element, the norm after its row's statistics; the numpy path computes into new arrays),
    so output 0 may take input 0's storage: a long step holds one [rows, hidden] buffer less."""

    output_may_share = 0

    def __init__(self, backend, params: LayerNormParams, gamma, beta):
        super().__init__(backend)
        self.params = params
        self.gamma, self.beta = gamma, beta
        self.packed_bytes = sum(a.nbytes for a in (gamma, beta) if a is not None)
        self.kernel_call = None  # the numba kernel with its arguments, bound at resize (memory "low")

    def on_resize(self, inputs, outputs) -> None:
        self.kernel_call = None
        p, x = self.params, inputs[0]
        layout = p.layout(x.shape)
        check_norm_lengths(layout, *(0 if a is None else a.size for a in (self.gamma, self.beta)))
        if p.channel_axis and len(x.shape) == 4 and tuple(x.shape[2:]) != (1, 1):
            return  # rows of channels only when each image is one pixel
        if not (self.backend.low_memory() and p.group == 1 and x.dtype == np.float32):
            return
        empty = np.zeros(0, np.float32)
        gamma = self.gamma if self.gamma is not None else empty
        beta = self.beta if self.beta is not None else empty
        from ..kernels.norm import add_normalize_rows, normalize_rows
        flat = [t.storage.reshape(-1) for t in (*inputs, *outputs)]  # storages stay put until the next resize
        if len(inputs) == 2:
            self.kernel_call = partial(add_normalize_rows, flat[0], flat[1], layout.length, gamma, beta, p.epsilon,
                                       p.rms, flat[2], flat[3])
        else:
            self.kernel_call = partial(normalize_rows, flat[0], layout.length, gamma, beta, p.epsilon, p.rms, flat[1])

    def on_execute(self, inputs, outputs) -> None:
        if self.kernel_call is not None:
            self.kernel_call()
            return
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

    def replay_steps(self, inputs, outputs) -> list:
        return super().replay_steps(inputs, outputs) if self.kernel_call is None else [self.kernel_call]

    def on_clone(self, backend, op):
        return LayerNormExecution(backend, self.params, self.gamma, self.beta)


def create_layernorm(backend, inputs, outputs, op):
    gamma, beta = layernorm_weights(op)
    return LayerNormExecution(backend, op.param, gamma, beta)


CREATORS = {"LayerNorm": create_layernorm}
