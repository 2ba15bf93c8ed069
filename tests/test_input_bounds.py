"""An image is bounded before anything is allocated for it: a <hw> size past image_max_size, an
image whose tokens alone pass max_all_tokens, an array past MAX_PIXELS, and NaN or infinite pixels
are typed errors naming the field, in well under a second and without a large allocation; a long
thin array is resized reading only the pixels it samples. Driven on the shared tiny Qwen2-VL and
the arch3 Qwen3-VL and SmolVLM exports."""
from __future__ import annotations

import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import mnnllm_core
from mnnllm_core.errors import ConfigError, ContextLengthError, FormatError
from mnnllm_core.llm.image import MAX_PIXELS

pytest.importorskip("PIL", reason="images need Pillow (the vision extra)")
MODELS = Path(__file__).resolve().parents[1] / ".." / "shared" / "models"
QWEN2_VL = (MODELS / "vl" / "tiny-qwen2_vl-mnn-q4").resolve()
QWEN3_VL = (MODELS / "arch3" / "tiny-qwen3_vl-mnn-q4").resolve()
SMOLVLM = (MODELS / "arch3" / "tiny-smolvlm-mnn-q4").resolve()
IMAGE = (MODELS / "vl" / "test_image.png").resolve()
FOLDERS = {"qwen2_vl": QWEN2_VL, "qwen3_vl": QWEN3_VL, "smolvlm": SMOLVLM}
FAST = 1.0  # seconds: the refusals come before any resize, patch or encoder run
SMALL = 64 << 20  # bytes: what a refusal may allocate at its peak (the images asked for are gigabytes)


@pytest.fixture(scope="module", params=list(FOLDERS))
def model(request):
    folder = FOLDERS[request.param]
    if not folder.is_dir():
        pytest.skip(f"{folder} is not there")
    llm = mnnllm_core.create(str(folder))
    llm.set_config({"memory": "normal", "sampler_type": "greedy"})
    return llm.load()


def _refused(call, error: type, field: str):
    """Run `call`, expecting `error` on `field`, fast and with a small peak allocation."""
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(error) as err:
            call()
        seconds, peak = time.perf_counter() - start, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert err.value.field == field, str(err.value)
    assert seconds < FAST
    assert peak < SMALL
    return err.value


def test_a_huge_hw_is_refused_naming_hw_or_clamped_as_mnn_clamps_tiles(model):
    """Qwen-VL: past image_max_size is a ConfigError on hw. SmolVLM: MNN clamps the tiled size to
    image_max_size, so the answer comes, at the clamped size, as fast and as small."""
    model.reset()
    prompt = f"<img><hw>100000,100000</hw>{IMAGE}</img>Describe."
    if model.config.get("image_max_size") is None:
        error = _refused(lambda: model.response(prompt, max_new_tokens=1), ConfigError, "hw")
        assert "image_max_size" in str(error)
        return
    tracemalloc.start()
    try:
        assert isinstance(model.response(prompt, max_new_tokens=1), str)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < SMALL


def test_an_hw_whose_tokens_pass_the_context_is_refused_before_encoding(model):
    """2000x2000 is within MNN's default image_max_size (2048) but stands for thousands of tokens."""
    if model.config.get("image_max_size") is not None:
        pytest.skip("this model caps its tiles at image_max_size, as MNN does")
    model.reset()
    model.set_config({"max_all_tokens": 1024})
    try:
        _refused(lambda: model.response(f"<img><hw>2000,2000</hw>{IMAGE}</img>Describe.", max_new_tokens=1),
                 ContextLengthError, "hw")
    finally:
        model.set_config({"max_all_tokens": 2048})


def _encode_peak(model, array: np.ndarray) -> int:
    tracemalloc.start()
    try:
        out = model.vision.encode(array)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert np.isfinite(out.embeds).all()
    return peak


def test_a_long_thin_array_is_resized_without_building_its_rows_at_full_width(model):
    """(1, 10**6, 3) is 12 MB; resizing its one row to 420 rows at full width was 5 GB. Its peak
    is a square image's (the encoder's own work) plus about the array itself."""
    model.reset()
    square = _encode_peak(model, np.full((64, 64, 3), 128, np.float32))
    thin = _encode_peak(model, np.full((1, 10**6, 3), 128, np.float32))
    assert thin < square + (32 << 20)


def test_an_array_past_max_pixels_is_refused_naming_image(model):
    huge = np.broadcast_to(np.zeros(3, np.uint8), (1, MAX_PIXELS + 1, 3))  # no memory behind it
    _refused(lambda: model.vision.encode(huge), FormatError, "image")


def test_a_pil_image_past_max_pixels_is_refused_before_it_is_converted(model):
    from PIL import Image
    image = Image.new("L", (MAX_PIXELS // 4096 + 1, 4096))  # 64 MB of gray, 800 MB as float RGB
    _refused(lambda: model.vision.encode(image), FormatError, "image")


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_non_finite_pixels_are_refused_naming_image(model, value):
    array = np.full((64, 64, 3), 100.0, np.float32)
    array[10, 20, 1] = value
    error = _refused(lambda: model.vision.encode(array), FormatError, "image")
    assert "non-finite" in str(error) and "[10, 20, 1]" in str(error)


def test_an_all_nan_image_through_the_api_is_a_typed_error_not_an_empty_reply(model):
    model.reset()
    messages = [{"role": "user", "content": [{"type": "image", "image": np.full((64, 64, 3), np.nan, np.float32)},
                                             {"type": "text", "text": "Describe."}]}]
    _refused(lambda: model.response(messages, max_new_tokens=1), FormatError, "image")


def test_a_non_numeric_array_is_refused_naming_image(model):
    _refused(lambda: model.vision.encode(np.full((8, 8, 3), "x")), FormatError, "image")


def test_an_image_within_the_bounds_still_answers(model):
    model.reset()
    assert isinstance(model.response(f"<img><hw>64,64</hw>{IMAGE}</img>Describe.", max_new_tokens=2), str)
