"""bench/model_scale.py's Qwen3-0.6B and Llama-3.1-8B shapes: the tensors it writes are those transformers 5
builds from its configs (on the meta device: no weights), our exporter reads the configs as meant, and a
shrunk copy of each (real vocab, a few narrow layers) exports and runs in our engine and MNN's runtime
with the same logits, though the vocab outnumbers the tokenizer."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from mnnllm_core.export.exporter import ARCHITECTURES
from mnnllm_core.llm.create import create
from mnn_oracle import run_mnn
from paths import smollm2_gguf

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "model_scale.py"
NEW_SHAPES = {"qwen3-0.6b": 0.596e9, "llama3.1-8b": 8.03e9}  # parameters, as published (tied once)


def model_scale():
    spec = importlib.util.spec_from_file_location("model_scale", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def config_of(shape: str, **changes) -> dict:
    ms = model_scale()
    return {**ms.COMMON, **ms.SHAPES[shape], **changes}


@pytest.mark.parametrize("shape", NEW_SHAPES)
def test_the_tensors_written_are_those_transformers_builds_from_the_config(shape):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = config_of(shape)
    hf = transformers.AutoConfig.for_model(**config)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf)
    built = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    if config["tie_word_embeddings"]:
        built.pop("lm_head.weight")  # saved once, as the embedding
    written = dict(model_scale()._tensors(config))
    assert written == built
    assert abs(sum(int(np.prod(s)) for s in written.values()) / NEW_SHAPES[shape] - 1) < 0.01
    assert hf.rope_parameters["rope_type"] == config["rope_parameters"]["rope_type"]


def test_the_exporter_reads_the_configs_as_the_models_mean_them():
    qwen = ARCHITECTURES["qwen3"].ModelArgs.from_dict(config_of("qwen3-0.6b"))
    assert (qwen.head_dim, qwen.num_key_value_heads, qwen.tie_word_embeddings, qwen.qkv_bias) == (128, 8, True, False)
    assert {(r.kind, r.theta) for r in qwen.ropes} == {("default", 1e6)}
    assert ARCHITECTURES["qwen3"].Model(qwen).attention(0).q_norm == "model.layers.0.self_attn.q_norm.weight"
    llama = ARCHITECTURES["llama"].ModelArgs.from_dict(config_of("llama3.1-8b"))
    assert (llama.head_dim, llama.num_key_value_heads, llama.tie_word_embeddings) == (128, 8, False)
    assert {(r.kind, r.theta, r.factor, r.original_max_position_embeddings) for r in llama.ropes} == {
        ("llama3", 5e5, 8.0, 8192)}


@pytest.mark.parametrize("shape", NEW_SHAPES)
def test_a_shrunk_copy_exports_and_runs_as_in_mnns_runtime(shape, tmp_path, monkeypatch):
    """Narrow layers, the real vocab (151936 / 128256 rows over SmolLM2's 49152-token tokenizer); q8 so the
    logits differ by the engines' arithmetic only (both dequantize to fp32 with memory "normal")."""
    smollm2_gguf()
    ms = model_scale()
    monkeypatch.setitem(ms.SHAPES, "shrunk", {**ms.SHAPES[shape], "hidden_size": 128, "intermediate_size": 256,
                                              "num_hidden_layers": 2, "num_attention_heads": 4,
                                              "num_key_value_heads": 2, "head_dim": 32})
    (config,) = ms.build("shrunk", tmp_path, [(8, False)], 64)
    settings = {"memory": "normal", "precision": "high", "thread_num": 2}
    ids = [[1, 504, 3458, 314, 260, 2681, 30], [49151, 7, 49000]]
    llm = create(str(config))
    llm.set_config(settings)
    llm.load()
    assert llm.tokenizer.vocab_size == 49152 < ms.SHAPES[shape]["vocab_size"]
    ours = []
    for prompt in ids:
        llm.reset()
        ours.append(llm.forward(prompt))
    llm.reset()
    greedy = llm.generate(ids[0], 24)  # no id beyond the tokenizer: its rows are zero (a TokenizerError before)
    mnn = run_mnn(str(config.parent), config=settings, logits=ids, generate=[(ids[0], 24)])
    for mine, reference in zip(ours, mnn["logits"]):
        reference = np.asarray(reference, np.float32)
        assert mine.shape == reference.shape == (ms.SHAPES[shape]["vocab_size"],)
        assert np.abs(mine - reference).max() <= 1e-5 * np.abs(reference).max()
        assert not mine[49152:].any() and mine[:49152].max() > 0  # padded rows: logit 0, below the best token's
    assert max(greedy) < 49152 and len(greedy) == 24
    assert mnn["generate"][0] == greedy  # MNN's greedy tokens too


@pytest.mark.parametrize("shape", ["135m", *NEW_SHAPES])
def test_the_gguf_of_a_shape_holds_its_weights_for_llama_cpp(shape, tmp_path, monkeypatch):
    """bench/shape_gguf.py: the same random values as the safetensors (Q4_1 / Q8_0 of them, within half a
    quantization step), llama.cpp's tensor names and types, the tokenizer padded to the shape's vocab."""
    import gguf
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    from shape_gguf import gguf_name, write_shape_gguf
    ms = model_scale()
    config = config_of(shape, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=32)
    write_shape_gguf(tmp_path / "m.gguf", config, ms.random_tensors, str(smollm2_gguf()))
    reader = gguf.GGUFReader(tmp_path / "m.gguf")
    tensors = {t.name: t for t in reader.tensors}
    expected = list(ms.random_tensors(config))
    assert sorted(tensors) == sorted(gguf_name(name) for name, _, _ in expected)
    for name, shape_, chunks in expected:
        values = np.concatenate([(c.astype(np.uint32) << 16).view(np.float32) for c in chunks]).reshape(shape_)
        stored = tensors[gguf_name(name)]
        kind = stored.tensor_type
        back = gguf.quants.dequantize(stored.data, kind).reshape(shape_)
        if len(shape_) == 1:
            assert kind == gguf.GGMLQuantizationType.F32 and np.array_equal(back, values)
            continue
        assert kind == (gguf.GGMLQuantizationType.Q8_0 if name == "model.embed_tokens.weight"
                        else gguf.GGMLQuantizationType.Q4_1)
        blocks = values.reshape(-1, 32)
        step = (np.ptp(blocks, axis=1) / (15 if kind == gguf.GGMLQuantizationType.Q4_1 else 127)).reshape(-1, 1)
        assert np.all(np.abs(back.reshape(-1, 32) - blocks) <= 0.51 * step + 1e-7), name
    assert len(reader.fields["tokenizer.ggml.tokens"].data) == config["vocab_size"]


def test_llama_cpp_decodes_a_shape_gguf(tmp_path, monkeypatch):
    pytest.importorskip("llama_cpp")
    from mnnllm_core.bench.llama_worker import run
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    from shape_gguf import write_shape_gguf
    config = config_of("qwen3-0.6b", hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=32)
    write_shape_gguf(tmp_path / "m.gguf", config, model_scale().random_tensors, str(smollm2_gguf()))
    result = run({"config": "shrunk", "gguf": str(tmp_path / "m.gguf"), "threads": 2, "tests": [[8, 0], [0, 4]],
                  "reps": 1, "cache_type": "q8_0"})
    assert [r["test"] for r in result["rows"]] == ["pp8", "tg4"] and all(r["avg_ts"] > 0 for r in result["rows"])
