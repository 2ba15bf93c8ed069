"""The context's two limits: `max_all_tokens` (checked before a step runs) and what a backend's KV
cache can hold (a device buffer's size limit), each a ContextLengthError naming both numbers."""
import numpy as np
import pytest

from mnnllm_core.backend_api import DeviceKVCache, KVMeta
from mnnllm_core.errors import ContextLengthError

ROW_BYTES = 100
LIMIT = 1000  # bytes one buffer may hold: 10 tokens


def limited_cache() -> DeviceKVCache:
    buffers = []

    def alloc(nbytes):
        assert nbytes <= LIMIT, "allocated past the device limit"
        buffers.append(bytearray(nbytes))
        return buffers[-1]

    def copy(dst, src, nbytes, dst_offset=0):
        dst[dst_offset:dst_offset + nbytes] = bytes(src[:nbytes])
    cache = DeviceKVCache(alloc, copy, fits=lambda nbytes: nbytes <= LIMIT)
    cache.row_bytes = ROW_BYTES
    return cache


def rows(n: int) -> bytes:
    return bytes([n % 256]) * (n * ROW_BYTES)


def test_a_device_cache_grows_to_its_limit_and_past_it_names_need_and_capacity():
    cache = limited_cache()
    cache.append(rows(6), rows(6), 6)
    cache.begin_step(KVMeta(previous=6))
    cache.append(rows(4), rows(4), 4)
    assert (cache.length, cache.capacity) == (10, 10)  # doubling would not fit: grown only to the need
    with pytest.raises(ContextLengthError, match=r"11 tokens do not fit the KV cache: .* at most 10 tokens") as err:
        cache.append(rows(1), rows(1), 1)
    assert err.value.field == "max_all_tokens"
    assert cache.length == 10  # nothing half appended


def test_max_tokens_bisects_the_device_limit():
    cache = limited_cache()
    assert cache.max_tokens(1 << 20) == 10
    assert cache.max_tokens(5) == 4


class _FullCache:
    def forward(self, feeds, consume=False):
        raise ContextLengthError("40 tokens do not fit the KV cache: its buffers hold at most 32 tokens",
                                 field="max_all_tokens")


def test_the_llm_names_max_all_tokens_beside_the_cache_capacity(monkeypatch):
    import mnnllm_core
    from paths import CONFIG
    llm = mnnllm_core.create(CONFIG)
    llm.set_config({"thread_num": 2, "max_all_tokens": 4096})
    llm.load()
    monkeypatch.setattr(llm.pool, "get", lambda seq, all_logits: _FullCache())
    with pytest.raises(ContextLengthError, match=r"at most 32 tokens; max_all_tokens is 4096") as err:
        llm.forward([1, 2, 3])
    assert err.value.field == "max_all_tokens"
    assert llm.context.history_tokens == []


def test_max_all_tokens_errors_name_the_cached_new_and_limit_counts():
    import mnnllm_core
    from paths import CONFIG
    llm = mnnllm_core.create(CONFIG)
    llm.set_config({"thread_num": 2, "max_all_tokens": 8})
    llm.load()
    llm.forward([1, 2, 3, 4, 5, 6])
    with pytest.raises(ContextLengthError, match=r"6 cached \+ 3 new tokens exceed max_all_tokens 8"):
        llm.forward([7, 8, 9])
    with pytest.raises(ContextLengthError, match=r"the prompt has 9 tokens; max_all_tokens is 8"):
        llm.generate(list(range(1, 10)), 2)


def test_kvcache_mmap_keeps_the_cpu_kv_cache_in_an_unlinked_file_mapping_with_the_same_tokens(tmp_path):
    import json
    import mmap

    import mnnllm_core
    from mnnllm_core.llm.prefix_cache import model_caches
    from paths import CONFIG, REFERENCE
    prompt = json.loads(REFERENCE.read_text())["prompts"][0]
    llm = mnnllm_core.create(CONFIG)
    llm.set_config({"sampler_type": "greedy", "thread_num": 2, "kvcache_mmap": True, "tmp_path": str(tmp_path)})
    llm.load()
    assert llm.generate(prompt["prompt_ids"], 8) == prompt["mnn_cpp_q4_memory_normal"]["gen_ids"][:8]
    def in_a_mapping(array) -> bool:
        while isinstance(array, np.ndarray):
            array = array.base
        return isinstance(array, memoryview) and isinstance(array.obj, mmap.mmap)
    caches = model_caches(llm.module)
    assert caches and all(in_a_mapping(c.k) and in_a_mapping(c.v) for c in caches)
    llm.set_config({"kvcache_mmap": False})
    assert not in_a_mapping(np.zeros(3))
    assert list(tmp_path.iterdir()) == []  # unlinked at once: nothing left behind
