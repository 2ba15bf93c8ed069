"""LayerNorm / RMSNorm as the cpu backend: last `axis_count` dims, groups (every dim after the
first), the channel axis of NC4HW4 tensors, and the fused residual form (two inputs, two outputs).
Contiguous rows of a multiple of 4 on an adapter whose subgroups hold 8 invocations (lavapipe)
take norm_rows.wgsl (8 invocations a row, vec4 reads, subgroupAdd: no barrier, which lavapipe
pays for); the rest norm.wgsl (64 a row, a shared-memory tree)."""
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
        device = self.backend.device
        groups, row = fold(rows, 1)
        params = pack_params("iiifiI", rows, length, hw, self.params.epsilon, launch.flags, row)
        gamma, beta = self.tables.gamma, self.tables.beta
        shader = "norm"
        if hw == 1 and length % 4 == 0 and device.is_cpu and device.subgroup_size >= 8:
            shader = "norm_rows"  # vec4 tables: an absent one (4 bytes) is the device's 16-byte dummy
            gamma = gamma if self.tables.gamma_count else device.dummy
            beta = beta if self.tables.beta_count else device.dummy
        buffers = [inputs[0].storage, launch.second.storage, outputs[0].storage, launch.target.storage, gamma, beta]
        self.steps = [Program(device, shader, buffers, params, groups if rows else (0, 0, 0))]

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
