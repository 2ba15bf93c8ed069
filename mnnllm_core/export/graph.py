"""`GraphBuilder`: MNN ops and tensor names in the order they are made, packed into a Net (with subgraphs)."""
from __future__ import annotations

import uuid
from typing import Any

import flatbuffers
import numpy as np

from mnnllm_core.schema.MNN.Attribute import AttributeT
from mnnllm_core.schema.MNN.Axis import AxisT
from mnnllm_core.schema.MNN.BinaryOp import BinaryOpT
from mnnllm_core.schema.MNN.BinaryOpOperation import BinaryOpOperation
from mnnllm_core.schema.MNN.Blob import BlobT
from mnnllm_core.schema.MNN.DataType import DataType
from mnnllm_core.schema.MNN.Extra import ExtraT
from mnnllm_core.schema.MNN.ExtraInfo import ExtraInfoT
from mnnllm_core.schema.MNN.GatherV2 import GatherV2T
from mnnllm_core.schema.MNN.Input import InputT
from mnnllm_core.schema.MNN.MNN_DATA_FORMAT import MNN_DATA_FORMAT
from mnnllm_core.schema.MNN.Net import NetT
from mnnllm_core.schema.MNN.NetSource import NetSource
from mnnllm_core.schema.MNN.Op import OpT
from mnnllm_core.schema.MNN.OpParameter import OpParameter
from mnnllm_core.schema.MNN.OpType import OpType
from mnnllm_core.schema.MNN.Reshape import ReshapeT
from mnnllm_core.schema.MNN.SqueezeParam import SqueezeParamT
from mnnllm_core.schema.MNN.StridedSliceParam import StridedSliceParamT
from mnnllm_core.schema.MNN.SubGraphProto import SubGraphProtoT
from mnnllm_core.schema.MNN.TensorConvertInfo import TensorConvertInfoT
from mnnllm_core.schema.MNN.UnaryOp import UnaryOpT

MNN_VERSION = "3.6.1"
NCHW, NHWC, NC4HW4 = MNN_DATA_FORMAT.NCHW, MNN_DATA_FORMAT.NHWC, MNN_DATA_FORMAT.NC4HW4


class GraphBuilder:
    """Ops and tensor names in the order they are created; `finish` packs the Net, `subgraph` one SubGraphProto."""

    def __init__(self) -> None:
        self.tensors: list[str] = []
        self.index: dict[str, int] = {}
        self.ops: list[OpT] = []
        self.produced: set[str] = set()

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
        for o in outputs:
            if o in self.produced:
                raise ValueError(f"tensor {o!r} is produced twice (op {name!r})")
            self.produced.add(o)
        op.outputIndexes = [self.tensor(o) for o in outputs]
        op.mainType = main_type
        op.main = main
        op.defaultDimentionFormat = fmt
        self.ops.append(op)
        return outputs[0]

    def input(self, name: str, dims: list[int], dtype: int) -> str:
        param = InputT()
        param.dims, param.dtype, param.dformat = dims, dtype, NCHW
        return self.op(OpType.Input, name, [], [name], OpParameter.Input, param)

    def const_int(self, name: str, values: list[int], dims: list[int] | None) -> str:
        blob = BlobT()
        blob.dims = dims
        blob.dataFormat = NCHW
        blob.dataType = DataType.DT_INT32
        blob.int32s = values
        return self.op(OpType.Const, name, [], [name], OpParameter.Blob, blob)

    def const_float(self, name: str, values: np.ndarray | float, dims: list[int] | None = None,
                    fmt: int = NCHW) -> str:
        """A float constant; a Python float is a scalar (no dims). `fmt` NC4HW4: a per-channel constant
        that meets a Linear's NC4HW4 output (MNN writes the op's default format the same)."""
        array = np.asarray(values, np.float32).reshape(-1)
        blob = BlobT()
        blob.dims = dims if dims is not None else (None if np.ndim(values) == 0 else [int(array.size)])
        blob.dataFormat = fmt
        blob.dataType = DataType.DT_FLOAT
        blob.float32s = array.tolist()
        return self.op(OpType.Const, name, [], [name], OpParameter.Blob, blob, NC4HW4 if fmt == NC4HW4 else NHWC)

    def binary(self, name: str, op: int, a: str, b: str, fmt: int = NHWC, output: str | None = None) -> str:
        param = BinaryOpT()
        param.opType = op
        param.t = DataType.DT_FLOAT
        return self.op(OpType.BinaryOp, name, [a, b], [output or name], OpParameter.BinaryOp, param, fmt)

    def unary(self, name: str, op: int, x: str, fmt: int = NHWC) -> str:
        param = UnaryOpT()
        param.opType, param.t = op, DataType.DT_FLOAT
        return self.op(OpType.UnaryOp, name, [x], [name], OpParameter.UnaryOp, param, fmt)

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

    def concat(self, name: str, inputs: list[str], axis: int) -> str:
        param = AxisT()
        param.axis = axis
        return self.op(OpType.Concat, name, inputs, [name], OpParameter.Axis, param)

    def extra(self, op_type: int, name: str, inputs: list[str], outputs: list[str], attrs: dict[str, int]) -> str:
        """An op whose parameters are integer attributes (MNN's MoE)."""
        param = ExtraT()
        param.attr = []
        for key, value in attrs.items():
            attr = AttributeT()
            attr.key, attr.i = key, int(value)
            param.attr.append(attr)
        return self.op(op_type, name, inputs, outputs, OpParameter.Extra, param)

    def planes(self, table: str, count: int, names: list[str], one: str, axis1: str) -> list[str]:
        """table[0], table[1], ... on axis 0 as the ONNX converter writes Gather: index (k + dim) % dim on
        axis rank % rank, from Shape, Rank, Mod, StridedSlice and Squeeze (folded away at load)."""
        shape = self.op(OpType.Shape, f"{table}/Shape", [table], [f"{table}/Shape"], fmt=NCHW)
        rank = self.op(OpType.Rank, f"{table}/Rank", [table], [f"{table}/Rank"])
        axis = self.binary(f"{table}/gather_axis", BinaryOpOperation.MOD, rank, rank)
        axis_next = self.binary(f"{table}/gather_axis_next", BinaryOpOperation.ADD, axis, one)
        out = []
        for k, name in zip(range(count), names):
            begin = self.unsqueeze(f"{name}/begin", axis, dims=[0])
            end = self.unsqueeze(f"{name}/end", axis_next, dims=[0])
            dim = self.strided_slice(f"{name}/dim", [shape, begin, end, axis1], DataType.DT_FLOAT, 0)
            dim = self.op(OpType.Squeeze, f"{name}/dim_scalar", [dim], [f"{name}/dim_scalar"],
                          OpParameter.SqueezeParam, SqueezeParamT())
            index = dim
            for step in range(k):
                index = self.binary(f"{name}/shifted_{step}", BinaryOpOperation.ADD, one, index)
            index = self.binary(f"{name}/index", BinaryOpOperation.MOD, index, dim)
            out.append(self.op(OpType.GatherV2, name, [table, index, axis], [name], OpParameter.GatherV2,
                               GatherV2T()))
        return out

    def subgraph(self, name: str, inputs: list[str], outputs: list[str]) -> SubGraphProtoT:
        sub = SubGraphProtoT()
        sub.name = name
        sub.inputs = [self.index[i] for i in inputs]
        sub.outputs = [self.index[o] for o in outputs]
        sub.tensors = self.tensors
        sub.nodes = self.ops
        return sub

    def finish(self, outputs: list[str], model_id: str, subgraphs: list[SubGraphProtoT] | None = None) -> bytes:
        net = NetT()
        net.bizCode = "MNNTest"
        net.extraInfo = ExtraInfoT()
        net.extraInfo.version = MNN_VERSION
        net.oplists = self.ops
        net.outputName = outputs
        net.sourceType = NetSource.ONNX
        net.tensorName = self.tensors
        net.subgraphs = subgraphs or None
        net.mnnUuid = str(uuid.uuid5(uuid.NAMESPACE_URL, model_id))
        builder = flatbuffers.Builder(1 << 20)
        builder.Finish(net.Pack(builder))
        return bytes(builder.Output())

