"""MNN's split LoRA layout (`llmexport --lora_path P --lora_split`): `lora.mnn` beside the base.

It is the base graph with, after each adapted linear `/layers.{i}/{group}/{key}/Linear`, two
Convolution 1x1 ops with inline fp32 weights, `{i}{key}_A` (A, [r, in]) and `{i}{key}_B`
(scale * B, [out, r]), and a BinaryOp ADD `{i}{key}_add` of the linear's output and B's; every
consumer of the linear's output reads the sum instead. Every other op keeps its name and its
`external` offsets into the base's llm.mnn.weight, so loaded over the base (MNN's
`Llm::create_lora`, Module::Config.base) those ops reuse the base's packed weights and only the
small A/B ops pack weights of their own: y = W x + scale * B (A x), the adapter unmerged.
"""
from __future__ import annotations

import re
import uuid

import flatbuffers
import numpy as np

from mnnllm_core.errors import UnsupportedError
from mnnllm_core.schema.MNN.BinaryOp import BinaryOpT
from mnnllm_core.schema.MNN.BinaryOpOperation import BinaryOpOperation
from mnnllm_core.schema.MNN.Convolution2D import Convolution2DT
from mnnllm_core.schema.MNN.Convolution2DCommon import Convolution2DCommonT
from mnnllm_core.schema.MNN.DataType import DataType
from mnnllm_core.schema.MNN.Op import OpT
from mnnllm_core.schema.MNN.OpParameter import OpParameter
from mnnllm_core.schema.MNN.OpType import OpType
from mnnllm_core.schema.reader import read_net

from .lora import LoraAdapter

LORA_GRAPH = "lora.mnn"
_LINEAR = re.compile(r"^/layers\.(?P<layer>\d+)/(?P<group>self_attn|mlp)/(?P<key>\w+)/Linear$")


def split_lora_graph(base_graph: bytes, adapter: LoraAdapter, model_id: str) -> bytes:
    """The packed lora.mnn for `adapter` over the packed base graph `base_graph`."""
    net = read_net(base_graph)
    names: list[str] = list(net.tensorName)
    ops: list[OpT] = []
    used: set[str] = set()
    for op in net.oplists:
        ops.append(op)
        match = _LINEAR.match(op.name or "") if op.type == OpType.Convolution else None
        pair = adapter.pairs.get(f"model.layers.{match['layer']}.{match['group']}.{match['key']}.weight") \
            if match else None
        if pair is None:
            continue
        used.add(pair.weight_name)
        tag = f"{match['layer']}{match['key']}"
        source, out = int(op.inputIndexes[0]), int(op.outputIndexes[0])
        fmt = op.defaultDimentionFormat
        a_out = _tensor(names, f"{tag}_A")
        b_out = _tensor(names, f"{tag}_B")
        total = _tensor(names, f"{tag}_add")
        ops.append(_inline_linear(f"{tag}_A", source, a_out, pair.a, fmt))
        ops.append(_inline_linear(f"{tag}_B", a_out, b_out, np.float32(pair.scale) * pair.b, fmt))
        ops.append(_add(f"{tag}_add", out, b_out, total, fmt))
        _reroute(net.oplists, op, out, total)
    unused = sorted(set(adapter.pairs) - used)
    if unused:
        raise UnsupportedError(f"the adapter adapts {unused[0]!r}, which is not one linear op of the graph (a fused "
                               f"weight, or not a linear): the split layout cannot carry it, merge it instead",
                               file=str(adapter.weights_path), field=unused[0])
    net.oplists = ops
    net.tensorName = names
    net.mnnUuid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{model_id}|lora|{adapter.folder.resolve()}"))
    builder = flatbuffers.Builder(len(base_graph) + (1 << 16))
    builder.Finish(net.Pack(builder))
    return bytes(builder.Output())


def _tensor(names: list[str], name: str) -> int:
    names.append(name)
    return len(names) - 1


def _inline_linear(name: str, x: int, out: int, weight: np.ndarray, fmt: int) -> OpT:
    """A Convolution 1x1 with its fp32 weight ([oc, ic]) and zero bias inline, as MNN's LoRA writes it."""
    oc, ic = weight.shape
    common = Convolution2DCommonT()
    common.outputCount, common.inputCount = int(oc), int(ic)
    common.kernelX = common.kernelY = common.strideX = common.strideY = common.dilateX = common.dilateY = 1
    common.group = 1
    conv = Convolution2DT()
    conv.common = common
    conv.weight = np.ascontiguousarray(weight, np.float32).reshape(-1)
    conv.bias = np.zeros(oc, np.float32)
    return _op(OpType.Convolution, name, [x], out, OpParameter.Convolution2D, conv, fmt)


def _add(name: str, a: int, b: int, out: int, fmt: int) -> OpT:
    param = BinaryOpT()
    param.opType, param.t = BinaryOpOperation.ADD, DataType.DT_FLOAT
    return _op(OpType.BinaryOp, name, [a, b], out, OpParameter.BinaryOp, param, fmt)


def _op(op_type: int, name: str, inputs: list[int], out: int, main_type: int, main, fmt: int) -> OpT:
    op = OpT()
    op.type, op.name = op_type, name
    op.inputIndexes, op.outputIndexes = inputs, [out]
    op.mainType, op.main = main_type, main
    op.defaultDimentionFormat = fmt
    return op


def _reroute(oplists: list[OpT], producer: OpT, old: int, new: int) -> None:
    """Every op after `producer` that reads tensor `old` reads `new` (the linear plus its LoRA) instead."""
    after = False
    for op in oplists:
        if op is producer:
            after = True
            continue
        if after and op.inputIndexes is not None and old in [int(t) for t in op.inputIndexes]:
            op.inputIndexes = [new if int(t) == old else int(t) for t in op.inputIndexes]

