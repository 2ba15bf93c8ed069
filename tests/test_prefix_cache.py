"""The prefix cache on disk (prefix_cache.py): a second process loads a prompt's KV cache that a
first one saved and answers with the same greedy tokens; a prompt sharing only a leading part takes
that part; a stale, truncated or corrupt file is never used (a warning, then a fresh prefill whose
tokens equal an uncached run), nor is one made for a changed model. opencl's device cache is
saved and restored too; vulkan's and an LFM2 short-convolution history cannot be, and go without."""
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import mnnllm_core
from mnnllm_core.llm.prefix_cache import MIN_NEW_TOKENS
from paths import CONFIG, MODEL_DIR, linked_model_copy

SYSTEM = ("You are a careful assistant for a small museum of clocks. Answer in one short sentence. "
          "The museum opens at nine, closes at five, and is shut on Mondays. Tickets cost four euros; "
          "children under twelve enter free. The oldest clock was built in 1652 in Leiden.")
NEW_TOKENS = 6


def conversation(question: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


def load(model_config=CONFIG, **keys):
    llm = mnnllm_core.create(model_config)
    llm.set_config({"sampler_type": "greedy", "thread_num": 2, **keys})
    return llm.load()


def prompt_ids(llm, question: str) -> list[int]:
    return llm.tokenizer_encode(llm.apply_chat_template(conversation(question)))


def files(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.kv"))


@pytest.fixture(scope="module")
def uncached():
    """Each question's greedy tokens from an engine without the prefix cache."""
    llm = load()
    answers = {}
    for question in ("When does it open?", "What does a ticket cost?"):
        llm.reset()
        answers[question] = llm.generate(prompt_ids(llm, question), NEW_TOKENS)
    return answers


SCRIPT = """
import json, logging, sys
import mnnllm_core
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s: %(message)s")
llm = mnnllm_core.create(sys.argv[1])
llm.set_config({"sampler_type": "greedy", "thread_num": 2, "prefix_cache_path": sys.argv[2]})
llm.load()
print(json.dumps(llm.generate(json.loads(sys.argv[3]), int(sys.argv[4]))))
"""


def run_process(folder: Path, ids: list[int]) -> tuple[list[int], str]:
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(CONFIG), str(folder), json.dumps(ids), str(NEW_TOKENS)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def test_a_second_process_loads_the_saved_prefix_and_answers_the_same(tmp_path, uncached):
    question = "When does it open?"
    ids = prompt_ids(load(), question)
    first, log_first = run_process(tmp_path, ids)
    assert "prefix cache: saved" in log_first and "prompt tokens from" not in log_first
    assert len(files(tmp_path)) == 1
    second, log_second = run_process(tmp_path, ids)
    assert f"prefix cache: {len(ids) - 1} of {len(ids)} prompt tokens from" in log_second, log_second
    assert first == second == uncached[question]


@pytest.mark.parametrize("attention_mode", [9, 10])
def test_quantized_kv_is_saved_as_stored_and_a_second_engine_answers_the_same(tmp_path, attention_mode, caplog):
    """int8 keys (9) or keys and values (10): the file holds the stored rows (uint8, keys and
    values of their own widths), under a key of its own; a second engine loads them and answers as
    an engine without the prefix cache in the same mode."""
    question = "When does it open?"
    plain = load(attention_mode=attention_mode)
    ids = prompt_ids(plain, question)
    want = plain.generate(ids, NEW_TOKENS)
    assert load(attention_mode=attention_mode, prefix_cache_path=str(tmp_path)).generate(ids, NEW_TOKENS) == want
    (saved,) = files(tmp_path)
    header = json.loads(saved.read_bytes()[12:12 + int.from_bytes(saved.read_bytes()[8:12], "little")])
    assert header["identity"]["attention_mode"] == attention_mode
    assert {layer["dtype"] for layer in header["layers"]} == {"|u1"}
    assert all(("value_shape" in layer) == (attention_mode == 9) for layer in header["layers"])
    with caplog.at_level(logging.INFO, "mnnllm_core.llm.prefix_cache"):
        again = load(attention_mode=attention_mode, prefix_cache_path=str(tmp_path)).generate(ids, NEW_TOKENS)
    assert f"prefix cache: {len(ids) - 1} of {len(ids)} prompt tokens from" in caplog.text
    # Here the last prompt token runs as a one-token forward, there inside the prompt's: its keys differ
    # by float rounding, which an int8 code can turn into a whole step (its logits then move by 0.04-0.13
    # on this prompt). So the answers agree as far as every greedy choice is clearer than that.
    clear = greedy_steps_clearer_than(load(attention_mode=attention_mode), ids, want, ONE_ROW_INT8_TOL)
    assert clear >= 3 and again[:clear] == want[:clear]


ONE_ROW_INT8_TOL = 0.2


def greedy_steps_clearer_than(llm, ids: list[int], tokens: list[int], margin: float) -> int:
    """How many of the greedy `tokens` after `ids` lead the runner-up logit by more than `margin`."""
    logits = np.asarray(llm.forward(ids))
    for step, token in enumerate(tokens):
        top2 = np.sort(logits)[-2:]
        if int(np.argmax(logits)) != token or top2[1] - top2[0] <= margin:
            return step
        logits = np.asarray(llm.forward([token]))
    return len(tokens)


@pytest.fixture
def cached(tmp_path):
    """An engine with the prefix cache in tmp_path, and the file its first prompt saved."""
    llm = load(prefix_cache_path=str(tmp_path))
    llm.generate(prompt_ids(llm, "When does it open?"), NEW_TOKENS)
    (saved,) = files(tmp_path)
    llm.reset()
    return llm, saved


def test_a_prompt_sharing_the_system_part_takes_that_part_from_the_file(cached, uncached, caplog):
    llm, saved = cached
    question = "What does a ticket cost?"
    ids = prompt_ids(llm, question)
    first = prompt_ids(llm, "When does it open?")
    shared = next(i for i, (a, b) in enumerate(zip(ids, first)) if a != b)
    with caplog.at_level(logging.INFO, "mnnllm_core.llm.prefix_cache"):
        assert llm.generate(ids, NEW_TOKENS) == uncached[question]
    assert f"prefix cache: {shared} of {len(ids)} prompt tokens from {saved}" in caplog.text
    assert len(ids) - shared < MIN_NEW_TOKENS and files(saved.parents[1]) == [saved]  # too little new to save


def test_a_chat_that_continues_a_saved_prompt_replaces_its_file(cached, uncached):
    llm, saved = cached
    messages = conversation("When does it open?") + [
        {"role": "assistant", "content": llm.tokenizer_decode(uncached["When does it open?"])},
        {"role": "user", "content": "And on Sundays, is it open all day long, from the morning to the evening?"}]
    llm.generate(llm.tokenizer_encode(llm.apply_chat_template(messages)), 2)
    (now,) = files(saved.parents[1])
    assert now != saved


def damage_truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])


def damage_flip_a_value(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x40
    path.write_bytes(bytes(data))


def damage_header(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[12:20] = b"not json"
    path.write_bytes(bytes(data))


def damage_header_length(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[8:12] = (0xFFFFFFFF).to_bytes(4, "little")  # a 4 GiB header: refused before any read
    path.write_bytes(bytes(data))


def damage_fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)  # opening it to read would wait for a writer forever


def damage_tokens(path: Path) -> None:
    path.write_bytes(b"not a prefix cache file at all")


@pytest.mark.parametrize("damage,why", [(damage_truncate, "truncated"), (damage_flip_a_value, "corrupt"),
                                        (damage_header, "malformed header"), (damage_header_length, "truncated"),
                                        (damage_fifo, "not a regular file"),
                                        (damage_tokens, "not a prefix-cache")])
def test_a_damaged_file_is_refused_with_a_warning_and_the_prompt_prefilled(cached, uncached, caplog, damage, why):
    llm, saved = cached
    damage(saved)
    with caplog.at_level(logging.INFO, "mnnllm_core.llm.prefix_cache"):
        assert llm.generate(prompt_ids(llm, "When does it open?"), NEW_TOKENS) == uncached["When does it open?"]
    assert f"not using {saved}: " in caplog.text and why in caplog.text
    assert "prompt tokens from" not in caplog.text
    assert files(saved.parents[1]) == [saved] and "saved" in caplog.text  # recomputed, then saved afresh


def test_a_changed_model_never_uses_the_files_of_the_old_one(tmp_path, uncached, caplog):
    cache = tmp_path / "cache"
    model = linked_model_copy(tmp_path / "model", "llm.mnn")
    llm = load(model, prefix_cache_path=str(cache))
    ids = prompt_ids(llm, "When does it open?")
    llm.generate(ids, NEW_TOKENS)
    (old,) = files(cache)
    os.utime(model.parent / "llm.mnn", ns=(0, 0))
    changed = load(model, prefix_cache_path=str(cache))
    with caplog.at_level(logging.INFO, "mnnllm_core.llm.prefix_cache"):
        assert changed.generate(ids, NEW_TOKENS) == uncached["When does it open?"]
    assert "prompt tokens from" not in caplog.text
    assert len(files(cache)) == 2 and old in files(cache)  # under another key
    # a file copied by hand under the new key is refused as stale, naming what changed
    new_key = next(p.parent for p in files(cache) if p != old)
    for path in files(new_key):
        path.unlink()
    shutil.copyfile(old, new_key / old.name)
    changed.reset()
    caplog.clear()
    with caplog.at_level(logging.INFO, "mnnllm_core.llm.prefix_cache"):
        assert changed.generate(ids, NEW_TOKENS) == uncached["When does it open?"]
    assert "stale: made for another model" in caplog.text


def test_a_model_with_state_the_cache_cannot_save_goes_without_it(tmp_path, caplog):
    """LFM2's short convolutions keep a per-token history that cannot be saved: no prefix cache
    (restoring the attention caches alone would leave that history empty)."""
    config = MODEL_DIR.parent / "arch" / "tiny-lfm2-mnn-q4" / "config.json"
    with caplog.at_level(logging.WARNING, "mnnllm_core.llm.prefix_cache"):
        llm = load(config, prefix_cache_path=str(tmp_path))
    assert llm.prefix_cache is None and "prefix cache off: the KV cache (ConvHistory)" in caplog.text


def require(backend: str) -> None:
    from mnnllm_core.plugins.manager import registry
    available, reason = registry().get(backend).is_available()
    if not available:
        pytest.skip(f"{backend} unavailable: {reason}")


def test_an_opencl_device_cache_is_saved_and_restored_by_another_engine(tmp_path, caplog):
    require("opencl")
    question = "When does it open?"
    plain = load(backend_type="opencl")
    expected = plain.generate(prompt_ids(plain, question), NEW_TOKENS)
    load(backend_type="opencl", prefix_cache_path=str(tmp_path)).generate(prompt_ids(plain, question), NEW_TOKENS)
    assert len(files(tmp_path)) == 1
    later = load(backend_type="opencl", prefix_cache_path=str(tmp_path))
    ids = prompt_ids(later, question)
    with caplog.at_level(logging.INFO, "mnnllm_core.llm.prefix_cache"):
        assert later.generate(ids, NEW_TOKENS) == expected
    assert f"prefix cache: {len(ids) - 1} of {len(ids)} prompt tokens from" in caplog.text


def test_vulkan_whose_device_cache_cannot_be_read_back_goes_without_it(tmp_path, caplog):
    require("vulkan")
    with caplog.at_level(logging.WARNING, "mnnllm_core.llm.prefix_cache"):
        llm = load(backend_type="vulkan", prefix_cache_path=str(tmp_path))
    assert llm.prefix_cache is None and "(DeviceKVCache) of backend vulkan cannot be saved" in caplog.text


def test_a_device_cache_snapshot_restores_into_a_fresh_cache_row_for_row():
    import numpy as np

    from mnnllm_core.backend_api import DeviceKVCache

    def alloc(nbytes):
        return np.zeros(nbytes, np.uint8)

    def copy(dst, src, nbytes, dst_offset=0):
        dst[dst_offset:dst_offset + nbytes] = src[:nbytes]

    def write(buffer, data):
        buffer[:data.size] = data

    def device_cache():
        cache = DeviceKVCache(alloc, copy, read=lambda buffer, nbytes: buffer[:nbytes].copy(), write=write)
        cache.row_bytes = 12
        return cache

    rng = np.random.default_rng(3)
    keys, values = rng.integers(0, 255, 300 * 12, np.uint8), rng.integers(0, 255, 300 * 12, np.uint8)
    filled = device_cache()
    filled.append(keys, values, 300)  # past its first capacity (256 tokens)
    k, v = filled.snapshot()
    assert k.shape == (300, 12) and np.array_equal(k.reshape(-1), keys) and np.array_equal(v.reshape(-1), values)
    fresh = device_cache()
    fresh.restore(k[:200], v[:200])
    assert fresh.length == 200 and fresh.capacity >= 200
    fresh.append(keys[200 * 12:], values[200 * 12:], 100)
    assert np.array_equal(fresh.k[:300 * 12], keys) and np.array_equal(fresh.v[:300 * 12], values)
    assert not DeviceKVCache(alloc, copy).saveable and fresh.saveable
