"""Build llm.mnn: the op graph MNN's exporter emits for a llama-style decoder with `transformer_c4` fusion.

This is the part of MNN's graph that computes the outputs (MNN's file also carries
dead shape computations left behind by its optimizer; they are not reproduced):

    input_ids [seq,1,H] -> Reshape [1,-1,H] -> Reshape [-1,H,1,1] -> ConvertTensor NCHW->NC4HW4
    position_ids -> Cast -> Reshape [-1,1] -> * inv_freq -> Cos, Sin -> [2,seq,d/2] -> concat with
        itself on the last axis -> Unsqueeze 2, 1 -> [2,1,seq,1,d] -> GatherV2 0 (cos) and 1 (sin),
        with the index arithmetic (Shape, Rank, Mod, StridedSlice, Squeeze) the ONNX converter left
    per layer i:
        LayerNorm (RMS; from layer 1 on fused with the residual add: inputs (residual, x),
            outputs (residual + x, norm))
        q, k, v: Convolution 1x1 (the quantized linear) -> RoPE(q, k, cos, sin) -> Attention(q, k, v, mask)
        o_proj -> fused LayerNorm -> gate, up -> BinaryOp MUL_SILU(up, gate) -> down_proj
    last residual Add -> StridedSlice by logits_index -> LayerNorm (output "hidden_states")
        -> lm_head Convolution -> ConvertTensor NC4HW4->NCHW -> Reshape [1,-1,vocab] (output "logits")

Weights are written as the ops that use them are built, so llm.mnn.weight comes out
in MNN's order: each layer's input norm, q, k, v, o, post-attention norm, gate, up,
down; then the final norm and the lm_head.
"""
from __future__ import annotations

import uuid
from typing import Any

import flatbuffers
import numpy as np

from mnnllm_core.schema.MNN.AttentionParam import AttentionParamT
from mnnllm_core.schema.MNN.Axis import AxisT
from mnnllm_core.schema.MNN.BinaryOp import BinaryOpT
from mnnllm_core.schema.MNN.BinaryOpOperation import BinaryOpOperation
from mnnllm_core.schema.MNN.Blob import BlobT
from mnnllm_core.schema.MNN.CastParam import CastParamT
from mnnllm_core.schema.MNN.Convolution2D import Convolution2DT
from mnnllm_core.schema.MNN.Convolution2DCommon import Convolution2DCommonT
from mnnllm_core.schema.MNN.DataType import DataType
from mnnllm_core.schema.MNN.ExtraInfo import ExtraInfoT
from mnnllm_core.schema.MNN.GatherV2 import GatherV2T
from mnnllm_core.schema.MNN.IDSTQuan import IDSTQuanT
from mnnllm_core.schema.MNN.Input import InputT
from mnnllm_core.schema.MNN.LayerNorm import LayerNormT
from mnnllm_core.schema.MNN.MNN_DATA_FORMAT import MNN_DATA_FORMAT
from mnnllm_core.schema.MNN.Net import NetT
from mnnllm_core.schema.MNN.NetSource import NetSource
from mnnllm_core.schema.MNN.Op import OpT
from mnnllm_core.schema.MNN.OpParameter import OpParameter
from mnnllm_core.schema.MNN.OpType import OpType
from mnnllm_core.schema.MNN.Reshape import ReshapeT
from mnnllm_core.schema.MNN.RoPEParam import RoPEParamT
from mnnllm_core.schema.MNN.SqueezeParam import SqueezeParamT
from mnnllm_core.schema.MNN.StridedSliceParam import StridedSliceParamT
from mnnllm_core.schema.MNN.TensorConvertInfo import TensorConvertInfoT
from mnnllm_core.schema.MNN.UnaryOp import UnaryOpT
from mnnllm_core.schema.MNN.UnaryOpOperation import UnaryOpOperation

from .llama import Model
from .sources import Source
from .weights import LinearInfo, WeightWriter

MNN_VERSION = "3.6.1"
# MNN's exporter round-trips the graph through JSON, which prints floats with 6 decimals;
# the rotary frequencies in its llm.mnn carry that rounding, and so do ours.
_CONST_DECIMALS = 6
# The end index of the logits slice: "to the end" in MNN's graph.
_SLICE_END = 1 << 30
_SCALE_FP16 = 1

NCHW, NHWC, NC4HW4 = MNN_DATA_FORMAT.NCHW, MNN_DATA_FORMAT.NHWC, MNN_DATA_FORMAT.NC4HW4


class GraphBuilder:
    """Ops and tensor names in the order they are created; `finish` packs the Net."""

    def __init__(self) -> None:
        self.tensors: list[str] = []
        self.index: dict[str, int] = {}
        self.ops: list[OpT] = []

    def tensor(self, name: str) -> int:
        if name not in self.index:
            self.index[name] = len(self.tensors)
            self.tensors.append(name)
        return self.index[name]

    def op(self, op_type: int, name: str, inputs: list[str], outputs: list[str], main_type: int = OpParameter.NONE,
           main: Any = None, fmt: int = NHWC) -> str:
        op = OpT()
        op.type = op_type
        op.name = name
        op.inputIndexes = [self.index[i] for i in inputs] if inputs else None
        op.outputIndexes = [self.tensor(o) for o in outputs]
        op.mainType = main_type
        op.main = main
        op.defaultDimentionFormat = fmt
        self.ops.append(op)
        return outputs[0]

    def const_int(self, name: str, values: list[int], dims: list[int] | None) -> str:
        blob = BlobT()
        blob.dims = dims
        blob.dataFormat = NCHW
        blob.dataType = DataType.DT_INT32
        blob.int32s = values
        return self.op(OpType.Const, name, [], [name], OpParameter.Blob, blob)

    def const_float(self, name: str, values: np.ndarray) -> str:
        blob = BlobT()
        blob.dims = [int(values.size)]
        blob.dataFormat = NCHW
        blob.dataType = DataType.DT_FLOAT
        blob.float32s = values.astype(np.float32).tolist()
        return self.op(OpType.Const, name, [], [name], OpParameter.Blob, blob)

    def binary(self, name: str, op: int, a: str, b: str, fmt: int = NHWC) -> str:
        param = BinaryOpT()
        param.opType = op
        param.t = DataType.DT_FLOAT
        return self.op(OpType.BinaryOp, name, [a, b], [name], OpParameter.BinaryOp, param, fmt)

    def unsqueeze(self, name: str, x: str, axis_const: str | None = None, dims: list[int] | None = None) -> str:
        """MNN keeps both forms: axes as a second input (empty param) or as squeezeDims."""
        param = SqueezeParamT()
        param.squeezeDims = dims
        inputs = [x, axis_const] if axis_const else [x]
        return self.op(OpType.Unsqueeze, name, inputs, [name], OpParameter.SqueezeParam, param)

    def reshape(self, name: str, inputs: list[str], dims: list[int] | None, fmt: int, output: str | None = None) -> str:
        param = ReshapeT()
        param.dims = dims
        param.dimType = NCHW
        return self.op(OpType.Reshape, name, inputs, [output or name], OpParameter.Reshape, param, fmt)

    def convert(self, name: str, x: str, source: int, dest: int, fmt: int) -> str:
        param = TensorConvertInfoT()
        param.source, param.dest = source, dest
        return self.op(OpType.ConvertTensor, name, [x], [name], OpParameter.TensorConvertInfo, param, fmt)

    def strided_slice(self, name: str, inputs: list[str], t: int, from_type: int, fmt: int = NHWC) -> str:
        param = StridedSliceParamT()
        param.t = t
        param.fromType = from_type
        return self.op(OpType.StridedSlice, name, inputs, [name], OpParameter.StridedSliceParam, param, fmt)

    def finish(self, outputs: list[str], model_id: str) -> bytes:
        net = NetT()
        net.bizCode = "MNNTest"
        net.extraInfo = ExtraInfoT()
        net.extraInfo.version = MNN_VERSION
        net.oplists = self.ops
        net.outputName = outputs
        net.sourceType = NetSource.ONNX
        net.tensorName = self.tensors
        net.mnnUuid = str(uuid.uuid5(uuid.NAMESPACE_URL, model_id))
        builder = flatbuffers.Builder(1 << 20)
        builder.Finish(net.Pack(builder))
        return bytes(builder.Output())


def rotary_inv_freq(head_dim: int, theta: float) -> np.ndarray:
    """1 / theta^(2i/d), rounded to 6 decimals as in MNN's graph."""
    exponent = np.arange(0, head_dim, 2, dtype=np.float64) / head_dim
    return np.round(1.0 / theta ** exponent, _CONST_DECIMALS).astype(np.float32)


class DecoderGraph:
    """Emits the graph of one llama-style model, writing its weights through `weights` on the way."""

    def __init__(self, model: Model, source: Source, weights: WeightWriter):
        self.model = model
        self.args = model.args
        self.source = source
        self.weights = weights
        self.g = GraphBuilder()

    def build(self, model_id: str) -> tuple[bytes, LinearInfo]:
        """The packed llm.mnn and where the lm_head's block went (for `tie_embeddings`)."""
        g, a = self.g, self.args
        x = self._inputs()
        cos, sin = self._rotary()
        residual = x
        h = self._layernorm("/blocks.0/input_layernorm/Mul_1_output_0", self.model.input_norm(0), [x],
                            ["/blocks.0/input_layernorm/Mul_1_output_0"])
        for i in range(a.num_hidden_layers):
            attn = self._attention(i, h, cos, sin)
            residual, h = self._fused_norm(f"/blocks.{i}/post_attention_layernorm/Mul_1_output_0",
                                           self.model.post_attention_norm(i), residual, attn,
                                           f"/blocks.{i}/Add_output_0")
            mlp = self._mlp(i, h)
            if i + 1 < a.num_hidden_layers:
                residual, h = self._fused_norm(f"/blocks.{i + 1}/input_layernorm/Mul_1_output_0",
                                               self.model.input_norm(i + 1), residual, mlp,
                                               f"/blocks.{i}/Add_1_output_0")
        last = g.binary(f"/blocks.{a.num_hidden_layers - 1}/Add_1_output_0", BinaryOpOperation.ADD, residual, mlp,
                        NC4HW4)
        logits, lm_head = self._head(last)
        return g.finish([logits, "hidden_states"], model_id), lm_head

    # -- pieces -------------------------------------------------------------

    def _inputs(self) -> str:
        g, hidden = self.g, self.args.hidden_size
        for name, dims, dtype in (("input_ids", [1, 1, hidden], DataType.DT_FLOAT),
                                  ("attention_mask", [1, 1, -1, -1], DataType.DT_FLOAT),
                                  ("position_ids", [1, -1], DataType.DT_INT32),
                                  ("logits_index", [1], DataType.DT_INT32)):
            param = InputT()
            param.dims, param.dtype, param.dformat = dims, dtype, NCHW
            g.op(OpType.Input, name, [], [name], OpParameter.Input, param)
        shape = g.const_int("/blocks.0/Constant_output_0", [1, -1, hidden], [3])
        x = g.reshape("/blocks.0/Reshape_output_0", ["input_ids", shape], None, NHWC)
        x = g.reshape("FuseTransformerC4_region_pre_reshape", [x], [-1, hidden, 1, 1], NCHW)
        return g.convert("FuseTransformerC4_region_pre_convert", x, NCHW, NC4HW4, NCHW)

    def _rotary(self) -> tuple[str, str]:
        g, a = self.g, self.args
        one = g.const_int("/rotary/one", [1], None)
        axis1 = g.const_int("/rotary/axis_1", [1], [1])
        axis0 = g.const_int("/rotary/Constant_3_output_0", [0], [1])
        cast = CastParamT()
        cast.srcT, cast.dstT = DataType.DT_VARIANT, DataType.DT_FLOAT
        pos = g.op(OpType.Cast, "/rotary/Cast_output_0", ["position_ids"], ["/rotary/Cast_output_0"],
                   OpParameter.CastParam, cast)
        column = g.const_int("/rotary/Constant_output_0", [-1, 1], [2])
        pos = g.reshape("/rotary/Reshape_output_0", [pos, column], None, NHWC)
        freq = g.const_float("/rotary/Constant_1_output_0", rotary_inv_freq(a.head_dim, a.rope_theta))
        angle = g.binary("/rotary/Mul_output_0", BinaryOpOperation.MUL, pos, freq)
        parts = []
        for fn, tag in ((UnaryOpOperation.COS, "Cos"), (UnaryOpOperation.SIN, "Sin")):
            param = UnaryOpT()
            param.opType, param.t = fn, DataType.DT_FLOAT
            y = g.op(OpType.UnaryOp, f"/rotary/{tag}_output_0", [angle], [f"/rotary/{tag}_output_0"],
                     OpParameter.UnaryOp, param)
            parts.append(g.unsqueeze(f"/rotary/Unsqueeze_{tag}", y, axis0))
        both = self._concat("/rotary/Concat_output_0", parts, 0)
        both = self._concat("/rotary/Concat_1_output_0", [both, both], -1)
        axis2 = g.const_int("/rotary/Constant_5_output_0", [2], [1])
        both = g.unsqueeze("/rotary/Unsqueeze_2_output_0", both, axis2)
        table = g.unsqueeze("/rotary/Unsqueeze_3_output_0", both, axis1)
        # table[0] and table[1] as the ONNX converter wrote them: index (k + dim) % dim on axis rank % rank.
        shape = g.op(OpType.Shape, "/rotary/Shape", [table], ["/rotary/Shape"], fmt=NCHW)
        rank = g.op(OpType.Rank, "/rotary/Rank", [table], ["/rotary/Rank"])
        axis = g.binary("/rotary/gather_axis", BinaryOpOperation.MOD, rank, rank)
        axis_next = g.binary("/rotary/gather_axis_next", BinaryOpOperation.ADD, axis, one)
        outputs = []
        for k, tag in ((0, "Gather_2"), (1, "Gather_3")):
            begin = g.unsqueeze(f"/rotary/{tag}/begin", axis, dims=[0])
            end = g.unsqueeze(f"/rotary/{tag}/end", axis_next, dims=[0])
            dim = g.strided_slice(f"/rotary/{tag}/dim", [shape, begin, end, axis1], DataType.DT_FLOAT, 0)
            dim = g.op(OpType.Squeeze, f"/rotary/{tag}/dim_scalar", [dim], [f"/rotary/{tag}/dim_scalar"],
                       OpParameter.SqueezeParam, SqueezeParamT())
            index = dim if k == 0 else g.binary(f"/rotary/{tag}/shifted", BinaryOpOperation.ADD, one, dim)
            index = g.binary(f"/rotary/{tag}/index", BinaryOpOperation.MOD, index, dim)
            name = f"/blocks.0/self_attn/{tag}_output_0"
            outputs.append(g.op(OpType.GatherV2, name, [table, index, axis], [name], OpParameter.GatherV2,
                                GatherV2T()))
        return outputs[0], outputs[1]

    def _concat(self, name: str, inputs: list[str], axis: int) -> str:
        param = AxisT()
        param.axis = axis
        return self.g.op(OpType.Concat, name, inputs, [name], OpParameter.Axis, param)

    def _layernorm(self, name: str, weight: str, inputs: list[str], outputs: list[str]) -> str:
        param = LayerNormT()
        param.axis = [-1]
        param.epsilon = float(self.args.rms_norm_eps)
        param.group = 1
        param.useRmsnorm = True
        param.external = self.weights.layernorm(self.source.tensor(weight))
        self.g.op(OpType.LayerNorm, name, inputs, outputs, OpParameter.LayerNorm, param, NC4HW4)
        return outputs[-1]

    def _fused_norm(self, name: str, weight: str, residual: str, x: str, sum_name: str) -> tuple[str, str]:
        norm = self._layernorm(name, weight, [residual, x], [sum_name, name])
        return sum_name, norm

    def _linear(self, name: str, x: str, weight: str, bias: str | None, output: str | None = None) -> tuple[str, LinearInfo]:
        info = self.weights.linear(self.source.tensor(weight), self.source.tensor(bias) if bias else None)
        common = Convolution2DCommonT()
        common.outputCount, common.inputCount = info.oc, info.ic
        quant = IDSTQuanT()
        if info.bits == 16:
            quant.type = 3
        else:
            quant.type = 1
            quant.quantScale = 1.0
            quant.aMaxOrBits = info.bits
            quant.aMin = 1
            quant.readType = info.oc * (info.ic // info.block_size)
            quant.shapeInt32 = info.shape_int32
            quant.scaleStorage = _SCALE_FP16
        conv = Convolution2DT()
        conv.common = common
        conv.quanParameter = quant
        conv.external = info.external
        out = self.g.op(OpType.Convolution, name, [x], [output or name], OpParameter.Convolution2D, conv)
        return out, info

    def _attention(self, i: int, h: str, cos: str, sin: str) -> str:
        g, a, m = self.g, self.args, self.model
        proj = {}
        for p in ("q_proj", "k_proj", "v_proj"):
            base = m.linear(i, p)
            proj[p], _ = self._linear(f"/layers.{i}/self_attn/{p}/Linear", h, f"{base}.weight",
                                      f"{base}.bias" if m.qkv_bias else None)
        rope = RoPEParamT()
        rope.ropeCutHeadDim = a.head_dim
        rope.numHead, rope.kvNumHead, rope.headDim = a.num_attention_heads, a.num_key_value_heads, a.head_dim
        q_out = f"/blocks.{i}/self_attn/fused_rope/FusedRoPE_output_0"
        k_out = f"/blocks.{i}/self_attn/fused_rope/FusedRoPE_output_1"
        g.op(OpType.RoPE, f"/layers.{i}/self_attn/FusedRoPE", [proj["q_proj"], proj["k_proj"], cos, sin],
             [q_out, k_out], OpParameter.RoPEParam, rope)
        attn = AttentionParamT()
        attn.kvCache, attn.layerIndex, attn.kvSharedLayerIndex, attn.outputC4 = True, i, -1, True
        ctx = g.op(OpType.Attention, f"/layers.{i}/self_attn/FusedAttention",
                   [q_out, k_out, proj["v_proj"], "attention_mask"],
                   [f"/layers.{i}/self_attn/o_proj/Linear/pre_convert"], OpParameter.AttentionParam, attn)
        out, _ = self._linear(f"/layers.{i}/self_attn/o_proj/Linear", ctx, f"{m.linear(i, 'o_proj')}.weight", None)
        return out

    def _mlp(self, i: int, h: str) -> str:
        m = self.model
        gate, _ = self._linear(f"/layers.{i}/mlp/gate_proj/Linear", h, f"{m.linear(i, 'gate_proj')}.weight", None)
        up, _ = self._linear(f"/layers.{i}/mlp/up_proj/Linear", h, f"{m.linear(i, 'up_proj')}.weight", None)
        act = self.g.op(OpType.BinaryOp, f"/blocks.{i}/mlp/Mul_output_0", [up, gate],
                        [f"/layers.{i}/mlp/down_proj/Linear/pre_convert"], OpParameter.BinaryOp,
                        _binary_param(BinaryOpOperation.MUL_SILU), NC4HW4)
        out, _ = self._linear(f"/layers.{i}/mlp/down_proj/Linear", act, f"{m.linear(i, 'down_proj')}.weight", None)
        return out

    def _head(self, x: str) -> tuple[str, LinearInfo]:
        g, a = self.g, self.args
        end = g.const_int("/Constant_1_output_0", [_SLICE_END], [1])
        x = g.strided_slice("/Slice_output_0", [x, "logits_index", end, "/rotary/Constant_3_output_0", "/rotary/axis_1"],
                            DataType.DT_INVALID, 1, NC4HW4)
        hidden = self._layernorm("hidden_states", self.model.final_norm(), [x], ["hidden_states"])
        logits, info = self._linear("/lm/lm_head/Linear", hidden, self.model.lm_head(), None)
        logits = g.convert("/lm/lm_head/Linear/post_convert", logits, NC4HW4, NCHW, NHWC)
        logits = g.reshape("/lm/lm_head/Linear/post_reshape", [logits], [1, -1, a.vocab_size], NHWC, output="logits")
        return logits, info


def _binary_param(op: int) -> BinaryOpT:
    param = BinaryOpT()
    param.opType = op
    param.t = DataType.DT_FLOAT
    return param
