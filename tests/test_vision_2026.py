"""Qwen3-VL and SmolVLM (Idefics3) on the tiny 2026 exports (../shared/models/arch3): the
reference ids of MNN 3.6.1's runtime for the three text prompts and the image prompt (cpu,
memory normal and low; opencl and vulkan with the encoder's cpu fallbacks named), the image
prompt's ids, MNN's runtime on other image sizes and a later chat turn, preprocessing against
transformers' image processors, typed errors, and KV-cache reuse after an image prompt."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

import mnnllm_core
from mnnllm_core.errors import ConfigError, FormatError, UnsupportedError
from mnnllm_core.llm.omni import Omni
from paths import SHARED

pytest.importorskip("PIL", reason="images need Pillow (the vision extra)")

ARCH3 = SHARED / "models" / "arch3"
QWEN3_VL, SMOLVLM = "tiny-qwen3_vl-mnn-q4", "tiny-smolvlm-mnn-q4"
IMAGE = (ARCH3 / "test_image.png").resolve()
NEW_TOKENS = 8
# what each encoder leaves on cpu on a device backend (LLM: nothing)
DEVICE_FALLBACKS = {QWEN3_VL: {"BinaryOp", "GatherV2", "Reduction"},  # integer index math, the embedding gather
                    SMOLVLM: {"Convolution", "MatMul", "Softmax"}}  # the 16x16 patch conv, attention's matmuls


def _reference(folder: str) -> dict:
    path = ARCH3 / "reference.json"
    if not path.exists():
        pytest.skip(f"the shared 2026 models are not at {ARCH3}")
    return json.loads(path.read_text())[folder]


@pytest.fixture(scope="module")
def load():
    """load(folder, memory, backend): one loaded model per key for this module's tests."""
    models: dict[tuple, Omni] = {}

    def get(folder: str, memory: str = "normal", backend: str = "cpu") -> Omni:
        key = (folder, memory, backend)
        if key not in models:
            _reference(folder)
            model = mnnllm_core.create(ARCH3 / folder)
            settings = {"memory": memory, "sampler_type": "greedy", "backend_type": backend}
            if backend != "cpu":
                settings.update(precision="high", mllm={"backend_type": backend, "memory": memory,
                                                        "precision": "high"})
            model.set_config(settings)
            models[key] = model.load()
        return models[key]

    yield get
    models.clear()


def _image_prompt(model: Omni, prompt: dict) -> str:
    return model.apply_chat_template(prompt["prompt"].replace("{IMAGE}", str(IMAGE)))


def _reproduce(model: Omni, folder: str) -> None:
    ref = _reference(folder)
    for prompt in ref["prompts"]:
        model.reset()
        ids = model.tokenizer_encode(_image_prompt(model, prompt)) if "image" in prompt else prompt["mnn_prompt_ids"]
        assert ids == prompt["mnn_prompt_ids"]
        assert model.generate(ids, 24) == prompt[ref["reference"]], prompt["prompt"]


@pytest.mark.parametrize("memory", ["normal", "low"])
@pytest.mark.parametrize("folder", [QWEN3_VL, SMOLVLM])
def test_text_and_image_prompts_give_the_reference_ids_on_cpu(folder, memory, load):
    _reproduce(load(folder, memory), folder)


@pytest.mark.parametrize("memory", ["normal", "low"])
@pytest.mark.parametrize("backend", ["opencl", "vulkan"])
@pytest.mark.parametrize("folder", [QWEN3_VL, SMOLVLM])
def test_device_backends_give_the_reference_ids_with_the_encoders_fallbacks_named(folder, backend, memory, load):
    """The LLM and the encoder on the device (mllm.backend_type too), precision high."""
    from mnnllm_core.plugins.manager import registry
    available, reason = registry().get(backend).is_available()
    if not available:
        pytest.skip(f"{backend} unavailable: {reason}")
    model = load(folder, memory, backend)
    _reproduce(model, folder)
    assert model.placement()["fallbacks"] == []
    vision = model.vision_placement()
    assert {f["type"] for f in vision["fallbacks"]} == DEVICE_FALLBACKS[folder]
    assert all(f["reason"] for f in vision["fallbacks"])
    assert vision["ops_per_backend"][backend] > 50


def test_the_image_prompt_expands_as_mnn_does(load):
    """Qwen3-VL: 96x96 -> 6x6 patches of 16 -> 3x3 merged tokens between vision_start/end.
    SmolVLM: 96 rounds to 128 = 2x2 tiles of 64 (per tile 11, the first id of `<row_r_col_c>`, 4
    <image>; a newline after each row and after the last), then the global image 11, 13, 4 x 12, 11."""
    qwen = load(QWEN3_VL)
    ids = qwen.tokenizer_encode(_image_prompt(qwen, _reference(QWEN3_VL)["prompts"][3]))
    assert ids[24:35] == [11] + [13] * 9 + [12]
    assert qwen._pending.positions[:, 24:36].tolist() == [[24] + [25] * 9 + [28, 29],
                                                          [24] + [25, 25, 25, 26, 26, 26, 27, 27, 27] + [28, 29],
                                                          [24] + [25, 26, 27] * 3 + [28, 29]]
    assert qwen._pending.deepstack.shape == (1, 9, 64)
    smol = load(SMOLVLM)
    ids = smol.tokenizer_encode(_image_prompt(smol, _reference(SMOLVLM)["prompts"][3]))
    tile = [11, 44, 12, 12, 12, 12]
    assert ids[24:58] == tile * 2 + [198] + tile * 2 + [198, 198] + [11, 13, 12, 12, 12, 12, 11]
    assert smol.tokenizer.encode("<row_2_col_1>")[0] == 44  # no <row_r_col_c> tokens in this vocabulary


def _noise(path, height: int, width: int) -> str:
    from PIL import Image
    Image.fromarray(np.random.default_rng(7).integers(0, 256, (height, width, 3), dtype=np.uint8)).save(path)
    return str(path)


OTHER_SIZES = {
    # no <hw> first: MNN 3.6.1 keeps the last <hw> size for later images of the process
    QWEN3_VL: ["<img>{other}</img>What is this?",  # image_size 420 -> 416: 13x13 tokens
               "<img><hw>64,128</hw>{image}</img>Describe.",  # 2x4
               "<img><hw>70,80</hw>{other}</img>Describe.",  # 80/32 = 2.5 rounds up (MNN), to 3 columns
               "<img><hw>64,64</hw>{image}</img>and<img><hw>96,160</hw>{other}</img>Compare."],
    SMOLVLM: ["<img>{other}</img>What is this?",  # image_size 64: the global image only
              "<img><hw>64,200</hw>{image}</img>Describe.",  # 1x3 tiles capped at image_max_size: 1x2
              "<img><hw>150,90</hw>{other}</img>Describe.",  # 2x1 tiles
              "<img><hw>40,40</hw>{image}</img>and<img><hw>128,128</hw>{other}</img>Compare."],
}


@pytest.mark.parametrize("folder", [QWEN3_VL, SMOLVLM])
def test_other_sizes_two_images_and_a_later_turn_match_mnns_runtime(folder, tmp_path, load):
    from vl_oracle import mnn_encode_generate
    model = load(folder)
    other = _noise(tmp_path / "noise.png", 90, 130)
    texts = [model.apply_chat_template(q.format(image=IMAGE, other=other)) for q in OTHER_SIZES[folder]]
    chat = [{"role": "user", "content": f"<img><hw>96,96</hw>{IMAGE}</img>Describe this image."},
            {"role": "assistant", "content": "A disc."}, {"role": "user", "content": "What colour is it?"}]
    texts.append(model.apply_chat_template(chat))
    expected = mnn_encode_generate(ARCH3 / folder, texts, NEW_TOKENS)
    got = []
    for text in texts:
        model.reset()
        ids = model.tokenizer_encode(text)
        got.append({"prompt_ids": ids, "ids": model.generate(ids, NEW_TOKENS)})
    assert got == expected


@pytest.mark.parametrize("folder", [QWEN3_VL, SMOLVLM])
def test_a_text_turn_after_an_image_prompt_reuses_the_kv_cache(folder, load):
    """Turn 1 holds the image; turn 2 is text. The cache is reused past the image (same ids,
    positions and image rows), and the answer equals a fresh run on the whole conversation."""
    model = load(folder)
    model.reset()
    first = [{"role": "user", "content": f"<img><hw>96,96</hw>{IMAGE}</img>Describe this image."}]
    answer = model.response(first, max_new_tokens=4)
    second = first + [{"role": "assistant", "content": answer}, {"role": "user", "content": "And its colour?"}]
    ids = model._prompt_ids(second)
    last_image_row = max(i for i, t in enumerate(ids) if t == model.config.get("image_pad"))
    assert model.cached_prefix(ids) > last_image_row
    continued = model.generate(ids, NEW_TOKENS)
    model.reset()
    assert model.generate(model._prompt_ids(second), NEW_TOKENS) == continued


def test_qwen3_patches_match_transformers_processor(tmp_path, load):
    """No resize (sizes already multiples of 32): the same patch rows within fp32 rounding of
    (x - 127.5) * (1/127.5) against (x / 255 - 0.5) / 0.5. A size halfway between multiples differs
    in grid: MNN rounds 80/32 = 2.5 up (C round), transformers' smart_resize to even (2)."""
    pytest.importorskip("transformers")
    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    from mnnllm_core.llm.vision_qwen2 import qwen_patches
    processor = Qwen2VLImageProcessorPil(patch_size=16, temporal_patch_size=2, merge_size=2, image_mean=[0.5] * 3,
                                         image_std=[0.5] * 3, min_pixels=32 * 32, max_pixels=1 << 20)
    vision = load(QWEN3_VL).vision
    for path in (IMAGE, _noise(tmp_path / "a.png", 64, 128)):
        array = np.asarray(Image.open(path).convert("RGB"))
        out = processor(images=Image.fromarray(array), return_tensors="np")
        patches, _, grid = qwen_patches(vision.pixels(array, *array.shape[:2]), 16)
        assert np.asarray(out["image_grid_thw"])[0].tolist() == [grid[0], grid[1] * 2, grid[2] * 2]
        assert np.abs(patches - np.asarray(out["pixel_values"])).max() < 1e-6
    array = np.asarray(Image.open(_noise(tmp_path / "b.png", 70, 80)))
    assert np.asarray(processor(images=Image.fromarray(array), return_tensors="np")["image_grid_thw"])[0].tolist() \
        == [1, 4, 4]
    assert vision.target_size(70, 80) == (64, 96)


def test_qwen3_position_interpolation_matches_transformers():
    """MNN's idx_tensor / weight_tensor against transformers' bilinear (align_corners) indices
    and weights of the learned position table, in the same merge order."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.qwen3_vl.modeling_qwen3_vl import get_vision_interpolation_indices_and_weights
    from mnnllm_core.llm.vision_qwen3 import position_interpolation
    table = np.random.default_rng(0).standard_normal((64, 5))
    for grid_h, grid_w in ((6, 6), (4, 8), (26, 26), (2, 10)):
        idx, weight = position_interpolation(grid_h, grid_w, 8)
        hf_idx, hf_weight = get_vision_interpolation_indices_and_weights(
            torch.tensor([[1, grid_h, grid_w]]), num_grid_per_side=8, mode="bilinear", align_corners=True,
            spatial_merge_size=2, kwargs={})
        ours = (table[idx] * weight[:, :, None]).sum(0)
        theirs = (table[hf_idx.numpy()] * hf_weight.numpy()[:, :, None]).sum(1)
        assert np.abs(ours - theirs).max() < 1e-5


def test_smolvlm_tiles_match_transformers_processor(tmp_path, load):
    """A 128x128 image needs no resize for its 2x2 tiles: equal within fp32 rounding. Upscaled
    (96 -> 128) with transformers' bilinear, within 0.01 (PIL rounds to uint8: 1/127.5 = 0.008).
    The global image is MNN's bilinear where transformers uses LANCZOS: not compared."""
    pytest.importorskip("transformers")
    from PIL import Image
    from transformers.models.smolvlm.image_processing_pil_smolvlm import SmolVLMImageProcessorPil
    vision = load(SMOLVLM).vision
    for path, resample, bound in ((_noise(tmp_path / "a.png", 128, 128), Image.LANCZOS, 1e-6),
                                  (IMAGE, Image.BILINEAR, 0.01)):
        processor = SmolVLMImageProcessorPil(do_image_splitting=True, size={"longest_edge": 128},
                                             max_image_size={"longest_edge": 64}, image_mean=[0.5] * 3,
                                             image_std=[0.5] * 3, resample=resample)
        array = np.asarray(Image.open(path).convert("RGB"))
        theirs = np.asarray(processor(images=[[Image.fromarray(array)]], return_tensors="np")["pixel_values"])[0]
        whole, tiles = vision.pixel_values(array, *array.shape[:2])
        assert tiles.shape == theirs[:4].shape == (4, 3, 64, 64) and whole.shape == (1, 3, 64, 64)
        assert np.abs(tiles - theirs[:4]).max() < bound


def test_bad_images_and_sizes_are_typed_errors(tmp_path, load):
    qwen, smol = load(QWEN3_VL), load(SMOLVLM)
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not a png")
    for model in (qwen, smol):
        with pytest.raises(FormatError, match="does not exist"):
            model.tokenizer_encode("<img>/no/such.png</img>Hi")
        with pytest.raises(FormatError, match="cannot decode") as err:
            model.tokenizer_encode(f"<img>{bad}</img>Hi")
        assert err.value.file == str(bad)
        with pytest.raises(ConfigError, match="positive"):
            model.tokenizer_encode(f"<img><hw>0,5</hw>{IMAGE}</img>Hi")
        with pytest.raises(FormatError, match=r"\[H, W, 3\]"):
            model.tokenizer_encode("<img>pic</img>Hi", images={"pic": np.zeros((4, 4, 7), np.uint8)})
    with pytest.raises(UnsupportedError, match="at least 16"):  # 8 / 32 rounds to no patch row
        qwen.tokenizer_encode(f"<img><hw>8,96</hw>{IMAGE}</img>Hi")
    with pytest.raises(UnsupportedError, match="at least 32"):  # 200 wide is tiled; 20 / 64 rounds to no tile row
        smol.tokenizer_encode(f"<img><hw>20,200</hw>{IMAGE}</img>Hi")


def test_deepstack_rows_are_zero_for_text_and_mnns_fill_without_images():
    from mnnllm_core.llm.deepstack import NO_DEEPSTACK, deepstack_rows, graph_takes_deepstack
    features = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    rows = deepstack_rows(features, np.array([-1, 0, 1, 2, -1]))
    assert rows.shape == (2, 5, 4) and not rows[:, [0, 4]].any()
    assert np.array_equal(rows[:, 1:4], features)
    assert deepstack_rows(features, np.array([-1, -1])) is NO_DEEPSTACK and NO_DEEPSTACK.shape == (3, 1, 1)
    _reference(QWEN3_VL)
    assert graph_takes_deepstack(str(ARCH3 / QWEN3_VL / "llm.mnn"))
    assert not graph_takes_deepstack(str(ARCH3 / "tiny-qwen3_5-mnn-q4" / "llm.mnn"))  # has_deepstack, no input


def test_qwen3_5_visual_encoder_loads_as_qwen3_vl_and_encodes():
    """Qwen3.5's tower (no deepstack output); its LLM needs LinearAttention, so only the encoder runs."""
    from mnnllm_core.llm.config import LlmConfig, resolve_config_path
    from mnnllm_core.llm.runtime import init_runtime
    from mnnllm_core.llm.tokenizer import create_tokenizer
    from mnnllm_core.llm.vision_encoders import create_vision_encoder
    from mnnllm_core.llm.vision_qwen3 import Qwen3VisionEncoder
    folder = ARCH3 / "tiny-qwen3_5-mnn-q4"
    if not folder.exists():
        pytest.skip(f"{folder} is missing")
    config = LlmConfig.from_file(resolve_config_path(folder))
    config.set_config({"memory": "normal"})
    encoder = create_vision_encoder(config, init_runtime(config, mllm=True), create_tokenizer(config.tokenizer_file))
    assert isinstance(encoder, Qwen3VisionEncoder)
    out = encoder.encode(str(IMAGE), 96, 96)
    assert out.grid == (1, 3, 3) and out.embeds.shape == (9, 64) and out.deepstack is None
    assert np.isfinite(out.embeds).all() and np.abs(out.embeds).max() > 0
    assert out.ids == [248053] + [248056] * 9 + [248054]


def test_the_models_route_to_omni_with_their_encoder_family(load):
    from mnnllm_core.llm.vision_idefics3 import Idefics3VisionEncoder
    from mnnllm_core.llm.vision_qwen3 import Qwen3VisionEncoder
    assert isinstance(load(QWEN3_VL).vision, Qwen3VisionEncoder)
    assert isinstance(load(SMOLVLM).vision, Idefics3VisionEncoder)
    assert os.path.basename(load(SMOLVLM).config.visual_model) == "visual.mnn"


def _q4_block(dims: list[int], codes: np.ndarray) -> np.ndarray:
    """An MNN 4-bit weight block: dim count, uint16 dims, the 16-value map, codes high nibble first."""
    head = [len(dims)] + list(np.asarray(dims, "<u2").view(np.uint8)) + [16] + list(np.arange(-8, 8, dtype=np.int8)
                                                                                   .view(np.uint8))
    return np.concatenate([np.asarray(head, np.uint8), ((codes[0::2] << 4) | codes[1::2]).astype(np.uint8)])


def test_a_weight_header_with_each_row_split_decodes_as_oc_by_ic():
    """Qwen3-VL's patch embedding [32, 1536] is stored with dims [384, 128]: the same codes in
    the same order, so it decodes as [oc, ic]; dims that split no row are still corrupt."""
    from mnnllm_core.core.weights.quant import decode_convolution_weight
    oc, ic = 4, 64
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 16, oc * ic).astype(np.uint8)
    alpha = rng.standard_normal(oc * 4).astype("<f2").view(np.uint8)  # 2 blocks a row: (zero, scale) each

    def decode(dims):
        return decode_convolution_weight(_q4_block(dims, codes), alpha, bits=4, oc=oc, ic=ic, shape_int32=False,
                                         scale_storage="FP16", file="w", op_name="patch").dequantize()

    np.testing.assert_array_equal(decode([oc * 4, ic // 4]), decode([oc, ic]))
    with pytest.raises(FormatError, match="do not match"):
        decode([oc * 4 + 2, ic // 4 - 1])
    with pytest.raises(FormatError, match="do not match"):
        decode([2, oc * ic // 2])
