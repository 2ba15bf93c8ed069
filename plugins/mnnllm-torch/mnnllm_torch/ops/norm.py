"""LayerNorm / RMSNorm in fp32 over the last `axis_count` dims (over the channel axis for a 4-D
tensor in MNN's NC4HW4 format). With two inputs (MNN's fused residual form): out0 = in0 + in1,
out1 = norm(out0). Group norm stays on cpu."""
from __future__ import annotations

import torch

from mnnllm_core.backend_api import Execution, LayerNormParams, Refused, check_norm_lengths, layernorm_weights


class LayerNormExecution(Execution):
    def __init__(self, backend, params: LayerNormParams, gamma, beta):
        super().__init__(backend)
        self.params, self.gamma, self.beta = params, gamma, beta
        self.x = self.target = None

    def on_resize(self, inputs, outputs) -> None:
        source = (outputs[0] if len(inputs) == 2 else inputs[0]).storage
        target = outputs[-1].storage
        layout = self.params.layout(inputs[0].shape)
        check_norm_lengths(layout, *(0 if t is None else t.numel() for t in (self.gamma, self.beta)))
        if self.params.channel_axis and source.dim() == 4:
            self.x, self.target = source.movedim(1, -1), target.movedim(1, -1)
        else:
            self.x, self.target = source.view(-1, layout.length), target.view(-1, layout.length)

    def on_execute(self, inputs, outputs) -> None:
        if len(inputs) == 2:
            torch.add(inputs[0].storage, inputs[1].storage, out=outputs[0].storage)
        x = self.x
        if not self.params.rms:
            x = x - x.mean(-1, keepdim=True)
        y = x / torch.sqrt(x.square().mean(-1, keepdim=True) + self.params.epsilon)
        if self.gamma is not None:
            y = y * self.gamma
        if self.beta is not None:
            y = y + self.beta
        self.target.copy_(y)

    def on_clone(self, backend, op):
        return LayerNormExecution(backend, self.params, self.gamma, self.beta)


def create_layernorm(backend, inputs, outputs, op):
    if op.param.group > 1:
        return Refused("group norm stays on cpu")
    gamma, beta = layernorm_weights(op)
    constant = backend.allocator.constant
    return LayerNormExecution(backend, op.param, constant(gamma), constant(beta))


CREATORS = {"LayerNorm": create_layernorm}
