"""The torch Attention's KV cache (head-major device tensors): growing keeps what was written,
a removed token is gone before the next append, and snapshot/restore (the prefix cache on disk)
round-trip token-major host arrays."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not importable")

from mnnllm_core.backend_api import KVMeta  # noqa: E402
from mnnllm_torch.ops.attention import TorchKVCache  # noqa: E402

RNG = np.random.default_rng(5)


def _rows(seq: int) -> np.ndarray:
    return RNG.standard_normal((seq, 2, 4)).astype(np.float32)


def test_the_cache_grows_keeping_its_rows_and_snapshots_them_token_major() -> None:
    cache = TorchKVCache(torch.device("cpu"))
    cache.row_shape = (2, 4)
    cache.min_capacity = 4
    written = []
    for seq in (3, 1, 5):  # capacity 4, then 9
        k = _rows(seq)
        cache.append(torch.from_numpy(k), torch.from_numpy(-k), seq)
        written.append(k)
    keys, values = cache.snapshot()
    np.testing.assert_array_equal(keys, np.concatenate(written))
    np.testing.assert_array_equal(values, -keys)
    assert cache.k.shape == (2, cache.capacity, 4) and cache.capacity == 9
    assert not cache.k[:, cache.length:].any(), "rows never written stay zero"


def test_restore_holds_exactly_the_snapshot_and_a_removed_token_goes() -> None:
    cache = TorchKVCache(torch.device("cpu"))
    k = _rows(6)
    cache.restore(k, k + 1)
    assert cache.length == 6 and cache.row_shape == (2, 4)
    np.testing.assert_array_equal(cache.snapshot()[0], k)
    meta = KVMeta()
    meta.previous, meta.remove = 6, 2
    assert cache.begin_step(meta) == 4
    np.testing.assert_array_equal(cache.snapshot()[1], k[:4] + 1)
    empty = TorchKVCache(torch.device("cpu"))
    empty.row_shape = (2, 4)
    assert [a.shape for a in empty.snapshot()] == [(0, 2, 4), (0, 2, 4)]


def test_a_reserve_keeps_the_tree_paths_rows_moved_after_the_prefix() -> None:
    """KV meta reserve (MNN's (begin, size) runs of the removed tail): the rows move down in
    order, an overlapping run too."""
    cache = TorchKVCache(torch.device("cpu"))
    k = _rows(9)
    cache.restore(k, -k)
    meta = KVMeta(previous=9, remove=6, reserve=((1, 1), (2, 3)))
    assert cache.begin_step(meta) == 7
    keys, values = cache.snapshot()
    np.testing.assert_array_equal(keys, k[[0, 1, 2, 4, 5, 6, 7]])
    np.testing.assert_array_equal(values, -keys)
