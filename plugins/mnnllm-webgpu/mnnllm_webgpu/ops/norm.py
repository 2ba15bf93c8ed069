"""LayerNorm / RMSNorm as the cpu backend: last `axis_count` dims, groups (every dim after the
first), the channel axis of NC4HW4 tensors, and the fused residual form (two inputs, two outputs)."""
from __future__ import annotations

from mnnllm_core.backend_api import (FLOAT32, LayerNormParams, NormTables, Refused, layernorm_launch,
                                     layernorm_weights, norm_tables)

from ..device import Program, StepsExecution, fold, pack_params


class LayerNormExecution(StepsExecution):
    def __init__(self, backend, params: LayerNormParams, tables: NormTables):
        super().__init__(backend)
        self.params, self.tables = params, tables

    def on_resize(self, inputs, outputs) -> None:
        launch = layernorm_launch(self.params, self.tables, inputs, outputs)
        rows, length, hw = launch.layout.rows, launch.layout.length, launch.layout.hw
        groups, row = fold(rows, 1)
        params = pack_params("iiifiI", rows, length, hw, self.params.epsilon, launch.flags, row)
        buffers = [inputs[0].storage, launch.second.storage, outputs[0].storage, launch.target.storage,
                   self.tables.gamma, self.tables.beta]
        self.steps = [Program(self.backend.device, "norm", buffers, params, groups if rows else (0, 0, 0))]

    def on_clone(self, backend, op):
        return LayerNormExecution(backend, self.params, self.tables)


def create_layernorm(backend, inputs, outputs, op):
    if any(t.dtype != FLOAT32 for t in (*inputs, *outputs)):
        return Refused("float32 only")
    if not backend.fits(*inputs, *outputs):
        return Refused("a tensor exceeds max_storage_buffer_binding_size")
    gamma, beta = layernorm_weights(op)
    return LayerNormExecution(backend, op.param, norm_tables(backend.allocator.constant, gamma, beta))


CREATORS = {"LayerNorm": create_layernorm}
