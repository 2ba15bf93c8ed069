"""Gemma 4's per-layer embeddings (PLE) as graph pieces, following transformers' Gemma4TextModel.

The runtime looks each token up in `ple_embeddings_bf16.bin` ([vocab, layers * P] bf16), multiplies the
row by `ple_embed_scale` (sqrt(P)) and feeds it as the input `ple_embeddings` [1, seq, layers * P].

    once: proj = per_layer_model_projection(scaled input embedding) / sqrt(hidden) -> [1, seq, layers, P]
          -> RMSNorm(per_layer_projection_norm); ple = (proj + ple_embeddings) / sqrt(2); layer i takes ple[:, :, i]
    per layer, after the MLP's residual: x + RMSNorm(per_layer_projection(gelu_tanh(per_layer_input_gate(x)) * ple_i))

MNN's exporter feeds the projection the embedding before its sqrt(hidden) scale; the RMSNorm after it
removes that factor up to its epsilon. Here the projection reads the scaled embedding, as transformers does.
"""
from __future__ import annotations

import math

from mnnllm_core.schema.MNN.BinaryOpOperation import BinaryOpOperation
from mnnllm_core.schema.MNN.GatherV2 import GatherV2T
from mnnllm_core.schema.MNN.OpParameter import OpParameter
from mnnllm_core.schema.MNN.OpType import OpType

from .graph import NHWC


class PerLayerEmbeddings:
    """Mixed into DecoderGraph: Gemma 4's per-layer embedding inputs and blocks, written with its graph helpers."""

    def per_layer_inputs(self, embeds: str) -> list[str]:
        """Each layer's [1, seq, P] input, from the scaled input embedding `embeds` [1, seq, hidden]."""
        g, a, m = self.g, self.args, self.model
        layers, width = a.num_hidden_layers, m.per_layer_dim
        name = "/per_layer_model_projection/Linear"
        proj = self._conv(name, self._to_c4(name, embeds, a.hidden_size), self.source.tensor(m.ple_tensor("projection")))
        proj = self._from_c4(name, proj, layers * width)
        proj = g.binary("/per_layer/scaled_output_0", BinaryOpOperation.MUL, proj, g.const_float("/per_layer/scale",
                                                                                      a.hidden_size ** -0.5))
        proj = g.reshape("/per_layer/projection_output_0", [proj], [1, -1, layers, width], NHWC)
        proj = self._layernorm("/per_layer_projection_norm/Mul_1_output_0", m.ple_tensor("projection_norm"), [proj])
        token = g.reshape("/per_layer/token_output_0", ["ple_embeddings"], [1, -1, layers, width], NHWC)
        both = g.binary("/per_layer/sum_output_0", BinaryOpOperation.ADD, proj, token)
        both = g.binary("/per_layer/inputs_output_0", BinaryOpOperation.MUL, both, g.const_float("/per_layer/half_sqrt2",
                                                                                      1 / math.sqrt(2.0)))
        axis = g.const_int("/per_layer/axis", [2], None)
        out = []
        for i in range(layers):
            index = g.const_int(f"/per_layer/index_{i}", [i], None)
            out.append(g.op(OpType.GatherV2, f"/per_layer/Gather_{i}_output_0", [both, index, axis],
                            [f"/per_layer/Gather_{i}_output_0"], OpParameter.GatherV2, GatherV2T()))
        return out


    def per_layer_block(self, i: int, x: str, ple: str) -> str:
        """The residual branch layer `i` adds from its per-layer input `ple`."""
        g, a, m = self.g, self.args, self.model
        width = m.per_layer_dim
        name = f"/layers.{i}/per_layer_input_gate/Linear"
        gate = self._conv(name, self._to_c4(name, x, a.hidden_size), self.source.tensor(m.ple_layer_tensor(i, "gate")))
        gate = self._activation(f"/blocks.{i}", self._from_c4(name, gate, width), "gelu_tanh")
        y = g.binary(f"/blocks.{i}/Mul_output_0", BinaryOpOperation.MUL, gate, ple)
        name = f"/layers.{i}/per_layer_projection/Linear"
        y = self._conv(name, self._to_c4(name, y, width), self.source.tensor(m.ple_layer_tensor(i, "projection")))
        y = self._layernorm(f"/blocks.{i}/post_per_layer_input_norm/Mul_1_output_0", m.ple_layer_tensor(i, "norm"),
                         [self._from_c4(name, y, a.hidden_size)])
        return g.binary(f"/blocks.{i}/Add_2_output_0", BinaryOpOperation.ADD, x, y)
