"""Every op's parameters decoded once, when the schedule is built, into typed values that are
the same for every backend.

Backends differ in where they put the numbers (numpy arrays, device buffers), not in what the
numbers are: reading MNN's tables (defaults, optional fields, enum values, RoPE's cut dim, the
attention heads a packed layout hides) lives here, so no backend re-derives it and none reads a
raw flatbuffer field. `decode(op)` gives `op.param`; an op type without a decoder, or a table
missing what its op needs, decodes to None (a backend then refuses the op).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import FormatError, UnsupportedError
from .geometry.regions import RasterParam
from ..schema.MNN.BinaryOpOperation import BinaryOpOperation
from ..schema.MNN.EltwiseType import EltwiseType
from ..schema.MNN.ReductionType import ReductionType
from ..schema.MNN.UnaryOpOperation import UnaryOpOperation
from .dtypes import FLOAT32, runtime_dtype
from .op import Op

# Fused activations, as MNN's BinaryOp activationType numbers them (Convolution's relu/relu6 too).
NO_ACTIVATION, RELU, RELU6 = 0, 1, 2


def _enum_names(enum_class) -> dict[int, str]:
    return {v: k for k, v in vars(enum_class).items() if not k.startswith("_") and isinstance(v, int)}


BINARY_NAMES = _enum_names(BinaryOpOperation)
UNARY_NAMES = _enum_names(UnaryOpOperation)
REDUCTION_NAMES = _enum_names(ReductionType)
ELTWISE_NAMES = _enum_names(EltwiseType)


def _field(table: Any, name: str, default: Any = None) -> Any:
    value = getattr(table, name, None) if table is not None else None
    return default if value is None else value


def _floats(values) -> np.ndarray | None:
    return np.asarray(values, np.float32) if values is not None and len(values) else None


def _prod(values: Sequence[int]) -> int:
    return int(math.prod(int(v) for v in values))


# ------------------------------------------------------------------ Convolution

@dataclass(frozen=True)
class ConvolutionParams:
    """A Convolution: `oc` x `ic` channels, its kernel, stride and groups, and a fused
    activation (NO_ACTIVATION, RELU or RELU6). Its weights come from `op.weights.convolution()`."""

    oc: int
    ic: int
    kernel: tuple[int, int] = (1, 1)
    stride: tuple[int, int] = (1, 1)
    group: int = 1
    activation: int = NO_ACTIVATION
    pad: tuple[int, int] = (0, 0)  # (x, y) on both sides, MNN's padX/padY (pad mode CAFFE or VALID)
    dilation: tuple[int, int] = (1, 1)
    pad_mode: int = 0  # MNN's PadMode: 0 CAFFE (explicit pad), 1 VALID, 2 SAME

    @property
    def is_linear(self) -> bool:
        """1x1, stride 1, one group: a linear layer over the channels (all an LLM graph has)."""
        return self.kernel == (1, 1) and self.stride == (1, 1) and self.group == 1


def _convolution(op: Op) -> ConvolutionParams | None:
    common = _field(op.table, "common")
    if common is None:
        return None
    activation = RELU6 if common.relu6 else RELU if common.relu else NO_ACTIVATION
    return ConvolutionParams(int(common.outputCount or 0), int(common.inputCount or 0),
                             (int(common.kernelX or 1), int(common.kernelY or 1)),
                             (int(common.strideX or 1), int(common.strideY or 1)), int(common.group or 1), activation,
                             (int(common.padX or 0), int(common.padY or 0)),
                             (int(common.dilateX or 1), int(common.dilateY or 1)), int(common.padMode or 0))


# ------------------------------------------------------------------ LayerNorm and the q/k norms of RoPE

@dataclass(frozen=True)
class NormLayout:
    """How a norm walks a tensor: `rows` rows of `length` values, consecutive values `hw`
    apart (1, except over the channel axis of an NC4HW4 tensor)."""

    rows: int
    length: int
    hw: int = 1


@dataclass(frozen=True)
class LayerNormParams:
    """A LayerNorm (RMSNorm when `rms`) over the last `axis_count` dims, in `group` groups (a
    group spans every dim after the first; gamma/beta cover one group, as MNN's CPULayerNorm),
    or over the channel axis of an NC4HW4 tensor. Two inputs are MNN's fused residual form:
    out0 = in0 + in1, out1 = norm(out0). gamma/beta come from `op.weights.layernorm()`.
    `head_dim` (a norm on the packed [seq, heads*dim, 1, 1] q or k after a RoPE, Llama 4's
    q/k norm): its last axis is the head's, so it runs over rows of head_dim, as MNN does."""

    epsilon: float
    rms: bool
    axis_count: int = 1
    group: int = 1
    channel_axis: bool = False
    head_dim: int = 0

    def layout(self, shape: Sequence[int]) -> NormLayout:
        size = _prod(shape)
        if self.head_dim and len(shape) == 4 and tuple(shape[2:]) == (1, 1) and shape[1] % self.head_dim == 0:
            return NormLayout(size // self.head_dim, self.head_dim)
        if self.channel_axis and len(shape) == 4:
            hw = int(shape[2]) * int(shape[3])
            return NormLayout(int(shape[0]) * hw, int(shape[1]), hw)
        if self.group > 1:
            rows = int(shape[0]) * self.group
            return NormLayout(rows, size // rows if rows else 0)
        length = _prod(shape[len(shape) - self.axis_count:])
        return NormLayout(size // length if length else 0, length)


def _layernorm(op: Op) -> LayerNormParams | None:
    p = op.table
    if p is None:
        return None
    axis = list(p.axis) if p.axis is not None else [-1]
    return LayerNormParams(float(p.epsilon or 0.0), bool(p.useRmsnorm), max(1, len(axis)), int(p.group or 1),
                           op.extra.get("format") == "NC4HW4", int(op.extra.get("head_dim", 0)))


@dataclass(frozen=True, eq=False)
class QKNorm:
    """A per-head norm RoPE applies to q or k before rotating (Qwen3): over head_dim."""

    gamma: np.ndarray
    beta: np.ndarray | None
    epsilon: float
    rms: bool


def _qk_norm(table) -> QKNorm | None:
    """None when absent; a beta of another length than gamma is ignored, as MNN does."""
    gamma = _floats(_field(table, "gamma"))
    if gamma is None:
        return None
    beta = _floats(table.beta)
    return QKNorm(gamma, beta if beta is not None and len(beta) == len(gamma) else None,
                  float(table.epsilon or 0.0), bool(table.useRmsnorm))


# ------------------------------------------------------------------ RoPE, Attention

@dataclass(frozen=True, eq=False)
class RoPEParams:
    """Fused RoPE on q [seq, num_head*head_dim] and k (kv heads), rotate-half form, with the
    cos/sin inputs [.., seq, .., >= rope_dim]; the leading `rope_dim` dims of each head rotate
    (even), the rest pass through. Optional per-head norms first."""

    num_head: int
    kv_num_head: int
    head_dim: int
    rope_dim: int
    q_norm: QKNorm | None = None
    k_norm: QKNorm | None = None

    def rows(self, q_size: int, cos_size: int) -> tuple[int, int]:
        """(tokens, values per cos/sin row) of these input sizes; cos/sin rows shorter than
        rope_dim are a FormatError (a kernel would read past them)."""
        seq = q_size // (self.num_head * self.head_dim)
        stride = cos_size // seq if seq else 0
        if seq and stride < self.rope_dim:
            raise FormatError(f"RoPE cos/sin rows of {stride} values for rope_dim {self.rope_dim}", field="cos")
        return seq, stride


def _rope(op: Op) -> RoPEParams | None:
    """None when the table lacks the head layout (no backend can run it then)."""
    p = op.table
    if p is None or not p.numHead or not p.kvNumHead or not p.headDim:
        return None
    head_dim, cut = int(p.headDim), int(p.ropeCutHeadDim or 0)
    rope_dim = (cut if 0 < cut <= head_dim else head_dim) // 2 * 2
    return RoPEParams(int(p.numHead), int(p.kvNumHead), head_dim, rope_dim,
                      _qk_norm(_field(p, "qNorm")), _qk_norm(_field(p, "kNorm")))


# why a kernel without the sinks input (MNN's fifth Attention input, gpt-oss) refuses the op
SINKS_REFUSAL = "attention sinks (a fifth input, one logit per head) are not implemented"


@dataclass(frozen=True)
class AttentionParams:
    """Fused attention: q, k, v, and an optional mask (a scalar means causal). With `kv_cache`
    the layer appends k/v to its cache, which the LLM steers through `backend.kv_meta`.
    `heads` (num_head, kv_num_head, head_dim) is known when the inputs are packed
    [seq, heads*dim, 1, 1] (taken from the RoPE feeding it when the table lacks it)."""

    kv_cache: bool = True
    scale: float = 0.0  # 0: 1/sqrt(head_dim)
    heads: tuple[int, int, int] | None = None
    output_c4: bool = False

    def scale_for(self, head_dim: int) -> float:
        return self.scale or 1.0 / math.sqrt(head_dim)

    def layout(self, q_shape: Sequence[int], k_shape: Sequence[int]) -> tuple[int, int, int, int] | None:
        """(seq, heads, kv_heads, head_dim) of these input shapes, or None when they do not
        say (packed inputs without known heads, or fewer than 3 dims)."""
        q_shape, k_shape = tuple(q_shape), tuple(k_shape)
        if len(q_shape) == 4 and q_shape[2] == 1 and q_shape[3] == 1:
            if self.heads is None:
                return None
            num_head, kv_num_head, dim = self.heads
            return int(q_shape[0]), num_head, kv_num_head, dim
        if len(q_shape) < 3 or len(k_shape) < 3:
            return None
        return int(q_shape[-3]), int(q_shape[-2]), int(k_shape[-2]), int(q_shape[-1])

    def float_kernel_refusal(self, inputs: Sequence, outputs: Sequence, sinks: bool = False) -> str | None:
        """Why a device kernel on float32 q/k/v (and a float32 or int32 mask; float32 sinks when
        it adds them, `sinks`) cannot take this op, or None. The core may create Attention before
        shapes are known (so that clones share its cache): then the heads decide, and the
        kernel's on_resize checks again."""
        if self.heads is not None and self.heads[0] % self.heads[1]:
            return "heads not a multiple of kv heads"
        if any(t.dtype != np.float32 for t in (*inputs[:3], outputs[0])):
            return "float32 only"
        if len(inputs) > 3 and inputs[3].dtype not in (np.float32, np.int32):
            return "a mask neither float32 nor int32"
        if len(inputs) > 4 and not sinks:
            return SINKS_REFUSAL
        if len(inputs) > 4 and inputs[4].dtype != np.float32:
            return "sinks not float32"
        if inputs[0].shape and self.layout(inputs[0].shape, inputs[1].shape) is None:
            return "the inputs do not say the head layout"
        return None


def _attention(op: Op) -> AttentionParams:
    p = op.table
    shared = int(_field(p, "kvSharedLayerIndex", -1))
    if shared >= 0 or _field(p, "kvSharedLayer"):
        raise UnsupportedError(f"Attention {op.name!r} reads the KV cache of another layer (kv_shared_layer_index "
                               f"{shared}): KV sharing between layers (Gemma 4's num_kv_shared_layers) is not "
                               "implemented", field="kv_shared_layer_index")
    heads = op.extra.get("heads")
    scale = float(_field(p, "attnScale", 0.0)) or float(op.extra.get("attn_scale", 0.0))
    return AttentionParams(bool(_field(p, "kvCache", True)), scale,
                           tuple(int(h) for h in heads) if heads is not None else None,
                           bool(_field(p, "outputC4", False)))


@dataclass(frozen=True)
class AttentionMask:
    """What an Attention's mask input means this resize: "causal" (a scalar, or no mask),
    "float" (added to the scores) or "int" (0 blocks); a full mask is rows x cols."""

    kind: str
    rows: int = 1
    cols: int = 1


def attention_mask(mask, seq: int) -> AttentionMask:
    """The mask tensor (or None) of an Attention with `seq` queries; a full mask with fewer
    rows than queries is an UnsupportedError (a kernel would read past it)."""
    if mask is None or mask.size == 1:
        return AttentionMask("causal")
    if len(mask.shape) < 2 or mask.shape[-2] < seq:
        raise UnsupportedError(f"Attention: a mask of shape {mask.shape} has fewer rows than the {seq} queries",
                               field="attention_mask")
    return AttentionMask("int" if mask.dtype.kind in "iu" else "float", int(mask.shape[-2]), int(mask.shape[-1]))


# ------------------------------------------------------------------ elementwise and the rest

@dataclass(frozen=True)
class BinaryParams:
    """MNN's BinaryOpOperation name ("ADD", "MUL_SILU" = a * silu(b), ...) and a fused activation."""

    operation: str
    activation: int = NO_ACTIVATION


@dataclass(frozen=True)
class UnaryParams:
    operation: str  # MNN's UnaryOpOperation name ("SIN", "SILU", ...)


@dataclass(frozen=True)
class EltwiseParams:
    operation: str  # "SUM" | "PROD" | "MAXIMUM" | "SUB"


@dataclass(frozen=True)
class ReductionParams:
    operation: str  # MNN's ReductionType name ("SUM", "MEAN", ...)
    dims: tuple[int, ...] = ()  # () reduces every dim
    keep_dims: bool = False


@dataclass(frozen=True)
class CastParams:
    dtype: np.dtype  # the runtime dtype of the output


@dataclass(frozen=True)
class GatherParams:
    axis: int = 0  # a third input, when present, gives the axis at run time


@dataclass(frozen=True)
class MatMulParams:
    transpose_a: bool = False
    transpose_b: bool = False


@dataclass(frozen=True)
class SoftmaxParams:
    axis: int = -1


@dataclass(frozen=True)
class TopKParams:
    """TopKV2: k (input 1) and the axis (input 2, else the last) are read at resize."""

    largest: bool = True
    sorted: bool = True


@dataclass(frozen=True)
class MoEParams:
    """MNN's MoE op (an Extra with attrs): each token's hidden state through its top_k experts
    (subgraphs "/expert/{layer_id}_{e}"), weighted by the routing weights and summed."""

    num_experts: int
    top_k: int
    layer_id: int = 0


@dataclass(frozen=True)
class LinearAttentionParams:
    """MNN's LinearAttention: `attn_type` "short_conv" (LFM2: y = C * causal_conv(B * x), the
    input's channels B, C, x) or "gated_delta_rule"; heads and dims as the export gives them."""

    attn_type: str
    num_k_heads: int = 0
    num_v_heads: int = 0
    head_k_dim: int = 0
    head_v_dim: int = 0
    use_qk_l2norm: bool = False

    def gated_delta_rule_problem(self, channels: int | None = None, conv_channels: int | None = None) -> str | None:
        """Why a gated_delta_rule op cannot run (None when it can): positive heads and dims, v heads
        a multiple of k heads (each k head serves a group of v heads), and, once the shapes are
        known, a qkv input of `channels` and a conv weight of `conv_channels` rows = 2 * Hk * dk + Hv * dv."""
        counts = (self.num_k_heads, self.num_v_heads, self.head_k_dim, self.head_v_dim)
        if min(counts) <= 0:
            return f"heads and dims (num_k_heads, num_v_heads, head_k_dim, head_v_dim) {counts} must be positive"
        if self.num_v_heads % self.num_k_heads:
            return f"num_v_heads {self.num_v_heads} is not a multiple of num_k_heads {self.num_k_heads}"
        need = 2 * self.num_k_heads * self.head_k_dim + self.num_v_heads * self.head_v_dim
        if channels is not None and (channels != need or conv_channels != need):
            return (f"qkv has {channels} channels and the conv weight {conv_channels}, but the heads need "
                    f"2 * {self.num_k_heads} * {self.head_k_dim} + {self.num_v_heads} * {self.head_v_dim} = {need}")
        return None


@dataclass(frozen=True)
class ReluParams:
    slope: float = 0.0  # leaky slope; 0 is a plain ReLU


def _binary(op: Op) -> BinaryParams:
    return BinaryParams(BINARY_NAMES.get(int(_field(op.table, "opType", 0)), "ADD"),
                        int(_field(op.table, "activationType", 0)))


def _unary(op: Op) -> UnaryParams:
    return UnaryParams(UNARY_NAMES.get(int(_field(op.table, "opType", 0)), "ABS"))


def _eltwise(op: Op) -> EltwiseParams:
    return EltwiseParams(ELTWISE_NAMES.get(int(_field(op.table, "type", 1)), "SUM"))


def _reduction(op: Op) -> ReductionParams:
    dims = _field(op.table, "dim")
    return ReductionParams(REDUCTION_NAMES.get(int(_field(op.table, "operation", 0)), "SUM"),
                           tuple(int(d) for d in dims) if dims is not None else (),
                           bool(_field(op.table, "keepDims", False)))


def _cast(op: Op) -> CastParams:
    return CastParams(runtime_dtype(_field(op.table, "dstT"), FLOAT32))


def _gather(op: Op) -> GatherParams:
    return GatherParams(int(_field(op.table, "axis", 0)))


def _matmul(op: Op) -> MatMulParams:
    """MatMul's transposeA/B, BatchMatMul's adjX/adjY."""
    t = op.table
    return MatMulParams(bool(_field(t, "transposeA", _field(t, "adjX", False))),
                        bool(_field(t, "transposeB", _field(t, "adjY", False))))


def _softmax(op: Op) -> SoftmaxParams:
    return SoftmaxParams(int(_field(op.table, "axis", -1)))


def _topk(op: Op) -> TopKParams:
    return TopKParams(bool(_field(op.table, "largest", True)), bool(_field(op.table, "sorted", False)))


def extra_attributes(op: Op) -> dict[str, int]:
    """An Extra op's integer attributes by key."""
    attrs = _field(op.table, "attr") or []
    return {(a.key.decode() if isinstance(a.key, bytes) else a.key): int(a.i) for a in attrs if a.key is not None}


def _moe(op: Op) -> MoEParams:
    attrs = extra_attributes(op)
    for key in ("num_experts", "top_k"):
        if attrs.get(key, 0) < 1:
            raise FormatError(f"MoE op {op.name!r} needs a positive {key} attribute, got {attrs.get(key)}",
                              field=key)
    return MoEParams(attrs["num_experts"], attrs["top_k"], attrs.get("layer_id", 0))


def _linear_attention(op: Op) -> LinearAttentionParams:
    t = op.table
    kind = _field(t, "attnType")
    return LinearAttentionParams(kind.decode() if isinstance(kind, bytes) else (kind or ""),
                                 int(_field(t, "numKHeads", 0)), int(_field(t, "numVHeads", 0)),
                                 int(_field(t, "headKDim", 0)), int(_field(t, "headVDim", 0)),
                                 bool(_field(t, "useQkL2norm", False)))


def _relu(op: Op) -> ReluParams:
    return ReluParams(float(_field(op.table, "slope", 0.0)))


DECODERS: dict[str, Callable[[Op], Any]] = {
    "Convolution": _convolution, "Im2Col": _convolution, "LayerNorm": _layernorm, "RoPE": _rope, "Attention": _attention,
    "BinaryOp": _binary, "UnaryOp": _unary, "Eltwise": _eltwise, "Reduction": _reduction, "Cast": _cast,
    "GatherV2": _gather, "Gather": _gather, "MatMul": _matmul, "BatchMatMul": _matmul, "Softmax": _softmax,
    "ReLU": _relu, "TopKV2": _topk, "MoE": _moe, "LinearAttention": _linear_attention,
}

OpParams = (ConvolutionParams | LayerNormParams | RoPEParams | AttentionParams | BinaryParams | UnaryParams
            | EltwiseParams | ReductionParams | CastParams | GatherParams | MatMulParams | SoftmaxParams
            | ReluParams | TopKParams | MoEParams | LinearAttentionParams | RasterParam)


def decode(op: Op) -> Any:
    """`op.param` for this op: its given param when it has one, else the table decoded."""
    if op.param is not None:
        return op.param
    decoder = DECODERS.get(op.type)
    return None if decoder is None else decoder(op)
