"""Output shapes and dtypes of each op type (MNN's SizeComputer), computed at resize."""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from ..errors import UnsupportedError
from .geometry.shape_args import (concat_axis, gather_axis, normalize_axis, permute_axes,
                                   reshape_dims, squeeze_axes, strided_slice_output_shape,
                                   strided_slice_plan)
from .dtypes import INT32
from .op import Op
from .tensor import Tensor

Shape = tuple[int, ...]
Result = list[tuple[Shape, np.dtype]]
COMPARISONS = {"GREATER", "GREATER_EQUAL", "LESS", "LESS_EQUAL", "EQUAL", "NOTEQUAL",
               "LOGICALOR", "LOGICALXOR"}


def _param(op: Op, name: str, default=None):
    """A field of the op's MNN table, for the ops without typed params (`op_params`)."""
    value = getattr(op.table, name, None) if op.table is not None else None
    return default if value is None else value


def broadcast(*shapes: Shape) -> Shape:
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*shapes))
    except ValueError as err:
        raise UnsupportedError(f"shapes {shapes} do not broadcast") from err


def _same(op, ins) -> Result:
    return [(ins[0].shape, ins[0].dtype)]


def _layernorm(op, ins) -> Result:
    return [(ins[0].shape, ins[0].dtype)] * (2 if len(ins) == 2 else 1)


def _binary(op, ins) -> Result:
    dtype = INT32 if op.param.operation in COMPARISONS else ins[0].dtype
    return [(broadcast(ins[0].shape, ins[1].shape), dtype)]


def _convolution(op, ins) -> Result:
    p = op.param
    if p is None:
        raise UnsupportedError(f"Convolution {op.name!r} has no parameter table", field="common")
    shape = list(ins[0].shape)
    if len(shape) == 2:
        return [((shape[0], p.oc), ins[0].dtype)]
    if len(shape) != 4:
        raise UnsupportedError(f"Convolution {op.name!r}: input of rank {len(shape)}, not NCHW", field="inputIndexes")
    shape[1] = p.oc
    shape[2], shape[3] = sliding_output(op, shape[2], shape[3])
    return [(tuple(shape), ins[0].dtype)]


def sliding_output(op: Op, height: int, width: int) -> tuple[int, int]:
    """Output rows and columns of a Convolution/Im2Col window (kernel, stride, pad, dilation; pad
    modes CAFFE and VALID)."""
    p = op.param
    if p.pad_mode not in (0, 1):
        raise UnsupportedError(f"{op.type} {op.name!r}: pad mode {p.pad_mode} (only CAFFE and VALID)",
                               field="common.padMode")
    pad_x, pad_y = p.pad if p.pad_mode == 0 else (0, 0)
    out = []
    for size, kernel, stride, pad, dilation in ((height, p.kernel[1], p.stride[1], pad_y, p.dilation[1]),
                                                (width, p.kernel[0], p.stride[0], pad_x, p.dilation[0])):
        count = (size + 2 * pad - dilation * (kernel - 1) - 1) // stride + 1
        if count < 1:
            raise UnsupportedError(f"{op.type} {op.name!r}: a {kernel}-wide window does not fit {size} values",
                                   field="common.kernelX")
        out.append(count)
    return out[0], out[1]


def _im2col(op, ins) -> Result:
    """[N, C, H, W] -> [N, C * kh * kw, oh * ow], torch's unfold."""
    n, c, h, w = ins[0].shape
    oh, ow = sliding_output(op, h, w)
    return [((n, c * op.param.kernel[0] * op.param.kernel[1], oh * ow), ins[0].dtype)]


def _slice_tf(op, ins) -> Result:
    begin = ins[1].host.reshape(-1).astype(int)
    size = ins[2].host.reshape(-1).astype(int)
    shape = ins[0].shape
    out = tuple(d - b if s == -1 else s for d, b, s in zip(shape, begin, size))
    if len(begin) != len(shape) or any(b < 0 or o < 0 or b + o > d for d, b, o in zip(shape, begin, out)):
        raise UnsupportedError(f"SliceTf {op.name!r}: begin {begin.tolist()} size {size.tolist()} outside {shape}",
                               field="inputIndexes")
    return [(out, ins[0].dtype)]


def _unpack(op, ins) -> Result:
    shape = ins[0].shape
    axis = normalize_axis(int(_param(op, "axis", 0)), len(shape))
    rest = shape[:axis] + shape[axis + 1:]
    return [(rest, ins[0].dtype)] * shape[axis]


def _rope(op, ins) -> Result:
    return [(ins[0].shape, ins[0].dtype), (ins[1].shape, ins[1].dtype)]


def _attention(op, ins) -> Result:
    q = ins[0].shape
    if len(q) == 4 and q[2] == 1 and q[3] == 1:  # packed [seq, heads*dim, 1, 1]
        return [(q, ins[0].dtype)]
    if op.param.output_c4:
        return [((q[0] * q[1], q[2] * q[3], 1, 1), ins[0].dtype)]
    return [((q[0], q[1], q[2] * q[3]), ins[0].dtype)]


def _gated_delta_rule(op, ins) -> Result:
    """qkv [1, D, tokens] (MNN's layout, after the graph's Permute) -> [1, tokens, Hv, dv], or qkv
    [tokens, D, 1, 1] (a Linear's output, where MNN's transformer fusion dropped the Permute) ->
    [tokens, Hv * dv, 1, 1]; gate and beta [.., tokens, Hv], conv weight [D, 1, K]."""
    param, shape = op.param, ins[0].shape
    mnn_layout = len(shape) == 3
    tokens = shape[2] if mnn_layout else shape[0]
    problem = param.gated_delta_rule_problem(shape[1] if len(shape) > 1 else 0, ins[3].shape[0])
    if problem is None and mnn_layout and shape[0] != 1:
        problem = f"qkv {shape} is [batch, D, tokens] with a batch of {shape[0]} (only 1)"
    if problem is None and any(int(np.prod(t.shape)) != tokens * param.num_v_heads for t in ins[1:3]):
        problem = f"gate {ins[1].shape} and beta {ins[2].shape} must hold {tokens} tokens x {param.num_v_heads} v heads"
    if problem:
        raise UnsupportedError(f"LinearAttention {op.name!r}: gated_delta_rule: {problem}", field="param")
    if mnn_layout:
        return [((1, tokens, param.num_v_heads, param.head_v_dim), ins[0].dtype)]
    return [((tokens, param.num_v_heads * param.head_v_dim, 1, 1), ins[0].dtype)]


def _linear_attention(op, ins) -> Result:
    """short_conv: [tokens, 3 * channels, ...] (B, C, x) -> [tokens, channels, 1, 1] (C4, as the
    Linear after it takes it); gated_delta_rule: see `_gated_delta_rule`."""
    if op.param.attn_type == "gated_delta_rule":
        return _gated_delta_rule(op, ins)
    if op.param.attn_type != "short_conv":
        raise UnsupportedError(f"LinearAttention {op.name!r}: attn_type {op.param.attn_type!r} "
                               "(only short_conv and gated_delta_rule)", field="attn_type")
    shape = ins[0].shape
    if len(shape) < 2 or shape[1] % 3:
        raise UnsupportedError(f"LinearAttention {op.name!r}: short_conv needs 3 * channels, got {shape}",
                               field="inputs")
    return [((shape[0], shape[1] // 3, 1, 1), ins[0].dtype)]


def _cast(op, ins) -> Result:
    return [(ins[0].shape, op.param.dtype)]


def _shape(op, ins) -> Result:
    return [((len(ins[0].shape),), INT32)]


def _rank(op, ins) -> Result:
    return [((), INT32)]


def _gather(op, ins) -> Result:
    axis = gather_axis(op, ins)
    params = ins[0].shape
    return [(params[:axis] + tuple(ins[1].shape) + params[axis + 1:], ins[0].dtype)]


def _concat(op, ins) -> Result:
    rank = len(ins[0].shape)
    axis = concat_axis(op, rank)
    shape = list(ins[0].shape)
    shape[axis] = sum(t.shape[axis] for t in ins)
    return [(tuple(shape), ins[0].dtype)]


def _strided_slice(op, ins) -> Result:
    plan = strided_slice_plan(op, ins)
    if plan is None:
        raise UnsupportedError(f"StridedSlice {op.name!r}: bounds known only at run time", field="begin")
    return [(tuple(strided_slice_output_shape(op, ins, plan[2])), ins[0].dtype)]


def _squeeze(op, ins) -> Result:
    shape = list(ins[0].shape)
    axes = squeeze_axes(op, ins)
    if axes is None:
        return [(tuple(d for d in shape if d != 1), ins[0].dtype)]
    drop = {normalize_axis(a, len(shape)) for a in axes}
    return [(tuple(d for i, d in enumerate(shape) if i not in drop), ins[0].dtype)]


def _unsqueeze(op, ins) -> Result:
    shape = list(ins[0].shape)
    axes = squeeze_axes(op, ins) or []
    rank = len(shape) + len(axes)
    for axis in sorted(normalize_axis(a, rank) for a in axes):
        shape.insert(axis, 1)
    return [(tuple(shape), ins[0].dtype)]


def _expand_dims(op, ins) -> Result:
    axis = int(ins[1].host.reshape(-1)[0]) if len(ins) > 1 and ins[1].host is not None else int(_param(op, "axis", 0))
    shape = list(ins[0].shape)
    shape.insert(normalize_axis(axis, len(shape) + 1), 1)
    return [(tuple(shape), ins[0].dtype)]


def _reshape(op, ins) -> Result:
    source = ins[0].shape
    dims = reshape_dims(op, ins)
    shape = [source[i] if d == 0 and i < len(source) else d for i, d in enumerate(dims)]
    total = int(np.prod(source, dtype=np.int64))
    if shape.count(-1) == 1:
        known = int(np.prod([d for d in shape if d != -1], dtype=np.int64))
        shape[shape.index(-1)] = total // known if known else 0
    if int(np.prod(shape, dtype=np.int64)) != total:
        raise UnsupportedError(f"Reshape {op.name!r}: cannot reshape {source} to {dims}", field="dims")
    return [(tuple(shape), ins[0].dtype)]


def _flatten(op, ins) -> Result:
    axis = normalize_axis(int(_param(op, "axis", 1)), len(ins[0].shape))
    shape = ins[0].shape
    return [((int(np.prod(shape[:axis], dtype=np.int64)), int(np.prod(shape[axis:], dtype=np.int64))), ins[0].dtype)]


def _permute(op, ins) -> Result:
    axes = permute_axes(op, ins)
    if axes is None:
        raise UnsupportedError(f"{op.type} {op.name!r}: permutation known only at run time", field="dims")
    return [(tuple(ins[0].shape[a] for a in axes), ins[0].dtype)]


def _matmul(op, ins) -> Result:
    a, b = list(ins[0].shape), list(ins[1].shape)
    if op.param.transpose_a:
        a[-2], a[-1] = a[-1], a[-2]
    if op.param.transpose_b:
        b[-2], b[-1] = b[-1], b[-2]
    batch = broadcast(tuple(a[:-2]), tuple(b[:-2]))
    return [(batch + (a[-2], b[-1]), ins[0].dtype)]


def _reduction(op, ins) -> Result:
    shape = list(ins[0].shape)
    dims = op.param.dims
    if len(ins) > 1 and ins[1].host is not None:
        dims = ins[1].host.reshape(-1).tolist()
    axes = sorted({normalize_axis(int(d), len(shape)) for d in dims}) if len(dims) else list(range(len(shape)))
    keep = op.param.keep_dims
    out = [1 if i in axes else d for i, d in enumerate(shape)] if keep else [d for i, d in enumerate(shape) if i not in axes]
    return [(tuple(out), ins[0].dtype)]


def _topk(op, ins) -> Result:
    """Values and int32 indices: the input's shape with the axis cut to k (MNN's TopKV2SizeComputer)."""
    shape = list(ins[0].shape)
    k = int(ins[1].host.reshape(-1)[0])
    axis = normalize_axis(int(ins[2].host.reshape(-1)[0]), len(shape)) if len(ins) > 2 else len(shape) - 1
    if not 0 < k <= shape[axis]:
        raise UnsupportedError(f"TopKV2 {op.name!r}: k={k} on an axis of {shape[axis]}", field="k")
    shape[axis] = k
    return [(tuple(shape), ins[0].dtype), (tuple(shape), INT32)]


def _select(op, ins) -> Result:
    return [(broadcast(ins[0].shape, ins[1].shape, ins[2].shape), ins[1].dtype)]


def _fill(op, ins) -> Result:
    return [(tuple(int(v) for v in ins[0].host.reshape(-1)), ins[1].dtype)]


def _range(op, ins) -> Result:
    start, limit, delta = (ins[i].host.reshape(-1)[0] for i in range(3))
    if delta == 0:
        raise UnsupportedError(f"Range {op.name!r}: a delta of 0", field="delta")
    count = max(0, int(np.ceil((limit - start) / delta)))
    return [((count,), ins[0].dtype)]


SIZE_COMPUTERS: dict[str, Callable[[Op, Sequence[Tensor]], Result]] = {
    "Convolution": _convolution, "LayerNorm": _layernorm, "RoPE": _rope, "Attention": _attention,
    "BinaryOp": _binary, "UnaryOp": _same, "Eltwise": _same, "ReLU": _same, "Sigmoid": _same,
    "Softmax": _same, "TanH": _same, "Cast": _cast, "Shape": _shape, "Rank": _rank,
    "GatherV2": _gather, "Gather": _gather, "Concat": _concat, "StridedSlice": _strided_slice,
    "Squeeze": _squeeze, "Unsqueeze": _unsqueeze, "ExpandDims": _expand_dims, "Reshape": _reshape,
    "Flatten": _flatten, "ConvertTensor": _same, "Permute": _permute, "Transpose": _permute,
    "MatMul": _matmul, "BatchMatMul": _matmul, "Reduction": _reduction, "Select": _select,
    "Fill": _fill, "Range": _range, "TopKV2": _topk, "MoE": _same,
    "LinearAttention": _linear_attention, "Im2Col": _im2col, "SliceTf": _slice_tf, "Unpack": _unpack,
}


def compute_size(op: Op, inputs: Sequence[Tensor]) -> Result:
    computer = SIZE_COMPUTERS.get(op.type)
    if computer is None:
        raise UnsupportedError(f"op type {op.type} ({op.name!r}) is not supported: no shape rule", field="type")
    try:
        results = computer(op, inputs)
    except (IndexError, ValueError, TypeError, AttributeError) as err:
        shapes = [t.shape for t in inputs]
        raise UnsupportedError(f"{op.type} {op.name!r}: cannot compute the output shape from inputs {shapes}: "
                               f"{err}", field="inputIndexes") from err
    return results
