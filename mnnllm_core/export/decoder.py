"""Build llm.mnn: the op graph MNN's exporter emits for a decoder, in one of its two shapes.

Only the part of MNN's graph that computes the outputs is written (MNN's file also carries dead
shape computations left behind by its optimizer). Shared by both shapes:

    position_ids -> Cast -> Reshape [-1,1] -> * inv_freq -> Cos, Sin -> [2,seq,d/2] -> concat with
        itself on the last axis -> Unsqueeze 2, 1 -> [2,1,seq,1,d] -> GatherV2 0 (cos) and 1 (sin);
        one such table per distinct rotary (Gemma 3: local and global; a NoPE layer: inv_freq 0);
        a query scale other than 1/sqrt(head_dim) (Gemma's query_pre_attn_scalar) multiplies the
        table by sqrt(scale * sqrt(head_dim)): q and k both carry it, so q.k does once. MNN 3.6.1's
        runtime ignores AttentionParam.attnScale, so the scale cannot go there. YaRN's attention
        factor multiplies the table too (partial rotary: a table of rotary_dim, RoPE's ropeCutHeadDim).
    attention_mask: [1,1,-1,-1] (full attention: the causal mask lives in Attention), or for
        "mix" attention [2,1,1,-1,-1], plane 0 full, plane 1 sliding, picked per layer by GatherV2
    per layer: q, k, v Convolution 1x1 (the quantized linear, NC4HW4 in and out) -> RoPE(q, k, cos,
        sin) with the optional per-head q/k norm tables -> Attention(q, k, v, mask[, sinks]) -> o_proj;
        HunYuan (norms after the rotation): q, k to [1,seq,heads,d], x*cos + concat(-x2, x1)*sin from
        plain ops, then a LayerNorm each; LFM2's conv layers: in_proj -> LinearAttention "short_conv"
        (over Fill zeros and the inline [H,1,K] conv weight) -> out_proj

`c4` (MNN's transformer_c4 fusion, llama-like models): the hidden state stays NC4HW4 [seq,H,1,1];
each LayerNorm from layer 1 on is fused with the residual add (inputs (residual, x), outputs
(residual + x, norm)); the MLP is gate, up -> BinaryOp MUL_SILU(up, gate) -> down.

`plain` (Gemma, MoE models): the hidden state is NCHW [1,seq,H]; every Linear is Reshape [-1,ic,1,1]
-> ConvertTensor -> Convolution -> ConvertTensor -> Reshape [1,-1,oc]; residual adds are BinaryOps;
Gemma's sandwich norms, GELU-tanh (spelled out as MNN writes it) and final soft-cap; Phi's parallel
block (x + attention(h) + mlp(h)), LayerNorms with bias and ungated fc1 -> GELU-tanh -> fc2; MoE layers
are a router Linear -> Softmax (Sigmoid, + selection bias) -> TopKV2 (-> Softmax of the top-k, or
Reduction SUM, RealDiv) -> MoE op over expert subgraphs (silu or gpt-oss's clamped swiglu).

Per-layer variations the architecture files ask for (llama.AttentionSpec / MlpSpec / Model hooks):
a gated output (Qwen3.5: q_gate_proj -> Sigmoid -> Mul before o_proj), partial or proportional rotary
(RoPEParam.ropeCutHeadDim), a per-layer head size and KV heads (Gemma 4's full layers, one rotary
table per head size), a weightless v or q/k norm, a linear-attention mixer (linear_attention.py),
per-layer embeddings and a layer scalar (per_layer_embedding.py), a shared expert and Llama 4's
sigmoid-scaled top-1 routing in the MoE.

Weights are written as the ops that use them are built, so llm.mnn.weight comes out in MNN's
order: each layer's input norm, q, k, v, o, its norms and MLP; then the final norm and the lm_head.
"""
from __future__ import annotations

import math

import numpy as np

from mnnllm_core.errors import UnsupportedError
from mnnllm_core.schema.MNN.AttentionParam import AttentionParamT
from mnnllm_core.schema.MNN.Axis import AxisT
from mnnllm_core.schema.MNN.BinaryOpOperation import BinaryOpOperation
from mnnllm_core.schema.MNN.CastParam import CastParamT
from mnnllm_core.schema.MNN.Convolution2D import Convolution2DT
from mnnllm_core.schema.MNN.Convolution2DCommon import Convolution2DCommonT
from mnnllm_core.schema.MNN.DataType import DataType
from mnnllm_core.schema.MNN.GatherV2 import GatherV2T
from mnnllm_core.schema.MNN.IDSTQuan import IDSTQuanT
from mnnllm_core.schema.MNN.LayerNorm import LayerNormT
from mnnllm_core.schema.MNN.LinearAttentionParam import LinearAttentionParamT
from mnnllm_core.schema.MNN.OpParameter import OpParameter
from mnnllm_core.schema.MNN.OpType import OpType
from mnnllm_core.schema.MNN.ReductionParam import ReductionParamT
from mnnllm_core.schema.MNN.ReductionType import ReductionType
from mnnllm_core.schema.MNN.RoPEParam import RoPEParamT
from mnnllm_core.schema.MNN.SubGraphProto import SubGraphProtoT
from mnnllm_core.schema.MNN.TopKV2 import TopKV2T
from mnnllm_core.schema.MNN.UnaryOpOperation import UnaryOpOperation

from .graph import NC4HW4, NCHW, NHWC, GraphBuilder
from .linear_attention import GatedDeltaNetLayers
from .per_layer_embedding import PerLayerEmbeddings
from .llama import AttentionSpec, Model
from .rope import RopeSpec
from .sources import LazyTensor, Source
from .weights import LinearInfo, WeightWriter

LM_HEAD = "/lm/lm_head/Linear"  # the op whose bits are `--lm-quant-bit`
# The end index of the logits slice: "to the end" in MNN's graph.
_SLICE_END = 1 << 30
_SCALE_FP16 = 1
_GELU_C = math.sqrt(2.0 / math.pi)
_NOPE = RopeSpec(theta=1.0, kind="nope")  # the key of the angle-0 table of NoPE layers


class DecoderGraph(GatedDeltaNetLayers, PerLayerEmbeddings):
    """Emits the graph of one model, writing its weights through `weights` on the way."""

    def __init__(self, model: Model, source: Source, weights: WeightWriter):
        self.model = model
        self.args = model.args
        self.source = source
        self.weights = weights
        self.g = GraphBuilder()
        self.subgraphs: list[SubGraphProtoT] = []
        self.tables: dict[tuple[RopeSpec, float, int], tuple[str, str]] = {}
        self.masks: dict[bool, str] = {}
        self.kv_tensors: dict[int, tuple[str, str, str | None]] = {}  # layer -> (k before RoPE, v, k_norm)
        self.rotary_dims: dict[tuple[RopeSpec, float, int], int] = {}

    def build(self, model_id: str) -> tuple[bytes, LinearInfo]:
        """The packed llm.mnn and where the lm_head's block went (for `tie_embeddings`)."""
        x = self._inputs()
        self._rotary_tables()
        body = self._c4_body if self.model.style == "c4" else self._plain_body
        logits, lm_head = body(x)
        return self.g.finish([logits, "hidden_states"], model_id, self.subgraphs), lm_head

    # -- inputs, rotary tables, masks ---------------------------------------

    def _inputs(self) -> str:
        g, a, hidden = self.g, self.args, self.args.hidden_size
        windows = any(self.model.attention(i).window for i in range(self.args.num_hidden_layers))
        g.input("input_ids", [1, 1, hidden], DataType.DT_FLOAT)
        g.input("attention_mask", [2, 1, 1, -1, -1] if windows else [1, 1, -1, -1], DataType.DT_FLOAT)
        g.input("position_ids", [1, -1], DataType.DT_INT32)
        g.input("logits_index", [1], DataType.DT_INT32)
        if self.model.per_layer_dim:
            g.input("ple_embeddings", [1, -1, a.num_hidden_layers * self.model.per_layer_dim], DataType.DT_FLOAT)
        self.one = g.const_int("/rotary/one", [1], None)
        self.axis1 = g.const_int("/rotary/axis_1", [1], [1])
        self.axis0 = g.const_int("/rotary/Constant_3_output_0", [0], [1])
        if windows:
            full, sliding = g.planes("attention_mask", 2, ["/Gather_output_0", "/Gather_1_output_0"], self.one,
                                     self.axis1)
            self.masks = {False: full, True: sliding}
        else:
            self.masks = {False: "attention_mask"}
        x = "input_ids"
        if self.model.embed_scale is not None:
            scale = g.const_float("/Constant_output_0", float(self.model.embed_scale))
            x = g.binary("/Mul_output_0", BinaryOpOperation.MUL, x, scale)
        shape = g.const_int("/blocks.0/Constant_output_0", [1, -1, hidden], [3])
        return g.reshape("/blocks.0/Reshape_output_0", [x, shape], None, NHWC)

    def _rotary_tables(self) -> None:
        """One cos/sin table per distinct rotary of the layers, in the order the layers first use them."""
        g, a = self.g, self.args
        keys = []
        for i in self._attention_layers():
            key = self._table_key(i)
            if key not in keys:
                keys.append(key)
        cast = CastParamT()
        cast.srcT, cast.dstT = DataType.DT_VARIANT, DataType.DT_FLOAT
        pos = g.op(OpType.Cast, "/rotary/Cast_output_0", ["position_ids"], ["/rotary/Cast_output_0"],
                   OpParameter.CastParam, cast)
        column = g.const_int("/rotary/Constant_output_0", [-1, 1], [2])
        pos = g.reshape("/rotary/Reshape_output_0", [pos, column], None, NHWC)
        axis2 = g.const_int("/rotary/Constant_5_output_0", [2], [1])
        for n, (spec, gain, head_dim) in enumerate(keys):
            p = "/rotary" if n == 0 else f"/rotary_{n}"
            inv = np.zeros(head_dim // 2, np.float32) if spec is _NOPE else spec.inv_freq(head_dim)
            self.rotary_dims[(spec, gain, head_dim)] = 2 * inv.size
            freq = g.const_float(f"{p}/Constant_1_output_0", inv)
            angle = g.binary(f"{p}/Mul_output_0", BinaryOpOperation.MUL, pos, freq)
            parts = [g.unsqueeze(f"{p}/Unsqueeze_{tag}", g.unary(f"{p}/{tag}_output_0", fn, angle), self.axis0)
                     for fn, tag in ((UnaryOpOperation.COS, "Cos"), (UnaryOpOperation.SIN, "Sin"))]
            both = g.concat(f"{p}/Concat_output_0", parts, 0)
            if gain != 1.0:
                both = g.binary(f"{p}/scaled", BinaryOpOperation.MUL, both, g.const_float(f"{p}/gain", gain))
            both = g.concat(f"{p}/Concat_1_output_0", [both, both], -1)
            both = g.unsqueeze(f"{p}/Unsqueeze_2_output_0", both, axis2)
            table = g.unsqueeze(f"{p}/Unsqueeze_3_output_0", both, self.axis1)
            names = [f"/blocks.{n}/self_attn/Gather_2_output_0", f"/blocks.{n}/self_attn/Gather_3_output_0"]
            cos, sin = g.planes(table, 2, names, self.one, self.axis1)
            self.tables[(spec, gain, head_dim)] = (cos, sin)

    def _attention_layers(self) -> list[int]:
        m = self.model
        return [i for i in range(self.args.num_hidden_layers)
                if m.mixer(i) == "attention" and m.linear_attention(i) is None]

    def _table_key(self, layer: int) -> tuple[RopeSpec, float, int]:
        spec = self.model.attention(layer)
        head_dim = spec.head_dim or self.args.head_dim
        gain = 1.0 if spec.scale is None else math.sqrt(spec.scale * math.sqrt(head_dim))
        if spec.rope is not None:
            gain *= spec.rope.attention_factor  # YaRN: q and k both carry it, as cos and sin do in transformers
        return spec.rope or _NOPE, gain, head_dim

    # -- the two graph shapes ------------------------------------------------

    def _c4_body(self, x: str) -> tuple[str, LinearInfo]:
        g, a, m = self.g, self.args, self.model
        hidden = a.hidden_size
        x = g.reshape("FuseTransformerC4_region_pre_reshape", [x], [-1, hidden, 1, 1], NCHW)
        x = g.convert("FuseTransformerC4_region_pre_convert", x, NCHW, NC4HW4, NCHW)
        residual = x
        h = self._layernorm("/blocks.0/input_layernorm/Mul_1_output_0", m.input_norm(0), [x],
                            ["/blocks.0/input_layernorm/Mul_1_output_0"], NC4HW4)
        for i in range(a.num_hidden_layers):
            attn = self._mixer(i, h)
            residual, h = self._fused_norm(f"/blocks.{i}/post_attention_layernorm/Mul_1_output_0",
                                           m.post_attention_norm(i), residual, attn, f"/blocks.{i}/Add_output_0")
            gate = self._conv(f"/layers.{i}/mlp/gate_proj/Linear", h, m.linear_weight(self.source, i, "gate_proj"))
            up = self._conv(f"/layers.{i}/mlp/up_proj/Linear", h, m.linear_weight(self.source, i, "up_proj"))
            act = g.binary(f"/blocks.{i}/mlp/Mul_output_0", BinaryOpOperation.MUL_SILU, up, gate, NC4HW4,
                           f"/layers.{i}/mlp/down_proj/Linear/pre_convert")
            mlp = self._conv(f"/layers.{i}/mlp/down_proj/Linear", act, m.linear_weight(self.source, i, "down_proj"))
            if i + 1 < a.num_hidden_layers:
                residual, h = self._fused_norm(f"/blocks.{i + 1}/input_layernorm/Mul_1_output_0",
                                               m.input_norm(i + 1), residual, mlp, f"/blocks.{i}/Add_1_output_0")
        last = g.binary(f"/blocks.{a.num_hidden_layers - 1}/Add_1_output_0", BinaryOpOperation.ADD, residual, mlp,
                        NC4HW4)
        end = g.const_int("/Constant_1_output_0", [_SLICE_END], [1])
        x = g.strided_slice("/Slice_output_0", [last, "logits_index", end, self.axis0, self.axis1],
                            DataType.DT_INVALID, 1, NC4HW4)
        hidden_states = self._layernorm("hidden_states", m.final_norm(), [x], ["hidden_states"], NC4HW4)
        logits, info = self._linear(LM_HEAD, hidden_states, self.source.tensor(m.lm_head()),
                                    self._tensor_or_none(m.lm_head_bias()))
        logits = g.convert("/lm/lm_head/Linear/post_convert", logits, NC4HW4, NCHW, NHWC)
        logits = g.reshape("/lm/lm_head/Linear/post_reshape", [logits], [1, -1, a.vocab_size], NHWC,
                           output=self._logits_name())
        return self._softcap(logits), info

    def _plain_body(self, x: str) -> tuple[str, LinearInfo]:
        g, a, m = self.g, self.args, self.model
        ple = self.per_layer_inputs(x) if m.per_layer_dim else None
        for i in range(a.num_hidden_layers):
            h = self._layernorm(f"/blocks.{i}/input_layernorm/Mul_1_output_0", m.input_norm(i), [x])
            h_c4 = self._to_c4(f"/layers.{i}/self_attn/q_proj/Linear", h, a.hidden_size)
            attn = self._from_c4(f"/layers.{i}/self_attn/o_proj/Linear", self._mixer(i, h_c4), a.hidden_size)
            if m.parallel:
                both = g.binary(f"/blocks.{i}/Add_output_0", BinaryOpOperation.ADD, attn, self._plain_mlp(i, h))
                x = g.binary(f"/blocks.{i}/Add_1_output_0", BinaryOpOperation.ADD, both, x)
                continue
            if m.sandwich_norms:
                attn = self._layernorm(f"/blocks.{i}/post_attention_layernorm/Mul_1_output_0",
                                       m.post_attention_norm(i), [attn])
            x = g.binary(f"/blocks.{i}/Add_output_0", BinaryOpOperation.ADD, x, attn)
            before = m.mlp_norms(i)[0] if m.sandwich_norms else m.post_attention_norm(i)
            tag = "pre_feedforward_layernorm" if m.sandwich_norms else "post_attention_layernorm"
            h = self._layernorm(f"/blocks.{i}/{tag}/Mul_1_output_0", before, [x])
            spec = m.mlp(i)
            if spec.experts and spec.beside_dense:
                mlp = self._dense_and_experts(i, x, h)
            else:
                mlp = self._moe(i, h) if spec.experts else self._plain_mlp(i, h)
            if m.sandwich_norms:
                mlp = self._layernorm(f"/blocks.{i}/post_feedforward_layernorm/Mul_1_output_0", m.mlp_norms(i)[1],
                                      [mlp])
            x = g.binary(f"/blocks.{i}/Add_1_output_0", BinaryOpOperation.ADD, x, mlp)
            if ple is not None:
                x = self.per_layer_block(i, x, ple[i])
            scalar = m.layer_scalar(self.source, i)
            if scalar is not None:
                x = g.binary(f"/blocks.{i}/Mul_1_output_0", BinaryOpOperation.MUL, x,
                             g.const_float(f"/blocks.{i}/Constant_1_output_0", [scalar], [1]))
        end = g.const_int("/Constant_2_output_0", [_SLICE_END], [1])
        x = g.strided_slice("/Slice_output_0", [x, "logits_index", end, self.axis1, self.axis1],
                            DataType.DT_INVALID, 1)
        hidden_states = self._layernorm("hidden_states", m.final_norm(), [x], ["hidden_states"])
        name = LM_HEAD
        logits, info = self._linear(name, self._to_c4(name, hidden_states, a.hidden_size),
                                    self.source.tensor(m.lm_head()), self._tensor_or_none(m.lm_head_bias()))
        return self._softcap(self._from_c4(name, logits, a.vocab_size, output=self._logits_name())), info

    def _logits_name(self) -> str:
        return "logits" if self.model.final_softcap is None else "/lm/lm/FakeLinear_output_0"

    def _softcap(self, x: str) -> str:
        """Gemma's final soft-cap, cap * tanh(x / cap), ending in `logits`; nothing without one."""
        g, cap = self.g, self.model.final_softcap
        if cap is None:
            return x
        cap_const = g.const_float("/lm/Constant_output_0", float(cap))
        x = g.binary("/lm/Div_output_0", BinaryOpOperation.REALDIV, x, cap_const)
        x = g.unary("/lm/Tanh_output_0", UnaryOpOperation.TANH, x)
        return g.binary("logits", BinaryOpOperation.MUL, x, cap_const)

    # -- pieces -------------------------------------------------------------

    def _layernorm(self, name: str, weight: str, inputs: list[str], outputs: list[str] | None = None,
                   fmt: int = NHWC) -> str:
        param = LayerNormT()
        param.axis = [-1]
        param.epsilon = float(self.args.rms_norm_eps)
        param.group = 1
        param.useRmsnorm = self.model.rms_norm
        param.external = self.weights.layernorm(self.source.tensor(weight), self.model.norm_offset,
                                                self._tensor_or_none(self.model.norm_bias(weight)))
        outputs = outputs or [name]
        self.g.op(OpType.LayerNorm, name, inputs, outputs, OpParameter.LayerNorm, param, fmt)
        return outputs[-1]

    def _fused_norm(self, name: str, weight: str, residual: str, x: str, sum_name: str) -> tuple[str, str]:
        norm = self._layernorm(name, weight, [residual, x], [sum_name, name], NC4HW4)
        return sum_name, norm

    def _unit_norm(self, name: str, x: str, size: int) -> str:
        """An RMSNorm without a weight over the last axis (gamma 1 inline)."""
        param = LayerNormT()
        param.axis, param.epsilon, param.group, param.useRmsnorm = [-1], float(self.args.rms_norm_eps), 1, True
        param.gamma, param.beta = [1.0] * size, [0.0] * size
        return self.g.op(OpType.LayerNorm, name, [x], [name], OpParameter.LayerNorm, param)

    def _head_norm(self, weight: str | None, size: int, unit: bool = False) -> LayerNormT | None:
        """A per-head RMSNorm as RoPEParam carries it: gamma inline (`unit`: gamma 1, no weight)."""
        if weight is None and not unit:
            return None
        param = LayerNormT()
        param.axis = [-1]
        param.epsilon = float(self.args.rms_norm_eps)
        param.group = 1
        param.useRmsnorm = True
        if unit:
            param.gamma = [1.0] * size
        else:
            gamma = self.source.tensor(weight).load().astype(np.float32) + np.float32(self.model.norm_offset)
            param.gamma = gamma.astype(np.float32).tolist()
        return param

    def _tensor_or_none(self, name: str | None) -> LazyTensor | None:
        return None if name is None else self.source.tensor(name)

    def _linear(self, name: str, x: str, weight: LazyTensor, bias: LazyTensor | None = None,
                output: str | None = None, g: GraphBuilder | None = None) -> tuple[str, LinearInfo]:
        return linear(g or self.g, self.weights, name, x, weight, bias, output)

    def _conv(self, name: str, x: str, weight: LazyTensor, bias: LazyTensor | None = None,
              g: GraphBuilder | None = None) -> str:
        return self._linear(name, x, weight, bias, g=g)[0]

    def _to_c4(self, name: str, x: str, ic: int, g: GraphBuilder | None = None) -> str:
        return to_c4(g or self.g, name, x, ic)

    def _from_c4(self, name: str, x: str, oc: int, rows: int = 1, g: GraphBuilder | None = None,
                 output: str | None = None) -> str:
        return from_c4(g or self.g, name, x, oc, rows, output)

    def _mixer(self, i: int, h: str) -> str:
        """A layer's token mixer: attention, LFM2's short convolution or Qwen3.5's gated delta-net."""
        if self.model.mixer(i) == "short_conv":
            return self._short_conv(i, h)
        spec = self.model.linear_attention(i)
        return self._attention(i, h) if spec is None else self.gated_delta_net(i, h, spec)

    def _attention(self, i: int, h: str) -> str:
        """q, k, v from the NC4HW4 `h` -> RoPE -> Attention -> o_proj (its NC4HW4 output)."""
        g, a, m = self.g, self.args, self.model
        spec: AttentionSpec = m.attention(i)
        own_kv = spec.kv_from is None
        projections = ("q_proj",) + (("k_proj",) if own_kv else ()) + (("v_proj",) if own_kv and not spec.v_from_k
                                                                       else ())
        proj = {p: self._conv(f"/layers.{i}/self_attn/{p}/Linear", h, m.linear_weight(self.source, i, p),
                              m.linear_bias(self.source, i, p)) for p in projections}
        head_dim, kv_heads = spec.head_dim or a.head_dim, spec.kv_heads or a.num_key_value_heads
        k_norm = spec.k_norm
        if not own_kv:
            # Gemma 4's KV-sharing layers: the producer's k (rotated again here, with its k_norm) and normed v,
            # kept in this layer's own cache: the same keys and values, without MNN's kvSharedLayerIndex
            proj["k_proj"], v_shared, k_norm = self.kv_tensors[spec.kv_from]
        if spec.norm_after_rope:
            q_out, k_out = self._rope_then_norm(i, proj["q_proj"], proj["k_proj"], spec)
        else:
            q_out, k_out = self._fused_rope(i, proj["q_proj"], proj["k_proj"], spec, k_norm)
        attn = AttentionParamT()
        attn.kvCache, attn.layerIndex, attn.kvSharedLayerIndex, attn.outputC4 = True, i, -1, True
        ctx_name = (f"/blocks.{i}/self_attn/fused_attn/FusedAttention_output_0" if spec.output_gate
                    else f"/layers.{i}/self_attn/o_proj/Linear/pre_convert")
        if own_kv:
            v = proj["k_proj"] if spec.v_from_k else proj["v_proj"]
            if spec.v_norm:
                v = self._from_c4(f"/layers.{i}/self_attn/v_proj/Linear", v, kv_heads * head_dim)
                v = g.reshape(f"/blocks.{i}/self_attn/Reshape_2_output_0", [v], [1, -1, kv_heads, head_dim], NHWC)
                v = self._unit_norm(f"/blocks.{i}/self_attn/v_norm/Mul_output_0", v, head_dim)
            self.kv_tensors[i] = (proj["k_proj"], v, k_norm)
        else:
            v = v_shared
        inputs = [q_out, k_out, v, self.masks[spec.window is not None]]
        if spec.sinks is not None:  # MNN's Attention takes them as a fifth input, one value per head
            sinks = self.source.tensor(spec.sinks).load().astype(np.float32).reshape(-1)
            inputs.append(g.const_float(f"/layers.{i}/self_attn/sinks", sinks, [a.num_attention_heads]))
        ctx = g.op(OpType.Attention, f"/layers.{i}/self_attn/FusedAttention", inputs, [ctx_name],
                   OpParameter.AttentionParam, attn)
        if spec.output_gate:
            gate = self._conv(f"/layers.{i}/self_attn/q_gate_proj/Linear", h,
                              m.linear_weight(self.source, i, "q_gate_proj"))
            gate = g.unary(f"/blocks.{i}/self_attn/Sigmoid_output_0", UnaryOpOperation.SIGMOID, gate, NC4HW4)
            ctx = g.binary(f"/blocks.{i}/self_attn/Mul_output_0", BinaryOpOperation.MUL, ctx, gate, NC4HW4)
        return self._conv(f"/layers.{i}/self_attn/o_proj/Linear", ctx, m.linear_weight(self.source, i, "o_proj"),
                          m.linear_bias(self.source, i, "o_proj"))

    def _fused_rope(self, i: int, q: str, k: str, spec: AttentionSpec, k_norm: str | None) -> tuple[str, str]:
        """MNN's RoPE op on the packed q and k, with the per-head norms before the rotation (`k_norm`: the
        key norm, a KV-sharing layer's producer's)."""
        a = self.args
        head_dim = spec.head_dim or a.head_dim
        key = self._table_key(i)
        rope = RoPEParamT()
        rope.ropeCutHeadDim = self.rotary_dims[key]
        rope.numHead, rope.kvNumHead, rope.headDim = (a.num_attention_heads, spec.kv_heads or a.num_key_value_heads,
                                                      head_dim)
        rope.qNorm, rope.kNorm = (self._head_norm(n, head_dim, spec.unit_qk_norm) for n in (spec.q_norm, k_norm))
        cos, sin = self.tables[key]
        q_out = f"/blocks.{i}/self_attn/fused_rope/FusedRoPE_output_0"
        k_out = f"/blocks.{i}/self_attn/fused_rope/FusedRoPE_output_1"
        self.g.op(OpType.RoPE, f"/layers.{i}/self_attn/FusedRoPE", [q, k, cos, sin], [q_out, k_out],
                  OpParameter.RoPEParam, rope)
        return q_out, k_out

    def _rope_then_norm(self, i: int, q: str, k: str, spec: AttentionSpec) -> tuple[str, str]:
        """HunYuan's order, as MNN writes it without the RoPE op: each of q, k to [1, seq, heads, dim],
        x * cos + rotate_half(x) * sin from plain ops (rotate_half = concat(-x2, x1)), then the per-head
        RMSNorm (a LayerNorm whose gamma goes to the weight file)."""
        g, a = self.g, self.args
        key = self._table_key(i)
        if self.rotary_dims[key] != a.head_dim:
            raise UnsupportedError(f"{a.model_type}: partial rotary with norms after the rotation", field="rope")
        cos, sin = self.tables[key]
        p = f"/blocks.{i}/self_attn"
        half = a.head_dim // 2
        axis = g.const_int(f"{p}/last_axis", [-1], [1])
        bounds = [g.const_int(f"{p}/bound_{v}", [v], [1]) for v in (0, half, _SLICE_END)]
        out = []
        for n, (x, heads, name, norm) in enumerate(((q, a.num_attention_heads, "q", spec.q_norm),
                                                    (k, a.num_key_value_heads, "k", spec.k_norm))):
            lin = f"/layers.{i}/self_attn/{name}_proj/Linear"
            x = self._from_c4(lin, x, heads * a.head_dim)
            x = g.reshape(f"{p}/Reshape_{n}_output_0", [x], [1, -1, heads, a.head_dim], NHWC)
            first = g.strided_slice(f"{p}/Slice_{2 * n}_output_0", [x, bounds[0], bounds[1], axis],
                                    DataType.DT_INVALID, 1)
            second = g.strided_slice(f"{p}/Slice_{2 * n + 1}_output_0", [x, bounds[1], bounds[2], axis],
                                     DataType.DT_INVALID, 1)
            rotated = g.concat(f"{p}/Concat_{n}_output_0",
                               [g.unary(f"{p}/Neg_{n}_output_0", UnaryOpOperation.NEG, second), first], -1)
            x = g.binary(f"{p}/Add_{n}_output_0", BinaryOpOperation.ADD,
                         g.binary(f"{p}/Mul_{2 * n}_output_0", BinaryOpOperation.MUL, x, cos),
                         g.binary(f"{p}/Mul_{2 * n + 1}_output_0", BinaryOpOperation.MUL, rotated, sin))
            out.append(self._layernorm(f"{p}/{name}_norm/Mul_1_output_0", norm, [x]) if norm else x)
        return out[0], out[1]

    def _short_conv(self, i: int, h: str) -> str:
        """LFM2's gated short convolution as MNN writes it: in_proj (B, C, x) -> LinearAttention
        "short_conv" over zeros of the state's shape and the [H, 1, K] conv weight (an inline
        constant) -> out_proj."""
        g, a, m = self.g, self.args, self.model
        p = f"/blocks.{i}/self_attn"
        bcx = self._conv(f"/layers.{i}/self_attn/in_proj/Linear", h, m.conv_weight(self.source, i, "in_proj"))
        shape = g.op(OpType.Shape, f"{p}/Shape_output_0", [h], [f"{p}/Shape_output_0"], fmt=NCHW)
        rows, cols = g.planes(shape, 2, [f"{p}/Gather_output_0", f"{p}/Gather_1_output_0"], self.one, self.axis1)
        dims = [g.unsqueeze(f"{p}/Unsqueeze_{n}_output_0", d, self.axis0) for n, d in enumerate((rows, cols))]
        state_shape = g.concat(f"{p}/Concat_output_0", dims + [self.axis1], 0)
        zeros = g.op(OpType.Fill, f"{p}/ConstantOfShape_output_0",
                     [state_shape, g.const_float(f"{p}/fill_value", np.zeros(1, np.float32), [1])],
                     [f"{p}/ConstantOfShape_output_0"], fmt=NCHW)
        kernel = m.conv_kernel(self.source, i)
        weight = g.const_float(f"{p}/conv_weight", kernel, list(kernel.shape))
        param = LinearAttentionParamT()
        param.attnType = "short_conv"
        param.numKHeads = param.numVHeads = 1
        param.headKDim = param.headVDim = a.hidden_size
        param.useQkL2norm = False
        out = g.op(OpType.LinearAttention, f"/layers.{i}/self_attn/FusedLinearAttention", [bcx, zeros, zeros, weight],
                   [f"{p}/fused_attn/FusedLinearAttention_output_0"], OpParameter.LinearAttentionParam, param, NC4HW4)
        return self._conv(f"/layers.{i}/self_attn/out_proj/Linear", out, m.conv_weight(self.source, i, "out_proj"))

    def _activation(self, prefix: str, x: str, act: str, g: GraphBuilder | None = None) -> str:
        """silu, or gelu_tanh spelled out as MNN writes it: 0.5 x (1 + tanh(c (x + 0.044715 x^3)))."""
        g = g or self.g
        if act == "silu":
            return g.unary(f"{prefix}/act_fn/Mul_output_0", UnaryOpOperation.SILU, x)
        mul, add = BinaryOpOperation.MUL, BinaryOpOperation.ADD
        sq = g.unary(f"{prefix}/act_fn/Square_output_0", UnaryOpOperation.SQUARE, x)
        cube = g.binary(f"{prefix}/act_fn/Mul_1_output_0", mul, x, sq)
        k = g.const_float(f"{prefix}/act_fn/Constant_output_0", 0.044715)
        inner = g.binary(f"{prefix}/act_fn/Add_output_0", add, x, g.binary(f"{prefix}/act_fn/Mul_2_output_0", mul,
                                                                            k, cube))
        c = g.const_float(f"{prefix}/act_fn/Constant_1_output_0", _GELU_C)
        t = g.unary(f"{prefix}/act_fn/Tanh_output_0", UnaryOpOperation.TANH,
                    g.binary(f"{prefix}/act_fn/Mul_3_output_0", mul, c, inner))
        one = g.const_float(f"{prefix}/act_fn/Constant_2_output_0", 1.0)
        half = g.const_float(f"{prefix}/act_fn/Constant_3_output_0", 0.5)
        y = g.binary(f"{prefix}/act_fn/Mul_4_output_0", mul, x, g.binary(f"{prefix}/act_fn/Add_1_output_0", add,
                                                                          one, t))
        return g.binary(f"{prefix}/act_fn/Mul_5_output_0", mul, half, y)

    def _plain_mlp(self, i: int, h: str) -> str:
        g, a, m = self.g, self.args, self.model
        act = m.mlp(i).act
        if not m.mlp(i).gated:
            return self._ungated_mlp(i, h, act)
        gate_weight = m.linear_weight(self.source, i, "gate_proj")
        ffn = gate_weight.shape[0]  # the layer's own width (Gemma 4's double-wide MLPs)
        pre = self._to_c4(f"/layers.{i}/mlp/gate_proj/Linear", h, a.hidden_size)
        gate = self._from_c4(f"/layers.{i}/mlp/gate_proj/Linear",
                             self._conv(f"/layers.{i}/mlp/gate_proj/Linear", pre, gate_weight), ffn)
        gate = self._activation(f"/blocks.{i}/mlp", gate, act)
        up = self._from_c4(f"/layers.{i}/mlp/up_proj/Linear",
                           self._conv(f"/layers.{i}/mlp/up_proj/Linear", pre, m.linear_weight(self.source, i, "up_proj")),
                           ffn)
        y = g.binary(f"/blocks.{i}/mlp/Mul_output_0", BinaryOpOperation.MUL, gate, up)
        name = f"/layers.{i}/mlp/down_proj/Linear"
        down = self._conv(name, self._to_c4(name, y, ffn), m.linear_weight(self.source, i, "down_proj"))
        return self._from_c4(name, down, a.hidden_size)

    def _ungated_mlp(self, i: int, h: str, act: str) -> str:
        """up (fc1) -> act -> down (fc2), each with its bias when the model has one."""
        a, m = self.args, self.model
        name = f"/layers.{i}/mlp/up_proj/Linear"
        up = self._conv(name, self._to_c4(name, h, a.hidden_size), m.linear_weight(self.source, i, "up_proj"),
                        m.linear_bias(self.source, i, "up_proj"))
        y = self._activation(f"/blocks.{i}/mlp", self._from_c4(name, up, a.intermediate_size), act)
        name = f"/layers.{i}/mlp/down_proj/Linear"
        down = self._conv(name, self._to_c4(name, y, a.intermediate_size),
                          m.linear_weight(self.source, i, "down_proj"), m.linear_bias(self.source, i, "down_proj"))
        return self._from_c4(name, down, a.hidden_size)

    def _dense_and_experts(self, i: int, x: str, h: str) -> str:
        """Gemma 4's MoE layer: norm_1(MLP(h)) + norm_2(experts(pre_norm_2(x))), the router reading
        RMSNorm(x) * scale / sqrt(hidden) (x: the residual stream, h: its pre-feedforward norm)."""
        g, a, m = self.g, self.args, self.model
        p = f"/blocks.{i}"
        names = m.moe_norms(i)
        dense = self._layernorm(f"{p}/post_feedforward_layernorm_1/Mul_1_output_0", names["post_1"],
                                [self._plain_mlp(i, h)])
        tokens = self._layernorm(f"{p}/pre_feedforward_layernorm_2/Mul_1_output_0", names["pre_2"], [x])
        router = self._unit_norm(f"{p}/router/norm/Mul_output_0", x, a.hidden_size)
        scale = self.source.tensor(m.router_scale(i)).load().astype(np.float32) * np.float32(a.hidden_size ** -0.5)
        router = g.binary(f"{p}/router/Mul_output_0", BinaryOpOperation.MUL, router,
                          g.const_float(f"{p}/router/scale", scale))
        experts = self._layernorm(f"{p}/post_feedforward_layernorm_2/Mul_1_output_0", names["post_2"],
                                  [self._moe(i, tokens, router)])
        return g.binary(f"{p}/mlp/Add_experts_output_0", BinaryOpOperation.ADD, dense, experts)

    def _moe(self, i: int, h: str, router_input: str | None = None) -> str:
        """Router -> Softmax (or Sigmoid) -> TopKV2 (-> renormalise, scale) -> MoE over the
        `/expert/{i}_{e}` subgraphs. A selection bias (LFM2-MoE) is added to the scores for TopKV2 and
        taken off its values again (GatherV2 of the bias at the chosen experts). Llama 4 (`sigmoid_input`,
        top-1): TopKV2 on the logits, the token scaled by sigmoid(its top logit) before the expert, and the
        MoE op's weight 1."""
        g, a, m = self.g, self.args, self.model
        spec = m.mlp(i)
        p = f"/blocks.{i}/mlp"
        flat_shape = g.const_int(f"{p}/flat_shape", [-1, a.hidden_size], [2])
        flat = g.reshape(f"{p}/Reshape_output_0", [h, flat_shape], None, NHWC)
        route = flat if router_input is None else g.reshape(f"{p}/Reshape_router_output_0", [router_input, flat_shape],
                                                            None, NHWC)
        name = f"/layers.{i}/mlp/gate/Linear"
        logits = self._from_c4(name, self._conv(name, self._to_c4(name, route, a.hidden_size),
                                                self.source.tensor(m.router(i)),
                                                self._tensor_or_none(m.router_bias(i))), spec.experts)
        if spec.sigmoid_input or spec.scoring == "topk_softmax":
            probs = logits
        elif spec.scoring == "sigmoid":
            probs = g.unary(f"{p}/Sigmoid_output_0", UnaryOpOperation.SIGMOID, logits)
        else:
            softmax = AxisT()
            softmax.axis = -1
            probs = g.op(OpType.Softmax, f"{p}/Softmax_output_0", [logits], [f"{p}/Softmax_output_0"],
                         OpParameter.Axis, softmax)
        bias = None
        if spec.selection_bias is not None:
            values = self.source.tensor(spec.selection_bias).load().astype(np.float32).reshape(-1)
            bias = g.const_float(f"{p}/expert_bias", values, [spec.experts])
            probs = g.binary(f"{p}/Add_output_0", BinaryOpOperation.ADD, probs, bias)
        topk = TopKV2T()
        topk.t, topk.sorted, topk.largest = DataType.DT_FLOAT, True, True
        k = g.const_int(f"{p}/top_k", [spec.top_k], [1])
        last = g.const_int(f"{p}/last_axis", [-1], None)
        weights, experts = f"{p}/TopK_output_0", f"{p}/TopK_output_1"
        g.op(OpType.TopKV2, f"{p}/TopK_output_0", [probs, k, last], [weights, experts], OpParameter.TopKV2, topk)
        if spec.scoring == "topk_softmax":
            softmax = AxisT()
            softmax.axis = -1
            weights = g.op(OpType.Softmax, f"{p}/Softmax_output_0", [weights], [f"{p}/Softmax_output_0"],
                           OpParameter.Axis, softmax)
        if bias is not None:
            chosen = g.op(OpType.GatherV2, f"{p}/Gather_output_0", [bias, experts], [f"{p}/Gather_output_0"],
                          OpParameter.GatherV2, GatherV2T())
            weights = g.binary(f"{p}/Sub_output_0", BinaryOpOperation.SUB, weights, chosen)
        if spec.norm_topk:
            reduce = ReductionParamT()
            reduce.operation, reduce.keepDims, reduce.dType = ReductionType.SUM, True, DataType.DT_FLOAT
            axes = g.const_int(f"{p}/reduce_axes", [-1], [1])
            total = g.op(OpType.Reduction, f"{p}/ReduceSum_output_0", [weights, axes], [f"{p}/ReduceSum_output_0"],
                         OpParameter.ReductionParam, reduce)
            if spec.norm_eps:
                total = g.binary(f"{p}/Add_1_output_0", BinaryOpOperation.ADD, total,
                                 g.const_float(f"{p}/norm_eps", spec.norm_eps))
            weights = g.binary(f"{p}/Div_output_0", BinaryOpOperation.REALDIV, weights, total)
        if spec.expert_scale:  # Gemma 4: each chosen expert's weight times its per_expert_scale
            table = g.const_float(f"{p}/per_expert_scale", self.source.tensor(m.expert_scale(i)).load())
            picked = g.op(OpType.GatherV2, f"{p}/Gather_scale_output_0", [table, experts, g.const_int(
                f"{p}/scale_axis", [0], None)], [f"{p}/Gather_scale_output_0"], OpParameter.GatherV2, GatherV2T())
            weights = g.binary(f"{p}/Mul_scale_output_0", BinaryOpOperation.MUL, weights, picked)
        if spec.routed_scale != 1.0:
            weights = g.binary(f"{p}/Mul_output_0", BinaryOpOperation.MUL, weights,
                               g.const_float(f"{p}/routed_scale", spec.routed_scale))
        tokens = flat
        if spec.sigmoid_input:
            tokens = g.binary(f"{p}/Mul_input_output_0", BinaryOpOperation.MUL, flat,
                              g.unary(f"{p}/Sigmoid_router_output_0", UnaryOpOperation.SIGMOID, weights))
            # MNN 3.6.1 sizes the MoE op's output 0 rows when its tokens come straight from a BinaryOp
            tokens = g.reshape(f"{p}/Reshape_input_output_0", [tokens], [-1, a.hidden_size], NHWC)
            zero = g.binary(f"{p}/Zero_output_0", BinaryOpOperation.MUL, weights, g.const_float(f"{p}/zero", 0.0))
            weights = g.binary(f"{p}/Ones_output_0", BinaryOpOperation.ADD, zero, g.const_float(f"{p}/one", 1.0))
        for e in range(spec.experts):
            self.subgraphs.append(self._expert(i, e))
        out = g.extra(OpType.MoE, f"{p}/custom_moe/MoE_output_0", [tokens, weights, experts],
                      [f"{p}/custom_moe/MoE_output_0"],
                      {"layer_id": i, "num_experts": spec.experts, "top_k": spec.top_k})
        if spec.shared:
            shared = self._shared_expert(i, flat, spec.shared, spec.shared_gate)
            out = g.binary(f"{p}/Add_output_0", BinaryOpOperation.ADD, out, shared)
        return out

    def _shared_expert(self, i: int, flat: str, width: int, gated: bool) -> str:
        """down(silu(gate(x)) * up(x)) on the [n, H] tokens, times sigmoid(shared_expert_gate(x)) if `gated`."""
        g, a, m = self.g, self.args, self.model
        p, lin = f"/blocks.{i}/mlp", f"/layers.{i}/mlp"
        x = self._to_c4(f"{lin}/shared_expert/Linear", flat, a.hidden_size)

        def project(name: str, inp: str, oc: int) -> str:
            out = self._conv(f"{lin}/{name}/Linear", inp, m.shared_weight(self.source, i, name))
            return self._from_c4(f"{lin}/{name}/Linear", out, oc, rows=0)

        act = self._activation(f"{p}/shared_expert", project("shared_expert/gate_proj", x, width), "silu")
        y = g.binary(f"{p}/shared_expert/Mul_output_0", BinaryOpOperation.MUL, act,
                     project("shared_expert/up_proj", x, width))
        name = f"{lin}/shared_expert/down_proj/Linear"
        y = self._from_c4(name, self._conv(name, self._to_c4(name, y, width),
                                           m.shared_weight(self.source, i, "shared_expert/down_proj")),
                          a.hidden_size, rows=0)
        if not gated:
            return y
        gate = g.unary(f"{p}/Sigmoid_output_0", UnaryOpOperation.SIGMOID, project("shared_expert_gate", x, 1))
        return g.binary(f"{p}/Mul_output_0", BinaryOpOperation.MUL, gate, y)

    def _expert(self, i: int, e: int) -> SubGraphProtoT:
        """One expert as MNN's MoE op loads it: [n,H] -> fused gate_up Linear -> act(gate) * up -> down
        (or gpt-oss's clamped swiglu, and the Linears' biases where the model has them)."""
        g, a, m = GraphBuilder(), self.args, self.model
        name = f"/expert/{i}_{e}"
        ffn = m.args.moe_intermediate_size
        x = g.input("hidden_states.1", [1, a.hidden_size], DataType.DT_FLOAT)
        lin = f"{name}/gate_up_proj_linear"
        both = self._conv(lin, self._to_c4(lin, x, a.hidden_size, g), m.expert_weight(self.source, i, e, "gate_up"),
                          m.expert_bias(self.source, i, e, "gate_up"), g=g)
        both = self._from_c4(lin, both, 2 * ffn, rows=0, g=g)
        axis = g.const_int("/axis", [-1], [1])
        halves = [g.const_int(f"/bound_{v}", [v], [1]) for v in (0, ffn, 2 * ffn)]
        gate = g.strided_slice("/Slice_output_0", [both, halves[0], halves[1], axis], DataType.DT_INVALID, 1)
        up = g.strided_slice("/Slice_1_output_0", [both, halves[1], halves[2], axis], DataType.DT_INVALID, 1)
        spec = m.mlp(i)
        if spec.act == "clamped_swiglu":
            y = self._clamped_swiglu(g, gate, up, spec.glu_alpha, spec.glu_limit)
        else:
            y = g.binary("/Mul_2_output_0", BinaryOpOperation.MUL, up, self._activation("", gate, spec.act, g))
        lin = f"{name}/down_proj_linear"
        down = self._conv(lin, self._to_c4(lin, y, ffn, g), m.expert_weight(self.source, i, e, "down"),
                          m.expert_bias(self.source, i, e, "down"), g=g)
        out = self._from_c4(lin, down, a.hidden_size, rows=0, g=g, output="hidden_states")
        return g.subgraph(name, [x], [out])


    @staticmethod
    def _clamped_swiglu(g: GraphBuilder, gate: str, up: str, alpha: float, limit: float) -> str:
        """gpt-oss: g = min(gate, limit), u = clamp(up, -limit, limit); (u + 1) * g * sigmoid(alpha * g)."""
        b = BinaryOpOperation
        gate = g.binary("/glu/gate_clamped", b.MINIMUM, gate, g.const_float("/glu/limit", limit))
        up = g.binary("/glu/up_clamped", b.MAXIMUM, g.binary("/glu/up_upper", b.MINIMUM, up, "/glu/limit"),
                      g.const_float("/glu/minus_limit", -limit))
        scaled = g.binary("/glu/gate_alpha", b.MUL, gate, g.const_float("/glu/alpha", alpha))
        glu = g.binary("/glu/glu", b.MUL, gate, g.unary("/glu/sigmoid", UnaryOpOperation.SIGMOID, scaled))
        return g.binary("/glu/out", b.MUL, g.binary("/glu/up_plus_one", b.ADD, up, g.const_float("/glu/one", 1.0)),
                        glu)


def linear(g: GraphBuilder, weights: WeightWriter, name: str, x: str, weight: LazyTensor,
           bias: LazyTensor | None = None, output: str | None = None) -> tuple[str, LinearInfo]:
    """A Linear as MNN writes it: a 1x1 Convolution on NC4HW4 [rows, ic, 1, 1], its weight
    quantized into the weight file at the writer's bits (the lm_head at its own, any linear at its
    quant-config entry's), readType and aMin following that linear's own symmetry."""
    info = weights.linear(weight, bias, lm_head=name == LM_HEAD, name=name)
    common = Convolution2DCommonT()
    common.outputCount, common.inputCount = info.oc, info.ic
    quant = IDSTQuanT()
    if info.bits == 16:
        quant.type = 3
    else:
        quant.type = 1
        quant.quantScale = 1.0
        quant.aMaxOrBits = info.bits
        quant.aMin = 0 if info.symmetric else 1  # as MNN's exporter: a symmetric conv has readType 0, aMin 0
        quant.readType = 0 if info.symmetric else info.oc * (info.ic // info.block_size)
        quant.shapeInt32 = info.shape_int32
        quant.scaleStorage = _SCALE_FP16
    conv = Convolution2DT()
    conv.common = common
    conv.quanParameter = quant
    conv.external = info.external
    out = g.op(OpType.Convolution, name, [x], [output or name], OpParameter.Convolution2D, conv)
    return out, info


def to_c4(g: GraphBuilder, name: str, x: str, ic: int) -> str:
    """[..., ic] -> NC4HW4 [rows, ic, 1, 1], a Linear's input."""
    x = g.reshape(f"{name}/pre_reshape", [x], [-1, ic, 1, 1], NHWC)
    return g.convert(f"{name}/pre_convert", x, NCHW, NC4HW4, NHWC)


def from_c4(g: GraphBuilder, name: str, x: str, oc: int, rows: int = 1, output: str | None = None) -> str:
    """Back to NCHW [1,-1,oc] (rows 1) or [-1,oc] (rows 0, inside an expert)."""
    x = g.convert(f"{name}/post_convert", x, NC4HW4, NCHW, NHWC)
    return g.reshape(f"{name}/post_reshape", [x], [1, -1, oc] if rows else [-1, oc], NHWC, output)
