"""Bad input gets a typed error naming the file and the field: never a crash or garbage."""
import json
import shutil

import flatbuffers
import numpy as np
import pytest

import mnnllm_core
from mnnllm_core.errors import ConfigError, FormatError, TokenizerError, WeightFileError
from mnnllm_core.express.module import Module
from mnnllm_core.express.static_module import Config
from mnnllm_core.schema.reader import read_net
from paths import CONFIG, LLM_MNN, MODEL_DIR


def _copy_model(tmp_path, weight_bytes: int | None = None):
    target = tmp_path / "model"
    target.mkdir()
    for name in ("config.json", "llm_config.json", "tokenizer.mtok", "llm.mnn"):
        shutil.copy(MODEL_DIR / name, target / name)
    with open(MODEL_DIR / "llm.mnn.weight", "rb") as src, open(target / "llm.mnn.weight", "wb") as dst:
        dst.write(src.read() if weight_bytes is None else src.read(weight_bytes))
    return target


def test_truncated_llm_mnn_is_a_format_error_naming_the_file(tmp_path):
    path = tmp_path / "llm.mnn"
    path.write_bytes(LLM_MNN.read_bytes()[:100_000])
    with pytest.raises(FormatError) as err:
        Module.load([], [], path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("offset", [0, 4, 64, 1000, 120_000, 240_000])
def test_corrupt_llm_mnn_is_a_format_error_or_loads(tmp_path, offset):
    data = bytearray(LLM_MNN.read_bytes())
    data[offset:offset + 8] = b"\xff" * 8
    path = tmp_path / "llm.mnn"
    path.write_bytes(bytes(data))
    try:
        read_net(bytes(data), str(path))
    except FormatError as err:
        assert err.file == str(path)


def test_missing_model_file_is_a_format_error(tmp_path):
    with pytest.raises(FormatError, match="cannot read"):
        Module.load([], [], tmp_path / "nope.mnn")


def test_weight_file_cut_short_names_the_file_and_the_op(tmp_path):
    model = _copy_model(tmp_path, weight_bytes=1_000_000)
    with pytest.raises(WeightFileError) as err:
        Module.load([], [], model / "llm.mnn", config=Config(rearrange=True))
    message = str(err.value)
    assert "llm.mnn.weight" in message and "op '" in message


def test_an_offset_past_the_end_of_the_weight_file_is_reported(tmp_path):
    net = read_net(LLM_MNN.read_bytes(), str(LLM_MNN))
    conv = next(op for op in net.oplists if op.main is not None and getattr(op.main, "quanParameter", None))
    conv.main.external = np.array([10 ** 9] + list(conv.main.external[1:]), dtype=np.int64)
    builder = flatbuffers.Builder(1 << 20)
    builder.Finish(net.Pack(builder))
    model = _copy_model(tmp_path)
    (model / "llm.mnn").write_bytes(bytes(builder.Output()))
    with pytest.raises(WeightFileError) as err:
        Module.load([], [], model / "llm.mnn", config=Config(rearrange=True))
    assert conv.name in str(err.value) and "1000000000" in str(err.value)


def test_malformed_config_json_names_the_file(tmp_path):
    model = _copy_model(tmp_path)
    (model / "config.json").write_text('{"backend_type": "cpu",')
    with pytest.raises(ConfigError) as err:
        mnnllm_core.create(model / "config.json")
    assert "config.json" in str(err.value)


def test_a_wrongly_typed_key_names_the_field(tmp_path):
    model = _copy_model(tmp_path)
    config = json.loads((model / "config.json").read_text())
    config["thread_num"] = "many"
    (model / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="thread_num"):
        mnnllm_core.create(model / "config.json")


def test_unknown_sampler_is_a_config_error():
    llm = mnnllm_core.create(CONFIG)
    llm.set_config({"sampler_type": "clairvoyant"})
    with pytest.raises(ConfigError, match="sampler_type"):
        llm.load()


def test_truncated_tokenizer_is_a_tokenizer_error(tmp_path):
    model = _copy_model(tmp_path)
    data = (model / "tokenizer.mtok").read_bytes()
    (model / "tokenizer.mtok").write_bytes(data[: len(data) // 3])
    llm = mnnllm_core.create(model / "config.json")
    with pytest.raises(TokenizerError) as err:
        llm.load()
    assert "tokenizer.mtok" in str(err.value)
