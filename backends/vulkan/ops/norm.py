"""LayerNorm / RMSNorm as the cpu backend: last `axis_count` dims, groups (every dim after the
first), the channel axis of NC4HW4 tensors, and the fused residual form (two inputs, two outputs)."""
from __future__ import annotations

from mnnllm_core.backend_api import (FLOAT32, LayerNormParams, NormTables, Refused, layernorm_launch, layernorm_weights,
                                     norm_tables)

from ..device import Program, ProgramExecution, Texels, fold, pack_push


class LayerNormExecution(ProgramExecution):
    def __init__(self, backend, params: LayerNormParams, tables: NormTables):
        super().__init__(backend)
        self.params, self.tables = params, tables

    def on_resize(self, inputs, outputs) -> None:
        launch = layernorm_launch(self.params, self.tables, inputs, outputs)
        rows, length, hw = launch.layout.rows, launch.layout.length, launch.layout.hw
        x, second, gamma, beta = inputs[0].storage, launch.second.storage, self.tables.gamma, self.tables.beta
        if self.backend.runtime.subgroups:  # norm_subgroup.comp: a work-group of 8 per row
            groups, groups_x = fold(rows, 1)
            push = pack_push("3ifiI", rows, length, hw, self.params.epsilon, launch.flags, groups_x)
            bindings = [Texels(x, "float"), Texels(second, "float"), outputs[0].storage, launch.target.storage,
                        Texels(gamma, "float"), Texels(beta, "float")]
            self.program = Program(self.backend.device, "norm_subgroup", bindings, push,
                                   groups if rows else (0, 0, 0))
            return
        push = pack_push("3ifi", rows, length, hw, self.params.epsilon, launch.flags)
        self.program = Program(self.backend.device, "norm",
                               [x, second, outputs[0].storage, launch.target.storage, gamma, beta], push,
                               (-(-rows // 64), 1, 1) if rows else (0, 0, 0))

    def on_clone(self, backend, op):
        return LayerNormExecution(backend, self.params, self.tables)


def create_layernorm(backend, inputs, outputs, op):
    if any(t.dtype != FLOAT32 for t in (*inputs, *outputs)):
        return Refused("float32 only")
    if not backend.fits(*inputs, *outputs):
        return Refused("a tensor exceeds maxStorageBufferRange or maxTexelBufferElements")
    gamma, beta = layernorm_weights(op)
    return LayerNormExecution(backend, op.param, norm_tables(backend.allocator.constant, gamma, beta))


CREATORS = {"LayerNorm": create_layernorm}
