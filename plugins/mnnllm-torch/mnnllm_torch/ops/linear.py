"""Convolution 1x1 as a linear layer on an fp32 weight dequantized once at load."""
from __future__ import annotations

import torch

from mnnllm_core.backend_api import RELU, RELU6, Execution, linear_creator


class LinearExecution(Execution):
    """out [rows, oc] = x [rows, ic] @ weight_t (+ bias): the weight is dequantized once, at
    load, to an fp32 tensor on the device laid out [ic, oc] (contiguous rows of the
    transposed weight: torch's GEMV streams them fastest), shared by every clone."""

    def __init__(self, backend, weight_t: torch.Tensor, bias: torch.Tensor | None, activation: int):
        super().__init__(backend)
        self.weight_t, self.bias, self.activation = weight_t, bias, activation
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
        if self.activation == RELU6:
            self.out.clamp_(0, 6)
        elif self.activation == RELU:
            self.out.relu_()

    def on_clone(self, backend, op):
        return LinearExecution(backend, self.weight_t, self.bias, self.activation)


@linear_creator
def create_linear(backend, inputs, outputs, op, weights):
    constant = backend.allocator.constant
    return LinearExecution(backend, constant(weights.dequantize().T), constant(weights.nonzero_bias),
                           op.param.activation)


CREATORS = {"Convolution": create_linear}
