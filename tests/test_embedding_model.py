"""Embedding models (MNN's `Embedding`, pymnn's `create(config, embedding_model=True)`): a tiny random
BertModel built with transformers, exported by `mnnllm export`, embedded by our engine and compared
with transformers' pooled, L2-normalized output (cosine >= 0.9999); the tokenizer against HF
tokenizers; MNN's own Module API on our llm.mnn; and the typed errors."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import mnnllm_core
from mnnllm_core.errors import ConfigError, ContextLengthError, MnnllmError, UnsupportedError
from mnnllm_core.export.exporter import export_model
from mnnllm_core.plugins.manager import registry

from hf_tiny import on_grid
from test_export import dequantized

pytest.importorskip("transformers", reason="transformers builds the tiny reference encoders")

ROOT = Path(__file__).resolve().parents[1]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = ["hello", "world", "the", "quick", "brown", "fox", "jump", "##s", "over", "lazy", "dog", "caf", "##e", "e",
         "!", ",", ".", "?", "'", "a", "b", "c", "un", "##believ", "##able", "日", "本", "$", "1", "2", "##0", "-"]
MAX_POSITIONS = 40
TEXTS = ["hello world", "The quick brown fox jumps over the lazy dog, unbelievable!",
         "Café? 日本 $120 -- l'été (naïve)!", "a"]
COSINE = 0.9999
BLOCK = 32


def build_bert(folder: Path, seed: int = 0, pooling: str | None = None, **config) -> None:
    """A tiny BertModel (weights on the 1/64 grid, exact in fp16 and bf16) with a WordPiece tokenizer.json;
    `pooling` writes sentence-transformers' 1_Pooling/config.json."""
    import torch
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import BertConfig, BertModel

    folder.mkdir(parents=True)
    vocab = {t: i for i, t in enumerate(SPECIALS + WORDS)}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                       special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tok.decoder = decoders.WordPiece()
    tok.add_special_tokens(SPECIALS)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"cls_token": "[CLS]", "sep_token": "[SEP]",
                                                              "unk_token": "[UNK]", "do_lower_case": True}))
    torch.manual_seed(seed)
    cfg = BertConfig(**{"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 96,
                        "vocab_size": len(vocab), "max_position_embeddings": MAX_POSITIONS, **config})
    model = BertModel(cfg, add_pooling_layer=False).eval()
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("LayerNorm.weight"):
                values = 1 + 0.1 * rng.standard_normal(p.shape)
            elif name.endswith("bias"):
                values = 0.1 * rng.standard_normal(p.shape)
            elif "embeddings" in name:
                values = 0.5 * rng.standard_normal(p.shape)
            else:
                values = rng.standard_normal(p.shape) * (1.2 / np.sqrt(p.shape[-1]))
            p.copy_(torch.from_numpy(on_grid(values)))
    model.save_pretrained(folder)
    if pooling:
        (folder / "1_Pooling").mkdir()
        (folder / "1_Pooling" / "config.json").write_text(json.dumps(
            {"word_embedding_dimension": 64, "pooling_mode_cls_token": pooling == "cls",
             "pooling_mode_mean_tokens": pooling == "mean", "pooling_mode_max_tokens": False}))


def hf_ids(folder: Path, text: str) -> list[int]:
    from tokenizers import Tokenizer
    return Tokenizer.from_file(str(folder / "tokenizer.json")).encode(text).ids


def hf_embeddings(folder: Path, pooling: str, bits: int = 16) -> np.ndarray:
    """transformers' last hidden state pooled (CLS or mean) and L2-normalized, per text; at 4 bits on the
    linear weights as the export stores them."""
    import torch
    from transformers import BertModel

    model = BertModel.from_pretrained(folder, attn_implementation="eager").eval()
    if bits != 16:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.dim() == 2 and "embeddings" not in name:
                    p.copy_(torch.from_numpy(dequantized(p.numpy(), bits, BLOCK).astype(np.float32)))
    rows = []
    with torch.no_grad():
        for text in TEXTS:
            hidden = model(input_ids=torch.tensor([hf_ids(folder, text)])).last_hidden_state[0]
            pooled = hidden[0] if pooling == "cls" else hidden.mean(0)
            rows.append(torch.nn.functional.normalize(pooled, dim=-1).numpy())
    return np.stack(rows)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """name -> (HF folder, exported folder, pooling, bits), built once."""
    root = tmp_path_factory.mktemp("embedding")
    out = {}
    for name, pooling, bits, config in (("cls", None, 16, {}), ("mean", "mean", 16, {"hidden_act": "gelu_new"}),
                                        ("cls4", None, 4, {})):
        src = root / f"{name}-hf"
        build_bert(src, seed=len(out), pooling=pooling, **config)
        dst = root / name
        export_model(str(src), str(dst), quant_bit=bits, quant_block=BLOCK)
        out[name] = (src, dst, pooling or "cls", bits)
    return out


def embed(folder: Path, backend: str = "cpu", **settings) -> tuple[np.ndarray, object]:
    model = mnnllm_core.create(folder, embedding_model=True)
    model.set_config({"backend_type": backend, **settings})
    model.load()
    return np.concatenate([model.txt_embedding(t) for t in TEXTS]), model


def embed_text(folder: Path, text: str) -> np.ndarray:
    model = mnnllm_core.create(folder, embedding_model=True)
    return model.load().txt_embedding(text)


def copy_files(src: Path, dst: Path) -> Path:
    """The files (not folders) of `src` in a new folder `dst`, to break one of them."""
    dst.mkdir()
    for f in src.iterdir():
        if f.is_file():
            (dst / f.name).write_bytes(f.read_bytes())
    return dst


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_the_export_is_mnn_embedding_layout(models):
    _, dst, _, _ = models["cls"]
    llm_config = json.loads((dst / "llm_config.json").read_text())
    assert llm_config["attention_mask"] == "int" and llm_config["max_all_tokens"] == MAX_POSITIONS
    template = "[CLS]{% for message in messages %}{{ message['content'] }}{% endfor %}[SEP]"
    assert llm_config["jinja"]["chat_template"] == template
    assert (dst / "embeddings_bf16.bin").stat().st_size == (len(SPECIALS) + len(WORDS)) * 64 * 2
    from mnnllm_core.express.module import Module
    info = Module.load([], [], dst / "llm.mnn").info
    assert info.inputs == ["input_ids", "attention_mask", "position_ids"]
    assert info.outputs == ["sentence_embeddings"]


def test_tokenizer_ids_equal_hf_tokenizers(models):
    src, dst, _, _ = models["cls"]
    model = mnnllm_core.create(dst, embedding_model=True).load()
    for text in TEXTS:
        assert model.tokenizer_encode(model.apply_chat_template(text)) == hf_ids(src, text), text
    assert len(hf_ids(src, TEXTS[1])) > 12 and 1 not in hf_ids(src, TEXTS[1])  # long, and no [UNK]


@pytest.mark.parametrize("name", ["cls", "mean", "cls4"])
def test_cpu_embedding_matches_transformers(models, name):
    src, dst, pooling, bits = models[name]
    got, model = embed(dst)
    expected = hf_embeddings(src, pooling, bits)
    assert got.shape == (len(TEXTS), 64) and got.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert cosines(got, expected).min() >= COSINE, cosines(got, expected)
    assert np.abs(got - expected).max() < 1e-5  # measured 3.3e-7: fp32 rounding, nothing more
    assert cosines(got[:1], got[1:2])[0] < 0.999  # different texts, different vectors
    assert model.dim() == 64


def test_low_and_normal_memory_agree(models):
    _, dst, _, _ = models["cls4"]
    low, _ = embed(dst, memory="low")
    normal, _ = embed(dst, memory="normal")
    assert cosines(low, normal).min() >= COSINE


@pytest.mark.parametrize("backend", ["opencl", "vulkan"])
def test_gpu_backend_embedding_matches_transformers(models, backend):
    available, reason = registry().get(backend).is_available()
    if not available:
        pytest.skip(f"{backend} unavailable: {reason}")
    src, dst, pooling, bits = models["cls"]
    got, model = embed(dst, backend)
    assert cosines(got, hf_embeddings(src, pooling, bits)).min() >= COSINE
    ran = model.placement()["op_types_per_backend"]
    for op_type in ("Convolution", "Attention", "LayerNorm", "UnaryOp"):  # the encoder runs there
        assert ran[backend].get(op_type) and op_type not in ran.get("cpu", {}), ran


def test_ids_embedding_and_batch(models):
    src, dst, _, _ = models["cls"]
    model = mnnllm_core.create(dst, embedding_model=True).load()
    one = model.ids_embedding(hf_ids(src, TEXTS[0]))
    np.testing.assert_allclose(one, model.txt_embedding(TEXTS[0]), atol=1e-6)
    batch = model.embeddings(TEXTS[:2])
    np.testing.assert_allclose(batch[1:2], model.txt_embedding(TEXTS[1]), atol=1e-6)
    assert model.embeddings([]).shape == (0, 64)


def test_a_float_attention_mask_config_is_causal_as_in_mnn(models):
    """MNN's Embedding masks causally when llm_config says "float": CLS, token 0, then sees only itself."""
    src, dst, _, _ = models["cls"]
    causal = mnnllm_core.create(dst, embedding_model=True)
    causal.set_config({"attention_mask": "float"})
    causal.load()
    bidirectional = mnnllm_core.create(dst, embedding_model=True).load()
    ids = hf_ids(src, TEXTS[1])
    np.testing.assert_allclose(causal.ids_embedding(ids), bidirectional.ids_embedding(ids[:1]), atol=1e-5)
    assert cosines(causal.ids_embedding(ids), bidirectional.ids_embedding(ids))[0] < 0.99


@pytest.mark.oracle
def test_mnn_module_on_our_export_equals_transformers(models, tmp_path):
    """MNN's runtime (PyPI MNN, its Module API in a subprocess) on our llm.mnn with transformers' word embeddings."""
    pytest.importorskip("MNN", reason="MNN's runtime")
    src, dst, pooling, bits = models["cls"]
    script = textwrap.dedent(f"""
        import json, os, sys, numpy as np, MNN, MNN.nn as nn, MNN.expr as F
        rt = nn.create_runtime_manager(({{"backend": 0, "precision": "high"}},))
        rt.set_external({str(dst / "llm.mnn.weight")!r})
        mod = nn.load_module_from_file({str(dst / "llm.mnn")!r}, ["input_ids", "attention_mask", "position_ids"],
                                       ["sentence_embeddings"], runtime_manager=rt, rearrange=True)
        table = (np.fromfile({str(dst / "embeddings_bf16.bin")!r}, np.uint16).astype(np.uint32) << 16).view(np.float32)
        table = table.reshape(-1, 64)
        out = []
        for ids in json.loads(sys.argv[1]):
            n = len(ids)
            feeds = [F.const(table[ids].reshape(-1).tolist(), [n, 1, 64], F.NCHW, F.float),
                     F.const([1.0] * n * n, [1, 1, n, n], F.NCHW, F.float),
                     F.const(list(range(n)), [1, n], F.NCHW, F.int)]
            out.append(np.array(mod.forward(feeds)[0].read()).reshape(-1).tolist())
        print(json.dumps(out), flush=True)
        os._exit(0)  # MNN's buffered device info would follow our line at exit
    """)
    ids = [hf_ids(src, t) for t in TEXTS]
    done = subprocess.run([sys.executable, "-c", script, json.dumps(ids)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    got = np.array(json.loads(done.stdout.strip().splitlines()[-1]))
    assert cosines(got, hf_embeddings(src, pooling, bits)).min() >= COSINE


@pytest.mark.oracle
@pytest.mark.parametrize("name", ["cls", "mean"])
def test_mnn_runtime_txt_embedding_on_our_export_equals_transformers(models, name):
    """pymnn's own `create(config, embedding_model=True).txt_embedding` on our export: its template,
    tokenizer (the accents go by the NFD table of a kind-7 BertNormalizer), DiskEmbedding and mask."""
    pytest.importorskip("MNN", reason="MNN's runtime")
    src, dst, pooling, bits = models[name]
    script = textwrap.dedent(f"""
        import json, os, sys, numpy as np, MNN.llm as llm
        model = llm.create({str(dst / "config.json")!r}, True)
        print(json.dumps([np.array(model.txt_embedding(t).read()).reshape(-1).tolist() for t in json.loads(sys.argv[1])]),
              flush=True)
        os._exit(0)  # MNN's buffered device info would follow our line at exit
    """)
    done = subprocess.run([sys.executable, "-c", script, json.dumps(TEXTS)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    got = np.array(json.loads(done.stdout.strip().splitlines()[-1]))
    assert cosines(got, hf_embeddings(src, pooling, bits)).min() >= COSINE


def test_an_embedding_model_does_not_generate(models):
    _, dst, _, _ = models["cls"]
    model = mnnllm_core.create(dst, embedding_model=True).load()
    for call in (lambda: model.generate([2, 5, 3], 4), lambda: model.response("hello"),
                 lambda: model.forward([2, 5]), lambda: list(model.stream_ids([2, 5]))):
        with pytest.raises(UnsupportedError, match="does not generate"):
            call()


def test_loading_an_embedding_model_as_an_llm_says_how_to_load_it(models):
    _, dst, _, _ = models["cls"]
    with pytest.raises(UnsupportedError, match="embedding_model=True.*mnnllm embed"):
        mnnllm_core.create(dst).load()
    done = subprocess.run([sys.executable, "-m", "mnnllm_core.cli", "run", str(dst), "-p", "hi"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "mnnllm embed" in done.stderr and "Traceback" not in done.stderr


def test_text_longer_than_the_positions_is_refused(models):
    src, dst, _, _ = models["cls"]
    model = mnnllm_core.create(dst, embedding_model=True).load()
    long_text = " ".join(["hello"] * MAX_POSITIONS)
    with pytest.raises(ContextLengthError, match="max_all_tokens") as err:
        model.txt_embedding(long_text)
    assert err.value.field == "max_all_tokens"
    with pytest.raises(ContextLengthError):
        model.ids_embedding([5] * (MAX_POSITIONS + 1))
    assert model.ids_embedding([2] + [5] * (MAX_POSITIONS - 2) + [3]).shape == (1, 64)  # exactly full: fine


def test_bad_input_and_config_are_typed_errors(models, tmp_path):
    from paths import CONFIG
    _, dst, _, _ = models["cls"]
    with pytest.raises(MnnllmError, match="not loaded"):
        mnnllm_core.create(dst, embedding_model=True).txt_embedding("hello")
    model = mnnllm_core.create(dst, embedding_model=True).load()
    with pytest.raises(MnnllmError, match="at least one token"):
        model.ids_embedding([])
    with pytest.raises(MnnllmError):
        model.ids_embedding([10_000])
    with pytest.raises(MnnllmError, match="text must be a str"):
        model.txt_embedding(["hello"])
    with pytest.raises(ConfigError, match="not an embedding model.*sentence_embeddings"):  # a decoder LLM
        mnnllm_core.create(CONFIG, embedding_model=True).load()
    visual = copy_files(dst, tmp_path / "visual")
    cfg = json.loads((visual / "llm_config.json").read_text())
    (visual / "llm_config.json").write_text(json.dumps({**cfg, "is_visual": True}))
    with pytest.raises(ConfigError, match="multimodal"):
        mnnllm_core.create(visual, embedding_model=True)
    (visual / "llm_config.json").write_text(json.dumps({**cfg, "hidden_size": 48}))
    with pytest.raises(MnnllmError, match="bf16 rows|hidden_size"):
        mnnllm_core.create(visual, embedding_model=True).load().txt_embedding("hello")


@pytest.mark.parametrize("change,match", [
    ({"position_embedding_type": "relative_key"}, "position_embedding_type"),
    ({"is_decoder": True}, "is_decoder"),
    ({"hidden_act": "relu"}, "hidden_act"),
    ({"some_new_key": 3}, "some_new_key"),
])
def test_the_exporter_refuses_an_encoder_it_does_not_build(models, tmp_path, change, match):
    bad = copy_files(models["cls"][0], tmp_path / "bad")
    config = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(UnsupportedError, match=match):
        export_model(str(bad), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_the_exporter_refuses_a_pooling_it_does_not_build(models, tmp_path):
    bad = copy_files(models["cls"][0], tmp_path / "bad")
    (bad / "1_Pooling").mkdir()
    (bad / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_max_tokens": True}))
    with pytest.raises(UnsupportedError, match="pooling_mode_max_tokens"):
        export_model(str(bad), str(tmp_path / "out"))


def test_cli_embed(models):
    src, dst, pooling, bits = models["cls"]
    done = subprocess.run([sys.executable, "-m", "mnnllm_core.cli", "embed", str(dst), "-p", TEXTS[0], "-p", TEXTS[2],
                           "--json"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["text"] for r in rows] == [TEXTS[0], TEXTS[2]] and rows[0]["dim"] == 64
    assert rows[1]["ids"] == hf_ids(src, TEXTS[2])
    expected = hf_embeddings(src, pooling, bits)[[0, 2]]
    assert cosines(np.array([r["embedding"] for r in rows]), expected).min() >= COSINE
    plain = subprocess.run([sys.executable, "-m", "mnnllm_core.cli", "embed", str(dst)], input="hello\n",
                           capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert plain.returncode == 0 and len(plain.stdout.split()) == 64
    blank = subprocess.run([sys.executable, "-m", "mnnllm_core.cli", "embed", str(dst), "-p", " ", "--json"],
                           capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert blank.returncode == 0, blank.stderr  # the CLI embeds what the API embeds
    api = embed_text(dst, " ")
    assert np.allclose(json.loads(blank.stdout)["embedding"], api[0], atol=1e-6)
    long = subprocess.run([sys.executable, "-m", "mnnllm_core.cli", "embed", str(dst), "-p", "hello " * 60],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert long.returncode == 2 and "max_all_tokens" in long.stderr and "Traceback" not in long.stderr
