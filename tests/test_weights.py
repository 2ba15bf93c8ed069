"""External weights: the mapped file, MNN's quantized Convolution layout, LayerNorm data.

The shared model is checked three ways: every op decodes, the dequantized weights
match an independent source (the GGUF the export was made from) within 4-bit error,
and a quantizer written here round-trips through the decoder to fp32 rounding.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mnnllm_core.core.weights.file import ExternalWeightFile
from mnnllm_core.core.weights.formats import FloatWeight, QuantizedWeight
from mnnllm_core.core.weights.quant import decode_bias, decode_convolution_weight, decode_layernorm, is_asymmetric
from mnnllm_core.errors import FormatError, WeightFileError
from paths import smollm2_gguf

_REPO = Path(__file__).resolve().parent.parent
_MODEL_NAME = "smollm2-135m-instruct-mnn-q4"


def _find_model_dir() -> Path | None:
    for base in (_REPO / "shared", _REPO.parent / "shared"):
        if (base / "models" / _MODEL_NAME / "llm.mnn.weight").exists():
            return base / "models" / _MODEL_NAME
    return None


MODEL_DIR = _find_model_dir()
needs_model = pytest.mark.skipif(MODEL_DIR is None, reason=f"shared/models/{_MODEL_NAME} not found")


# ---------------------------------------------------------------- helpers on the shared model

@pytest.fixture(scope="module")
def graph() -> dict:
    return json.loads((MODEL_DIR / "llm.mnn.json").read_text())


@pytest.fixture(scope="module")
def convolutions(graph: dict) -> dict[str, dict]:
    return {op["name"]: op for op in graph["oplists"] if op["type"] == "Convolution"}


@pytest.fixture(scope="module")
def weight_file():
    with ExternalWeightFile(MODEL_DIR / "llm.mnn.weight") as wf:
        yield wf


def decode_op(wf: ExternalWeightFile, op: dict) -> QuantizedWeight | FloatWeight:
    """What the core does with a parsed Convolution op: read its sections, decode with its params."""
    main = op["main"]
    quan = main.get("quanParameter")
    weight, alpha, _bias = wf.read_sections(main["external"], ("weight", "alpha", "bias"), op_name=op["name"])
    common = main["common"]
    return decode_convolution_weight(
        weight, alpha, bits=quan["aMaxOrBits"], oc=common["outputCount"], ic=common["inputCount"],
        shape_int32=quan["shapeInt32"], scale_storage=quan["scaleStorage"],
        asymmetric=is_asymmetric(quan["readType"], quan["type"], quan["aMin"], quan["quantScale"]),
        quant_type=quan["type"], a_min=quan["aMin"], quant_scale=quan["quantScale"],
        file=str(wf.path), op_name=op["name"])


@pytest.fixture(scope="module")
def gguf_reader():
    gguf = pytest.importorskip("gguf")
    return gguf.GGUFReader(smollm2_gguf())


def gguf_weight(reader, name: str) -> np.ndarray:
    from gguf.quants import dequantize
    tensor = next(t for t in reader.tensors if t.name == name)
    return dequantize(tensor.data, tensor.tensor_type).astype(np.float32)


def gguf_int(reader, key: str) -> int:
    field = reader.fields[key]
    return int(field.parts[field.data[0]][0])


def assert_within_4bit_error(ours: QuantizedWeight, reference: np.ndarray, label: str) -> float:
    """Per (row, block): |ours - reference| <= 0.6 of the block's 4-bit step; returns the relative RMS."""
    got = ours.dequantize()
    assert got.shape == reference.shape
    blocks = reference.reshape(ours.oc, ours.n_blocks, ours.block_size)
    step = (blocks.max(-1) - blocks.min(-1)) / 15
    worst = np.abs(got - reference).reshape(blocks.shape).max(-1)
    assert np.all(worst <= 0.6 * step + 2e-4), f"{label}: worst block error {np.max(worst / step):.3f} steps"
    rel_rms = float(np.sqrt(np.mean((got - reference) ** 2) / np.mean(reference ** 2)))
    print(f"{label}: worst error {np.max(worst / np.maximum(step, 1e-12)):.4f} of a step, "
          f"relative RMS {rel_rms:.4f}")
    assert rel_rms < 0.15
    return rel_rms


# ---------------------------------------------------------------- the shared model

@needs_model
def test_every_convolution_of_the_shared_model_decodes_with_block_64(weight_file, convolutions):
    shapes = collections.Counter()
    for name, op in convolutions.items():
        weight = decode_op(weight_file, op)
        assert isinstance(weight, QuantizedWeight), name
        assert (weight.bits, weight.block_size) == (4, 64), name
        assert weight.is_linear, name
        assert weight.zero.shape == weight.scale.shape == (weight.oc, weight.ic // 64)
        assert np.all(np.isfinite(weight.zero)) and np.all(weight.scale >= 0), name
        assert decode_bias(weight_file.read_sections(op["main"]["external"], ("weight", "alpha", "bias"),
                                                     op_name=name)[2], weight.oc).shape == (weight.oc,)
        shapes[(name.split("/")[-2], weight.oc, weight.ic)] += 1
    assert len(convolutions) == 211
    print("convolutions:", dict(shapes))


@needs_model
def test_every_layernorm_of_the_shared_model_decodes_to_fp32(weight_file, graph):
    norms = [op for op in graph["oplists"] if op["type"] == "LayerNorm"]
    for op in norms:
        gamma_bytes, beta_bytes = weight_file.read_sections(op["main"]["external"], ("gamma", "beta"),
                                                            op_name=op["name"])
        gamma, beta = decode_layernorm(gamma_bytes, beta_bytes, file=str(weight_file.path), op_name=op["name"])
        assert gamma.dtype == np.float32 and gamma.shape == beta.shape == (576,)
        assert np.all(np.isfinite(gamma)) and np.all(np.isfinite(beta))
    assert len(norms) == 61


@needs_model
def test_tie_embeddings_points_at_the_lm_head_codes_and_alphas(convolutions):
    tie = json.loads((MODEL_DIR / "llm_config.json").read_text())["tie_embeddings"]
    offset, weight_bytes, alpha_bytes = convolutions["/lm/lm_head/Linear"]["main"]["external"][:3]
    header = 1 + 2 * 2 + 1 + 16  # ndim, two uint16 dims, map count, 16 map values
    assert tie["weight_offset"] == offset + header
    assert tie["alpha_offset"] == offset + weight_bytes
    assert tie["alpha_size"] == alpha_bytes
    assert (tie["quant_bit"], tie["quant_block"]) == (4, 64)


@needs_model
def test_tied_lm_head_equals_the_gguf_token_embedding_within_4bit_error(weight_file, convolutions,
                                                                         gguf_reader):
    lm_head = decode_op(weight_file, convolutions["/lm/lm_head/Linear"])
    assert_within_4bit_error(lm_head, gguf_weight(gguf_reader, "token_embd.weight"), "lm_head vs token_embd")


@needs_model
@pytest.mark.parametrize("layer", [0, 29])
@pytest.mark.parametrize("mnn_name, gguf_name", [
    ("self_attn/v_proj", "attn_v"), ("self_attn/o_proj", "attn_output"),
    ("mlp/gate_proj", "ffn_gate"), ("mlp/up_proj", "ffn_up"), ("mlp/down_proj", "ffn_down")])
def test_unpermuted_projections_equal_the_gguf_within_4bit_error(weight_file, convolutions, gguf_reader,
                                                                 layer, mnn_name, gguf_name):
    ours = decode_op(weight_file, convolutions[f"/layers.{layer}/{mnn_name}/Linear"])
    assert_within_4bit_error(ours, gguf_weight(gguf_reader, f"blk.{layer}.{gguf_name}.weight"),
                             f"layer {layer} {mnn_name}")


@needs_model
@pytest.mark.parametrize("mnn_name, gguf_name, heads_key", [
    ("q_proj", "attn_q", "llama.attention.head_count"),
    ("k_proj", "attn_k", "llama.attention.head_count_kv")])
def test_q_and_k_equal_the_gguf_once_llama_cpp_rope_row_permutation_is_undone(
        weight_file, convolutions, gguf_reader, mnn_name, gguf_name, heads_key):
    """llama.cpp's HF->GGUF conversion reorders each head's q/k rows (first half / second half of the
    rotary pairs interleaved) for its rope kernel; MNN keeps HF's order. Undone, they agree."""
    ours = decode_op(weight_file, convolutions[f"/layers.0/self_attn/{mnn_name}/Linear"])
    permuted = gguf_weight(gguf_reader, f"blk.0.{gguf_name}.weight")
    heads = gguf_int(gguf_reader, heads_key)
    half = ours.oc // heads // 2
    hf_order = permuted.reshape(heads, half, 2, ours.ic).swapaxes(1, 2).reshape(ours.oc, ours.ic)
    assert np.abs(ours.dequantize() - permuted).max() > 1.0  # compared as stored, rows are mismatched
    assert_within_4bit_error(ours, hf_order, f"layer 0 {mnn_name} (rows un-permuted)")


@needs_model
def test_all_convolutions_decode_and_dequantize_quickly(weight_file, convolutions):
    start = time.perf_counter()
    elements = sum(decode_op(weight_file, op).dequantize().size for op in convolutions.values())
    seconds = time.perf_counter() - start
    print(f"decoded and dequantized {len(convolutions)} convolutions ({elements / 1e6:.1f} M weights) "
          f"in {seconds:.3f} s")
    assert seconds < 5.0


# ---------------------------------------------------------------- dequantize_rows touches only its rows

class ByteAccessRecorder(np.ndarray):
    """Packed bytes that log every index read from them and refuse whole-array numpy use."""

    def __new__(cls, data: np.ndarray) -> ByteAccessRecorder:
        recorder = data.view(cls)
        recorder.touched = []
        return recorder

    def __array_finalize__(self, obj) -> None:
        self.touched = getattr(obj, "touched", [])

    def __getitem__(self, index):
        plain = self.view(np.ndarray)
        if isinstance(index, np.ndarray) and index.dtype.kind in "iu":
            self.touched.append(np.unique(index))
        elif isinstance(index, slice):
            self.touched.append(np.arange(plain.size)[index])
        else:
            raise AssertionError(f"unexpected index {index!r}")
        return plain[index]

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        raise AssertionError(f"whole-array {ufunc.__name__} on the packed bytes")

    def __array_function__(self, func, types, args, kwargs):
        raise AssertionError(f"whole-array {func.__name__} on the packed bytes")

    def touched_bytes(self) -> np.ndarray:
        return np.unique(np.concatenate(self.touched)) if self.touched else np.empty(0, np.int64)


def row_byte_range(weight: QuantizedWeight, row: int) -> np.ndarray:
    first_bit = row * weight.ic * weight.bits
    return np.arange(first_bit // 8, (first_bit + weight.ic * weight.bits - 1) // 8 + 1)


@needs_model
def test_lm_head_rows_equal_full_dequantization_and_read_only_their_bytes(weight_file, convolutions):
    lm_head = decode_op(weight_file, convolutions["/lm/lm_head/Linear"])
    rows = np.array([0, 1, 17, 4242, 4242, 49151])
    recorder = ByteAccessRecorder(lm_head.packed)
    watched = dataclasses.replace(lm_head, packed=recorder)
    got = watched.dequantize_rows(rows)
    np.testing.assert_array_equal(got, lm_head.dequantize()[rows])
    expected = np.unique(np.concatenate([row_byte_range(lm_head, r) for r in rows]))
    np.testing.assert_array_equal(recorder.touched_bytes(), expected)
    print(f"dequantize_rows read {expected.size} of {lm_head.packed.size} packed bytes for {rows.size} rows")


@pytest.mark.parametrize("bits, ic", [(4, 37), (3, 50), (8, 11), (1, 19)])
def test_rows_starting_inside_a_byte_read_only_their_bytes(bits, ic):
    rng = np.random.default_rng(bits * 100 + ic)
    oc = 23
    weight = decode_convolution_weight(*quantize_like_mnn(rng.normal(size=(oc, ic)), bits, 0, rng)[:2],
                                       bits=bits, oc=oc, ic=ic, shape_int32=False, scale_storage="FP16",
                                       file="synthetic.weight", op_name="synthetic")
    rows = np.array([0, 5, 6, 22, 5])
    recorder = ByteAccessRecorder(weight.packed)
    got = dataclasses.replace(weight, packed=recorder).dequantize_rows(rows)
    np.testing.assert_array_equal(got, weight.dequantize()[rows])
    expected = np.unique(np.concatenate([row_byte_range(weight, r) for r in rows]))
    np.testing.assert_array_equal(recorder.touched_bytes(), expected)


def test_rows_do_not_depend_on_other_rows_bytes():
    rng = np.random.default_rng(7)
    oc, ic = 30, 45
    weight = decode_convolution_weight(*quantize_like_mnn(rng.normal(size=(oc, ic)), 4, 16, rng)[:2],
                                       bits=4, oc=oc, ic=ic, shape_int32=False, scale_storage="FP16",
                                       file="synthetic.weight", op_name="synthetic")
    rows = np.array([3, 11, 29])
    keep = np.concatenate([row_byte_range(weight, r) for r in rows])
    poisoned = rng.integers(0, 256, weight.packed.size, dtype=np.uint8)
    poisoned[keep] = weight.packed[keep]
    got = dataclasses.replace(weight, packed=poisoned).dequantize_rows(rows)
    np.testing.assert_array_equal(got, weight.dequantize()[rows])


# ---------------------------------------------------------------- round trip through a quantizer written here

def pack_msb_first(codes: np.ndarray, bits: int) -> np.ndarray:
    """Each code's low `bits` bits, most significant first, concatenated and zero-padded to bytes."""
    code_bits = np.unpackbits(codes.astype(np.uint8).reshape(-1, 1), axis=1)[:, 8 - bits:]
    return np.packbits(code_bits.reshape(-1))


def quantize_like_mnn(weight: np.ndarray, bits: int, block: int, rng: np.random.Generator, *,
                      shape_int32: bool = False, scale_dtype: str = "<f2", shuffle_map: bool = False,
                      symmetric: bool = False):
    """MNN's asymmetric block quantization and byte layout, from this test's own reading of the format.

    Returns (weight bytes, alpha bytes, codes, zero, scale) with zero/scale as stored (rounded).
    The block is halved until it divides ic, as MNN's exporter does; 0 means one block per row.
    """
    oc, ic = weight.shape
    block = ic if block == 0 else block
    while ic % block:
        block //= 2
    offset = 1 << (bits - 1)
    blocks = weight.reshape(oc, ic // block, block)
    if symmetric:
        scale = np.abs(blocks).max(-1) / (offset - 1 if bits > 1 else 1)
        scale = np.where(scale == 0, 1.0, scale).astype(scale_dtype).astype(np.float64)
        codes = np.clip(np.round(blocks / scale[..., None]), -offset + 1, offset - 1) + offset
        zero = np.zeros_like(scale)
        alpha = scale
    else:
        low, high = blocks.min(-1), blocks.max(-1)
        scale = (high - low) / ((1 << bits) - 1)
        scale = np.where(scale == 0, 2.0 ** -10, scale).astype(scale_dtype).astype(np.float64)
        zero = (low + offset * scale).astype(scale_dtype).astype(np.float64)
        codes = np.clip(np.round((blocks - low[..., None]) / scale[..., None]), 0, (1 << bits) - 1)
        alpha = np.stack([zero, scale], -1)
    codes = codes.astype(np.uint8).reshape(oc, ic)
    value_map = np.arange(-offset, offset, dtype=np.int8)
    if shuffle_map:
        value_map = rng.permutation(value_map)
    dims = np.array([oc, ic], "<u4" if shape_int32 else "<u2")
    header = bytes([2]) + dims.tobytes() + bytes([len(value_map) % 256]) + value_map.tobytes()
    weight_bytes = np.frombuffer(header + pack_msb_first(codes, bits).tobytes(), np.uint8)
    alpha_bytes = np.frombuffer(alpha.astype(scale_dtype).tobytes(), np.uint8)
    return weight_bytes, alpha_bytes, codes, zero, scale


def reference_dequantize(codes: np.ndarray, zero: np.ndarray, scale: np.ndarray, bits: int,
                         dtype: type) -> np.ndarray:
    oc, ic = codes.shape
    values = (codes.astype(np.int64) - (1 << (bits - 1))).reshape(oc, zero.shape[1], -1).astype(dtype)
    return (values * scale[..., None].astype(dtype) + zero[..., None].astype(dtype)).reshape(oc, ic)


@settings(max_examples=80, deadline=None, derandomize=True)
@given(oc=st.integers(1, 40), ic=st.integers(1, 300), bits=st.sampled_from([1, 2, 3, 4, 8]),
       block=st.sampled_from([0, 16, 32, 64, 128]), shape_int32=st.booleans(),
       scale_dtype=st.sampled_from(["<f2", "<f4"]), shuffle_map=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_own_quantizer_round_trips_to_fp32_rounding(oc, ic, bits, block, shape_int32, scale_dtype,
                                                     shuffle_map, seed):
    rng = np.random.default_rng(seed)
    source = rng.normal(scale=0.05, size=(oc, ic))
    weight_bytes, alpha_bytes, codes, zero, scale = quantize_like_mnn(
        source, bits, block, rng, shape_int32=shape_int32, scale_dtype=scale_dtype, shuffle_map=shuffle_map)
    weight = decode_convolution_weight(
        weight_bytes, alpha_bytes, bits=bits, oc=oc, ic=ic, shape_int32=shape_int32,
        scale_storage="FP16" if scale_dtype == "<f2" else "FP32", file="synthetic.weight", op_name="synthetic")
    assert weight.is_linear  # MNN sorts the map, so a shuffled linear map is still linear
    np.testing.assert_array_equal(weight.unpack(), codes)
    got = weight.dequantize()
    exact = reference_dequantize(codes, zero, scale, bits, np.float64)
    zero_per_weight = np.repeat(zero, weight.block_size, 1)
    # Two fp32 roundings (product, then sum): within 2^-23 of |value * scale| + |zero|.
    bound = 2.0 ** -23 * (np.abs(exact - zero_per_weight) + np.abs(zero_per_weight))
    assert np.all(np.abs(got - exact) <= bound)
    np.testing.assert_array_equal(got, reference_dequantize(codes, zero, scale, bits, np.float32))
    assert np.all(np.abs(got - source) <= 0.5 * np.repeat(scale, weight.block_size, 1) * 1.01 + 1e-3)
    rows = rng.integers(0, oc, size=7)
    np.testing.assert_array_equal(weight.dequantize_rows(rows), got[rows])


def test_four_bit_codes_are_packed_high_nibble_first():
    header = bytes([2, 1, 0, 3, 0, 16]) + np.arange(-8, 8, dtype=np.int8).tobytes()
    weight_bytes = np.frombuffer(header + bytes([0x12, 0x30]), np.uint8)
    alpha = np.array([0.0, 1.0], "<f2").view(np.uint8)
    weight = decode_convolution_weight(weight_bytes, alpha, bits=4, oc=1, ic=3, shape_int32=False,
                                       scale_storage="FP16", file="f", op_name="op")
    np.testing.assert_array_equal(weight.unpack(), [[1, 2, 3]])
    np.testing.assert_array_equal(weight.dequantize(), [[-7.0, -6.0, -5.0]])


def test_a_nonlinear_value_map_is_sorted_then_indexed_like_mnn():
    value_map = np.array([5, -3, 0, 9], np.int8)  # 4 entries: 2-bit codes; sorted: -3, 0, 5, 9
    codes = np.array([[0, 1, 2, 3, 3]], np.uint8)
    header = bytes([2]) + np.array([1, 5], "<u2").tobytes() + bytes([4]) + value_map.tobytes()
    weight_bytes = np.frombuffer(header + pack_msb_first(codes, 2).tobytes(), np.uint8)
    alpha = np.array([0.5, 2.0], "<f4").view(np.uint8)
    weight = decode_convolution_weight(weight_bytes, alpha, bits=4, oc=1, ic=5, shape_int32=False,
                                       scale_storage=0, file="f", op_name="op")
    assert not weight.is_linear and weight.bits == 2
    np.testing.assert_array_equal(weight.dequantize(), [[-5.5, 0.5, 10.5, 18.5, 18.5]])


def test_a_code_outside_a_short_value_map_is_a_format_error():
    header = bytes([2]) + np.array([1, 4], "<u2").tobytes() + bytes([3]) + bytes([0xFF, 0, 1])
    weight_bytes = np.frombuffer(header + pack_msb_first(np.array([0, 1, 2, 3]), 2).tobytes(), np.uint8)
    alpha = np.array([0.0, 1.0], "<f2").view(np.uint8)
    weight = decode_convolution_weight(weight_bytes, alpha, bits=2, oc=1, ic=4, shape_int32=False,
                                       scale_storage="FP16", file="model.weight", op_name="/bad/Linear")
    with pytest.raises(FormatError, match="/bad/Linear.*value map") as err:
        weight.dequantize()
    assert err.value.file == "model.weight"


def test_eight_bit_per_channel_symmetric_weights_use_scale_only():
    rng = np.random.default_rng(3)
    weight_bytes, alpha_bytes, codes, zero, scale = quantize_like_mnn(
        rng.normal(size=(6, 20)), 8, 0, rng, symmetric=True)
    assert weight_bytes[1 + 4] == 0  # a 256-entry map is counted as 0
    weight = decode_convolution_weight(weight_bytes, alpha_bytes, bits=8, oc=6, ic=20, shape_int32=False,
                                       scale_storage="FP16", asymmetric=False, file="f", op_name="op")
    assert weight.block_size == 20
    np.testing.assert_array_equal(weight.dequantize(), reference_dequantize(codes, zero, scale, 8, np.float32))


def test_legacy_alpha_minimum_is_shifted_by_a_min_like_mnn():
    codes = np.array([[0, 255, 128]], np.uint8)
    header = bytes([2]) + np.array([1, 3], "<u2").tobytes() + bytes([0]) + np.arange(-128, 128).astype(
        np.int8).tobytes()
    weight_bytes = np.frombuffer(header + codes.tobytes(), np.uint8)
    alpha = np.array([-1.0, 0.5], "<f4").view(np.uint8)  # stored minimum, i.e. the value of code 0
    common = dict(bits=8, oc=1, ic=3, shape_int32=False, scale_storage="FP32", file="f", op_name="op")
    legacy = decode_convolution_weight(weight_bytes, alpha, a_min=-128, **common)
    np.testing.assert_array_equal(legacy.dequantize(), [[-1.0, 126.5, 63.0]])
    old_default = decode_convolution_weight(weight_bytes, alpha, a_min=0, **common)
    np.testing.assert_array_equal(old_default.dequantize(), legacy.dequantize())
    scaled = decode_convolution_weight(weight_bytes, alpha, a_min=-128, quant_scale=2.0, **common)
    np.testing.assert_array_equal(scaled.dequantize(), 2 * legacy.dequantize())


def test_raw_int8_weights_decode_per_channel():
    values = np.array([[-128, 0, 127], [5, -5, 1]], np.int8)
    alpha = np.array([0.5, 2.0], "<f4").view(np.uint8)
    assert not is_asymmetric(0, 4, a_min=-127, quant_scale=1.0)
    weight = decode_convolution_weight(values.view(np.uint8).reshape(-1), alpha, bits=8, oc=2, ic=3,
                                       shape_int32=False, scale_storage="FP32", asymmetric=False,
                                       quant_type=4, file="f", op_name="op")
    np.testing.assert_array_equal(weight.dequantize(), values * np.array([[0.5], [2.0]], np.float32))


@pytest.mark.parametrize("quant_type, dtype", [(3, "<f2"), (None, "<f4")])
def test_float_weights_are_read_as_stored(quant_type, dtype):
    data = np.arange(12, dtype=np.float32).reshape(3, 4) / 8
    stored = np.frombuffer(data.astype(dtype).tobytes(), np.uint8)
    weight = decode_convolution_weight(stored, np.empty(0, np.uint8), bits=16, oc=3, ic=4, shape_int32=False,
                                       scale_storage="FP16", quant_type=quant_type, file="f", op_name="op")
    assert isinstance(weight, FloatWeight)
    np.testing.assert_array_equal(weight.dequantize(), data)
    np.testing.assert_array_equal(weight.dequantize_rows([2, 0]), data[[2, 0]])
    with pytest.raises(IndexError):
        weight.dequantize_rows([-1])


def test_bias_and_layernorm_decode_fp32_and_reject_odd_sizes():
    raw = np.arange(4, dtype="<f4").view(np.uint8)
    np.testing.assert_array_equal(decode_bias(raw, 4), [0, 1, 2, 3])
    np.testing.assert_array_equal(decode_bias(np.empty(0, np.uint8), 3), [0, 0, 0])
    gamma, beta = decode_layernorm(raw, np.empty(0, np.uint8))
    np.testing.assert_array_equal(gamma, [0, 1, 2, 3])
    assert beta is None
    with pytest.raises(FormatError, match="/b/Linear"):
        decode_bias(raw, 3, file="m.weight", op_name="/b/Linear")
    with pytest.raises(FormatError, match="/norm"):
        decode_layernorm(raw[:7], raw, file="m.weight", op_name="/norm")


# ---------------------------------------------------------------- the weight file and typed errors

def test_reads_are_zero_copy_read_only_views_of_the_file(tmp_path):
    path = tmp_path / "w.weight"
    path.write_bytes(bytes(range(256)) * 4)
    with ExternalWeightFile(path) as wf:
        view = wf.read(10, 6, op_name="op", field="weight")
        assert wf.size == 1024
        np.testing.assert_array_equal(view, np.arange(10, 16))
        assert not view.flags.owndata and not view.flags.writeable
        assert np.shares_memory(view, wf.read(0, 1024, op_name="op", field="weight"))
    assert wf.closed
    np.testing.assert_array_equal(view, np.arange(10, 16))  # a view outlives close()
    with pytest.raises(WeightFileError, match="closed"):
        wf.read(0, 1, op_name="op", field="weight")


@pytest.mark.parametrize("offset, nbytes, what", [
    (1020, 8, "past the end"), (2048, 1, "past the end"), (-4, 4, "negative"), (0, -1, "negative")])
def test_reads_outside_the_file_raise_weight_file_error_naming_file_op_and_offset(tmp_path, offset, nbytes,
                                                                                  what):
    path = tmp_path / "w.weight"
    path.write_bytes(bytes(1024))
    with ExternalWeightFile(path) as wf, pytest.raises(WeightFileError, match=what) as err:
        wf.read(offset, nbytes, op_name="/layers.3/mlp/up_proj/Linear", field="alpha")
    message = str(err.value)
    assert str(path) in message and "/layers.3/mlp/up_proj/Linear" in message and str(offset) in message
    assert err.value.field == "alpha"


def test_an_empty_weight_file_maps_and_fails_every_read(tmp_path):
    path = tmp_path / "empty.weight"
    path.write_bytes(b"")
    with ExternalWeightFile(path) as wf:
        assert wf.size == 0
        with pytest.raises(WeightFileError):
            wf.read(0, 1, op_name="op", field="weight")


def test_a_missing_weight_file_raises_weight_file_error(tmp_path):
    with pytest.raises(WeightFileError, match="cannot open") as err:
        ExternalWeightFile(tmp_path / "absent.weight")
    assert err.value.file == str(tmp_path / "absent.weight")


@needs_model
def test_a_truncated_copy_of_the_shared_weight_file_raises_for_the_first_op_past_its_end(tmp_path, convolutions):
    prefix = tmp_path / "llm.mnn.weight"
    with open(MODEL_DIR / "llm.mnn.weight", "rb") as f:
        prefix.write_bytes(f.read(200_000))
    with ExternalWeightFile(prefix) as wf:
        decode_op(wf, convolutions["/layers.0/self_attn/q_proj/Linear"])  # ends at byte 191254
        with pytest.raises(WeightFileError, match="k_proj") as err:
            decode_op(wf, convolutions["/layers.0/self_attn/k_proj/Linear"])
    assert str(prefix) in str(err.value) and "191254" in str(err.value)


def _corrupt(data: np.ndarray, position: int, value: int) -> np.ndarray:
    broken = data.copy()
    broken[position] = value
    return broken


@pytest.mark.parametrize("case", ["no dims", "five dims", "wrong oc", "short map", "truncated codes",
                                  "extra codes", "empty", "alpha size", "bits above declared"])
def test_a_corrupt_quantized_block_raises_format_error_naming_file_and_op(case):
    rng = np.random.default_rng(11)
    weight_bytes, alpha_bytes, *_ = quantize_like_mnn(rng.normal(size=(8, 64)), 4, 32, rng)
    bits = 4
    if case == "no dims":
        weight_bytes = _corrupt(weight_bytes, 0, 0)
    elif case == "five dims":
        weight_bytes = _corrupt(weight_bytes, 0, 5)
    elif case == "wrong oc":
        weight_bytes = _corrupt(weight_bytes, 1, 9)
    elif case == "short map":
        weight_bytes = weight_bytes[:10]
    elif case == "truncated codes":
        weight_bytes = weight_bytes[:-1]
    elif case == "extra codes":
        weight_bytes = np.concatenate([weight_bytes, np.zeros(3, np.uint8)])
    elif case == "empty":
        weight_bytes = np.empty(0, np.uint8)
    elif case == "alpha size":
        alpha_bytes = alpha_bytes[:-2]
    elif case == "bits above declared":
        bits = 3
    with pytest.raises(FormatError) as err:
        decode_convolution_weight(weight_bytes, alpha_bytes, bits=bits, oc=8, ic=64, shape_int32=False,
                                  scale_storage="FP16", file="/models/x/llm.mnn.weight",
                                  op_name="/layers.7/self_attn/o_proj/Linear")
    assert "/layers.7/self_attn/o_proj/Linear" in str(err.value)
    assert err.value.file == "/models/x/llm.mnn.weight" and "/models/x/llm.mnn.weight" in str(err.value)


def test_released_pages_read_back_the_same_bytes(tmp_path):
    path = tmp_path / "w.bin"
    data = np.random.default_rng(3).integers(0, 256, 3 * 4096 + 17, dtype=np.uint8)
    path.write_bytes(data.tobytes())
    with ExternalWeightFile(path) as f:
        before = f.read(4000, 5000, op_name="op", field="weight").copy()
        f.release(4000, 5000)
        f.release(0, 0)
        np.testing.assert_array_equal(f.read(4000, 5000, op_name="op", field="weight"), before)
