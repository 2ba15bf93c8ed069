"""Gemma 4 (text): Gemma 3's sandwich-norm layout with

- RMSNorm weights used as they are (not 1 + w), a weightless RMSNorm on the values, attention scale 1
  (written as llm_config's `attn_scale`, which MNN's runtime gives every Attention op);
- full-attention layers with their own head size (`per_layer_config`, `global_head_dim`) and
  proportional RoPE (`partial_rotary_factor` of the frequencies spread over the whole head, the rest 0);
- per-layer embeddings (PLE, see per_layer_embedding.py) in `ple_embeddings_bf16.bin`;
- a constant `layer_scalar` per layer and the final logit soft-cap;
- `attention_k_eq_v`: the full-attention layers take their values from k_proj, normed by v_norm;
- KV sharing (`num_kv_shared_layers`): each of the last layers attends to the keys and values of the
  last earlier layer of its type. The graph hands that layer's k (rotated again, with its k_norm) and v
  to the sharing layer's Attention, which caches its own copy: exact, at the cost of that cache's
  memory (MNN's AttentionParam.kvSharedLayerIndex is not used; our engine does not read it);
  their MLPs may be double-wide (`use_double_wide_mlp`), as their weights say;
- `enable_moe_block`: experts beside each dense MLP (MNN's MoE op; a softmax router on
  RMSNorm(x) * scale / sqrt(hidden), top-k renormalised, times per_expert_scale), each branch with its norms.

Refused: bidirectional attention.
A composite checkpoint (Gemma4ForConditionalGeneration) exports its language model.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, replace
from typing import Any

from . import gemma2, llama
from .config import FULL, SLIDING, ConfigReader, language_part
from .sources import LazyTensor, Source, expert_matrix

logger = logging.getLogger(__name__)

_COMPOSITE_KEYS = ("vision_config", "audio_config", "audio_token_id", "boa_token_id", "boi_token_id",
                   "eoa_token_index", "eoi_token_id", "image_token_id", "video_token_id", "initializer_range")
_PER_LAYER_KEYS = ("head_dim", "num_key_value_heads")


@dataclass
class ModelArgs(llama.ModelArgs):
    final_logit_softcapping: float | None = None
    per_layer: dict[int, dict[str, int]] = field(default_factory=dict)
    per_layer_input: int = 0
    k_eq_v: bool = False
    kv_shared: int = 0
    num_experts: int = 0           # enable_moe_block: experts beside every layer's dense MLP
    top_k_experts: int = 0
    moe_intermediate_size: int = 0
    composite: bool = False

    @classmethod
    def from_dict(cls, config: dict[str, Any], file: str | None = None) -> "ModelArgs":
        config, composite = language_part(config, file, _COMPOSITE_KEYS)
        if composite:
            logger.info("%s: exporting the language model of a composite checkpoint; vision and audio are left out",
                        file)
        reader = ConfigReader(config, file)
        args = cls(**cls.read(reader), composite=composite)
        reader.finish()
        return args

    @classmethod
    def read(cls, r: ConfigReader) -> dict[str, Any]:
        kw = super().read(r)
        layers = kw["num_hidden_layers"]
        kw["head_dim"] = r.size("head_dim", 256)
        kw["tie_word_embeddings"] = r.flag("tie_word_embeddings", True)
        cap = r.get("final_logit_softcapping")
        kw["final_logit_softcapping"] = None if cap is None else r.number("final_logit_softcapping", 0.0)
        kw["k_eq_v"] = r.flag("attention_k_eq_v", False)
        shared = r.get("num_kv_shared_layers", 0)
        if isinstance(shared, bool) or not isinstance(shared, int) or not 0 <= shared < layers:
            raise r.error(f"num_kv_shared_layers must be in [0, {layers}), got {shared!r}", "num_kv_shared_layers")
        kw["kv_shared"] = shared
        types, first = kw["layer_types"], layers - shared
        if shared and set(types[first:]) - set(types[:first]):
            raise r.error(f"the last {shared} layers share keys and values, but no earlier layer has their type "
                          f"{sorted(set(types[first:]) - set(types[:first]))}", "num_kv_shared_layers")
        r.require("use_bidirectional_attention", (None,), None)
        if r.flag("enable_moe_block", False):
            experts, top_k = r.size("num_experts"), r.size("top_k_experts")
            if top_k > experts:
                raise r.error(f"top_k_experts {top_k} exceeds num_experts {experts}", "top_k_experts")
            kw.update(num_experts=experts, top_k_experts=top_k, moe_intermediate_size=r.size("moe_intermediate_size"))
        else:
            r.ignore("num_experts", "top_k_experts", "moe_intermediate_size")
        r.flag("use_double_wide_mlp", False)  # widens the KV-sharing layers' MLPs: their weights say how much
        r.ignore("allow_global_per_layer_attribute_access")  # a flag MNN's exporter needs; no math
        kw["per_layer"] = cls.per_layer_overrides(r, kw["layer_types"], kw["k_eq_v"])
        width = r.get("hidden_size_per_layer_input", 256)
        kw["per_layer_input"] = 0 if not width else r.size("hidden_size_per_layer_input", 256)
        r.ignore("vocab_size_per_layer_input")  # the PLE table's rows, as its tensor says
        return kw

    @classmethod
    def activation(cls, r: ConfigReader) -> str:
        r.require("hidden_activation", ("gelu_pytorch_tanh",), "gelu_pytorch_tanh")
        r.ignore("hidden_act")
        return "gelu_tanh"

    biases = staticmethod(llama.ModelArgs.no_biases)

    @classmethod
    def attention_layout(cls, r: ConfigReader, layers: int) -> dict[str, Any]:
        types = r.layer_types(layers, [SLIDING if (i + 1) % 6 else FULL for i in range(layers)])
        if types[-1] != FULL:
            types[-1] = FULL  # transformers forces the last layer to full attention
        ropes = {t: r.rope(1000000.0 if t == FULL else 10000.0, t) for t in set(types)}
        return dict(layer_types=types, sliding_window=cls.window_from(r, types, 512), ropes=[ropes[t] for t in types])

    @staticmethod
    def per_layer_overrides(r: ConfigReader, types: list[str], k_eq_v: bool) -> dict[int, dict[str, int]]:
        """`per_layer_config` {layer: {head_dim, num_key_value_heads}}, or transformers' default when
        absent: `global_head_dim` (512) on the full-attention layers, and with attention_k_eq_v their
        `num_global_key_value_heads`."""
        given = r.get("per_layer_config")
        if given is None:
            over = {"head_dim": r.size("global_head_dim", 512)}
            if k_eq_v and r.has("num_global_key_value_heads"):
                over["num_key_value_heads"] = r.size("num_global_key_value_heads")
            r.ignore("num_global_key_value_heads")
            return {i: dict(over) for i, t in enumerate(types) if t == FULL}
        r.ignore("global_head_dim", "num_global_key_value_heads")
        if not isinstance(given, dict):
            raise r.error(f"per_layer_config must be an object, got {given!r}", "per_layer_config")
        out: dict[int, dict[str, int]] = {}
        for key, values in given.items():
            if not str(key).isdigit() or int(key) >= len(types) or not isinstance(values, dict):
                raise r.error(f"per_layer_config entry {key!r}: {values!r}", "per_layer_config")
            unknown = sorted(set(values) - set(_PER_LAYER_KEYS))
            if unknown:
                raise r.unsupported(f"per_layer_config key(s) {', '.join(unknown)}", "per_layer_config")
            if any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values.values()):
                raise r.error(f"per_layer_config entry {key!r} must hold positive integers", "per_layer_config")
            out[int(key)] = dict(values)
        return out


class Model(gemma2.Model):
    norm_offset = 0.0

    def __init__(self, args: ModelArgs):
        super().__init__(args)
        self.base = "model.language_model" if args.composite else "model"
        self.per_layer_dim = args.per_layer_input

    def attention(self, layer: int) -> llama.AttentionSpec:
        spec = llama.Model.attention(self, layer)
        base = f"{self.base}.layers.{layer}.self_attn"
        over = self.args.per_layer.get(layer, {})
        return replace(spec, q_norm=f"{base}.q_norm.weight", k_norm=f"{base}.k_norm.weight", v_norm=True,
                       head_dim=over.get("head_dim"), kv_heads=over.get("num_key_value_heads"),
                       v_from_k=self.args.k_eq_v and spec.window is None, kv_from=self.kv_producer(layer))

    def kv_producer(self, layer: int) -> int | None:
        """The last layer before the `num_kv_shared_layers` tail whose type matches `layer`'s, for a tail layer."""
        a = self.args
        first = a.num_hidden_layers - a.kv_shared
        if layer < first:
            return None
        return max(i for i in range(first) if a.layer_types[i] == a.layer_types[layer])

    def mlp(self, layer: int) -> llama.MlpSpec:
        a = self.args
        if not a.num_experts:
            return llama.MlpSpec(a.act)
        return llama.MlpSpec(a.act, a.num_experts, a.top_k_experts, norm_topk=True, beside_dense=True,
                             expert_scale=True)

    def router(self, layer: int) -> str:
        return f"{self.base}.layers.{layer}.router.proj.weight"

    def router_scale(self, layer: int) -> str:
        return f"{self.base}.layers.{layer}.router.scale"

    def expert_scale(self, layer: int) -> str:
        return f"{self.base}.layers.{layer}.router.per_expert_scale"

    def moe_norms(self, layer: int) -> dict[str, str]:
        base = f"{self.base}.layers.{layer}"
        return {"post_1": f"{base}.post_feedforward_layernorm_1.weight",
                "pre_2": f"{base}.pre_feedforward_layernorm_2.weight",
                "post_2": f"{base}.post_feedforward_layernorm_2.weight"}

    def expert_weight(self, source: Source, layer: int, expert: int, name: str) -> LazyTensor:
        """`name`: gate_up ([gate; up] rows) or down, from the fused [E, out, in] tensors."""
        fused = source.tensor(f"{self.base}.layers.{layer}.experts.{name}_proj")
        return expert_matrix(fused, expert, f"{fused.name}[{expert}]")

    def mlp_norms(self, layer: int) -> tuple[str, str]:
        base = f"{self.base}.layers.{layer}"
        return f"{base}.pre_feedforward_layernorm.weight", f"{base}.post_feedforward_layernorm.weight"

    def llm_config(self) -> dict[str, Any]:
        config = {**super().llm_config(), "attn_scale": 1.0}
        if self.per_layer_dim:
            config.update(ple_embed_file="ple_embeddings_bf16.bin", ple_embed_scale=math.sqrt(self.per_layer_dim),
                          ple_embed_dim=self.args.num_hidden_layers * self.per_layer_dim)
        return config

    def extra_tables(self) -> dict[str, str]:
        return {"ple_embeddings_bf16.bin": self.ple_tensor("embedding")} if self.per_layer_dim else {}

    def layer_scalar(self, source: Source, layer: int) -> float | None:
        name = f"{self.base}.layers.{layer}.layer_scalar"
        if not source.has(name):
            return None
        value = float(source.tensor(name).load().reshape(-1)[0])
        return None if value == 1.0 else value

    def ple_tensor(self, part: str) -> str:
        """The model-wide PLE tensors: embedding, projection, projection_norm."""
        return {"embedding": f"{self.base}.embed_tokens_per_layer.weight",
                "projection": f"{self.base}.per_layer_model_projection.weight",
                "projection_norm": f"{self.base}.per_layer_projection_norm.weight"}[part]

    def ple_layer_tensor(self, layer: int, part: str) -> str:
        """A layer's PLE tensors: gate, projection, norm."""
        name = {"gate": "per_layer_input_gate.weight", "projection": "per_layer_projection.weight",
                "norm": "post_per_layer_input_norm.weight"}[part]
        return f"{self.base}.layers.{layer}.{name}"

    def norms(self, layer: int) -> list[str]:
        names = super().norms(layer) + ([self.ple_layer_tensor(layer, "norm")] if self.per_layer_dim else [])
        return [n for n in names if self.attention(layer).kv_from is None or not n.endswith("k_norm.weight")]

    def layer_tensors(self, source: Source, layer: int) -> list[LazyTensor]:
        return self._attention_and_mlp_tensors(source, layer) + self._expert_tensors(source, layer)

    def _expert_tensors(self, source: Source, layer: int) -> list[LazyTensor]:
        if not self.args.num_experts:
            return []
        names = list(self.moe_norms(layer).values()) + [self.router(layer), self.router_scale(layer),
                                                         self.expert_scale(layer)]
        return [source.tensor(n) for n in names] + self.expert_tensors(source, layer)

    def _attention_and_mlp_tensors(self, source: Source, layer: int) -> list[LazyTensor]:
        spec = self.attention(layer)
        skip = {"k_proj", "v_proj"} if spec.kv_from is not None else {"v_proj"} if spec.v_from_k else set()
        projections = [p for p in llama.PROJECTIONS if p not in skip]
        tensors = [source.tensor(n) for n in self.norms(layer)]
        tensors += [self.linear_weight(source, layer, p) for p in projections]
        if self.per_layer_dim:
            tensors += [source.tensor(self.ple_layer_tensor(layer, p)) for p in ("gate", "projection")]
        return tensors

    def parameter_count(self, source: Source) -> int:
        extra = 0
        if self.per_layer_dim:
            for part in ("projection", "projection_norm"):
                shape = source.tensor(self.ple_tensor(part)).shape
                extra += math.prod(shape)
        return super().parameter_count(source) + extra
