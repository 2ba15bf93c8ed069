"""Long context on the cpu backend (issue #31): the KV cache below fp32 (attention_mode's int8
keys and values, the kv_fp16 hint) within a stated logit tolerance of the fp32 cache on a long
prompt; a prefill in chunks (`chunk`, `chunk_limits`) equal to one at once; `kvcache_limit`
moving a layer's cache into a file-backed mapping; the stored rows' own properties."""
import mmap

import numpy as np
import pytest

import mnnllm_core
from mnnllm_backends.cpu.host_memory import MAPPED_FROM, mapped_zeros
from mnnllm_backends.cpu.kv_memory import KVMemory
from mnnllm_backends.cpu.kv_storage import StoredKinds, StoredKVCache
from mnnllm_core.llm.prefix_cache import model_caches
from paths import CONFIG

LONG = 768  # prompt tokens of the long-prompt checks
# max |logit - fp32 logit| of the last token after LONG tokens (logits of magnitude ~25), measured
# 0.012 (fp16) and 0.13-0.17 (int8) at 1000 tokens; the greedy token is the same
TOLERANCE = {"fp16": 0.05, "int8": 0.5}


def load(**keys):
    llm = mnnllm_core.create(CONFIG)
    llm.set_config({"sampler_type": "greedy", "thread_num": 2, "max_all_tokens": 4096, **keys})
    return llm.load()


@pytest.fixture(scope="module")
def long_ids():
    text = " ".join(f"Clock {i} of the museum was built in {1500 + 7 * i % 400} by maker {i % 13}." for i in range(300))
    return load().tokenizer_encode(text)[:LONG]


@pytest.fixture(scope="module")
def fp32_logits(long_ids):
    return {memory: load(memory=memory).forward(long_ids) for memory in ("low", "normal")}


@pytest.mark.parametrize("memory", ["low", "normal"])
@pytest.mark.parametrize("kind, keys", [("fp16", {"backend_hints": {"kv_fp16": True}}),
                                        ("int8", {"attention_mode": 9}), ("int8", {"attention_mode": 10})])
def test_a_kv_cache_below_fp32_stays_within_its_tolerance_on_a_long_prompt(long_ids, fp32_logits, memory, kind, keys):
    llm = load(memory=memory, **keys)
    logits = llm.forward(long_ids)
    assert all(isinstance(c, StoredKVCache) for c in model_caches(llm.module))
    assert np.abs(logits - fp32_logits[memory]).max() <= TOLERANCE[kind]
    assert logits.argmax() == fp32_logits[memory].argmax()


@pytest.mark.parametrize("memory", ["low", "normal"])
def test_the_fp32_cache_is_kept_as_computed(memory):
    assert not any(isinstance(c, StoredKVCache) for c in model_caches(load(memory=memory).module))


@pytest.mark.parametrize("keys", [{"chunk": 64}, {"chunk_limits": [100, 1]}])
def test_a_prefill_in_chunks_gives_the_logits_and_tokens_of_one_at_once(long_ids, fp32_logits, keys):
    llm = load(**keys)
    assert np.array_equal(llm.forward(long_ids), fp32_logits["low"])
    llm.reset()
    whole = load()
    assert llm.generate(long_ids[:300], 8) == whole.generate(long_ids[:300], 8)
    llm.reset()
    whole.reset()
    assert np.array_equal(llm.forward(long_ids[:150], all_logits=True), whole.forward(long_ids[:150], all_logits=True))


def test_kvcache_limit_moves_a_layer_past_it_into_a_file_backed_mapping(long_ids, tmp_path):
    plain = load()
    want = plain.generate(long_ids[:200], 6)
    limited = load(kvcache_limit=64 * 1024, tmp_path=str(tmp_path))
    assert limited.generate(long_ids[:200], 6) == want
    assert all(file_backed(cache.v) for cache in model_caches(limited.module))
    small = load(kvcache_limit=1 << 30)
    small.generate(long_ids[:20], 1)
    assert not any(file_backed(cache.v) for cache in model_caches(small.module))


def mapping_of(array: np.ndarray) -> str | None:
    """The path of the mapping of its own that holds `array`'s data, as /proc/self/maps names it
    ("" when anonymous; Python's shared anonymous mmap shows as "/dev/zero (deleted)"), None when
    the array is not over a mapping object (the heap)."""
    base = array
    while isinstance(base, np.ndarray):
        base = base.base
    if not (isinstance(base, memoryview) and isinstance(base.obj, mmap.mmap)):
        return None
    address = array.__array_interface__["data"][0]
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            low, high = (int(x, 16) for x in fields[0].split("-"))
            if low <= address < high:
                path = fields[5].strip() if len(fields) > 5 else ""
                return "" if path.startswith("/dev/zero") else path
    raise AssertionError(f"no mapping holds address {address:#x}")


def file_backed(array: np.ndarray) -> bool:
    """Whether `array` lives in a mapping of a file (an anonymous mapping is not)."""
    return bool(mapping_of(array))


def test_kv_memory_chooses_by_the_bytes_of_a_layer():
    assert KVMemory(limit=-1).zeros_for(1 << 40) is mapped_zeros
    assert KVMemory(limit=100).zeros_for(100) is mapped_zeros
    assert KVMemory(limit=100).zeros_for(101) is not mapped_zeros
    assert KVMemory(mmap=True).zeros_for(1) is not mapped_zeros


def test_large_host_arrays_are_zeroed_mappings_of_their_own():
    big, small = mapped_zeros((MAPPED_FROM // 4,), np.float32), mapped_zeros((3, 5), np.int8)
    assert mapping_of(big) == "" and not file_backed(big)  # an anonymous mapping of its own
    assert small.base is None and small.shape == (3, 5) and small.dtype == np.int8
    assert not big.any() and big.flags.writeable
    big[-1] = 2.5
    assert big[-1] == 2.5


def test_attention_mode_reads_as_mnn_cpu_does():
    assert StoredKinds.of(8) == StoredKinds("f32", "f32") and StoredKinds.of(0).exact
    assert StoredKinds.of(9) == StoredKinds.of(1) == StoredKinds("i8", "f32")
    assert StoredKinds.of(10) == StoredKinds("i8", "i8")
    assert StoredKinds.of(2) == StoredKinds("i8", "f32")  # int8 values only with flash attention, as MNN
    assert StoredKinds.of(8, fp16=True) == StoredKinds("f16", "f16")
    assert StoredKinds.of(12) == StoredKinds("f32", "f32")  # not MNN's two parts: runs as 8, reported as ignored


def stored_cache(kind: str, transposed: bool = False) -> StoredKVCache:
    buffers = {}

    def scratch(name, size):
        if name not in buffers or buffers[name].size < size:
            buffers[name] = np.empty(size, np.float32)
        return buffers[name]

    return StoredKVCache(StoredKinds(kind, kind), transposed, scratch, lambda nbytes: np.zeros)


@pytest.mark.parametrize("transposed", [False, True])
def test_int8_rows_are_within_half_a_step_and_survive_snapshot_restore_and_moves(transposed):
    rng = np.random.default_rng(0)
    k = rng.normal(size=(37, 3, 64)).astype(np.float32) * rng.uniform(0.1, 10, size=(37, 3, 1)).astype(np.float32)
    v = rng.normal(size=(37, 3, 64)).astype(np.float32)
    k[5, 1] = 2.5  # a constant row: its scale is 0, its value exact
    cache = stored_cache("i8", transposed)
    cache.add(k[:30], v[:30])
    cache.add(k[30:], v[30:])
    keys, values = cache.dense()
    keys = keys[:, :, :37].transpose(2, 0, 1) if transposed else keys[:, :37].transpose(1, 0, 2)
    step = (k.max(-1, keepdims=True) - k.min(-1, keepdims=True)) / 255
    assert np.all(np.abs(keys - k) <= step / 2 + 1e-5 * np.abs(k) + 1e-6)
    assert np.array_equal(keys[5, 1], k[5, 1])
    assert np.abs(values[:, :37].transpose(1, 0, 2) - v).max() <= (v.max() - v.min()) / 255
    saved = cache.snapshot()
    assert saved[0].dtype == np.uint8 and saved[0].shape == (37, 3, 64 + 8)
    again = stored_cache("i8", transposed)
    again.restore(*saved)
    assert all(np.array_equal(a, b) for a, b in zip(again.snapshot(), saved))
    again.move(30, 10, 7)
    assert np.array_equal(again.snapshot()[0][10:17], saved[0][30:37])


def test_fp16_rows_round_as_fp16():
    rng = np.random.default_rng(1)
    k = rng.normal(size=(9, 2, 16)).astype(np.float32)
    cache = stored_cache("f16")
    cache.add(k, k)
    keys, _ = cache.dense()
    assert np.array_equal(keys[:, :9].transpose(1, 0, 2), k.astype(np.float16).astype(np.float32))


@pytest.mark.parametrize("kind", ["f32", "i8"])
@pytest.mark.parametrize("length, heads, kv_heads, sinks", [(4096, 9, 3, False), (4096, 4, 2, True), (5, 6, 1, False)])
def test_decode_over_stored_rows_split_over_keys_matches_float64(kind, length, heads, kv_heads, sinks):
    """The flash-decoding kernel reading float32 or int8 rows as stored, against float64 attention
    over the rows those codes stand for (relative 1e-4 of the values' range)."""
    from mnnllm_backends.cpu.kernels import set_threads
    from mnnllm_backends.cpu.kernels.decode_attention import attend_stored, splits_for
    rng = np.random.default_rng(length + heads)
    dim = 64
    cache = stored_cache(kind)
    k = (rng.normal(size=(length, kv_heads, dim)) * 3).astype(np.float32)
    cache.add(k, rng.normal(size=(length, kv_heads, dim)).astype(np.float32))
    q = rng.normal(size=(heads, dim)).astype(np.float32)
    sink = rng.normal(size=heads).astype(np.float32) if sinks else np.zeros(0, np.float32)
    keys, values = (a[:, :length].astype(np.float64) for a in cache.dense())
    scale = 1 / np.sqrt(dim)
    group = heads // kv_heads
    scores = np.einsum("hd,hpd->hp", q.astype(np.float64), np.repeat(keys, group, axis=0)) * scale
    top = scores.max(axis=1, keepdims=True) if not sinks else np.maximum(scores.max(1, keepdims=True), sink[:, None])
    weights = np.exp(scores - top)
    denominator = weights.sum(axis=1, keepdims=True) + (np.exp(sink[:, None] - top) if sinks else 0)
    want = np.einsum("hp,hpd->hd", weights / denominator, np.repeat(values, group, axis=0))
    out = np.empty((heads, dim), np.float32)
    set_threads(2)
    attend_stored(q, *cache.stored(), length, np.float32(scale), sink, out, splits_for(length, 2))
    assert np.abs(out - want).max() <= 1e-4 * (values.max() - values.min())


@pytest.mark.parametrize("memory, attention_mode", [("low", 0), ("low", 9), ("low", 10), ("normal", 10)])
def test_the_decode_replay_gives_the_per_op_tokens_at_depth(long_ids, memory, attention_mode):
    """A replayed decode step (`replay.py`) runs an Attention over a StoredKVCache as one bound
    call (`append_attend_stored`: the new rows stored, then the split decode kernel), at memory
    "low" an instruction of the step's programs, and the fp32 cache's past SPLIT_FROM tokens
    split over keys (`append_decode_deep`, whose warm-up part the cache's growth loads): the same
    kernels as op by op, so the same tokens."""
    from mnnllm_backends.cpu.kernels.attention import SPLIT_FROM
    prompt = (long_ids * 4)[:SPLIT_FROM + 100]
    replayed = load(memory=memory, attention_mode=attention_mode)
    per_op = load(memory=memory, attention_mode=attention_mode, backend_hints={"replay": False})
    assert replayed.generate(prompt, 12) == per_op.generate(prompt, 12)
    if memory == "low" and attention_mode == 0:  # the fp32 cache: the kernels that split its keys
        for llm in (replayed, per_op):
            assert "deep_decode" in llm.runtime_manager.runtime._kernel_parts
    replay = replayed.pool.get(1, False).static_module.session.pipeline.replay
    if memory == "low":  # no Attention left outside the programs
        assert replay.kernel_calls >= 30 * 12 and len(replay.calls) <= 16, (replay.kernel_calls, len(replay.calls))


@pytest.mark.parametrize("kind", ["i8", "f32"])
def test_the_decode_kernel_stores_a_row_as_the_cache_does(kind):
    """`append_attend_stored` quantizes the new rows as RowStore.write does, bit for bit, in
    ranges of kv heads as in whole (its replay and the per-op loop keep the same cache)."""
    from mnnllm_backends.cpu.kernels.decode_attention import _store_rows
    rng = np.random.default_rng(2)
    x = rng.normal(size=(6, 3, 64)).astype(np.float32) * rng.uniform(0.01, 30, size=(6, 3, 1)).astype(np.float32)
    x[2, 1] = -1.5  # a constant row
    cache, ours = stored_cache(kind), stored_cache(kind)
    cache.add(x, x)
    ours.add(np.zeros_like(x), x)
    codes, scale, zero, *_ = ours.stored()
    for at in range(6):  # kv heads 0..1, then 1..3: a thread team's rank stores a range of them
        _store_rows(x[at], codes, scale, zero, at, 0, 1)
        _store_rows(x[at], codes, scale, zero, at, 1, 3)
    assert all(np.array_equal(a, b) for a, b in zip(ours.stored()[:3], cache.stored()[:3]))


@pytest.mark.parametrize("length, heads, kv_heads, sinks",
                         [(4096, 9, 3, False), (2500, 4, 2, True), (2100, 8, 1, False)])
def test_decode_over_the_fp32_cache_split_over_keys_matches_float64(length, heads, kv_heads, sinks):
    """The fp32 cache's decode step at depth (`decode_attend_deep` from SPLIT_FROM cached tokens,
    with threads: spans of keys across them, merged) against float64 attention (relative 1e-5 of
    the values' range); below SPLIT_FROM it is `attend`, bit for bit, as `decode_attend` (the
    kernel of a cache that cannot reach SPLIT_FROM) is."""
    from mnnllm_backends.cpu.kernels import set_threads
    from mnnllm_backends.cpu.kernels.attention import SPLIT_FROM, attend, decode_attend, decode_attend_deep
    rng = np.random.default_rng(length)
    dim, capacity = 64, -(-length // 16) * 16 + 16
    keys_t, values = np.zeros((kv_heads, dim, capacity), np.float32), np.zeros((kv_heads, capacity, dim), np.float32)
    keys_t[:, :, :length] = rng.normal(size=(kv_heads, dim, length)) * 3
    values[:, :length] = rng.normal(size=(kv_heads, length, dim))
    q = rng.normal(size=(1, heads, dim)).astype(np.float32)
    sink = rng.normal(size=heads).astype(np.float32) if sinks else np.zeros(0, np.float32)
    scale, group = 1 / np.sqrt(dim), heads // kv_heads
    keys = np.repeat(keys_t[:, :, :length].astype(np.float64), group, axis=0)
    scores = np.einsum("hd,hdp->hp", q[0].astype(np.float64), keys) * scale
    top = scores.max(axis=1, keepdims=True) if not sinks else np.maximum(scores.max(1, keepdims=True), sink[:, None])
    weights = np.exp(scores - top)
    denominator = weights.sum(axis=1, keepdims=True) + (np.exp(sink[:, None] - top) if sinks else 0)
    want = np.einsum("hp,hpd->hd", weights / denominator, np.repeat(values[:, :length].astype(np.float64), group, 0))
    set_threads(2)
    out = np.empty_like(q)
    decode_attend_deep(q, keys_t, values, length - 1, np.float32(scale), sink, out, 2)
    assert np.abs(out[0] - want).max() <= 1e-5 * (values.max() - values.min())
    short, unsplit, single = np.empty_like(q), np.empty_like(q), np.empty_like(q)
    decode_attend_deep(q, keys_t, values, SPLIT_FROM - 2, np.float32(scale), sink, short, 2)
    decode_attend(q, keys_t, values, SPLIT_FROM - 2, np.float32(scale), sink, unsplit, 2)
    attend(q, keys_t, values, SPLIT_FROM - 2, np.float32(scale), sink, single)
    np.testing.assert_array_equal(short, single)
    np.testing.assert_array_equal(unsplit, single)


def test_a_backend_not_honouring_attention_mode_reports_a_set_one_as_ignored(caplog):
    from types import SimpleNamespace

    from mnnllm_core.core.backend import ScheduleConfig
    from mnnllm_core.express.runtime_manager import report_ignored_settings
    plain = SimpleNamespace(name="plain-kv-test", settings=frozenset(["thread_num", "precision", "memory", "power"]))
    with caplog.at_level("INFO", "mnnllm_core.express.runtime_manager"):
        assert report_ignored_settings(plain, ScheduleConfig(), {"attention_mode": 8}) == []
        assert report_ignored_settings(plain, ScheduleConfig(), {"attention_mode": 10}) == ["attention_mode"]
    assert "backend plain-kv-test ignores attention_mode=10" in caplog.text
    cpu = SimpleNamespace(name="cpu-kv-test", settings=frozenset(["thread_num", "memory", "attention_mode"]))
    assert "attention_mode" not in report_ignored_settings(cpu, ScheduleConfig(), {"attention_mode": 10})


def test_memory_normal_attention_on_threads_gives_the_logits_of_the_blocks_in_order(long_ids, monkeypatch):
    """memory "normal": a prefill's attention blocks spread over the runtime's threads, BLAS on
    one thread in each (`host_threads.py`), give the logits of the blocks run in order with BLAS
    on its threads (the path before), bit for bit, for a prompt crossing CAUSAL_QUERIES and
    TILED_FROM (lowered: key tiles of 96 past 160 keys) from an empty cache and after one."""
    from mnnllm_backends.cpu.ops import attention as cpu_attention
    monkeypatch.setattr(cpu_attention, "TILED_FROM", 160)
    monkeypatch.setattr(cpu_attention, "KEY_TILE", 96)

    class InOrder:
        def run(self, task, items):
            for item in items:
                task(item)
    llm = load(memory="normal")
    runtime = llm.runtime_manager.runtime
    on_threads = runtime.host_threads
    got = {}
    for name, runner in (("threads", on_threads), ("in order", InOrder())):
        runtime.host_threads = runner
        llm.reset()
        first = llm.forward(long_ids[:300], all_logits=True)
        got[name] = (first, llm.forward(long_ids[300:420]))
    assert all(np.array_equal(a, b) for a, b in zip(got["threads"], got["in order"]))


def test_a_long_step_gives_its_activation_buffers_back_and_the_same_logits(long_ids, fp32_logits, monkeypatch):
    """A step longer than RELEASED_STEP_ROWS drops its module clone after it runs (its buffers are
    collected before the decode that follows); the logits are those of a kept clone, again the
    next time a step of that length is resized afresh."""
    from mnnllm_core.llm import chunked_prefill
    monkeypatch.setattr(chunked_prefill, "RELEASED_STEP_ROWS", 100)
    llm = load()
    assert np.array_equal(llm.forward(long_ids), fp32_logits["low"])
    assert (LONG, False) not in llm.pool.keys()
    llm.forward([long_ids[0]])
    assert (1, False) in llm.pool.keys()
    llm.reset()
    assert np.array_equal(llm.forward(long_ids), fp32_logits["low"])


class _Tensor:
    def __init__(self, shape, dtype=np.float32):
        self.shape, self.dtype, self.storage = shape, np.dtype(dtype), None


def test_the_cpu_step_buffers_serve_any_shape_that_fits_but_never_two_live_tensors():
    from mnnllm_backends.cpu.buffer_pool import SizedBufferPool
    pool = SizedBufferPool()
    wide = _Tensor((8, 12))
    wide.storage = pool.acquire(wide)
    assert wide.storage.shape == (8, 12) and wide.storage.dtype == np.float32
    pool.release(wide)
    pool.release(wide)  # a tensor read twice by its last command: pooled once
    narrow, other = _Tensor((4, 6), np.int32), _Tensor((4, 6), np.int32)
    narrow.storage, other.storage = pool.acquire(narrow), pool.acquire(other)
    assert np.shares_memory(narrow.storage, wide.storage)  # the released buffer, as another shape
    assert not np.shares_memory(other.storage, wide.storage)  # the one pooled buffer went to narrow
    pool.release(narrow)
    tiny = _Tensor((1, 2))
    assert not np.shares_memory(pool.acquire(tiny), wide.storage)  # under 1/MAX_WASTE of it: a buffer of its own
    empty = _Tensor((0, 5))
    assert pool.acquire(empty).shape == (0, 5)
