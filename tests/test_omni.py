"""Omni on the shared tiny Qwen2-VL (fp16 and q4 exports of MNN's exporter): the reference ids,
the encoder against transformers' vision tower, the prompt against transformers' processor, and
MNN's own runtime on other image sizes, two images, and an image in a later chat turn."""
from __future__ import annotations

import numpy as np
import pytest

import mnnllm_core
from mnnllm_core.errors import ConfigError, FormatError, MnnllmError
from mnnllm_core.llm.omni import Omni
from mnnllm_core.llm.vision_qwen2 import qwen_patches
from vl_oracle import mnn_vision_ids
from vl_reference import FP16, IMAGE, Q4, hf_image_embeds, hf_processor_patches, reference, vision_tower

pytest.importorskip("PIL", reason="images need Pillow (the vision extra)")
NEW_TOKENS = 8


def _load(folder) -> Omni:
    reference()
    model = mnnllm_core.create(folder)
    model.set_config({"memory": "normal", "sampler_type": "greedy"})
    return model.load()


@pytest.fixture(scope="module")
def fp16():
    return _load(FP16)


@pytest.fixture(scope="module")
def q4():
    return _load(Q4)


def _query(ref: dict) -> str:
    return ref["mnn_response_query"].replace("test_image.png", str(IMAGE))


@pytest.mark.parametrize("name, key", [("fp16", "mnn_fp16_gen_ids"), ("q4", "mnn_q4_gen_ids")])
def test_the_reference_query_gives_the_reference_ids(request, name, key):
    ref = reference()
    model = request.getfixturevalue(name)
    model.reset()
    ids = model._prompt_ids(_query(ref))
    assert ids == ref["prompt_ids"]  # transformers' processor + template gave the same 42 ids
    assert model.generate(ids, 16) == ref[key]
    assert model.context.vision_us > 0


def test_response_text_equals_mnn_response_text(fp16):
    ref = reference()
    fp16.reset()
    assert fp16.response(_query(ref), max_new_tokens=16) == ref["mnn_fp16_response_text"]


def test_image_embeds_match_transformers_vision_tower(fp16):
    """transformers fp32 on the export's weights; the graph's rotary table is fp16, hence the bound."""
    pixel_values, grid = hf_processor_patches(IMAGE)
    expected = hf_image_embeds(vision_tower(FP16), pixel_values, grid)
    out = fp16.vision.encode(str(IMAGE), 112, 112)
    assert out.grid == (1, 4, 4) and out.embeds.shape == expected.shape == (16, 64)
    assert np.abs(out.embeds - expected).max() < 2e-3  # measured 3.6e-4, |embeds| up to 1.7


def test_patches_match_transformers_processor(fp16):
    """Same pixels in, same patch rows out: MNN's patch order is transformers' (no resize at 112x112)."""
    pixel_values, grid = hf_processor_patches(IMAGE)
    from mnnllm_core.llm.image import load_image, resize_normalize
    vision = fp16.vision
    pixels = resize_normalize(load_image(str(IMAGE)), 112, 112, vision.mean, vision.norm)
    patches, position_ids, merged = qwen_patches(pixels)
    assert list(merged) == [grid[0][0], grid[0][1] // 2, grid[0][2] // 2]
    assert np.abs(patches - pixel_values).max() < 1e-4
    assert position_ids[:, :4].T.tolist() == [[0, 0], [0, 1], [1, 0], [1, 1]]


def test_numpy_image_and_image_parts_encode_like_the_path(fp16):
    from PIL import Image
    array = np.asarray(Image.open(IMAGE).convert("RGB"))
    by_path = fp16.tokenizer_encode(f"<img><hw>112,112</hw>{IMAGE}</img>Hi")
    by_name = fp16.tokenizer_encode("<img><hw>112,112</hw>pic</img>Hi", images={"pic": array})
    assert by_path == by_name
    ref = reference()
    messages = [{"role": "user", "content": [{"type": "image", "image": array, "height": 112, "width": 112},
                                             {"type": "text", "text": "Describe this image."}]}]
    assert fp16._prompt_ids(messages) == ref["prompt_ids"]


def _second_image(tmp_path):
    from PIL import Image
    rng = np.random.default_rng(7)
    path = tmp_path / "noise.png"
    Image.fromarray(rng.integers(0, 256, (90, 130, 3), dtype=np.uint8)).save(path)
    return path


def test_other_sizes_two_images_and_a_chat_match_mnn(fp16, tmp_path):
    """Odd merged grids both ways (3x5, 5x3), a resize to a size that is no multiple of 28, two
    images in one prompt, and an image in the third message of a chat: MNN's runtime gives the
    same prompt length and greedy ids."""
    other = _second_image(tmp_path)
    chat = [{"role": "user", "content": "Hi there."}, {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": f"<img><hw>56,84</hw>{IMAGE}</img>What is it?"}]
    # without <hw>, image_size (420: 15x15 tokens); first, as MNN 3.6.1 keeps the last <hw> size for later images
    queries = [f"<img>{other}</img>What is this?",
               f"<img><hw>84,140</hw>{IMAGE}</img>Describe.", f"<img><hw>140,84</hw>{IMAGE}</img>Describe.",
               f"<img><hw>56,56</hw>{IMAGE}</img>and<img><hw>100,70</hw>{other}</img>Compare."]
    prompts = [fp16.apply_chat_template(q) for q in queries] + [fp16.apply_chat_template(chat)]
    expected = mnn_vision_ids(FP16, prompts, NEW_TOKENS)
    got = []
    for text in prompts:
        fp16.reset()
        ids = fp16.tokenizer_encode(text)
        got.append({"prompt_len": len(ids), "ids": fp16.generate(ids, NEW_TOKENS)})
    assert got == expected


def test_an_image_in_the_second_turn_reuses_only_what_is_the_same(fp16):
    """Turn 1 is text; turn 2 adds an image. The KV cache is reused for the first turn's prompt
    (same tokens and positions), and the answer equals a fresh run on the whole conversation."""
    fp16.reset()
    first = [{"role": "user", "content": "Hi there."}]
    answer = fp16.response(first, max_new_tokens=4)
    second = first + [{"role": "assistant", "content": answer},
                      {"role": "user", "content": f"<img><hw>56,84</hw>{IMAGE}</img>What is it?"}]
    ids = fp16._prompt_ids(second)
    reused = fp16.cached_prefix(ids)
    assert reused > 0
    continued = fp16.generate(ids, NEW_TOKENS)
    fp16.reset()
    assert fp16.generate(fp16._prompt_ids(second), NEW_TOKENS) == continued


def test_the_same_tokens_with_another_image_do_not_reuse_its_rows(fp16, tmp_path):
    other = _second_image(tmp_path)
    fp16.reset()
    first = fp16.tokenizer_encode(f"<img><hw>56,56</hw>{IMAGE}</img>Hi")
    fp16.generate(first, 2)
    again = fp16.tokenizer_encode(f"<img><hw>56,56</hw>{other}</img>Hi")
    assert again == first
    assert fp16.cached_prefix(again) == first.index(49154)  # up to the first image row


def test_image_errors_are_clear(fp16, tmp_path):
    with pytest.raises(FormatError, match="does not exist"):
        fp16.tokenizer_encode("<img>/no/such.png</img>Hi")
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not a png")
    with pytest.raises(FormatError, match="cannot decode"):
        fp16.tokenizer_encode(f"<img>{bad}</img>Hi")
    with pytest.raises(ConfigError, match="hw"):
        fp16.tokenizer_encode(f"<img><hw>big</hw>{IMAGE}</img>Hi")
    fp16.reset()
    pad_ids = [1, 49152, 49154, 49153, 2]
    with pytest.raises(MnnllmError, match="image_pad"):
        fp16.generate(pad_ids, 1)


def test_mrope_positions_follow_mnn():
    from mnnllm_core.llm.multimodal import MropePositions
    positions = MropePositions()
    positions.add_text(2)
    positions.add_image((1, 2, 3))
    positions.add_text(1)
    rows = positions.array()
    assert rows[0].tolist() == [0, 1, 2, 3, 3, 3, 3, 3, 3, 6, 7]
    assert rows[1].tolist() == [0, 1, 2, 3, 3, 3, 4, 4, 4, 6, 7]
    assert rows[2].tolist() == [0, 1, 2, 3, 4, 5, 3, 4, 5, 6, 7]


def _cli(*args, stdin: str | None = None):
    import subprocess
    import sys
    return subprocess.run([sys.executable, "-m", "mnnllm_core.cli", *args], capture_output=True, text=True,
                          input=stdin, timeout=600)


GREEDY = ["--set", "sampler_type=greedy", "--set", "memory=normal", "--set", "image_size=112"]


def test_cli_run_with_an_image_gives_the_reference_ids():
    import json
    ref = reference()
    done = _cli("run", str(FP16), *GREEDY, "--image", str(IMAGE), "-p", "Describe this image.", "--json",
                "--max-new-tokens", "16")
    assert done.returncode == 0, done.stderr
    row = json.loads(done.stdout.strip().splitlines()[-1])
    assert row["prompt_ids"] == ref["prompt_ids"]
    assert row["gen_ids"] == ref["mnn_fp16_gen_ids"]
    assert row["vision_ms"] > 0


def test_cli_chat_image_command_adds_the_image_to_the_next_message():
    ref = reference()
    done = _cli("chat", str(FP16), *GREEDY, "--max-new-tokens", "16",
                stdin=f"/image /no/such.png\n/image {IMAGE}\nDescribe this image.\n/exit\n")
    assert done.returncode == 0, done.stderr
    assert "the image does not exist: /no/such.png" in done.stderr
    answers = [line for line in done.stdout.split("> ") if line.strip()]
    assert answers[0].strip() == ref["mnn_fp16_response_text"].strip()


def test_cli_image_on_a_text_model_is_a_clear_error():
    from paths import CONFIG
    done = _cli("run", str(CONFIG), "--image", str(IMAGE), "-p", "Hi")
    assert done.returncode == 2
    assert "--image needs a vision-language model" in done.stderr


PATCH_EMBEDDING_OPS = {"Im2Col", "Unpack", "Convolution", "Eltwise"}  # the 14x14 patch conv: cpu-only ops


@pytest.mark.parametrize("backend", ["opencl", "vulkan"])
@pytest.mark.parametrize("name, key", [("fp16", "mnn_fp16_gen_ids"), ("q4", "mnn_q4_gen_ids")])
def test_device_backends_reproduce_the_reference_with_the_patch_embedding_on_cpu(backend, name, key):
    """The LLM and the encoder on the device (mllm.backend_type); the encoder's patch embedding
    falls back to cpu, listed in its placement. The decode steps pin down that constants uploaded
    at resize keep their own buffers (they once shared one with an M-RoPE intermediate)."""
    from mnnllm_core.plugins.manager import registry
    available, reason = registry().get(backend).is_available()
    if not available:
        pytest.skip(f"{backend} unavailable: {reason}")
    ref = reference()
    model = mnnllm_core.create(FP16 if name == "fp16" else Q4)
    model.set_config({"memory": "normal", "sampler_type": "greedy", "backend_type": backend, "precision": "high",
                      "mllm": {"backend_type": backend, "memory": "normal", "precision": "high"}})
    model.load()
    assert model.generate(model._prompt_ids(_query(ref)), 16) == ref[key]
    vision = model.vision_placement()
    assert {f["type"] for f in vision["fallbacks"]} == PATCH_EMBEDDING_OPS
    assert vision["ops_per_backend"][backend] > 100
    assert model.placement()["fallbacks"] == []


def test_the_disk_prefix_cache_is_off_for_a_multimodal_model(tmp_path):
    reference()
    model = mnnllm_core.create(FP16)
    model.set_config({"memory": "normal", "prefix_cache_path": str(tmp_path / "cache")})
    model.load()
    assert model.prefix_cache is None
    model.generate(model.tokenizer_encode(f"<img><hw>56,56</hw>{IMAGE}</img>Hi there, what is this?"), 1)
    assert not any((tmp_path / "cache").rglob("*.kv"))
