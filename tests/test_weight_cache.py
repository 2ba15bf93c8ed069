"""Packed weights kept on disk and memory-mapped (`use_mmap` with `tmp_path`, weight_cache.py): the
first load packs and writes, a later one maps every pack and packs nothing, with the same greedy
tokens; a changed model, mnnllm or layout version never reuses a file; a damaged file is refused
with a warning and packed again."""
import json
import logging
import os

import numpy as np
import pytest

import mnnllm_core
from mnnllm_core.backend_api import WeightCache
from paths import CONFIG, REFERENCE, linked_model_copy

PROMPT = json.loads(REFERENCE.read_text())["prompts"][0]
EXPECTED = PROMPT["mnn_cpp_q4_memory_normal"]["gen_ids"][:8]
LINEARS = 211


def arrays():
    return {"codes": np.arange(1000, dtype=np.uint8), "alpha": np.linspace(0, 1, 33).astype(np.float16),
            "shape": np.array([4, 3, 2, 1], np.int64), "empty": np.zeros((0, 5), np.float32)}


def cache(tmp_path, identity="model-a", backend="cpu") -> WeightCache:
    return WeightCache.from_hints({"use_mmap": True, "tmp_path": str(tmp_path), "model_identity": identity}, backend)


def counted(made: list):
    def make():
        made.append(1)
        return arrays()
    return make


def test_arrays_are_made_once_then_mapped_from_the_file(tmp_path):
    made = []
    first = cache(tmp_path).arrays("3:/layers.0/q_proj", "v1", counted(made))
    later = cache(tmp_path)
    again = later.arrays("3:/layers.0/q_proj", "v1", counted(made))
    assert made == [1] and (later.hits, later.misses) == (1, 0)
    for key, value in arrays().items():
        assert again[key].dtype == value.dtype and np.array_equal(again[key], value), key
        assert np.array_equal(first[key], value)
    assert len(list(later.folder.iterdir())) == 1  # no temporary left beside it


@pytest.mark.parametrize("change", [{"identity": "model-b"}, {"backend": "other"}])
def test_another_model_or_backend_uses_its_own_files(tmp_path, change):
    made = []
    cache(tmp_path).arrays("op", "v1", counted(made))
    cache(tmp_path, **change).arrays("op", "v1", counted(made))
    assert made == [1, 1]


def test_another_layout_version_packs_again_with_a_warning(tmp_path, caplog):
    made = []
    cache(tmp_path).arrays("op", "v1", counted(made))
    with caplog.at_level(logging.WARNING):
        cache(tmp_path).arrays("op", "v2", counted(made))
    assert made == [1, 1] and "layout 'v1', wanted 'op' layout 'v2'" in caplog.text
    cache(tmp_path).arrays("op", "v2", counted(made))
    assert made == [1, 1]  # the repack replaced the file


@pytest.mark.parametrize("damage", ["truncate", "header", "magic", "header length", "fifo"])
def test_a_damaged_file_is_refused_and_packed_again(tmp_path, caplog, damage):
    made = []
    weights = cache(tmp_path)
    weights.arrays("op", "v1", counted(made))
    (path,) = list(weights.folder.iterdir())
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[:len(data) - 100])
    elif damage == "header":
        path.write_bytes(data[:12] + b"{broken" + data[19:])
    elif damage == "header length":  # a 4 GiB header is refused before anything is read
        path.write_bytes(data[:8] + (0xFFFFFFFF).to_bytes(4, "little") + data[12:])
    elif damage == "fifo":  # opening it to read would wait for a writer forever
        path.unlink()
        os.mkfifo(path)
    else:
        path.write_bytes(b"XXXXXXXX" + data[8:])
    with caplog.at_level(logging.WARNING):
        again = cache(tmp_path).arrays("op", "v1", counted(made))
    assert made == [1, 1] and "packing again" in caplog.text
    assert damage != "header length" or "-byte header in a" in caplog.text  # refused, not read
    assert damage != "fifo" or "not a regular file" in caplog.text
    assert np.array_equal(again["codes"], arrays()["codes"])


def test_an_unwritable_folder_leaves_the_made_arrays_in_use(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with caplog.at_level(logging.WARNING):
        got = cache(blocker).arrays("op", "v1", arrays)
    assert np.array_equal(got["codes"], arrays()["codes"]) and "cannot keep op" in caplog.text


def load(config=CONFIG, **keys):
    llm = mnnllm_core.create(config)
    llm.set_config({"sampler_type": "greedy", "thread_num": 2, **keys})
    return llm.load()


def test_a_second_load_maps_every_pack_and_answers_the_same(tmp_path):
    first = load(use_mmap=True, tmp_path=str(tmp_path))
    packs = first.runtime_manager.runtime.weight_cache
    assert (packs.hits, packs.misses) == (0, LINEARS)
    assert first.generate(PROMPT["prompt_ids"], 8) == EXPECTED
    second = load(use_mmap=True, tmp_path=str(tmp_path))
    packs = second.runtime_manager.runtime.weight_cache
    assert (packs.hits, packs.misses) == (LINEARS, 0)
    assert second.generate(PROMPT["prompt_ids"], 8) == EXPECTED
    assert load().runtime_manager.runtime.weight_cache is None  # use_mmap off: nothing kept


def test_a_changed_model_never_maps_the_old_packs(tmp_path):
    config = linked_model_copy(tmp_path / "model", "llm.mnn")
    keys = {"use_mmap": True, "tmp_path": str(tmp_path / "packs")}
    load(config, **keys)
    os.utime(config.parent / "llm.mnn", ns=(0, 0))
    changed = load(config, **keys).runtime_manager.runtime.weight_cache
    assert (changed.hits, changed.misses) == (0, LINEARS)


def test_int8_activations_map_their_own_layout_on_a_second_load(tmp_path):
    """With `cpu_int8_activations` the cache keeps the int8 kernel's layout, in files of its own
    beside the fp32 path's: the second load maps it and gives the logits of a load without use_mmap."""
    pytest.importorskip("numba")
    from mnnllm_backends.cpu.kernels import int8_dot
    if not int8_dot.supported():
        pytest.skip("no AVX512-VNNI on this cpu")
    keys = {"memory": "low", "backend_hints": {"cpu_int8_activations": True}}
    expected = load(**keys).forward(PROMPT["prompt_ids"]).copy()
    first = load(use_mmap=True, tmp_path=str(tmp_path), **keys)
    packs = first.runtime_manager.runtime.weight_cache
    made = packs.misses
    assert packs.hits == 0 and made > 0
    assert np.array_equal(first.forward(PROMPT["prompt_ids"]), expected)
    second = load(use_mmap=True, tmp_path=str(tmp_path), **keys)
    packs = second.runtime_manager.runtime.weight_cache
    assert (packs.hits, packs.misses) == (made, 0)
    assert np.array_equal(second.forward(PROMPT["prompt_ids"]), expected)
    fp32 = load(use_mmap=True, tmp_path=str(tmp_path), memory="low").runtime_manager.runtime.weight_cache
    assert (fp32.hits, fp32.misses) == (LINEARS - made, made)  # the linears int8 does not take share files
