"""MNN's PipelineModule::load: turn the parsed Net into ops, constant tensors and a ScheduleInfo.

Constants come from Const ops (inline, or external in the weight file); inputs whose
*content* decides shapes (e.g. `logits_index`, which picks the slice of hidden states
the lm_head sees) are found here, so a static module knows to re-resize when they change.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Sequence

from ..core.dtypes import runtime_dtype
from ..core.op import Op
from ..core.op_params import decode
from ..core.schedule import OpNode, ScheduleInfo
from ..core.weights.const_blob import blob_to_array
from ..core.weights.file import ExternalWeightFile
from ..core.weights.moe_experts import expert_weights
from ..core.weights.op_weights import OpWeights
from ..errors import FormatError, UnsupportedError
from ..schema.MNN.MNN_DATA_FORMAT import MNN_DATA_FORMAT
from ..schema.reader import op_type_name

log = logging.getLogger(__name__)

WEIGHTED = {"Convolution", "LayerNorm"}
CONTROL_FLOW = {"While", "If", "Loop"}
# input positions of each op type that are read as shape arguments at resize time
SHAPE_ARGUMENTS = {
    "StridedSlice": (1, 2, 3, 4), "Reshape": (1,), "Squeeze": (1,), "Unsqueeze": (1,), "ExpandDims": (1,),
    "GatherV2": (2,), "Gather": (2,), "Permute": (1,), "Transpose": (1,), "Fill": (0,), "Range": (0, 1, 2),
    "Reduction": (1,), "TopKV2": (1, 2),
}


def _enum_names(enum_class) -> dict[int, str]:
    return {v: k for k, v in vars(enum_class).items() if not k.startswith("_") and isinstance(v, int)}


FORMAT_NAMES = _enum_names(MNN_DATA_FORMAT)


@dataclass
class NetInfo:
    uuid: str
    version: str
    biz_code: str
    metadata: dict
    inputs: list[str]
    outputs: list[str]
    input_dims: dict[str, list[int]] = field(default_factory=dict)  # as each Input op declares them (-1: any)


def _text(value) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else (value or "")


def build_schedule(net, path: str, weight_file: ExternalWeightFile | None,
                   inputs: Sequence[str] = (), outputs: Sequence[str] = (),
                   attn_scale: float | None = None) -> tuple[ScheduleInfo, NetInfo]:
    """`attn_scale`: the config's (MNN's KVMeta::attn_scale), see apply_attention_scale."""
    names = [_text(n) for n in (net.tensorName or [])]
    nodes, constants, input_ops = [], {}, {}
    for i, raw in enumerate(net.oplists or []):
        op_type = op_type_name(raw.type)
        name = _text(raw.name) or f"{op_type}{i}"
        if op_type in CONTROL_FLOW:
            raise UnsupportedError(f"{op_type} op {name!r}: control-flow sub-modules are not supported", file=path,
                                   field="oplists")
        extra = {"format": FORMAT_NAMES.get(raw.defaultDimentionFormat, "NHWC")}
        has_external = raw.main is not None and getattr(raw.main, "external", None) is not None
        weights = OpWeights(name, raw.main, weight_file, path) if op_type in WEIGHTED and raw.main is not None else None
        op = Op(op_type, name, table=raw.main, index=i, weights=weights, extra=extra)
        if op_type == "MoE":
            op.weights = expert_weights(net, decode(op), name, weight_file, path)
        in_idx = [int(t) for t in (raw.inputIndexes if raw.inputIndexes is not None else [])]
        out_idx = [int(t) for t in (raw.outputIndexes if raw.outputIndexes is not None else [])]
        for t in in_idx + out_idx:
            if not 0 <= t < len(names):
                raise FormatError(f"op {name!r} refers to tensor {t}, the net has {len(names)}", file=path,
                                  field="oplists.inputIndexes")
        if op_type in ("Const", "Input") and len(out_idx) != 1:
            raise FormatError(f"{op_type} op {name!r} has {len(out_idx)} outputs, not 1", file=path,
                              field="oplists.outputIndexes")
        if op_type == "Const":
            constants[out_idx[0]] = blob_to_array(raw.main, name, weight_file if has_external else None, path)
        if op_type == "Input":
            dims = getattr(raw.main, "dims", None)
            input_ops[names[out_idx[0]]] = (out_idx[0], runtime_dtype(getattr(raw.main, "dtype", 1)),
                                            [int(d) for d in dims] if dims is not None else [])
        nodes.append(OpNode(op, in_idx, out_idx))
    _annotate_attention_heads(nodes)
    apply_attention_scale(nodes, attn_scale)
    input_names = list(inputs) or list(input_ops)
    for n in input_names:
        if n not in input_ops:
            raise UnsupportedError(f"input {n!r} is not an Input of the graph", file=path, field="inputs")
    output_names = list(outputs) or _default_outputs(net, names, nodes)
    index_of = {n: i for i, n in enumerate(names)}
    for n in output_names:
        if n not in index_of:
            raise FormatError(f"output {n!r} is not a tensor of the graph", file=path, field="outputName")
    info = ScheduleInfo(nodes, names, constants,
                        {n: input_ops[n][0] for n in input_names}, {n: input_ops[n][1] for n in input_names},
                        {n: index_of[n] for n in output_names}, path)
    info.shape_inputs = _shape_inputs(info)
    extra = net.extraInfo
    net_info = NetInfo(_text(net.mnnUuid), _text(getattr(extra, "version", None)), _text(net.bizCode),
                       _metadata(extra), input_names, output_names, {n: input_ops[n][2] for n in input_names})
    return info, net_info


def _metadata(extra) -> dict:
    if extra is None:
        return {}
    meta = {"name": _text(getattr(extra, "name", None))}
    buffer = getattr(extra, "buffer", None)
    if buffer is not None and len(buffer):
        meta["buffer_bytes"] = len(buffer)
    return meta


def _default_outputs(net, names: list[str], nodes: list[OpNode]) -> list[str]:
    """As loadInternal does: the Net's outputName, else tensors produced but never consumed."""
    if net.outputName:
        return [_text(n) for n in net.outputName]
    consumed = {t for node in nodes for t in node.inputs}
    return [names[t] for node in nodes for t in node.outputs if t not in consumed and node.op.type != "Const"]


# ops between a RoPE and its Attention that keep the packed [seq, heads*dim, 1, 1] layout (Llama 4's
# weightless q/k norm: Cast, then an RMS LayerNorm)
LAYOUT_KEEPING = {"Cast", "LayerNorm", "UnaryOp", "ConvertTensor"}


def _annotate_attention_heads(nodes: list[OpNode]) -> None:
    """Exports whose AttentionParam has no head layout take it from the RoPE feeding it, directly or
    through ops that keep the layout (a q/k norm applied after rotating); such a norm's last axis is
    the head's (MNN normalizes each head of the packed q/k), so it learns head_dim too."""
    producer = {t: node for node in nodes for t in node.outputs}
    for node in nodes:
        if node.op.type != "Attention" or not node.inputs:
            continue
        norms = []
        source = producer.get(node.inputs[0])
        while source is not None and source.op.type in LAYOUT_KEEPING and source.inputs:
            norms.append(source)
            source = producer.get(source.inputs[0])
        p = source.op.table if source is not None and source.op.type == "RoPE" else None
        if p is None or not (p.numHead and p.kvNumHead and p.headDim):
            continue
        node.op.extra["heads"] = (int(p.numHead), int(p.kvNumHead), int(p.headDim))
        key = producer.get(node.inputs[1]) if len(node.inputs) > 1 else None
        while key is not None and key.op.type in LAYOUT_KEEPING and key.inputs:
            norms.append(key)
            key = producer.get(key.inputs[0])
        for norm in norms:
            if norm.op.type == "LayerNorm":
                norm.op.extra["head_dim"] = int(p.headDim)


def apply_attention_scale(nodes: list[OpNode], attn_scale: float | None) -> None:
    """MNN's KVMeta::attn_scale (the config's `attn_scale`, e.g. Gemma 4's 1.0): the score scale of
    every Attention whose own attnScale is 0, in place of 1/sqrt(head_dim); 0 or absent changes nothing."""
    if not attn_scale or attn_scale <= 0:
        return
    for node in nodes:
        if node.op.type == "Attention":
            node.op.extra["attn_scale"] = float(attn_scale)


def _shape_inputs(info: ScheduleInfo) -> list[str]:
    """Graph inputs whose values (not just shapes) reach a shape argument."""
    producer = {t: node for node in info.nodes for t in node.outputs}
    input_of = {i: n for n, i in info.input_indexes.items()}
    found, seen = set(), set()
    stack = [node.inputs[k] for node in info.nodes for k in SHAPE_ARGUMENTS.get(node.op.type, ())
             if k < len(node.inputs)]
    while stack:
        t = stack.pop()
        if t in seen:
            continue
        seen.add(t)
        if t in input_of:
            found.add(input_of[t])
            continue
        node = producer.get(t)
        if node is not None and node.op.type not in ("Shape", "Rank", "Input"):
            stack.extend(node.inputs)
    return sorted(found)
