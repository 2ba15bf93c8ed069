"""A corrupt weight file whose quantization scale, zero point, norm weight or fp16 weight decodes
to NaN or infinity is a FormatError naming the op and the weight file when the model loads (MNN's
format has no checksum; these values are checked as they are decoded), on memory "low" (codes
kept) and "normal" (weights dequantized). Copies of the shared 135M q4 model and the tiny
Qwen2-VL fp16 export, one value overwritten at the offset the op's `external` gives."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import mnnllm_core
from mnnllm_core.errors import FormatError
from mnnllm_core.schema.reader import op_type_name, read_net_file

MODELS = (Path(__file__).resolve().parents[1] / ".." / "shared" / "models").resolve()
SMOLLM = MODELS / "smollm2-135m-instruct-mnn-q4"
QWEN2_VL_FP16 = MODELS / "vl" / "tiny-qwen2_vl-mnn-fp16"
FP16_BITS = {"nan": 0x7E00, "inf": 0x7C00}
FP32_VALUES = {"nan": np.float32(np.nan), "inf": np.float32(np.inf)}


def _copy(folder: Path, tmp_path: Path) -> Path:
    if not folder.is_dir():
        pytest.skip(f"{folder} is not there")
    target = tmp_path / folder.name
    shutil.copytree(folder, target, ignore=shutil.ignore_patterns("visual.mnn*", "reference.json"))
    return target


def _op(folder: Path, kind: str, quant_type: int | None):
    """The first op of `kind` with external data (and, for a Convolution, quanParameter.type `quant_type`)."""
    for op in read_net_file(str(folder / "llm.mnn")).oplists:
        main = op.main
        if op_type_name(op.type) != kind or main is None or main.external is None or not len(main.external):
            continue
        quan = getattr(main, "quanParameter", None)
        if kind != "Convolution" or (quan is not None and int(quan.type) == quant_type):
            return op.name, [int(v) for v in main.external], quan
    raise AssertionError(f"no {kind} op with external weights in {folder}")


def _poke(path: Path, offset: int, raw: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(raw)


def _fp16(which: str) -> bytes:
    return np.uint16(FP16_BITS[which]).tobytes()


def _load_fails(folder: Path, memory: str, op_name: str):
    model = mnnllm_core.create(str(folder))
    model.set_config({"memory": memory})
    with pytest.raises(FormatError) as err:
        model.load()
    assert err.value.file is not None and Path(err.value.file).resolve() == (folder / "llm.mnn.weight").resolve()
    assert repr(op_name) in str(err.value), str(err.value)
    assert "corrupt" in str(err.value)
    return err.value


@pytest.mark.parametrize("memory", ["low", "normal"])
@pytest.mark.parametrize("which", ["nan", "inf"])
@pytest.mark.parametrize("part", ["scale", "zero"])
def test_a_non_finite_quantization_scale_or_zero_point_fails_the_load(tmp_path, memory, which, part):
    folder = _copy(SMOLLM, tmp_path)
    name, external, quan = _op(folder, "Convolution", 1)
    assert int(quan.scaleStorage) == 1 and int(quan.readType) != 0  # fp16 (zero, scale) pairs
    alpha = external[0] + external[1]
    _poke(folder / "llm.mnn.weight", alpha + 2 * (7 * 2 + (1 if part == "scale" else 0)), _fp16(which))
    error = _load_fails(folder, memory, name)
    assert error.field == "alpha" and ("scale" if part == "scale" else "zero point") in error.reason


@pytest.mark.parametrize("which", ["nan", "inf"])
def test_a_non_finite_norm_weight_fails_the_load(tmp_path, which):
    folder = _copy(SMOLLM, tmp_path)
    name, external, _ = _op(folder, "LayerNorm", None)
    _poke(folder / "llm.mnn.weight", external[0] + 4 * 5, FP32_VALUES[which].tobytes())
    assert _load_fails(folder, "low", name).field == "gamma"


@pytest.mark.parametrize("memory", ["low", "normal"])
@pytest.mark.parametrize("which", ["nan", "inf"])
def test_a_non_finite_fp16_weight_fails_the_load(tmp_path, memory, which):
    folder = _copy(QWEN2_VL_FP16, tmp_path)
    name, external, _ = _op(folder, "Convolution", 3)
    _poke(folder / "llm.mnn.weight", external[0] + 2 * 1000, _fp16(which))
    error = _load_fails(folder, memory, name)
    assert error.field == "weight" and "weight 1000 " in error.reason


def test_the_copies_load_and_answer_when_nothing_is_changed(tmp_path):
    folder = _copy(SMOLLM, tmp_path)
    model = mnnllm_core.create(str(folder))
    model.set_config({"memory": "low", "sampler_type": "greedy"})
    assert model.load().response("Hi", max_new_tokens=2)


def test_a_non_finite_bf16_embedding_row_is_refused_when_read(tmp_path):
    """embeddings_bf16.bin is read a row per token (never whole): the row is checked as it is decoded."""
    folder = _copy(MODELS / "arch3" / "tiny-llama4_text_dense-mnn-q4", tmp_path)
    model = mnnllm_core.create(str(folder)).load()
    token = model.tokenizer.encode("Hi")[-1]
    hidden = int(model.config.hidden_size)
    _poke(folder / "embeddings_bf16.bin", (token * hidden + 3) * 2, np.uint16(0x7F80).tobytes())  # +inf
    corrupt = mnnllm_core.create(str(folder)).load()
    with pytest.raises(FormatError) as err:
        corrupt.response("Hi", max_new_tokens=1)
    assert err.value.field == "embedding" and Path(err.value.file).name == "embeddings_bf16.bin"
    assert f"token {token}'s row, value 3 is inf" in str(err.value)
