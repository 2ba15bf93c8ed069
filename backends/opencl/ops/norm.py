"""LayerNorm / RMSNorm incl. MNN's fused residual form (two inputs: out0 = a + b,
out1 = norm(out0)), group norm (groups of every dim after the first, gamma/beta of one group)
and channel-axis norm of NC4HW4 tensors. gamma and beta are uploaded once at creation."""
from __future__ import annotations

import numpy as np

from mnnllm_core.backend_api import LayerNormParams, NormTables, layernorm_launch, layernorm_weights, norm_tables

from ..device import ProgramExecution


class LayerNormExecution(ProgramExecution):
    def __init__(self, backend, params: LayerNormParams, tables: NormTables):
        super().__init__(backend)
        self.params, self.tables = params, tables

    def on_resize(self, inputs, outputs) -> None:
        launch = layernorm_launch(self.params, self.tables, inputs, outputs)
        layout = launch.layout
        self.program = self.backend.program("norm.cl", "layernorm").bind(
            (layout.rows,), None, inputs[0].storage, launch.second.storage, outputs[0].storage,
            launch.target.storage, self.tables.gamma, self.tables.beta, np.int32(layout.length),
            np.int32(layout.hw), np.float32(self.params.epsilon), np.int32(launch.flags))

    def on_clone(self, backend, op):
        return LayerNormExecution(backend, self.params, self.tables)


def create_layernorm(backend, inputs, outputs, op):
    gamma, beta = layernorm_weights(op)
    return LayerNormExecution(backend, op.param, norm_tables(backend.allocator.constant, gamma, beta))


CREATORS = {"LayerNorm": create_layernorm}
