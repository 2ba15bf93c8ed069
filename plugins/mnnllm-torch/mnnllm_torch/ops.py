"""The ops the torch backend runs: Convolution (1x1, as a linear layer), LayerNorm (RMS and
plain, with MNN's fused residual form), BinaryOp on float tensors, and Raster.

Every other op type (RoPE, Attention, UnaryOp, Cast, ...) has no creator here, and a creator
returns None for a form it does not take: the pipeline then runs that op on the cpu backend
and copies its tensors across. Executions bind views of their tensors' storage in
`on_resize` (storage is fixed from then until the next resize), so `on_execute` is only
the torch calls.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from mnnllm_core.core.backend import Execution


def _on_device(backend, array: np.ndarray | None) -> torch.Tensor | None:
    if array is None:
        return None
    return torch.from_numpy(np.array(array, dtype=np.float32, order="C", copy=True)).to(backend.device)


# -- Convolution 1x1 ---------------------------------------------------------------

class LinearExecution(Execution):
    """out [rows, oc] = x [rows, ic] @ weight_t (+ bias): the weight is dequantized once, at
    load, to an fp32 tensor on the device laid out [ic, oc] (contiguous rows of the
    transposed weight: torch's GEMV streams them fastest), shared by every clone."""

    def __init__(self, backend, weight_t: torch.Tensor, bias: torch.Tensor | None, relu: bool, relu6: bool):
        super().__init__(backend)
        self.weight_t, self.bias = weight_t, bias
        self.relu, self.relu6 = relu, relu6
        self.packed_bytes = weight_t.nbytes + (bias.nbytes if bias is not None else 0)
        self.x = self.out = None

    def on_resize(self, inputs, outputs) -> None:
        rows = inputs[0].shape[0] if inputs[0].shape else 1
        self.x = inputs[0].storage.view(rows, -1)
        self.out = outputs[0].storage.view(rows, -1)

    def on_execute(self, inputs, outputs) -> None:
        if self.bias is None:
            torch.mm(self.x, self.weight_t, out=self.out)
        else:
            torch.addmm(self.bias, self.x, self.weight_t, out=self.out)
        if self.relu6:
            self.out.clamp_(0, 6)
        elif self.relu:
            self.out.relu_()

    def on_clone(self, backend, op):
        return LinearExecution(backend, self.weight_t, self.bias, self.relu, self.relu6)


def create_linear(backend, inputs, outputs, op):
    common = op.param.common
    if int(common.kernelX or 1) != 1 or int(common.kernelY or 1) != 1 or int(common.group or 1) != 1:
        return None
    weights = op.weights.convolution()
    weight_t = _on_device(backend, weights.quantized.dequantize().T)
    bias = weights.bias if weights.bias is not None and np.any(weights.bias) else None
    return LinearExecution(backend, weight_t, _on_device(backend, bias), bool(common.relu), bool(common.relu6))


# -- LayerNorm ---------------------------------------------------------------------

class LayerNormExecution(Execution):
    """Normalize over the last `axis_count` dims in fp32 (over the channel axis for a 4-D
    tensor in MNN's NC4HW4 format). With two inputs (MNN's fused residual form):
    out0 = in0 + in1, out1 = norm(out0)."""

    def __init__(self, backend, gamma, beta, eps: float, rms: bool, axis_count: int, channel_axis: bool):
        super().__init__(backend)
        self.gamma, self.beta = gamma, beta
        self.eps, self.rms, self.axis_count = eps, rms, axis_count
        self.channel_axis = channel_axis
        self.x = self.target = None

    def on_resize(self, inputs, outputs) -> None:
        source = (outputs[0] if len(inputs) == 2 else inputs[0]).storage
        target = outputs[-1].storage
        if self.channel_axis and source.dim() == 4:
            self.x, self.target = source.movedim(1, -1), target.movedim(1, -1)
            return
        shape = inputs[0].shape
        inner = int(np.prod(shape[len(shape) - self.axis_count:], dtype=np.int64))
        self.x, self.target = source.view(-1, inner), target.view(-1, inner)

    def on_execute(self, inputs, outputs) -> None:
        if len(inputs) == 2:
            torch.add(inputs[0].storage, inputs[1].storage, out=outputs[0].storage)
        x = self.x
        if not self.rms:
            x = x - x.mean(-1, keepdim=True)
        y = x / torch.sqrt(x.square().mean(-1, keepdim=True) + self.eps)
        if self.gamma is not None:
            y = y * self.gamma
        if self.beta is not None:
            y = y + self.beta
        self.target.copy_(y)

    def on_clone(self, backend, op):
        return LayerNormExecution(backend, self.gamma, self.beta, self.eps, self.rms, self.axis_count,
                                  self.channel_axis)


def create_layernorm(backend, inputs, outputs, op):
    param = op.param
    if int(param.group or 1) > 1:
        return None  # group norm stays on cpu
    gamma, beta = op.weights.layernorm() if op.weights is not None else (None, None)
    axis = list(param.axis) if param.axis is not None else [-1]
    return LayerNormExecution(backend, _on_device(backend, gamma), _on_device(backend, beta),
                              float(param.epsilon or 0.0), bool(param.useRmsnorm), max(1, len(axis)),
                              op.extra.get("format") == "NC4HW4")


# -- BinaryOp ----------------------------------------------------------------------

def _mul_silu(a, b, out):
    return torch.mul(a, F.silu(b), out=out)


BINARY = {
    "ADD": torch.add, "SUB": torch.sub, "MUL": torch.mul, "REALDIV": torch.div,
    "MAXIMUM": torch.maximum, "MINIMUM": torch.minimum, "MAX_TEMP": torch.maximum, "MIN_TEMP": torch.minimum,
    "POW": torch.pow, "MUL_SILU": _mul_silu,
}
ACTIVATIONS = {0: None, 1: lambda out: out.relu_(), 2: lambda out: out.clamp_(0, 6)}


class BinaryExecution(Execution):
    def __init__(self, backend, function, activation):
        super().__init__(backend)
        self.function, self.activation = function, activation
        self.out = None

    def on_resize(self, inputs, outputs) -> None:
        shape = torch.broadcast_shapes(inputs[0].storage.shape, inputs[1].storage.shape)
        self.out = outputs[0].storage.view(shape)

    def on_execute(self, inputs, outputs) -> None:
        self.function(inputs[0].storage, inputs[1].storage, out=self.out)
        if self.activation is not None:
            self.activation(self.out)


def create_binary(backend, inputs, outputs, op):
    function = BINARY.get(op.extra.get("operation"))
    activation = int(getattr(op.param, "activationType", 0) or 0)
    dtypes = {t.dtype for t in (*inputs, *outputs)}
    if function is None or activation not in ACTIVATIONS or dtypes != {np.dtype(np.float32)}:
        return None  # integer arithmetic (MOD on positions, ...) keeps numpy's rules on cpu
    return BinaryExecution(backend, function, ACTIVATIONS[activation])


# -- Raster ------------------------------------------------------------------------

class RasterExecution(Execution):
    """Each region is one strided copy: a view of the destination receives a view of its source."""

    def __init__(self, backend, param):
        super().__init__(backend)
        self.param = param
        self.dst = None
        self.copies: list[tuple[torch.Tensor, torch.Tensor]] = []

    def on_resize(self, inputs, outputs) -> None:
        self.dst = outputs[0].storage.view(-1)
        sources = [t.storage.view(-1) for t in inputs]
        self.copies = [(_box(self.dst, r.dst.offset, r.dst.stride, r.size),
                        _box(sources[r.origin], r.src.offset, r.src.stride, r.size)) for r in self.param.regions]

    def on_execute(self, inputs, outputs) -> None:
        if self.param.zero_fill:
            self.dst.zero_()
        for dst, src in self.copies:
            dst.copy_(src)


def _box(flat: torch.Tensor, offset: int, stride, size) -> torch.Tensor:
    return flat.as_strided(tuple(size), tuple(stride), flat.storage_offset() + offset)


def create_raster(backend, inputs, outputs, op):
    if len({t.dtype for t in (*inputs, *outputs)}) != 1:
        return None
    for region in op.param.regions:
        if any(s < 0 for s in (*region.src.stride, *region.dst.stride)):
            return None  # torch views have no negative strides
        if any(n > 1 and s == 0 for n, s in zip(region.size, region.dst.stride)):
            return None  # a destination that writes one element twice
    return RasterExecution(backend, op.param)


CREATORS = {
    "Convolution": create_linear,
    "LayerNorm": create_layernorm,
    "BinaryOp": create_binary,
    "Raster": create_raster,
}
