"""LayerNorm / RMSNorm, including MNN's fused residual form (two inputs: out0 = a + b,
out1 = norm(out0)) and group norm. With memory "low" a norm over the last axis runs as one
numba kernel (`kernels/norm.py`)."""
from __future__ import annotations

import numpy as np

from mnnllm_core.core.backend import Execution
from mnnllm_core.core.op_params import layernorm_params


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
    def __init__(self, backend, gamma, beta, eps: float, rms: bool, axis_count: int, group: int, channel_axis: bool):
        super().__init__(backend)
        self.gamma, self.beta = gamma, beta
        self.eps, self.rms = eps, rms
        self.axis_count, self.group = axis_count, group
        self.channel_axis = channel_axis  # C4 tensors normalize over channels
        self.packed_bytes = sum(a.nbytes for a in (gamma, beta) if a is not None)
        self.kernel_call = None  # (kernel, arguments) bound at resize when a numba kernel runs this norm

    def on_resize(self, inputs, outputs) -> None:
        self.kernel_call = None
        x = inputs[0]
        shape = tuple(x.shape)
        if self.channel_axis and len(shape) == 4:
            if shape[2:] != (1, 1):  # rows of channels only when each image is one pixel
                return
            inner = shape[1]
        else:
            inner = int(np.prod(shape[len(shape) - self.axis_count:], dtype=np.int64))
        if not (self.backend.low_memory() and self.group == 1 and x.dtype == np.float32):
            return
        empty = np.zeros(0, np.float32)
        gamma = self.gamma if self.gamma is not None else empty
        beta = self.beta if self.beta is not None else empty
        if any(a.size not in (0, inner) for a in (gamma, beta)):
            return
        from ..kernels.norm import add_normalize_rows, normalize_rows
        flat = [t.storage.reshape(-1) for t in (*inputs, *outputs)]  # storages stay put until the next resize
        if len(inputs) == 2:
            self.kernel_call = (add_normalize_rows, (flat[0], flat[1], inner, gamma, beta, self.eps, self.rms,
                                                     flat[2], flat[3]))
        else:
            self.kernel_call = (normalize_rows, (flat[0], inner, gamma, beta, self.eps, self.rms, flat[1]))

    def on_execute(self, inputs, outputs) -> None:
        if self.kernel_call is not None:
            kernel, arguments = self.kernel_call
            kernel(*arguments)
            return
        x = inputs[0].storage
        if len(inputs) == 2:
            outputs[0].storage[...] = x + inputs[1].storage
            x, target = outputs[0].storage, outputs[1].storage
        else:
            target = outputs[0].storage
        if self.channel_axis and x.ndim == 4:
            moved = np.moveaxis(x, 1, -1)
            y = normalize(moved, self.gamma, self.beta, self.eps, self.rms)
            target[...] = np.moveaxis(y, -1, 1)
            return
        shape = x.shape
        if self.group > 1:
            # as MNN's CPULayerNorm: a group spans every dim after the first; gamma/beta cover one group
            grouped = x.reshape(shape[0], self.group, -1)
            target[...] = normalize(grouped, self.gamma, self.beta, self.eps, self.rms).reshape(target.shape)
            return
        inner = int(np.prod(shape[len(shape) - self.axis_count:], dtype=np.int64))
        y = normalize(x.reshape(-1, inner), self.gamma, self.beta, self.eps, self.rms)
        target[...] = y.reshape(target.shape)

    def on_clone(self, backend, op):
        return LayerNormExecution(backend, self.gamma, self.beta, self.eps, self.rms, self.axis_count, self.group,
                                  self.channel_axis)


def create_layernorm(backend, inputs, outputs, op):
    p = layernorm_params(op)
    return LayerNormExecution(backend, p.gamma, p.beta, p.epsilon, p.rms, p.axis_count, p.group, p.channel_axis)


CREATORS = {"LayerNorm": create_layernorm}
