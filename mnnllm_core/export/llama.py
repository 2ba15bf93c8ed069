"""Llama (SmolLM2, TinyLlama, Llama 2/3 incl. llama3 rope scaling): RMSNorm, GQA attention with RoPE, SwiGLU MLP.

The base every other architecture file builds on: `ModelArgs.read` pulls its fields out of a
`ConfigReader`, `Model` names the checkpoint's tensors and says, layer by layer, what the graph
must compute (`AttentionSpec`, `MlpSpec`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .config import FULL, SLIDING, ConfigReader
from .linear_attention import LinearAttentionSpec
from .rope import RopeSpec
from .sources import LazyTensor, Source

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class ModelArgs:
    """The config.json fields the export needs; `from_dict` refuses keys it does not understand."""

    model_type: str
    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    vocab_size: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    layer_types: list[str] = field(default_factory=list)
    sliding_window: int | None = None
    ropes: list[RopeSpec | None] = field(default_factory=list)
    act: str = "silu"

    default_theta = 10000.0

    @classmethod
    def from_dict(cls, config: dict[str, Any], file: str | None = None) -> "ModelArgs":
        """A ConfigError naming `file` and the field when a size is bad; UnsupportedError for a key not understood."""
        reader = ConfigReader(config, file)
        args = cls(**cls.read(reader))
        reader.finish()
        return args

    @classmethod
    def read(cls, r: ConfigReader) -> dict[str, Any]:
        """The dataclass fields from `r`; subclasses extend the dict."""
        heads = r.size("num_attention_heads")
        hidden = r.size("hidden_size")
        layers = r.size("num_hidden_layers")
        kw = dict(model_type=r.get("model_type"), hidden_size=hidden, num_hidden_layers=layers,
                  intermediate_size=r.size("intermediate_size"), num_attention_heads=heads,
                  vocab_size=r.size("vocab_size"), num_key_value_heads=r.size("num_key_value_heads", heads),
                  head_dim=r.size("head_dim", hidden // heads), rms_norm_eps=r.number("rms_norm_eps", 1e-6),
                  tie_word_embeddings=r.flag("tie_word_embeddings", False))
        kw["act"] = cls.activation(r)
        r.require("mlp_bias", (False,), False)
        r.require("rope_interleaved", (False,), False)  # SmolLM2's configs say so; True would pair dims differently
        kw["qkv_bias"], kw["o_bias"] = cls.biases(r)
        kw.update(cls.attention_layout(r, layers))
        return kw

    @classmethod
    def activation(cls, r: ConfigReader) -> str:
        """The MLP's gate activation, as the graph names it."""
        r.require("hidden_act", ("silu",), "silu")
        return "silu"

    @classmethod
    def biases(cls, r: ConfigReader) -> tuple[bool, bool]:
        """(q/k/v bias, o_proj bias): llama's `attention_bias` puts one on all four."""
        bias = r.flag("attention_bias", False)
        return bias, bias

    @staticmethod
    def no_biases(r: ConfigReader) -> tuple[bool, bool]:
        """`biases` of a family whose attention has none: its `attention_bias` may only say so."""
        r.require("attention_bias", (False,), False)
        return False, False

    @classmethod
    def attention_layout(cls, r: ConfigReader, layers: int) -> dict[str, Any]:
        """Per-layer attention kind, window and rotary table; llama: full attention, one table."""
        rope = r.rope(cls.default_theta)
        return dict(layer_types=[FULL] * layers, sliding_window=None, ropes=[rope] * layers)

    @staticmethod
    def window_from(r: ConfigReader, types: list[str], default: int | None = None) -> int | None:
        """`sliding_window` when some layer slides (missing: the architecture's transformers default);
        a sliding layer whose window is null, or missing without a default, is an error."""
        if SLIDING not in types:
            r.ignore("sliding_window")
            return None
        if "sliding_window" in r.config and r.config["sliding_window"] is None:
            raise r.error("sliding_window is null but layers slide", "sliding_window")
        return r.size("sliding_window", default)


@dataclass(frozen=True)
class AttentionSpec:
    """What one layer's attention computes beyond plain causal softmax(q k^T / sqrt(d)) v."""

    rope: RopeSpec | None          # None: a NoPE layer (the graph rotates by angle 0)
    window: int | None             # sliding window in keys, the query's own included; None: full
    q_norm: str | None = None      # per-head RMSNorm weights (Qwen3, Gemma 3)
    k_norm: str | None = None
    scale: float | None = None     # None: 1/sqrt(head_dim)
    output_gate: bool = False      # Qwen3.5: q_proj also yields a per-head gate, out * sigmoid(gate)
    v_norm: bool = False           # Gemma 4: values RMS-normed per head, no weight
    unit_qk_norm: bool = False     # Llama 4: q and k RMS-normed per head, no weight
    kv_from: int | None = None     # Gemma 4's KV sharing: the layer whose keys and values (cache) this one reads
    v_from_k: bool = False         # Gemma 4's attention_k_eq_v: values are k_proj's output (before k's norm, RoPE)
    head_dim: int | None = None    # per-layer overrides (Gemma 4's full layers); None: the model's
    kv_heads: int | None = None
    norm_after_rope: bool = False  # HunYuan: q/k norms after the rotation (not the RoPE op's, which come before)
    sinks: str | None = None       # gpt-oss: a learned logit per head that joins each softmax (and is dropped)


@dataclass(frozen=True)
class MlpSpec:
    """A dense gated MLP (`act` on gate, times up) or a routed mixture of such experts."""

    act: str = "silu"              # silu | gelu_tanh | clamped_swiglu (gpt-oss experts, see glu_alpha)
    experts: int = 0
    top_k: int = 0
    norm_topk: bool = False
    shared: int = 0                # a shared expert of this width (Qwen3.5-MoE, Llama 4)
    shared_gate: bool = False      # Qwen3.5-MoE: the shared expert times sigmoid(shared_expert_gate(x))
    sigmoid_input: bool = False    # Llama 4: top-1 on the logits, the expert's input times sigmoid(logit)
    beside_dense: bool = False     # Gemma 4: the experts run beside a dense MLP, each with its own norms
    expert_scale: bool = False     # Gemma 4: each chosen expert's weight times its per_expert_scale
    gated: bool = True             # False: up -> act -> down (Phi's fc1, fc2)
    scoring: str = "softmax"       # the routing: softmax | sigmoid (LFM2-MoE) of the router's logits, or
                                   # topk_softmax (gpt-oss): the top-k logits chosen, then their softmax
    selection_bias: str | None = None  # a tensor added to the scores to pick the experts, not to weigh them
    norm_eps: float = 0.0          # added to the sum of the top-k weights when they are renormalised
    routed_scale: float = 1.0      # the routing weights' final factor
    glu_alpha: float = 1.0         # clamped_swiglu: (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g),
    glu_limit: float = 0.0         # g = min(gate, limit)


class Model:
    """Names of the weights of one architecture, in the HF checkpoint's naming, and what each layer computes."""

    style = "c4"                   # c4: MNN's transformer_c4 fused graph; plain: one Linear after another
    norm_offset = 0.0              # Gemma stores RMSNorm weights as w - 1
    sandwich_norms = False         # Gemma 2/3: norms after attention and after the MLP too
    base = "model"                 # the decoder's tensor prefix (a composite VL checkpoint: model.language_model)
    per_layer_dim = 0              # Gemma 4: per-layer embedding width (the `ple_embeddings` input); 0: none
    rms_norm = True                # False: LayerNorm with mean and bias (Phi)
    parallel = False               # Phi: x + attention(norm(x)) + mlp(norm(x)), one norm per layer

    def __init__(self, args: ModelArgs):
        self.args = args

    @property
    def embed_scale(self) -> float | None:
        return None

    @property
    def final_softcap(self) -> float | None:
        return None

    def attention(self, layer: int) -> AttentionSpec:
        a = self.args
        window = a.sliding_window if a.layer_types[layer] == SLIDING else None
        return AttentionSpec(a.ropes[layer], window)

    def mlp(self, layer: int) -> MlpSpec:
        return MlpSpec(self.args.act)

    def layer_scalar(self, source: Source, layer: int) -> float | None:
        """A constant the layer's output is multiplied by (Gemma 4's `layer_scalar`); None: none."""
        return None

    def runtime_config(self) -> dict[str, Any]:
        """config.json keys the model needs (Llama 4: a context cap); the user's overrides still win."""
        return {}

    def extra_tables(self) -> dict[str, str]:
        """bf16 tables written beside the model, file name -> tensor (Gemma 4's per-layer embeddings)."""
        return {}

    def linear_attention(self, layer: int) -> "LinearAttentionSpec | None":
        """The layer's linear-attention mixer, or None: it attends (every layer but Qwen3.5's delta-net ones)."""
        return None
    def mixer(self, layer: int) -> str:
        """What mixes the tokens in a layer: "attention", or "short_conv" (LFM2)."""
        return "attention"

    def llm_config(self) -> dict[str, Any]:
        """The llm_config.json keys that describe attention: MNN builds a 2-plane mask for "mix"."""
        windows = {self.attention(i).window for i in range(self.args.num_hidden_layers)} - {None}
        if not windows:
            return {"attention_type": "full"}
        return {"attention_type": "mix", "sliding_window": int(windows.pop())}

    # -- tensor names -----------------------------------------------------------

    def embedding(self) -> str:
        return f"{self.base}.embed_tokens.weight"

    def final_norm(self) -> str:
        return f"{self.base}.norm.weight"

    def lm_head(self) -> str:
        return self.embedding() if self.args.tie_word_embeddings else "lm_head.weight"

    def lm_head_bias(self) -> str | None:
        return None

    def router_bias(self, layer: int) -> str | None:
        return None

    def expert_bias(self, source: Source, layer: int, expert: int, name: str) -> LazyTensor | None:
        """The bias of an expert's gate_up or down Linear (gpt-oss); None without."""
        return None

    def norm_bias(self, weight: str) -> str | None:
        """The bias (beta) of the norm whose weight is `weight`; None for an RMSNorm."""
        return None

    def input_norm(self, layer: int) -> str:
        return f"{self.base}.layers.{layer}.input_layernorm.weight"

    def post_attention_norm(self, layer: int) -> str:
        return f"{self.base}.layers.{layer}.post_attention_layernorm.weight"

    def linear(self, layer: int, name: str) -> str:
        """`name` is one of PROJECTIONS."""
        group = "mlp" if name in ("gate_proj", "up_proj", "down_proj") else "self_attn"
        return f"{self.base}.layers.{layer}.{group}.{name}"

    def linear_weight(self, source: Source, layer: int, name: str) -> LazyTensor:
        return source.tensor(f"{self.linear(layer, name)}.weight")

    def linear_bias(self, source: Source, layer: int, name: str) -> LazyTensor | None:
        a = self.args
        wanted = a.qkv_bias if name in ("q_proj", "k_proj", "v_proj") else a.o_bias if name == "o_proj" else False
        return source.tensor(f"{self.linear(layer, name)}.bias") if wanted else None

    def norms(self, layer: int) -> list[str]:
        """Every norm weight of a layer (for counting what the export writes)."""
        spec = self.attention(layer)
        return [self.input_norm(layer), self.post_attention_norm(layer)] + [n for n in (spec.q_norm, spec.k_norm) if n]

    def layer_tensors(self, source: Source, layer: int) -> list[LazyTensor]:
        """Every tensor of a layer that the export writes."""
        return self.attention_tensors(source, layer) + [self.linear_weight(source, layer, p) for p in PROJECTIONS[4:]]

    def attention_tensors(self, source: Source, layer: int) -> list[LazyTensor]:
        """A layer's norms and its q/k/v/o projections."""
        return ([source.tensor(n) for n in self.norms(layer)] +
                [self.linear_weight(source, layer, p) for p in PROJECTIONS[:4]])

    def expert_tensors(self, source: Source, layer: int) -> list[LazyTensor]:
        """Every expert's gate_up and down of an MoE layer (its model defines `expert_weight`)."""
        return [self.expert_weight(source, layer, e, p) for e in range(self.args.num_experts) for p in ("gate_up", "down")]

    def parameter_count(self, source: Source) -> int:
        """Elements the weight file is built from (the lm_head counts again when tied, as it is written again)."""
        tensors = [source.tensor(self.final_norm()), source.tensor(self.lm_head())]
        for i in range(self.args.num_hidden_layers):
            tensors += self.layer_tensors(source, i)
        return sum(int(np.prod(t.shape, dtype=np.int64)) for t in tensors)
