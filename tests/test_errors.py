"""Bad input gets a typed error naming the file and the field: never a crash or garbage."""
import json
import shutil

import flatbuffers
import numpy as np
import pytest

import mnnllm_core
from mnnllm_core.core.dtypes import DT_BFLOAT16, DT_FLOAT
from mnnllm_core.core.weights.const_blob import blob_to_array
from mnnllm_core.core.weights.file import ExternalWeightFile
from mnnllm_core.errors import ConfigError, FormatError, MnnllmError, TokenizerError, WeightFileError
from mnnllm_core.express.module import Module
from mnnllm_core.express.static_module import Config
from mnnllm_core.schema.MNN.Blob import BlobT
from mnnllm_core.schema.reader import op_type_name, read_net
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
    assert err.value.field == "weight"  # the section of external = [offset, weight, alpha, bias, ...]


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


def _rewrite_net(tmp_path, edit) -> object:
    """A copy of the shared model whose llm.mnn went through `edit(net)`."""
    net = read_net(LLM_MNN.read_bytes(), str(LLM_MNN))
    edit(net)
    builder = flatbuffers.Builder(1 << 20)
    builder.Finish(net.Pack(builder))
    model = _copy_model(tmp_path)
    (model / "llm.mnn").write_bytes(bytes(builder.Output()))
    return model / "llm.mnn"


def test_outputs_needing_an_input_left_out_of_the_module_inputs_is_an_error_at_load():
    with pytest.raises(MnnllmError, match="attention_mask") as err:
        Module.load(["input_ids", "position_ids", "logits_index"], ["logits"], LLM_MNN)
    assert err.value.field == "inputs" and err.value.file == str(LLM_MNN)


@pytest.mark.parametrize("op_type", ["Input", "Const"])
def test_an_input_or_const_op_without_an_output_is_a_format_error(tmp_path, op_type):
    def edit(net):
        op = next(op for op in net.oplists if op_type_name(op.type) == op_type)
        op.outputIndexes = np.zeros(0, np.int32)

    path = _rewrite_net(tmp_path, edit)
    with pytest.raises(FormatError, match=f"{op_type} op .* has 0 outputs") as err:
        Module.load([], [], path)
    assert err.value.file == str(path)


def _blob(data_type: int, dims: list[int], external: list[int]) -> BlobT:
    blob = BlobT()
    blob.dataType, blob.dims, blob.external = data_type, dims, external
    return blob


def test_external_const_bytes_that_are_not_whole_values_are_a_format_error(tmp_path):
    (tmp_path / "w").write_bytes(bytes(64))
    with ExternalWeightFile(tmp_path / "w") as weights, pytest.raises(FormatError, match="whole number") as err:
        blob_to_array(_blob(DT_FLOAT, [1], [0, 6]), "c", weights, "m.mnn")
    assert (err.value.file, err.value.field) == ("m.mnn", "external")


def test_external_bf16_const_is_widened_to_float32(tmp_path):
    values = np.array([1.5, -2.25, 3.0e10], np.float32)
    (tmp_path / "w").write_bytes((values.view(np.uint32) >> 16).astype("<u2").tobytes())
    with ExternalWeightFile(tmp_path / "w") as weights:
        np.testing.assert_array_equal(blob_to_array(_blob(DT_BFLOAT16, [3], [0, 6]), "c", weights, "m.mnn"),
                                      (values.view(np.uint32) >> 16 << 16).view(np.float32))
