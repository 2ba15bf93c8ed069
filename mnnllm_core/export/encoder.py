"""Build llm.mnn for a BERT-style encoder: the graph MNN's `Embedding` loads.

Inputs and output as MNN's llmexport names them for embedding models:

    input_ids float [1, seq, hidden] (the word embeddings, read by DiskEmbedding from
        embeddings_bf16.bin), attention_mask [1, 1, seq, seq] of ones (added to every score it
        changes nothing: the attention is bidirectional), position_ids int32 [1, seq]
    -> sentence_embeddings float [1, hidden]

    x = LayerNorm(input_ids + GatherV2(position table, position_ids) + token type 0's row)
    per layer: q, k, v Linear (biased) -> Reshape [1, seq, heads, dim] -> Attention without KV cache
        -> o Linear -> LayerNorm(x + .) -> Linear -> GELU -> Linear -> LayerNorm(x + .)
    pooling (CLS: token 0; mean: over the tokens) -> x / max(||x||, 1e-12)

Each Linear is Reshape [-1, ic, 1, 1] -> ConvertTensor NC4HW4 -> Convolution -> back, as in the
decoder's plain graph (whose Linear pieces this reuses); weights go to llm.mnn.weight in that order.
"""
from __future__ import annotations

from mnnllm_core.schema.MNN.AttentionParam import AttentionParamT
from mnnllm_core.schema.MNN.BinaryOpOperation import BinaryOpOperation
from mnnllm_core.schema.MNN.DataType import DataType
from mnnllm_core.schema.MNN.GatherV2 import GatherV2T
from mnnllm_core.schema.MNN.LayerNorm import LayerNormT
from mnnllm_core.schema.MNN.OpParameter import OpParameter
from mnnllm_core.schema.MNN.OpType import OpType
from mnnllm_core.schema.MNN.ReductionParam import ReductionParamT
from mnnllm_core.schema.MNN.ReductionType import ReductionType
from mnnllm_core.schema.MNN.UnaryOpOperation import UnaryOpOperation

from .bert import QKV, Model
from .decoder import DecoderGraph
from .graph import NCHW, NC4HW4, NHWC
from .sources import Source
from .weights import WeightWriter

OUTPUT = "sentence_embeddings"
NORM_EPS = 1e-12  # torch.nn.functional.normalize's floor on the norm


class EncoderGraph(DecoderGraph):
    """Emits the encoder's graph, writing its weights through `weights` on the way."""

    def __init__(self, model: Model, source: Source, weights: WeightWriter):
        super().__init__(model, source, weights)  # type: ignore[arg-type]  # for the Linear pieces only

    def build(self, model_id: str) -> bytes:  # type: ignore[override]
        x = self._embeddings()
        for i in range(self.args.num_hidden_layers):
            x = self._layer(i, x)
        return self.g.finish([self._normalize(self._pool(x))], model_id)

    def _embeddings(self) -> str:
        g, a, m = self.g, self.args, self.model
        g.input("input_ids", [1, -1, a.hidden_size], DataType.DT_FLOAT)
        g.input("attention_mask", [1, 1, -1, -1], DataType.DT_FLOAT)
        g.input("position_ids", [1, -1], DataType.DT_INT32)
        shape = g.const_int("/embed/shape", [1, -1, a.hidden_size], [3])
        x = g.reshape("/embed/Reshape_output_0", ["input_ids", shape], None, NHWC)
        table = g.const_float("/embed/position_embeddings", m.position_table(self.source),
                              [a.max_position_embeddings, a.hidden_size])
        axis0 = g.const_int("/embed/axis_0", [0], None)
        positions = g.op(OpType.GatherV2, "/embed/position_embeddings/Gather_output_0", [table, "position_ids", axis0],
                         ["/embed/position_embeddings/Gather_output_0"], OpParameter.GatherV2, GatherV2T())
        x = g.binary("/embed/Add_output_0", BinaryOpOperation.ADD, x, positions)
        token_type = g.const_float("/embed/token_type_embeddings", m.token_type_row(self.source))
        x = g.binary("/embed/Add_1_output_0", BinaryOpOperation.ADD, x, token_type)
        return self._norm("/embed/LayerNorm/output_0", m.embedding_norm(), x)

    def _layer(self, i: int, x: str) -> str:
        g, a, m = self.g, self.args, self.model
        hidden, p = a.hidden_size, f"/layers.{i}"
        h = self._to_c4(f"{p}/attention/query/Linear", x, hidden)
        heads = g.const_int(f"{p}/attention/heads_shape", [1, -1, a.num_attention_heads, a.head_dim], [4])
        qkv = []
        for part in QKV:
            name = f"{p}/{part}/Linear"
            out = self._conv(name, h, m.weight(self.source, m.layer(i, part)), m.bias(self.source, m.layer(i, part)))
            out = g.convert(f"{name}/post_convert", out, NC4HW4, NCHW, NHWC)
            qkv.append(g.reshape(f"{name}/heads", [out, heads], None, NHWC))
        attn = AttentionParamT()
        attn.kvCache, attn.layerIndex, attn.kvSharedLayerIndex, attn.outputC4 = False, i, -1, False
        ctx = g.op(OpType.Attention, f"{p}/attention/FusedAttention", [*qkv, "attention_mask"],
                   [f"{p}/attention/FusedAttention_output_0"], OpParameter.AttentionParam, attn)
        attn_out = self._dense(f"{p}/attention.output.dense/Linear", ctx, i, "attention.output.dense", hidden, hidden)
        x = self._norm(f"{p}/attention/output/LayerNorm_output_0", m.layer(i, "attention.output.LayerNorm"),
                       g.binary(f"{p}/attention/output/Add_output_0", BinaryOpOperation.ADD, attn_out, x))
        up = self._dense(f"{p}/intermediate.dense/Linear", x, i, "intermediate.dense", hidden, a.intermediate_size)
        act = g.unary(f"{p}/intermediate/act_fn_output_0", getattr(UnaryOpOperation, a.act), up)
        down = self._dense(f"{p}/output.dense/Linear", act, i, "output.dense", a.intermediate_size, hidden)
        return self._norm(f"{p}/output/LayerNorm_output_0", m.layer(i, "output.LayerNorm"),
                          g.binary(f"{p}/output/Add_output_0", BinaryOpOperation.ADD, down, x))

    def _dense(self, name: str, x: str, i: int, part: str, ic: int, oc: int) -> str:
        """A biased Linear on NCHW [1, seq, ic] -> [1, seq, oc]."""
        m = self.model
        out = self._conv(name, self._to_c4(name, x, ic), m.weight(self.source, m.layer(i, part)),
                         m.bias(self.source, m.layer(i, part)))
        return self._from_c4(name, out, oc)

    def _norm(self, name: str, prefix: str, x: str) -> str:
        """LayerNorm over the last axis with gamma and beta (`prefix`.weight / .bias)."""
        param = LayerNormT()
        param.axis = [-1]
        param.epsilon = float(self.args.layer_norm_eps)
        param.group = 1
        param.useRmsnorm = False
        param.external = self.weights.layernorm(self.source.tensor(f"{prefix}.weight"),
                                                beta=self.source.tensor(f"{prefix}.bias"))
        return self.g.op(OpType.LayerNorm, name, [x], [name], OpParameter.LayerNorm, param)

    def _reduce(self, name: str, operation: int, x: str, axis: int) -> str:
        param = ReductionParamT()
        param.operation, param.dim, param.keepDims, param.dType = operation, [axis], False, DataType.DT_FLOAT
        return self.g.op(OpType.Reduction, name, [x], [name], OpParameter.ReductionParam, param)

    def _pool(self, x: str) -> str:
        """[1, seq, hidden] -> [1, hidden]: token 0 (CLS) or the mean over the tokens."""
        g = self.g
        if self.args.pooling == "mean":
            return self._reduce("/pool/ReduceMean_output_0", ReductionType.MEAN, x, 1)
        zero, one = g.const_int("/pool/start", [0], [1]), g.const_int("/pool/end", [1], [1])
        first = g.strided_slice("/pool/Slice_output_0", [x, zero, one, one, one], DataType.DT_INVALID, 1)
        shape = g.const_int("/pool/shape", [1, self.args.hidden_size], [2])
        return g.reshape("/pool/Reshape_output_0", [first, shape], None, NHWC)

    def _normalize(self, x: str) -> str:
        """x / max(||x||_2, 1e-12) over the last axis, as torch's normalize."""
        g = self.g
        total = self._reduce("/normalize/ReduceSum_output_0", ReductionType.SUM,
                             g.unary("/normalize/Square_output_0", UnaryOpOperation.SQUARE, x), -1)
        norm = g.unary("/normalize/Sqrt_output_0", UnaryOpOperation.SQRT, total)
        norm = g.binary("/normalize/Max_output_0", BinaryOpOperation.MAXIMUM, norm,
                        g.const_float("/normalize/eps", NORM_EPS))
        shape = g.const_int("/normalize/column", [-1, 1], [2])
        norm = g.reshape("/normalize/Reshape_output_0", [norm, shape], None, NHWC)
        return g.binary(OUTPUT, BinaryOpOperation.REALDIV, x, norm)
