"""Qwen3.5's gated delta-net token mixer as MNN's exporter writes it: one `LinearAttention` op.

    h (NC4HW4) -> in_proj_qkv -> LinearAttention(qkv, g, beta, conv1d weight [C,1,K]) -> [-1, Dv]
    g = -exp(A_log) * softplus(in_proj_a(h) + dt_bias), softplus spelled log(exp(x) + 1) as MNN does
    beta = sigmoid(in_proj_b(h))
    out = RMSNorm(core, weight w, not 1 + w) * silu(in_proj_z(h) as [-1, Dv]) -> [-1, V*Dv, 1, 1] -> out_proj

The op does the causal depthwise conv1d (+ SiLU), the q/k L2 norms and the recurrence, and keeps the
conv and recurrent state across calls; its output is [seq, V*Dv] in the Linear's NC4HW4 layout.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mnnllm_core.errors import FormatError
from mnnllm_core.schema.MNN.BinaryOpOperation import BinaryOpOperation
from mnnllm_core.schema.MNN.CastParam import CastParamT
from mnnllm_core.schema.MNN.DataType import DataType
from mnnllm_core.schema.MNN.LayerNorm import LayerNormT
from mnnllm_core.schema.MNN.LinearAttentionParam import LinearAttentionParamT
from mnnllm_core.schema.MNN.OpParameter import OpParameter
from mnnllm_core.schema.MNN.OpType import OpType
from mnnllm_core.schema.MNN.UnaryOpOperation import UnaryOpOperation

from .graph import NC4HW4


@dataclass(frozen=True)
class LinearAttentionSpec:
    """One gated delta-net layer: head counts and sizes, and where its tensors live (`base`.in_proj_qkv ...)."""

    base: str
    key_heads: int
    value_heads: int
    key_dim: int
    value_dim: int
    conv_kernel: int

    @property
    def conv_channels(self) -> int:
        return 2 * self.key_heads * self.key_dim + self.value_heads * self.value_dim

    def linears(self) -> tuple[str, ...]:
        return ("in_proj_qkv", "in_proj_a", "in_proj_b", "in_proj_z", "out_proj")

    def small_tensors(self) -> tuple[str, ...]:
        """Written inline as constants or a norm: A_log, dt_bias, conv1d.weight, norm.weight."""
        return ("A_log", "dt_bias", "conv1d.weight", "norm.weight")


class GatedDeltaNetLayers:
    """Mixed into DecoderGraph: Qwen3.5's linear-attention layers, written with its graph helpers."""

    def gated_delta_net(self, i: int, h: str, spec: LinearAttentionSpec) -> str:
        """The layer's mixer from the NC4HW4 normed input `h`; returns out_proj's NC4HW4 output."""
        g, source = self.g, self.source
        p, lin = f"/blocks.{i}/self_attn", f"/layers.{i}/self_attn"
        v = spec.value_heads

        def weight(name: str):
            return source.tensor(f"{spec.base}.{name}.weight")

        def small(name: str, expected: tuple[int, ...]) -> np.ndarray:
            values = source.tensor(f"{spec.base}.{name}").load().astype(np.float32)
            if values.shape != expected:
                raise FormatError(f"tensor {spec.base}.{name} has shape {values.shape}, the config says {expected}",
                                  field=f"{spec.base}.{name}")
            return values

        qkv = self._conv(f"{lin}/in_proj_qkv/Linear", h, weight("in_proj_qkv"))
        decay = -np.exp(small("A_log", (v,)))
        neg = g.const_float(f"{p}/Neg_output_0", decay, [1, v, 1, 1], NC4HW4)
        a = self._conv(f"{lin}/in_proj_a/Linear", h, weight("in_proj_a"))
        bias = g.const_float(f"blocks.{i}.linear_attn.dt_bias", small("dt_bias", (v,)), [1, v, 1, 1], NC4HW4)
        x = g.binary(f"{p}/Add_output_0", BinaryOpOperation.ADD, a, bias, NC4HW4)
        x = g.unary(f"{p}/Exp_output_0", UnaryOpOperation.EXP, x, NC4HW4)
        one = g.const_float(f"{p}/Softplus_one", 1.0)
        x = g.binary(f"{p}/Softplus_add_output_0", BinaryOpOperation.ADD, x, one, NC4HW4)
        x = g.unary(f"{p}/Softplus_output_0", UnaryOpOperation.LOG, x, NC4HW4)
        gate = g.binary(f"{p}/Mul_output_0", BinaryOpOperation.MUL, neg, x, NC4HW4)
        b = self._conv(f"{lin}/in_proj_b/Linear", h, weight("in_proj_b"))
        beta = g.unary(f"{p}/Sigmoid_output_0", UnaryOpOperation.SIGMOID, b, NC4HW4)
        conv = small("conv1d.weight", (spec.conv_channels, 1, spec.conv_kernel))
        conv = g.const_float(f"{p}/conv1d_weight", conv, list(conv.shape))

        param = LinearAttentionParamT()
        param.attnType = "gated_delta_rule"
        param.numKHeads, param.numVHeads = spec.key_heads, v
        param.headKDim, param.headVDim = spec.key_dim, spec.value_dim
        param.useQkL2norm = True
        core = g.op(OpType.LinearAttention, f"{lin}/FusedLinearAttention", [qkv, gate, beta, conv],
                    [f"{p}/fused_attn/FusedLinearAttention_output_0"], OpParameter.LinearAttentionParam, param, NC4HW4)

        heads = g.const_int(f"{p}/Constant_2_output_0", [-1, spec.value_dim], [2])
        core = g.reshape(f"{p}/Reshape_output_0", [core, heads], None, NC4HW4)
        cast = CastParamT()
        cast.srcT, cast.dstT = DataType.DT_VARIANT, DataType.DT_FLOAT
        core = g.op(OpType.Cast, f"{p}/norm/Cast_output_0", [core], [f"{p}/norm/Cast_output_0"], OpParameter.CastParam,
                    cast, NC4HW4)
        norm = LayerNormT()
        norm.axis, norm.epsilon, norm.group, norm.useRmsnorm = [-1], float(self.args.rms_norm_eps), 1, True
        norm.external = self.weights.layernorm(source.tensor(f"{spec.base}.norm.weight"), 0.0)
        core = g.op(OpType.LayerNorm, f"{p}/norm/Mul_1_output_0", [core], [f"{p}/norm/Mul_1_output_0"],
                    OpParameter.LayerNorm, norm, NC4HW4)
        z = self._conv(f"{lin}/in_proj_z/Linear", h, weight("in_proj_z"))
        z = g.reshape(f"{p}/Reshape_1_output_0", [z, heads], None, NC4HW4)
        z = g.unary(f"{p}/norm/Mul_2_output_0", UnaryOpOperation.SILU, z, NC4HW4)
        y = g.binary(f"{p}/norm/Mul_3_output_0", BinaryOpOperation.MUL, core, z, NC4HW4)
        y = g.reshape(f"{p}/Reshape_2_output_0", [y], [-1, v * spec.value_dim, 1, 1], NC4HW4)
        return self._conv(f"{lin}/out_proj/Linear", y, weight("out_proj"))
