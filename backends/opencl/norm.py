"""LayerNorm / RMSNorm incl. MNN's fused residual form (two inputs: out0 = a + b,
out1 = norm(out0)), group norm (groups of every dim after the first, gamma/beta of one group)
and channel-axis norm of NC4HW4 tensors.
gamma and beta are uploaded once at creation as fp32 buffers of the op's shape."""
from __future__ import annotations

import numpy as np

from mnnllm_core.core.backend import Execution
from mnnllm_core.core.op_params import layernorm_params
from mnnllm_core.errors import FormatError


class LayerNormExecution(Execution):
    def __init__(self, backend, gamma, beta, eps: float, rms: bool, axis_count: int, group: int,
                 channel_axis: bool):
        super().__init__(backend)
        self.gamma, self.beta = gamma, beta  # (cl.Buffer, present)
        self.eps, self.rms = eps, rms
        self.axis_count, self.group, self.channel_axis = axis_count, group, channel_axis
        self.kernel = None

    def on_resize(self, inputs, outputs) -> None:
        x = inputs[0]
        if self.channel_axis and len(x.shape) == 4:
            hw = x.shape[2] * x.shape[3]
            length, rows = x.shape[1], x.shape[0] * hw
        elif self.group > 1:  # as MNN's CPULayerNorm: a group spans every dim after the first
            hw, rows = 1, x.shape[0] * self.group
            length = x.size // rows
        else:
            hw = 1
            length = int(np.prod(x.shape[len(x.shape) - self.axis_count:], dtype=np.int64))
            rows = x.size // length
        for name, (buffer, present) in (("gamma", self.gamma), ("beta", self.beta)):
            if present and buffer.size != 4 * length:  # the kernel reads `length` of them
                raise FormatError(f"LayerNorm {name} has {buffer.size // 4} values for rows of {length}",
                                  field=name)
        residual = len(inputs) == 2
        flags = (1 if self.rms else 0) | (2 if self.gamma[1] else 0) | (4 if self.beta[1] else 0) | \
                (8 if residual else 0)
        target = outputs[1] if residual else outputs[0]
        second = inputs[1] if residual else inputs[0]
        self.kernel = self.backend.program("norm.cl", "layernorm").bind(
            (rows,), None, x.storage, second.storage, outputs[0].storage, target.storage,
            self.gamma[0], self.beta[0], np.int32(length), np.int32(hw),
            np.float32(self.eps), np.int32(flags))

    def on_execute(self, inputs, outputs) -> None:
        self.kernel(self.backend.queue)

    def on_clone(self, backend, op):
        return LayerNormExecution(backend, self.gamma, self.beta, self.eps, self.rms, self.axis_count,
                                  self.group, self.channel_axis)


def constant_or_placeholder(backend, values) -> tuple[object, bool]:
    """(buffer, present): fp32 values on the device, or a one-float placeholder."""
    if values is None:
        return backend.allocator.constant(np.zeros(1, np.float32)), False
    return backend.allocator.constant(np.asarray(values, np.float32).reshape(-1)), True


def create_layernorm(backend, inputs, outputs, op):
    p = layernorm_params(op)
    return LayerNormExecution(backend, constant_or_placeholder(backend, p.gamma),
                              constant_or_placeholder(backend, p.beta), p.epsilon, p.rms, p.axis_count, p.group,
                              p.channel_axis)


CREATORS = {"LayerNorm": create_layernorm}
