"""Qwen3.5 (text): a hybrid of gated delta-net linear attention (MNN's `LinearAttention` op, see
linear_attention.py) and gated full attention every `full_attention_interval`-th layer.

Full-attention layers: q_proj yields per head [query | gate] (split here into q_proj and q_gate_proj
as MNN's exporter does), per-head q/k RMSNorms, partial rotary (`partial_rotary_factor`, default 0.25)
and out * sigmoid(gate) before o_proj. Every RMSNorm but the delta-net's gated one multiplies by (1 + w).
The rotary is M-RoPE in transformers; text positions are equal in its three sections, so the export
(text only) writes plain 1-D positions with the same frequencies (`is_mrope` false).

A composite checkpoint (`Qwen3_5ForConditionalGeneration`, model_type qwen3_5 with `text_config`)
exports its language model (tensors under model.language_model); the vision tower is left out.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any

from . import llama
from .config import FULL, ConfigReader, language_part
from .linear_attention import LinearAttentionSpec
from .sources import LazyTensor, Source, concat_rows

logger = logging.getLogger(__name__)

LINEAR = "linear_attention"
# Keys of the composite (vision-language) config beside text_config: none changes the text model.
_COMPOSITE_KEYS = ("vision_config", "image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")


@dataclass
class ModelArgs(llama.ModelArgs):
    mixers: list[str] = field(default_factory=list)
    linear_key_heads: int = 0
    linear_value_heads: int = 0
    linear_key_dim: int = 0
    linear_value_dim: int = 0
    conv_kernel: int = 0
    composite: bool = False

    default_theta = 10000000.0

    @classmethod
    def from_dict(cls, config: dict[str, Any], file: str | None = None) -> "ModelArgs":
        config, composite = language_part(config, file, _COMPOSITE_KEYS)
        if composite:
            logger.info("%s: exporting the language model of a composite checkpoint; the vision tower is left out",
                        file)
        reader = ConfigReader(cls.with_defaults(config), file)
        args = cls(**cls.read(reader), composite=composite)
        reader.finish()
        return args

    @classmethod
    def with_defaults(cls, config: dict[str, Any]) -> dict[str, Any]:
        """transformers' Qwen3.5 defaults partial_rotary_factor to 0.25 (not 1) when the config omits it."""
        params = config.get("rope_parameters")
        if isinstance(params, dict) and "partial_rotary_factor" not in params and "partial_rotary_factor" not in config:
            return {**config, "rope_parameters": {**params, "partial_rotary_factor": 0.25}}
        if params is None and "partial_rotary_factor" not in config:
            return {**config, "partial_rotary_factor": 0.25}
        return config

    @classmethod
    def read(cls, r: ConfigReader) -> dict[str, Any]:
        kw = super().read(r)
        kw["head_dim"] = r.size("head_dim", 256)
        layers = kw["num_hidden_layers"]
        interval = r.size("full_attention_interval", 4)
        default = [LINEAR if (i + 1) % interval else FULL for i in range(layers)]
        mixers = r.get("layer_types", default)
        if not isinstance(mixers, list) or len(mixers) != layers or any(t not in (LINEAR, FULL) for t in mixers):
            raise r.unsupported(f"layer_types must list {layers} of {LINEAR!r}/{FULL!r}, got {mixers!r}",
                                "layer_types")
        kw.update(mixers=list(mixers), linear_key_heads=r.size("linear_num_key_heads", 16),
                  linear_value_heads=r.size("linear_num_value_heads", 32),
                  linear_key_dim=r.size("linear_key_head_dim", 128),
                  linear_value_dim=r.size("linear_value_head_dim", 128),
                  conv_kernel=r.size("linear_conv_kernel_dim", 4))
        if kw["linear_value_heads"] % kw["linear_key_heads"]:
            raise r.error("linear_num_value_heads must be a multiple of linear_num_key_heads", "linear_num_value_heads")
        return kw

    biases = staticmethod(llama.ModelArgs.no_biases)

    @classmethod
    def attention_layout(cls, r: ConfigReader, layers: int) -> dict[str, Any]:
        rope = r.rope(cls.default_theta, partial=True, text_mrope=True)
        return dict(layer_types=[FULL] * layers, sliding_window=None, ropes=[rope] * layers)


class Model(llama.Model):
    norm_offset = 1.0

    def __init__(self, args: ModelArgs):
        super().__init__(args)
        self.base = "model.language_model" if args.composite else "model"

    def attention(self, layer: int) -> llama.AttentionSpec:
        base = f"{self.base}.layers.{layer}.self_attn"
        return replace(super().attention(layer), q_norm=f"{base}.q_norm.weight", k_norm=f"{base}.k_norm.weight",
                       output_gate=True)

    def linear_attention(self, layer: int) -> LinearAttentionSpec | None:
        a = self.args
        if a.mixers[layer] != LINEAR:
            return None
        return LinearAttentionSpec(f"{self.base}.layers.{layer}.linear_attn", a.linear_key_heads, a.linear_value_heads,
                                   a.linear_key_dim, a.linear_value_dim, a.conv_kernel)

    def linear_weight(self, source: Source, layer: int, name: str) -> LazyTensor:
        """q_proj holds per head [query rows | gate rows]: `q_proj` and `q_gate_proj` are the two halves."""
        if name not in ("q_proj", "q_gate_proj"):
            return super().linear_weight(source, layer, name)
        fused = super().linear_weight(source, layer, "q_proj")
        d = self.args.head_dim
        half = d if name == "q_proj" else 0
        rows = [fused.row_range(2 * d * h + d - half, 2 * d * h + 2 * d - half, f"{name} head {h}")
                for h in range(self.args.num_attention_heads)]
        return concat_rows(rows, f"{fused.name}:{name}")

    def norms(self, layer: int) -> list[str]:
        if self.linear_attention(layer) is None:
            return super().norms(layer)
        return [self.input_norm(layer), self.post_attention_norm(layer)]

    def layer_tensors(self, source: Source, layer: int) -> list[LazyTensor]:
        spec = self.linear_attention(layer)
        if spec is None:
            return super().layer_tensors(source, layer) + [self.linear_weight(source, layer, "q_gate_proj")]
        tensors = [source.tensor(n) for n in self.norms(layer)]
        tensors += [source.tensor(f"{spec.base}.{n}.weight") for n in spec.linears()]
        tensors += [source.tensor(f"{spec.base}.{n}") for n in spec.small_tensors()]
        tensors += [self.linear_weight(source, layer, p) for p in ("gate_proj", "up_proj", "down_proj")]
        return tensors
