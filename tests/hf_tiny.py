"""Tiny random HF models of each exported architecture, built with transformers at test time.

Weights sit on a 1/64 grid (|w| < 4), so fp16 and bf16 hold them exactly: a 16-bit export then
carries the very weights transformers computes with, and the greedy tokens must agree. The
transformers reference is a plain greedy loop, full forward per token, fp32, eager attention.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from test_export import TEMPLATE, VOCAB, dequantized, tokenizer_json

GRID = 64
BASE = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "vocab_size": VOCAB, "max_position_embeddings": 256,
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
WINDOW = 6
GEMMA4 = {"layer_types": ["sliding_attention", "sliding_attention", "full_attention"], "sliding_window": WINDOW,
          "hidden_size_per_layer_input": 4, "vocab_size_per_layer_input": VOCAB, "final_logit_softcapping": 30.0,
          "global_head_dim": 32, "rope_parameters": {
              "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
              "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6}}}
LLAMA4 = {"intermediate_size_mlp": 96, "intermediate_size": 32, "moe_layers": [], "no_rope_layers": [1, 0, 1],
          "use_qk_norm": True, "attention_chunk_size": 256, "tie_word_embeddings": False}
QWEN3_5 = {"layer_types": ["linear_attention", "full_attention", "linear_attention"], "linear_num_key_heads": 2,
           "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
           "linear_conv_kernel_dim": 4, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                            "partial_rotary_factor": 0.5}}
PROMPTS = [[1, 40, 80, 200, 262, 120, 9, 33, 71, 140], [5, 17, 99, 250, 3, 64, 128, 11]]
NEW_TOKENS = 12
STOP = 2  # <|im_end|>, the tokenizer's eos: both runtimes stop there
ROPE = {"rope_type": "default", "rope_theta": 10000.0}
MOE = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}
CONV_ATTN_CONV = ["conv", "full_attention", "conv"]  # LFM2's layer_types
NTK_ALPHA = {"alpha": 4.0, "factor": 1.0}  # HunYuan's "dynamic" rope: a fixed alpha, a static theta
GPT_OSS = {"num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 32,
           "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]}


@dataclass(frozen=True)
class Arch:
    """One tiny model: its model_type, config on top of BASE, and how norm weights are centred."""

    name: str
    model_type: str
    config: dict[str, Any] = field(default_factory=dict)
    norm_centre: float = 1.0          # Gemma stores w - 1: weights centred on 0
    embed_std: float = 0.5            # Gemma scales embeddings by sqrt(hidden): smaller, or they drown the layers
    seed: int = 0
    unit_norms: tuple[str, ...] = ()  # norm weights (name suffixes) used as w, not 1 + w, whatever norm_centre says
    unquantized: tuple[str, ...] = ()  # parameters (name parts) an export keeps in fp32: no 4-bit rounding
    in_out: tuple[str, ...] = ()      # parameters (name parts) stored [in, out]: quantized as their transpose
    composite: dict[str, Any] | None = None  # a vision-language checkpoint: its outer config (text: BASE + config)


ARCHS = [
    Arch("llama3", "llama", {"tie_word_embeddings": False, "rope_parameters": {
        "rope_type": "llama3", "rope_theta": 100000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 16}}),
    Arch("qwen2", "qwen2", {"tie_word_embeddings": True, "rope_parameters": {"rope_type": "default",
                                                                            "rope_theta": 1000000.0}},
         embed_std=0.2),
    Arch("qwen3", "qwen3", {"tie_word_embeddings": False}),
    Arch("qwen3_moe", "qwen3_moe", {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                                    "norm_topk_prob": True, "mlp_only_layers": [1]}),
    Arch("gemma2", "gemma2", {"sliding_window": WINDOW, "query_pre_attn_scalar": 24, "final_logit_softcapping": 5.0,
                              "attn_logit_softcapping": None}, norm_centre=0.0, embed_std=0.1),
    Arch("gemma3_text", "gemma3_text", {"sliding_window": WINDOW, "query_pre_attn_scalar": 16,
                                        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]},
         norm_centre=0.0, embed_std=0.1),
    Arch("mistral", "mistral", {"sliding_window": WINDOW, "tie_word_embeddings": False}),
    Arch("phi3", "phi3", {"tie_word_embeddings": False}),
    Arch("smollm3", "smollm3", {"no_rope_layers": [1, 0, 1], "tie_word_embeddings": True}, embed_std=0.2),
    Arch("gemma4", "gemma4_text", GEMMA4, norm_centre=1.0, embed_std=0.1, unquantized=("embed_tokens_per_layer",)),
    Arch("gemma4_k_eq_v", "gemma4_text", {**GEMMA4, "attention_k_eq_v": True, "hidden_size_per_layer_input": 0,
                                          "num_global_key_value_heads": 1}, norm_centre=1.0, embed_std=0.1, seed=1),
    Arch("gemma4_kv_shared", "gemma4_text", {**GEMMA4, "num_hidden_layers": 4, "num_kv_shared_layers": 2,
                                             "use_double_wide_mlp": True,
                                             "layer_types": ["sliding_attention", "full_attention",
                                                             "sliding_attention", "full_attention"]},
         norm_centre=1.0, embed_std=0.1, unquantized=("embed_tokens_per_layer",)),
    Arch("gemma4_moe", "gemma4_text", {**GEMMA4, "hidden_size_per_layer_input": 0, "enable_moe_block": True,
                                       "num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": 32},
         norm_centre=1.0, embed_std=0.1),
    Arch("llama4_text", "llama4_text", LLAMA4),
    Arch("qwen3_5", "qwen3_5_text", {**QWEN3_5, "tie_word_embeddings": True}, norm_centre=0.0, embed_std=0.2,
         unit_norms=("linear_attn.norm.weight",), unquantized=("conv1d",)),
    Arch("llama4_text_moe", "llama4_text", {**LLAMA4, "moe_layers": [1], "num_local_experts": 4,
                                           "num_experts_per_tok": 1}, in_out=("feed_forward.experts",)),
    Arch("qwen3_5_moe", "qwen3_5_moe_text", {**QWEN3_5, "num_experts": 4, "num_experts_per_tok": 2,
                                             "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48},
         norm_centre=0.0, embed_std=0.2, unit_norms=("linear_attn.norm.weight",), unquantized=("conv1d",)),
    Arch("phi", "phi", {"rope_parameters": {**ROPE, "partial_rotary_factor": 0.5}}),
    Arch("lfm2", "lfm2", {"layer_types": CONV_ATTN_CONV, "block_auto_adjust_ff_dim": False}),
    Arch("hunyuan", "hunyuan_v1_dense", {"rope_parameters": {**ROPE, "rope_type": "dynamic", **NTK_ALPHA}}),
    Arch("lfm2_moe", "lfm2_moe", {"layer_types": CONV_ATTN_CONV, "num_dense_layers": 1, **MOE}),
    Arch("gpt_oss", "gpt_oss", {**GPT_OSS, "sliding_window": WINDOW, "swiglu_limit": 1.0},  # its own yarn rope
         in_out=("mlp.experts.",)),
]

# Vision-language checkpoints whose language model the exporter writes (text-only prompts).
COMPOSITES = [
    Arch("qwen3_5_vl", "qwen3_5", QWEN3_5, norm_centre=0.0, embed_std=0.2, unit_norms=("linear_attn.norm.weight",),
         composite={"tie_word_embeddings": False, "vision_config": {
             "depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 64}}),
    Arch("gemma4_vl", "gemma4", GEMMA4, norm_centre=1.0, embed_std=0.1,
         composite={"vision_config": None, "audio_config": None}),
]


def build(arch: Arch, folder: Path):
    """Save the tiny model (safetensors, config, tokenizer) into `folder`; returns the torch model."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    torch.manual_seed(arch.seed)
    if arch.composite is None:
        config = AutoConfig.for_model(arch.model_type, **{**BASE, **arch.config})
        config._attn_implementation = "eager"
        model = AutoModelForCausalLM.from_config(config).eval()
    else:
        config = AutoConfig.for_model(arch.model_type, **arch.composite, text_config={**BASE, **arch.config})
        config._attn_implementation = "eager"
        model = AutoModelForImageTextToText.from_config(config).eval()
    rng = np.random.default_rng(arch.seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(arch.unit_norms):
                values = 1.0 + 0.1 * rng.standard_normal(p.shape)
            elif name.endswith("norm.weight"):
                values = arch.norm_centre + 0.1 * rng.standard_normal(p.shape)
            elif "embed_tokens" in name:
                values = arch.embed_std * rng.standard_normal(p.shape)
            else:
                values = rng.standard_normal(p.shape) * (1.2 / np.sqrt(p.shape[-1]))
            p.copy_(torch.from_numpy(on_grid(values)))
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):  # Gemma 4: a per-layer constant, 1 at init
                b.copy_(torch.from_numpy(on_grid(0.8 + 0.4 * rng.random(b.shape))))
            if name.endswith("expert_bias"):  # LFM2-MoE's selection bias: zeros would leave it untested
                b.copy_(torch.from_numpy(on_grid(0.2 * rng.standard_normal(b.shape))))
    model.save_pretrained(folder)
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer_json()))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "chat_template": TEMPLATE,
         "clean_up_tokenization_spaces": False}))
    (folder / "generation_config.json").unlink(missing_ok=True)
    return model


def on_grid(values: np.ndarray) -> np.ndarray:
    return (np.clip(np.round(values * GRID), -4 * GRID + 1, 4 * GRID - 1) / GRID).astype(np.float32)


def greedy(model, prompts: list[list[int]] = PROMPTS, n: int = NEW_TOKENS) -> list[list[int]]:
    """transformers' greedy tokens, up to and including the stop token."""
    import torch

    out = []
    with torch.no_grad():
        for prompt in prompts:
            ids, new = list(prompt), []
            for _ in range(n):
                logits = model(torch.tensor([ids])).logits[0, -1]
                token = int(torch.argmax(logits))
                new.append(token)
                ids.append(token)
                if token == STOP:
                    break
            out.append(new)
    return out


def dequantize_into(model, bits: int, block: int, unquantized: tuple[str, ...] = (),
                    in_out: tuple[str, ...] = ()) -> None:
    """Replace the model's weights by what a `bits`-bit export stores: every Linear (and a tied
    embedding, which is read from the lm_head's block) dequantized; norms and biases stay fp32.
    transformers 5 holds MoE experts as 3-D [experts, rows, cols] tensors: each expert's matrix is
    quantized alone, along its input (`in_out`: those stored input-major, [experts, in, out], as
    gpt-oss's and Llama 4's experts are). `unquantized`: parameters an export keeps in fp32."""
    import torch

    tied = model.config.tie_word_embeddings
    with torch.no_grad():
        for name, p in model.named_parameters():
            if (p.dim() < 2 or name.endswith("bias") or ("embed_tokens" in name and not tied)
                    or any(u in name for u in unquantized)):
                continue
            matrices = p.numpy().reshape((-1,) + tuple(p.shape[-2:]))
            if any(u in name for u in in_out):
                stored = np.stack([dequantized(w.T, bits, block).T for w in matrices]).reshape(p.shape)
            else:
                stored = np.stack([dequantized(w, bits, block) for w in matrices]).reshape(p.shape)
            p.copy_(torch.from_numpy(np.ascontiguousarray(stored, dtype=np.float32)))


def until_stop(tokens: list[int]) -> list[int]:
    return tokens[:tokens.index(STOP) + 1] if STOP in tokens else tokens
