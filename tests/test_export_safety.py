"""The exporter never harms its source, cleans up after killed exports, and refuses inputs that
would give a silently wrong model or an untyped crash (issue 29, round 2, item 5)."""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mnnllm_core.errors import ConfigError, FormatError
from mnnllm_core.export import export_model

from test_export import TINY, VOCAB, random_weights, write_hf_folder

DEEP = 100_000
HIDDEN = TINY["hidden_size"]


def tiny_model(folder: Path, **replace: np.ndarray) -> Path:
    """A tiny random tied llama in `folder`, with the tensors of `replace` put in."""
    weights = random_weights("llama", True)
    weights.update(replace)
    return write_hf_folder(folder, "llama", weights, True)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_exporting_a_model_onto_itself_with_force_refuses_and_keeps_the_source(tmp_path):
    src = tiny_model(tmp_path / "hf")
    before = snapshot(src)
    with pytest.raises(ConfigError, match="source") as err:
        export_model(str(src), str(src), quant_bit=8, force=True)
    assert err.value.field == "dst"
    assert snapshot(src) == before


@pytest.mark.parametrize("where", ["dst inside src", "src inside dst", "dst a symlink to src"])
def test_a_destination_overlapping_the_source_is_refused(tmp_path, where):
    if where == "src inside dst":
        src, dst = tiny_model(tmp_path / "out" / "hf"), tmp_path / "out"
    elif where == "dst inside src":
        src = tiny_model(tmp_path / "hf")
        dst = src / "exported"
    else:
        src, dst = tiny_model(tmp_path / "hf"), tmp_path / "link"
        dst.symlink_to(src, target_is_directory=True)
    before = snapshot(src)
    with pytest.raises(ConfigError, match="source") as err:
        export_model(str(src), str(dst), quant_bit=8, force=True)
    assert err.value.field == "dst"
    assert snapshot(src) == before and not (src / "exported").exists()


def _staging(beside: Path, pid: int) -> Path:
    folder = beside.parent / f".{beside.name}-{pid}-leftover"
    folder.mkdir(parents=True)
    (folder / "llm.mnn.weight").write_bytes(b"half a model")
    return folder


def test_a_dead_exports_staging_folder_is_removed_and_a_live_ones_is_kept(tmp_path):
    src = tiny_model(tmp_path / "hf")
    dst = tmp_path / "out" / "model"
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    dead = _staging(dst, ended.pid)
    other = _staging(dst.with_name("model-2"), ended.pid)  # another destination's: not this export's to remove
    sleeping = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = _staging(dst, sleeping.pid)
        export_model(str(src), str(dst), quant_bit=8)
        assert not dead.exists()
        assert live.is_dir() and (live / "llm.mnn.weight").read_bytes() == b"half a model"
    finally:
        sleeping.kill()
        sleeping.wait()
    assert sorted(p.name for p in dst.parent.iterdir()) == sorted([dst.name, live.name, other.name])


KV = HIDDEN // TINY["num_attention_heads"] * TINY["num_key_value_heads"]


@pytest.mark.parametrize("name,expected", [
    ("model.embed_tokens.weight", f"{(VOCAB, HIDDEN)}"),  # stored transposed
    ("model.layers.0.input_layernorm.weight", f"{(HIDDEN,)}"),  # given the embedding's shape
    ("model.layers.1.self_attn.k_proj.weight", f"({KV}, *)"),  # transposed
    ("model.layers.1.mlp.down_proj.weight", f"(*, {TINY['intermediate_size']})"),  # transposed
])
def test_a_tensor_whose_shape_disagrees_with_the_config_is_a_format_error_naming_it(tmp_path, name, expected):
    weights = random_weights("llama", True)
    right = weights["model.embed_tokens.weight"] if name.endswith("layernorm.weight") else weights[name]
    wrong = right.copy() if name.endswith("layernorm.weight") else right.T.copy()
    src = tiny_model(tmp_path / "hf", **{name: wrong})
    with pytest.raises(FormatError) as err:
        export_model(str(src), str(tmp_path / "out"), quant_bit=8)
    message = str(err.value)
    assert name in message and expected in message and str(wrong.shape) in message
    assert err.value.field == name
    assert not (tmp_path / "out").exists()


def test_a_safetensors_header_nested_100000_deep_is_a_format_error_naming_the_file(tmp_path):
    src = tiny_model(tmp_path / "hf")
    shard = src / "model-00001-of-00002.safetensors"
    head = ('{"__metadata__": {"a": ' + "[" * DEEP + "]" * DEEP + "}}").encode()
    shard.write_bytes(struct.pack("<Q", len(head)) + head)
    with pytest.raises(FormatError, match="nested deeper") as err:
        export_model(str(src), str(tmp_path / "out"), quant_bit=8)
    assert err.value.file == str(shard)


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json"])
def test_a_source_json_nested_100000_deep_is_a_typed_error_naming_the_file(tmp_path, name):
    src = tiny_model(tmp_path / "hf")
    data = json.loads((src / name).read_text())
    (src / name).write_text(json.dumps(data)[:-1] + ', "deep": ' + "[" * DEEP + "]" * DEEP + "}")
    with pytest.raises((ConfigError, FormatError), match="nested deeper") as err:
        export_model(str(src), str(tmp_path / "out"), quant_bit=8)
    assert err.value.file == str(src / name)


def _gguf_with_nested_array(path: Path, depth: int) -> None:
    """A GGUF v3 header whose one metadata value is an array of an array of ... `depth` deep."""
    key = b"general.nested"
    array, u32 = 9, 4
    value = struct.pack("<IQ", array, 1) * (depth - 1) + struct.pack("<IQI", u32, 1, 7)
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key +
                     struct.pack("<I", array) + value)


def test_gguf_metadata_arrays_nested_100000_deep_are_a_format_error_naming_the_file(tmp_path):
    _gguf_with_nested_array(tmp_path / "deep.gguf", DEEP)
    with pytest.raises(FormatError, match="nested deeper") as err:
        export_model(str(tmp_path / "deep.gguf"), str(tmp_path / "out"), quant_bit=8)
    assert err.value.file == str(tmp_path / "deep.gguf")


MOE = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "mlp_only_layers": [1],
       "head_dim": HIDDEN // TINY["num_attention_heads"]}


def tiny_moe(folder: Path, transposed: str | None = None) -> Path:
    """The tiny llama made a Qwen3-MoE (q/k norms; layer 0's MLP routed to 4 experts), the tensor
    `transposed` (if any) stored transposed."""
    rng = np.random.default_rng(0)
    weights = random_weights("llama", True)
    head_dim, ffn = MOE["head_dim"], MOE["moe_intermediate_size"]
    for layer in range(TINY["num_hidden_layers"]):
        for norm in ("q_norm", "k_norm"):
            weights[f"model.layers.{layer}.self_attn.{norm}.weight"] = np.ones(head_dim, np.float32)
    for proj in ("gate_proj", "up_proj", "down_proj"):
        del weights[f"model.layers.0.mlp.{proj}.weight"]
    weights["model.layers.0.mlp.gate.weight"] = rng.standard_normal((MOE["num_experts"], HIDDEN), np.float32)
    for e in range(MOE["num_experts"]):
        for proj, shape in (("gate_proj", (ffn, HIDDEN)), ("up_proj", (ffn, HIDDEN)), ("down_proj", (HIDDEN, ffn))):
            weights[f"model.layers.0.mlp.experts.{e}.{proj}.weight"] = rng.standard_normal(shape, np.float32)
    if transposed is not None:
        weights[transposed] = weights[transposed].T.copy()
    folder = write_hf_folder(folder, "llama", weights, True)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "qwen3_moe", **MOE}))
    return folder


def test_an_moe_expert_stored_transposed_is_a_format_error_naming_it(tmp_path):
    name = "model.layers.0.mlp.experts.2.down_proj.weight"
    src = tiny_moe(tmp_path / "hf", name)
    with pytest.raises(FormatError) as err:
        export_model(str(src), str(tmp_path / "out"), quant_bit=8)
    expected = (HIDDEN, MOE["moe_intermediate_size"])
    assert name in str(err.value) and str(expected) in str(err.value) and str(expected[::-1]) in str(err.value)
    export_model(str(tiny_moe(tmp_path / "right")), str(tmp_path / "out"), quant_bit=8)  # the model is otherwise sound
