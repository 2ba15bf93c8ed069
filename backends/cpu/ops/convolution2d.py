"""Convolutions with a spatial kernel (a vision encoder's patch embedding) and Im2Col: numpy
windows gathered im2col-style, then one BLAS GEMM against the [oc, ic * kh * kw] weight.
1x1 stride-1 convolutions stay linear layers (`linear.py`)."""
from __future__ import annotations

import numpy as np

from mnnllm_core.backend_api import Execution, Refused

from .bias_activation import finish
from .linear import create_linear


def unfold(x: np.ndarray, param) -> np.ndarray:
    """[N, C, H, W] -> [N, C * kh * kw, oh * ow] (torch's unfold order: channel, kernel row, column)."""
    kw, kh = param.kernel
    sw, sh = param.stride
    dw, dh = param.dilation
    pw, ph = param.pad if param.pad_mode == 0 else (0, 0)
    if ph or pw:
        x = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    n, c, h, w = x.shape
    oh = (h - dh * (kh - 1) - 1) // sh + 1
    ow = (w - dw * (kw - 1) - 1) // sw + 1
    rows = (np.arange(kh) * dh)[:, None] + (np.arange(oh) * sh)[None, :]  # [kh, oh]
    cols = (np.arange(kw) * dw)[:, None] + (np.arange(ow) * sw)[None, :]  # [kw, ow]
    windows = x[:, :, rows[:, None, :, None], cols[None, :, None, :]]  # [n, c, kh, kw, oh, ow]
    return windows.reshape(n, c * kh * kw, oh * ow)


class Im2ColExecution(Execution):
    def __init__(self, backend, param):
        super().__init__(backend)
        self.param = param

    def on_execute(self, inputs, outputs) -> None:
        outputs[0].storage[...] = unfold(inputs[0].storage, self.param)

    def on_clone(self, backend, op):
        return Im2ColExecution(backend, self.param)


class SpatialConvolutionExecution(Execution):
    """out[n, :, y, x] = W @ window(n, y, x) + bias; weight fp32 [oc, ic * kh * kw], shared by clones."""

    def __init__(self, backend, param, weight: np.ndarray, bias: np.ndarray | None):
        super().__init__(backend)
        self.param = param
        self.weight = weight
        self.bias = bias
        self.packed_bytes = weight.nbytes

    def on_execute(self, inputs, outputs) -> None:
        columns = unfold(inputs[0].storage, self.param)  # [n, k, l]
        out = outputs[0].storage
        n, oc = out.shape[0], out.shape[1]
        result = np.matmul(columns.transpose(0, 2, 1), self.weight.T)  # [n, l, oc]
        if self.bias is not None:
            result += self.bias
        finish(result, None, self.param.activation)
        out[...] = result.transpose(0, 2, 1).reshape(n, oc, *out.shape[2:])

    def on_clone(self, backend, op):
        return SpatialConvolutionExecution(backend, self.param, self.weight, self.bias)


def create_convolution(backend, inputs, outputs, op):
    param = op.param
    if param is None or param.is_linear:
        return create_linear(backend, inputs, outputs, op)
    if param.group != 1:
        return Refused("grouped spatial convolutions")
    if param.pad_mode not in (0, 1):
        return Refused(f"pad mode {param.pad_mode}")
    if op.weights is None:
        return Refused("its weights were packed for another backend")
    weights = op.weights.convolution()
    return SpatialConvolutionExecution(backend, param, weights.dequantize(), weights.nonzero_bias)


def create_im2col(backend, inputs, outputs, op):
    if op.param is None or op.param.pad_mode not in (0, 1):
        return Refused("Im2Col without a CAFFE/VALID window")
    return Im2ColExecution(backend, op.param)


CREATORS = {"Convolution": create_convolution, "Im2Col": create_im2col}
